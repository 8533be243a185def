import Foundation

/// Runs a program to its end, waited for on a thread of its own (the server under test runs
/// on the two cooperative ones). posix_spawn and waitpid rather than Foundation's Process,
/// whose termination handler was seen never to run in this test process.
enum Spawn {
    /// The program's wait status (0: exited 0), or -1 when it could not be started.
    static func run(_ arguments: [String]) async -> Int32 {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                var pid = pid_t()
                let argv = arguments.map { strdup($0) } + [nil]
                defer { for pointer in argv { free(pointer) } }
                guard posix_spawn(&pid, arguments[0], nil, nil, argv, environ) == 0 else {
                    return continuation.resume(returning: -1)
                }
                var status: Int32 = 0
                while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                continuation.resume(returning: status)
            }
        }
    }
}
