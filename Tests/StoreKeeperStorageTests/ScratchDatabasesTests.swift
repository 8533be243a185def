import Foundation
import SQLKit
import StoreKeeperStorage
import StoreKeeperSupport
import Testing

/// The test suites' PostgreSQL databases: lent empty, emptied when given back, never more at once
/// than the lender allows.
@Suite struct ScratchDatabasesTests {
    static let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"]

    @Test(.enabled(if: base != nil))
    func aDatabaseComesBackEmptyAndTheLimitHolds() async throws {
        let base = try #require(Self.base)
        let lender = ScratchDatabases(capacity: 1)
        let first = try await lender.lend(base: base)
        let database = try await Database.open(url: first.url)
        try await database.read { sql in
            try await sql.raw("CREATE TABLE left_behind (n INTEGER)").run()
            try await sql.raw("INSERT INTO left_behind VALUES (1)").run()
        }
        // Left open on purpose: giving back ends the connections a test forgot.
        let second = Task { try await lender.lend(base: base) }
        try await Task.sleep(for: .milliseconds(300))
        await lender.giveBack(first)
        let again = try await second.value
        #expect(again.name == first.name, "the one database, lent again once given back")
        let reused = try await Database.open(url: again.url)
        let tables = try await reused.read { sql in
            try await sql.raw(
                "SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = 'public'"
            ).first()?.decode(column: "n", as: Int.self) ?? -1
        }
        #expect(tables == 0)
        let others = try await reused.read { sql in
            try await sql.raw(
                """
                SELECT COUNT(*) AS n FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                """
            ).first()?.decode(column: "n", as: Int.self) ?? -1
        }
        #expect(others <= 1, "at most this pool's second connection")
        try? await reused.close()
        try? await database.close()
        await lender.giveBack(again)
    }
}

extension ScratchDatabasesTests {
    /// A database left by a process that has ended is taken over (renamed to this process, emptied)
    /// before a new one is created: runs after runs leave no more databases behind.
    @Test(.enabled(if: base != nil))
    func aDatabaseLeftByAnEndedProcessIsTakenOverEmpty() async throws {
        let base = try #require(Self.base)
        // posix_spawn, never Foundation's Process (its run() can crash a busy test process on Linux).
        let ended = ChildProcess()
        ended.executableURL = URL(fileURLWithPath: "/bin/true")
        try ended.run()
        ended.waitUntilExit()
        // Its own prefix: only this test's leftover is a candidate (the suites' lender, and other
        // runs' leftovers, never meet it).
        let prefix = "sk_scratchtest_\(UUID().uuidString.prefix(6).lowercased())_"
        let left = "\(prefix)\(ended.processIdentifier)_leftover"
        let admin = try await Database.open(url: base)
        try await admin.read { sql in try await sql.raw("CREATE DATABASE \(ident: left)").run() }
        var components = URLComponents(string: base)!
        components.path = "/\(left)"
        let old = try await Database.open(url: components.string!)
        try await old.read { sql in try await sql.raw("CREATE TABLE left_behind (n INTEGER)").run() }
        try await old.close()

        let lender = ScratchDatabases(capacity: 4, prefix: prefix)
        let lease = try await lender.lend(base: base)
        #expect(lease.name.hasPrefix("\(prefix)\(getpid())_"))
        let names = try await admin.read { sql in
            try await sql.raw("SELECT datname FROM pg_database").all().map {
                try $0.decode(column: "datname", as: String.self)
            }
        }
        #expect(!names.contains(left), "taken over, not left beside a new one")
        #expect(names.filter { $0.hasPrefix(prefix) } == [lease.name])
        let database = try await Database.open(url: lease.url)
        let tables = try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = 'public'")
                .first()?.decode(column: "n", as: Int.self) ?? -1
        }
        #expect(tables == 0)
        try await database.close()
        await lender.giveBack(lease)
        try? await admin.read { sql in
            try await sql.raw("DROP DATABASE IF EXISTS \(ident: lease.name) WITH (FORCE)").run()
        }
        try await admin.close()
    }
}

extension ScratchDatabasesTests {
    /// The limit is per server (per base URL): the restart tests' cluster never waits behind the
    /// main cluster's tests. With one database allowed, a second base still lends at once.
    @Test(.enabled(if: base != nil), .timeLimit(.minutes(2)))
    func eachServerHasALimitOfItsOwn() async throws {
        let base = try #require(Self.base)
        var other = try #require(URLComponents(string: base))
        other.path = "/postgres"
        let lender = ScratchDatabases(capacity: 1)
        let first = try await lender.lend(base: base)
        let second = try await lender.lend(base: try #require(other.string))
        #expect(first.name != second.name)
        await lender.giveBack(second)
        await lender.giveBack(first)
    }
}
