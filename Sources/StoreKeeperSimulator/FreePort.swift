import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's pick, released for
/// the caller): for a server whose local App Store must know its address before it listens.
public enum FreePort {
    public static func pick() throws -> Int {
        #if canImport(Glibc)
            let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let socketFD = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard socketFD >= 0 else { throw POSIXError(.EMFILE) }
        defer { close(socketFD) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
                guard bind(socketFD, pointer, length) == 0 else { return -1 }
                return getsockname(socketFD, pointer, &length)
            }
        }
        guard bound == 0 else { throw POSIXError(.EADDRINUSE) }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
