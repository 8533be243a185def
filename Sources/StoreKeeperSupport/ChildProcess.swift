import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A child process started with `posix_spawn`, for the CLI's benchmarks and the tests: the part
/// of Foundation's `Process` they use. On Linux, Foundation's `Process.run()` (Swift 6.3) lists
/// `/proc/self/fd` by copying each entry's whole 256-byte name field, reading past the entry,
/// and the process crashes now and then with a bad memory access (a test process that holds
/// hundreds of connections crashed this way while launching a `storekeeper serve`). Here the
/// child closes every descriptor above the three standard ones itself (`closefrom` as a spawn
/// action), so nothing is listed.
public final class ChildProcess: @unchecked Sendable {
    public enum TerminationReason: Sendable {
        case exit
        case uncaughtSignal
    }

    public struct SpawnFailed: Error, CustomStringConvertible {
        public var executable: String
        public var errno: Int32
        public var description: String { "cannot start \(executable): \(String(cString: strerror(errno)))" }
    }

    public var executableURL: URL?
    public var arguments: [String]?
    /// Nil: this process's environment.
    public var environment: [String: String]?
    /// A `Pipe` (the child reads its reading end) or a `FileHandle`; nil inherits this process's.
    public var standardInput: Any?
    /// A `Pipe` (the child writes its writing end) or a `FileHandle`; nil inherits this process's.
    public var standardOutput: Any?
    public var standardError: Any?

    private let lock = NSLock()
    private var pid: pid_t = 0
    /// `waitpid`'s status once the child has been reaped.
    private var waitStatus: Int32?

    public init() {}

    public var processIdentifier: Int32 { lock.withLock { pid } }

    public func run() throws {
        guard let executable = executableURL?.path else {
            throw SpawnFailed(executable: "(no executable)", errno: ENOENT)
        }
        #if canImport(Darwin)
            var actions: posix_spawn_file_actions_t?
            var attributes: posix_spawnattr_t?
        #else
            var actions = posix_spawn_file_actions_t()
            var attributes = posix_spawnattr_t()
        #endif
        posix_spawn_file_actions_init(&actions)
        posix_spawnattr_init(&attributes)
        defer {
            posix_spawn_file_actions_destroy(&actions)
            posix_spawnattr_destroy(&attributes)
        }
        // The child's standard descriptors, then nothing else of ours.
        let slots: [(Any?, Int32, Bool)] = [
            (standardInput, 0, true), (standardOutput, 1, false), (standardError, 2, false),
        ]
        for (value, target, reads) in slots {
            guard let descriptor = Self.descriptor(value, reads: reads) else { continue }
            if descriptor >= 0 {
                posix_spawn_file_actions_adddup2(&actions, descriptor, target)
            } else {
                // `FileHandle.nullDevice` has no descriptor of its own.
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_RDWR, 0)
            }
        }
        var flags = Int32(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK)
        #if canImport(Darwin)
            // Every descriptor not named by an action is closed in the child.
            flags |= Int32(POSIX_SPAWN_CLOEXEC_DEFAULT)
            for target: Int32 in 0...2 where Self.descriptor(slots[Int(target)].0, reads: target == 0) == nil {
                posix_spawn_file_actions_addinherit_np(&actions, target)
            }
        #else
            guard let closeFrom = Self.addCloseFrom else {
                throw SpawnFailed(executable: executable, errno: ENOSYS)
            }
            _ = closeFrom(&actions, 3)
        #endif
        // Default dispositions (this process ignores SIGPIPE, which a child would inherit) and no
        // blocked signals.
        var defaults = sigset_t()
        sigfillset(&defaults)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        posix_spawnattr_setflags(&attributes, Int16(truncatingIfNeeded: flags))

        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + (arguments ?? [])).map { strdup($0) } + [nil]
        let environment = self.environment ?? ProcessInfo.processInfo.environment
        let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var child: pid_t = 0
        let result = posix_spawn(&child, executable, &actions, &attributes, argv, envp)
        guard result == 0 else { throw SpawnFailed(executable: executable, errno: result) }
        lock.withLock { pid = child }
        // The child's ends of its pipes are the child's alone: a reader here sees the end of the
        // output when the child (and whatever it started) is gone.
        var closed: Set<ObjectIdentifier> = []
        for (value, _, reads) in slots {
            guard let pipe = value as? Pipe else { continue }
            let handle = reads ? pipe.fileHandleForReading : pipe.fileHandleForWriting
            if closed.insert(ObjectIdentifier(handle)).inserted { try? handle.close() }
        }
    }

    /// The descriptor a standard slot takes: a pipe's end or a file handle's (negative for the
    /// null device).
    static func descriptor(_ value: Any?, reads: Bool) -> Int32? {
        if let pipe = value as? Pipe {
            return reads ? pipe.fileHandleForReading.fileDescriptor : pipe.fileHandleForWriting.fileDescriptor
        }
        guard let handle = value as? FileHandle else { return nil }
        return handle === FileHandle.nullDevice ? -1 : handle.fileDescriptor
    }

    #if !canImport(Darwin)
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later), which the C
        /// module does not import.
        static let addCloseFrom: CloseFrom? = {
            guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np")
            else { return nil }
            return unsafeBitCast(symbol, to: CloseFrom.self)
        }()
    #endif

    /// Reaps the child if it has ended (`block`: waits for it). True once it has been reaped.
    @discardableResult
    private func reap(block: Bool) -> Bool {
        let child = lock.withLock { waitStatus == nil ? pid : 0 }
        guard child > 0 else { return lock.withLock { waitStatus != nil } }
        var status: Int32 = 0
        while true {
            let reaped = waitpid(child, &status, block ? 0 : WNOHANG)
            if reaped == child {
                lock.withLock { waitStatus = status }
                return true
            }
            if reaped == 0 { return false }
            if errno == EINTR { continue }
            // ECHILD: another caller of ours reaped it and is about to record its status, or
            // something outside this type (a `waitpid(-1)`, SIGCHLD ignored) took it and its
            // status is gone. Wait a bounded while for the first; then record it as exit 255.
            var waited = 0
            while block && lock.withLock({ waitStatus == nil }) && waited < 2_000 {
                usleep(1_000)
                waited += 1
            }
            if block { lock.withLock { if waitStatus == nil { waitStatus = 255 << 8 } } }
            return lock.withLock { waitStatus != nil }
        }
    }

    public var isRunning: Bool {
        guard lock.withLock({ pid > 0 }) else { return false }
        return !reap(block: false)
    }

    /// Blocks the calling thread until the child ends.
    public func waitUntilExit() {
        guard lock.withLock({ pid > 0 }) else { return }
        reap(block: true)
    }

    /// The exit code, or the signal that ended it (as Foundation's `Process` reports it).
    public var terminationStatus: Int32 {
        guard let status = lock.withLock({ waitStatus }) else { return 0 }
        return status & 0x7f == 0 ? (status >> 8) & 0xff : status & 0x7f
    }

    public var terminationReason: TerminationReason {
        guard let status = lock.withLock({ waitStatus }) else { return .exit }
        return status & 0x7f == 0 ? .exit : .uncaughtSignal
    }

    /// SIGTERM.
    public func terminate() { signal(SIGTERM) }

    /// SIGINT.
    public func interrupt() { signal(SIGINT) }

    /// Sends `signal` to the child while it has not been reaped.
    public func signal(_ signal: Int32) {
        let child = lock.withLock { waitStatus == nil ? pid : 0 }
        if child > 0 { _ = kill(child, signal) }
    }
}
