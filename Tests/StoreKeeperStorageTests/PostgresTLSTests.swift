import Foundation
import SQLKit
import Synchronization
import Testing

@testable import StoreKeeperStorage

#if canImport(Glibc)
    import Glibc
#endif

/// `database.url`'s sslmode (docs/api.md): TLS to PostgreSQL as libpq means it, `require` by default
/// for any host but loopback, and a password never sent to a server that refuses TLS.
@Suite struct PostgresTLSTests {
    static let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"]
    static let root = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_TLS_ROOT"]

    static func url(host: String? = nil, query: String) -> String {
        var components = URLComponents(string: base!)!
        if let host { components.host = host }
        components.percentEncodedQuery = query
        return components.string!
    }

    /// Whether the session runs over TLS, as the server sees it.
    static func usesTLS(_ url: String) async throws -> Bool {
        let database = try await Database.open(url: url)
        defer { Task { try? await database.close() } }
        return try await database.read { sql in
            try await sql.raw("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").first()?
                .decode(column: "ssl", as: Bool.self) ?? false
        }
    }

    @Test func theDefaultIsRequireExceptOnLoopback() throws {
        func mode(_ url: String) throws -> PostgresBackend.SSLMode {
            let components = URLComponents(string: url)!
            return try PostgresBackend.sslMode(components, host: components.host!)
        }
        #expect(try mode("postgres://u:p@db.internal:5432/sk") == .require)
        #expect(try mode("postgres://u:p@10.0.0.5/sk") == .require)
        #expect(try mode("postgres://u:p@127.0.0.1/sk") == .disable)
        #expect(try mode("postgres://u:p@localhost/sk") == .disable)
        #expect(try mode("postgres://u:p@[::1]/sk") == .disable)
        #expect(try mode("postgres://u:p@db.internal/sk?sslmode=verify-full") == .verifyFull)
        #expect(try mode("postgres://u:p@127.0.0.1/sk?sslmode=require") == .require)
        #expect(throws: Database.InvalidURL.self) { try mode("postgres://u:p@db/sk?sslmode=sometimes") }
    }

    @Test(.enabled(if: base != nil && root != nil))
    func requireAndVerifyFullUseTLSWithARealServer() async throws {
        #expect(try await Self.usesTLS(Self.url(query: "sslmode=require")))
        #expect(try await Self.usesTLS(Self.url(query: "sslmode=prefer")))
        #expect(!(try await Self.usesTLS(Self.url(query: "sslmode=disable"))))
        let rooted = "sslmode=verify-full&sslrootcert=\(Self.root!)"
        #expect(try await Self.usesTLS(Self.url(host: "localhost", query: rooted)))
        #expect(try await Self.usesTLS(Self.url(host: "127.0.0.1", query: rooted)))
        // The self-signed certificate is trusted by nobody else: verify-full without it fails.
        let untrusted = Task {
            try await Self.usesTLS(Self.url(host: "localhost", query: "sslmode=verify-full"))
        }
        let timeout = Task {
            try await Task.sleep(for: .seconds(8))
            untrusted.cancel()
        }
        await #expect(throws: (any Error).self) { _ = try await untrusted.value }
        timeout.cancel()
    }

    /// A fake PostgreSQL on loopback that answers the SSLRequest with "N" (no TLS) and records
    /// every byte the client sends.
    final class Recorder: Sendable {
        let bytes = Mutex<[UInt8]>([])
    }

    final class FakeServer: Sendable {
        let port: Int
        let received = Recorder()
        private let listener: Int32

        init() throws {
            let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = 0
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
            }
            listen(listener, 8)
            _ = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
            }
            port = Int(UInt16(bigEndian: address.sin_port))
            self.listener = listener
            let received = self.received
            Thread {
                while true {
                    let connection = accept(listener, nil, nil)
                    guard connection >= 0 else { return }
                    var timeout = timeval(tv_sec: 5, tv_usec: 0)
                    setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                    var buffer = [UInt8](repeating: 0, count: 4096)
                    var answeredSSL = false
                    while true {
                        let count = recv(connection, &buffer, buffer.count, 0)
                        guard count > 0 else { break }
                        received.bytes.withLock { $0 += buffer[0..<count] }
                        if !answeredSSL {
                            answeredSSL = true
                            _ = send(connection, "N", 1, Int32(MSG_NOSIGNAL))
                        } else {
                            // Whatever comes next, ask for the password in clear text.
                            let cleartext: [UInt8] = [0x52, 0, 0, 0, 8, 0, 0, 0, 3]
                            _ = cleartext.withUnsafeBytes { send(connection, $0.baseAddress, 9, Int32(MSG_NOSIGNAL)) }
                        }
                    }
                    close(connection)
                }
            }.start()
        }

        func stop() {
            shutdown(listener, Int32(SHUT_RDWR))
            close(listener)
        }
    }

    @Test func requireNeverSendsThePasswordToAServerWithoutTLS() async throws {
        let fake = try FakeServer()
        defer { fake.stop() }
        let password = "hunter2-secret-password"
        for (query, expectsPassword) in [("sslmode=require", false), ("sslmode=verify-full", false)] {
            fake.received.bytes.withLock { $0 = [] }
            let url = "postgres://storekeeper:\(password)@127.0.0.1:\(fake.port)/sk?\(query)"
            let database = try await Database.open(url: url)
            let attempt = Task { try await database.read { sql in try await sql.raw("SELECT 1").run() } }
            // Until the client has connected (in a full test run on two cores that can take many
            // seconds), then long enough for anything it would send after the server's "N".
            let deadline = ContinuousClock.now + .seconds(90)
            while fake.received.bytes.withLock({ $0.isEmpty }), ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(50))
            }
            try await Task.sleep(for: .seconds(2))
            attempt.cancel()
            _ = try? await attempt.value
            try? await database.close()
            let bytes = fake.received.bytes.withLock { $0 }
            // Only SSLRequest messages (length 8, code 80877103), never a startup message or a password.
            #expect(!bytes.isEmpty, "\(query): the client never connected")
            #expect(bytes.count % 8 == 0, "\(query): \(bytes.count) bytes")
            #expect(!String(decoding: bytes, as: UTF8.self).contains(password) == !expectsPassword)
            #expect(!String(decoding: bytes, as: UTF8.self).contains("storekeeper"), "\(query): startup message sent")
        }
    }
}
