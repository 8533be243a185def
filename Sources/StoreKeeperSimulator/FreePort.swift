import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's pick, released for
/// the caller): for a server whose local App Store must know its address before it listens.
public enum FreePort {
    /// The first of `count` consecutive ports, all free right now, below the kernel's
    /// ephemeral range (32768 and up on Linux), where the outgoing connections of everything
    /// else on the machine take their ports: for `scripts/cluster`, whose instances listen on
    /// the ports after the balancer's.
    public static func block(_ count: Int) throws -> Int {
        for _ in 0..<100 {
            let base = 10_000 + Int.random(in: 0..<2_200) * 10
            if (base..<base + count).allSatisfy(isFree) { return base }
        }
        throw POSIXError(.EADDRINUSE)
    }

    /// Whether 127.0.0.1:`port` can be bound now.
    static func isFree(_ port: Int) -> Bool {
        (try? bound(port: port)) != nil
    }

    public static func pick() throws -> Int {
        try bound(port: 0)
    }

    private static func bound(port: Int) throws -> Int {
        #if canImport(Glibc)
            let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let socketFD = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard socketFD >= 0 else { throw POSIXError(.EMFILE) }
        defer { close(socketFD) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
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
