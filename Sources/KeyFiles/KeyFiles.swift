import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Private key files: written readable by their owner only from the first byte, and refused
/// when any user of the machine may read or replace them (as ssh refuses an unprotected key).
public enum KeyFiles {
    /// Why `path` may not hold a private key — readable or writable by others — or nil when it
    /// is the owner's (group access is left to the operator: a service's group may read it).
    public static func exposure(of path: String) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        let mode = info.st_mode & 0o777
        guard mode & 0o006 != 0 else { return nil }
        return "\(path) is \(mode & 0o004 != 0 ? "readable" : "writable") by every user of this machine (mode "
            + String(mode, radix: 8) + "); a private key must not be: chmod 600 \(path)"
    }

    /// Creates `path` with mode 0600 and writes `data` into it (the file never exists with
    /// wider permissions); replaces an existing file atomically.
    public static func writePrivate(_ data: Data, to path: String) throws {
        let temporary = path + ".tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let descriptor = open(temporary, O_CREAT | O_EXCL | O_WRONLY, 0o600)
        guard descriptor >= 0 else { throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: path]) }
        var written = 0
        let failed: Bool = data.withUnsafeBytes { buffer in
            while written < buffer.count {
                let result = write(descriptor, buffer.baseAddress! + written, buffer.count - written)
                if result <= 0 { return true }
                written += result
            }
            return fsync(descriptor) != 0
        }
        close(descriptor)
        guard !failed, rename(temporary, path) == 0 else {
            unlink(temporary)
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
    }
}
