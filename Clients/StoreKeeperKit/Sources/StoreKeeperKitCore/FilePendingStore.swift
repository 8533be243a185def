import Foundation

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

public struct PendingStoreError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The pending records in one append-only journal file: a header line, then one line per
/// write (`{"w": {key: base64}, "r": [key]}`), each appended and fsynced — one update costs one
/// short line, whatever the history. When the journal grows past four times what it holds, it is
/// compacted: written whole to a temporary file beside it, fsynced, renamed over it, the
/// directory fsynced. A crash at any instant leaves every write either whole or absent (a torn
/// last line is ignored). A file that is not a journal is the one-document format of version 1,
/// handed over as the `legacy` record; a damaged line is copied aside, never overwritten.
///
/// A write that fails part way (a full disk) is cut back off the file and throws; the next
/// write rewrites the journal whole, so nothing after it lands behind half a line. Several
/// stores or processes (an app and its extension) may share one journal: every read and write
/// holds an advisory lock (`flock` on `<journal>.lock`), and a write first takes in what the
/// others appended (or compacted) since it last looked, so no one's records are dropped.
public final class FilePendingStore: PendingStore, @unchecked Sendable {
    public let url: URL
    /// fsync the file and its directory (the default). Off only where power loss is not the
    /// question — a simulator whose crashes are simulated in-process — to spare a shared disk.
    public let synchronous: Bool
    private let lock = NSLock()
    private var records: [String: Data]?
    private var journalBytes = 0
    private var liveBytes = 0
    /// The file ends in a torn line or is a legacy document: rewrite before appending.
    private var needsCompaction = false

    static let header = Data("storekeeper-journal 2\n".utf8)

    public init(url: URL, synchronous: Bool = true) {
        self.url = url
        self.synchronous = synchronous
    }

    struct Line: Codable {
        var w: [String: Data]?
        var r: [String]?
    }

    /// The journal's identity and length when this store last read or wrote it: another
    /// writer's append or compaction changes one of them.
    private var seen: (inode: UInt64, size: Int)?
    /// The longest a read or write waits for another writer's lock.
    static let lockDeadline: TimeInterval = 5
    /// Test hook: the next append writes this many bytes, then fails as a full disk does.
    var failNextAppendAfter: Int?

    public func load() throws -> [String: Data] {
        lock.lock()
        defer { lock.unlock() }
        return try withFileLock(exclusive: false) { try loadLocked() }
    }

    /// The journal as it is on disk now: `nil` when there is none.
    private func fileIdentity() -> (inode: UInt64, size: Int)? {
        var info = stat()
        guard stat(url.path, &info) == 0 else { return nil }
        return (UInt64(info.st_ino), Int(info.st_size))
    }

