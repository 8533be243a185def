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

/// The pending store as one JSON file, replaced atomically: written to a temporary file
/// beside it, fsynced, renamed over the old one, and the directory fsynced — so a crash at
/// any instant leaves either the old state or the new one, never a torn file.
public final class FilePendingStore: PendingStore, @unchecked Sendable {
    public let url: URL
    /// fsync the file and its directory (the default). Off only where power loss is not the
    /// question — a simulator whose crashes are simulated in-process — to spare a shared disk.
    public let synchronous: Bool
    private let lock = NSLock()

    public init(url: URL, synchronous: Bool = true) {
        self.url = url
        self.synchronous = synchronous
    }

    public func load() throws -> PendingState {
        lock.lock()
        defer { lock.unlock() }
        guard let data = FileManager.default.contents(atPath: url.path) else { return PendingState() }
        do {
            return try JSONDecoder.storeKeeper.decode(PendingState.self, from: data)
        } catch {
            // Unreadable (a disk error, or a file from the future): keep it for support and
            // start from StoreKit's own queue, which still holds every unfinished transaction.
            let aside = url.appendingPathExtension("unreadable-\(Int(Date().timeIntervalSince1970))")
            try? FileManager.default.moveItem(at: url, to: aside)
            return PendingState()
        }
    }

    public func save(_ state: PendingState) throws {
        let data = try JSONEncoder.storeKeeper.encode(state)
        lock.lock()
        defer { lock.unlock() }
        let directory = url.deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let temporary = directory.appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString).tmp")
        let fd = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { throw PendingStoreError("cannot create \(temporary.path): errno \(errno)") }
        var written = 0
        let failure: String? = data.withUnsafeBytes { buffer -> String? in
            while written < buffer.count {
                let n = write(fd, buffer.baseAddress! + written, buffer.count - written)
                if n < 0 {
                    if errno == EINTR { continue }
                    return "write failed: errno \(errno)"
                }
                written += n
            }
            return nil
        }
        if let failure {
            close(fd)
            unlink(temporary.path)
            throw PendingStoreError(failure)
        }
        guard !synchronous || fsync(fd) == 0 else {
            let code = errno
            close(fd)
            unlink(temporary.path)
            throw PendingStoreError("fsync failed: errno \(code)")
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
    }
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
