import Foundation
import Logging
import SQLKit
import Testing

@testable import StoreKeeperStorage

/// A PostgreSQL at its connection limit is up and busy, not down: a call waiting for a pooled
/// connection then waits (up to its deadline) for one to come free, as for a busy pool, instead
/// of being answered "PostgreSQL unreachable" after three seconds. (CI on a many-core machine
/// once failed three tests that way while every suite's pools together held `max_connections`.)
@Suite struct PostgresFullServerTests {
    static let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"]

    @Test(.enabled(if: base != nil))
    func aServerAtItsConnectionLimitIsWaitedForNotCalledUnreachable() async throws {
        let admin = try await Database.open(url: Self.base!)
        let name = "sk_full_\(UInt32.random(in: 0...UInt32.max))"
        // A role's connection limit answers as `max_connections` does: SQLSTATE 53300.
        try await admin.read { sql in
            try await sql.raw("CREATE ROLE \(unsafeRaw: name) LOGIN PASSWORD 'full' CONNECTION LIMIT 1").run()
            try await sql.raw("CREATE DATABASE \(unsafeRaw: name) OWNER \(unsafeRaw: name)").run()
        }
        var components = URLComponents(string: Self.base!)!
        components.user = name
        components.password = "full"
        components.path = "/\(name)"
        let database = try await Database.open(url: components.string!)
        do {
            // One call holds the role's only connection for a few seconds (one, not several:
            // whether a loaded pool opens a second connection before the first call ends is
            // the machine's timing, and the limit is what matters)…
            let sleepers = (0..<1).map { _ in
                Task {
                    try await database.read { sql in try await sql.raw("SELECT pg_sleep(6)").run() }
                }
            }
            // (Up to a minute for a loaded machine to start them.)
            let started = ContinuousClock.now + .seconds(60)
            var sleeping = 0
            while sleeping < 1, ContinuousClock.now < started {
                sleeping = try await admin.read { sql in
                    try await sql.raw(
                        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = \(bind: name) AND query LIKE '%pg_sleep%'"
                    ).first()?.decode(column: "n", as: Int.self) ?? 0
                }
                if sleeping < 1 { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(sleeping == 1)
            // …a second waits for it (the pool's attempts and the restart watch's probe
            // are refused meanwhile) and is answered.
            // Its 30 s deadline may pass on a machine starting every suite's servers at once: asked
            // again then. Never "unreachable" — that is what this test is about.
            var answer: Int?
            for attempt in 1...4 where answer == nil {
                do {
                    answer = try await database.read { sql in
                        try await sql.raw("SELECT 41 + 1 AS n").first()?.decode(column: "n", as: Int.self)
                    }
                } catch  where attempt < 4 && "\(error)".contains("took longer than") {
                    continue
                }
            }
            #expect(answer == 42)
            for sleeper in sleepers { try await sleeper.value }
        } catch {
            Issue.record(error)
        }
        // Clean-up is best effort: a loaded server may take its time to end the role's sessions,
        // and what is left (a uniquely named database and role) harms no other test.
        try? await database.close()
        _ = try? await admin.read { sql in
            try await sql.raw("DROP DATABASE IF EXISTS \(unsafeRaw: name) WITH (FORCE)").run()
            try await sql.raw("DROP ROLE IF EXISTS \(unsafeRaw: name)").run()
        }
        try? await admin.close()
    }
}

/// The restart watch's probe calls PostgreSQL down only on what says so; a slow or busy server is
/// waited for, not answered "unreachable" (`PostgresBackend.probeFailure`).
@Suite struct PostgresProbeTests {
    static let logger = Logger(label: "probe-test")

    @Test func aRefusedConnectionIsDown() async throws {
        // Nothing listens on port 1.
        let backend = try PostgresBackend(url: "postgres://u:p@127.0.0.1:1/db?sslmode=disable", logger: Self.logger)
        defer { Task { try? await backend.close() } }
        // A deadline a machine starting every suite's servers at once cannot miss: what is
        // tested is how a refusal is read, not how fast.
        let probe = await backend.probeUptime(deadline: .seconds(120))
        #expect(probe.down?.contains("connection failed") == true, "\(probe)")
    }

    @Test func aServerThatAcceptsAndNeverAnswersIsUnknownNotDown() async throws {
        // A socket that completes TCP's handshake (the kernel's backlog) but never reads: as a
        // PostgreSQL too loaded to start a backend within the probe's 5 s.
        let listener = try SilentListener()
        defer { listener.close() }
        let backend = try PostgresBackend(
            url: "postgres://u:p@127.0.0.1:\(listener.port)/db?sslmode=disable", logger: Self.logger)
        defer { Task { try? await backend.close() } }
        let probe = await backend.probeUptime()
        #expect(probe == .unknown, "\(probe)")
        #expect(probe.down == nil)
    }

    @Test(.enabled(if: PostgresFullServerTests.base != nil))
    func aServerThatIsUpAnswersItsUptime() async throws {
        let backend = try PostgresBackend(url: PostgresFullServerTests.base!, logger: Self.logger)
        defer { Task { try? await backend.close() } }
        // Never `down`; `unknown` only while a loaded machine takes long to connect (every
        // suite's tests start at once), so with a long deadline, and asked again for a while.
        let until = ContinuousClock.now + .seconds(120)
        var probe = await backend.probeUptime(deadline: .seconds(60))
        while probe == .unknown, ContinuousClock.now < until {
            try await Task.sleep(for: .milliseconds(500))
            probe = await backend.probeUptime(deadline: .seconds(60))
        }
        guard case .up(let uptime) = probe else {
            Issue.record("\(probe)")
            return
        }
        #expect(uptime > 0)
    }
}

/// A listening TCP socket on loopback that accepts nothing and says nothing.
final class SilentListener: Sendable {
    let descriptor: Int32
    let port: Int

    init() throws {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(descriptor, 16) == 0 else { throw POSIXError(.EADDRINUSE) }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        self.descriptor = descriptor
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    func close() { _ = Glibc.close(descriptor) }
}