    /// Runs `body` holding the journal's advisory lock (shared for reads, exclusive for writes).
    private func withFileLock<T>(exclusive: Bool, _ body: () throws -> T) throws -> T {
        let directory = url.deletingLastPathComponent()
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let lockPath = url.path + ".lock"
        let fd = open(lockPath, O_RDWR | O_CREAT, 0o600)
        guard fd >= 0 else { return try body() }  // a read-only place: nothing else writes there
        defer { close(fd) }
        // Never a wait without a deadline: a writer that holds the lock for good (a hung
        // extension) makes this write fail after 5 s — the coordinator keeps the state in
        // memory, logs, and writes again at its next change.
        let deadline = Date().addingTimeInterval(Self.lockDeadline)
        while flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR else {
                throw PendingStoreError("cannot lock \(lockPath): errno \(errno)")
            }
            guard Date() < deadline else {
                throw PendingStoreError("\(lockPath) is held by another writer for over \(Int(Self.lockDeadline)) s")
            }
            usleep(5_000)
        }
        defer { _ = flock(fd, LOCK_UN) }
        return try body()
    }

    private func loadLocked() throws -> [String: Data] {
        if let records {
            // Another store (or process) wrote since: read it again.
            let now = fileIdentity()
            if now.map({ $0.inode }) == seen?.inode && now?.size == seen?.size { return records }
            self.records = nil
            needsCompaction = false
        }
        defer { seen = fileIdentity() }
        guard let data = FileManager.default.contents(atPath: url.path), !data.isEmpty else {
            records = [:]
            return [:]
        }
        guard data.starts(with: Self.header) else {
            // Version 1's single document: the coordinator migrates it.
            records = [PendingRecords.legacyKey: data]
            liveBytes = data.count
            journalBytes = data.count
            needsCompaction = true
            return records!
        }
        var current: [String: Data] = [:]
        let lines = data.dropFirst(Self.header.count).split(
            separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        let decoder = JSONDecoder()
        var damaged = false
        for (index, line) in lines.enumerated() where !line.isEmpty {
            guard let parsed = try? decoder.decode(Line.self, from: Data(line)) else {
                if index == lines.count - 1 {
                    // A write torn by a crash: it never returned, so nothing relied on it.
                    needsCompaction = true
                } else {
                    damaged = true
                }
                continue
            }
            for (key, value) in parsed.w ?? [:] { current[key] = value }
            for key in parsed.r ?? [] { current[key] = nil }
        }
        if damaged {
            let aside = url.appendingPathExtension("damaged-\(Int(Date().timeIntervalSince1970))")
            try? FileManager.default.copyItem(at: url, to: aside)
            needsCompaction = true
        }
        records = current
        journalBytes = data.count
        liveBytes = current.reduce(0) { $0 + $1.key.utf8.count + $1.value.count }
        return current
    }

    public func write(_ changes: [String: Data], removing: [String]) throws {
        guard !changes.isEmpty || !removing.isEmpty else { return }
        lock.lock()
        defer { lock.unlock() }
        try withFileLock(exclusive: true) {
            var current = try loadLocked()
            for (key, value) in changes { current[key] = value }
            for key in removing { current[key] = nil }
            liveBytes = current.reduce(0) { $0 + $1.key.utf8.count + $1.value.count }
            if needsCompaction || journalBytes > 4 * liveBytes + 65_536 {
                try compact(current)
            } else {
                let line = try JSONEncoder.storeKeeper.encode(
                    Line(w: changes.isEmpty ? nil : changes, r: removing.isEmpty ? nil : removing))
                try append(line + Data("\n".utf8))
                journalBytes += line.count + 1
            }
            records = current
            seen = fileIdentity()
        }
    }

    private func append(_ data: Data) throws {
        let directory = url.deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let created = !FileManager.default.fileExists(atPath: url.path)
        if created {
            try compact(records ?? [:])
        }
        let fd = open(url.path, O_WRONLY | O_APPEND)
        guard fd >= 0 else { throw PendingStoreError("cannot open \(url.path): errno \(errno)") }
        defer { close(fd) }
        var info = stat()
        let before = fstat(fd, &info) == 0 ? off_t(info.st_size) : off_t(journalBytes)
        do {
            if let limit = failNextAppendAfter {
                failNextAppendAfter = nil
                try Self.writeAll(fd, data.prefix(limit))
                throw PendingStoreError("write failed: errno \(ENOSPC) (no space left on device)")
            }
            try Self.writeAll(fd, data)
            guard !synchronous || fsync(fd) == 0 else { throw PendingStoreError("fsync failed: errno \(errno)") }
        } catch {
            // Half a line must not stay in front of the next write: cut it off, and have the
            // next write rewrite the journal whole in case the cut failed too.
            _ = ftruncate(fd, before)
            needsCompaction = true
            throw error
        }
    }

    private func compact(_ current: [String: Data]) throws {
        var data = Self.header
        if !current.isEmpty {
            data.append(try JSONEncoder.storeKeeper.encode(Line(w: current, r: nil)))
            data.append(UInt8(ascii: "\n"))
        }
        let directory = url.deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let temporary = directory.appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString).tmp")
        let fd = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { throw PendingStoreError("cannot create \(temporary.path): errno \(errno)") }
        do {
            try Self.writeAll(fd, data)
            guard !synchronous || fsync(fd) == 0 else { throw PendingStoreError("fsync failed: errno \(errno)") }
        } catch {
            close(fd)
            unlink(temporary.path)
            throw error
        }
        close(fd)
        guard rename(temporary.path, url.path) == 0 else {
            let code = errno
            unlink(temporary.path)
            throw PendingStoreError("rename failed: errno \(code)")
        }
        let directoryFd = synchronous ? open(directory.path, O_RDONLY) : -1
        if directoryFd >= 0 {
            _ = fsync(directoryFd)
            close(directoryFd)
        }
        journalBytes = data.count
        needsCompaction = false
    }

    private static func writeAll(_ fd: Int32, _ data: Data) throws {
        var written = 0
        let failure: String? = data.withUnsafeBytes { buffer -> String? in
            while written < buffer.count {
                let n = posixWrite(fd, buffer.baseAddress! + written, buffer.count - written)
                if n < 0 {
                    if errno == EINTR { continue }
                    return "write failed: errno \(errno)"
                }
                written += n
            }
            return nil
        }
        if let failure { throw PendingStoreError(failure) }
    }
}

/// `write(2)`, out of reach of the store's own `write` method.
private func posixWrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int {
    write(fd, buffer, count)
}

extension JSONEncoder {
    static var storeKeeper: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .millisecondsSince1970
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }
}

extension JSONDecoder {
    static var storeKeeper: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .millisecondsSince1970
        return decoder
    }
}
