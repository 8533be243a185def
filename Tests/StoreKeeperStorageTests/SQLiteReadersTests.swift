import Foundation
import NIOCore
import NIOPosix
import SQLKit
import Synchronization
import Testing
import VaporCSQLite

@testable import StoreKeeperStorage

/// SQLite reads on connections of their own (WAL): they see every commit acknowledged before
/// they began, never half of a transaction, do not wait for the writer, and cannot write.
@Suite struct SQLiteReadersTests {
    static func count(_ sql: any SQLDatabase) async throws -> Int {
        try await sql.raw("SELECT COUNT(*) AS n FROM t").first()?.decode(column: "n", as: Int.self) ?? -1
    }

    static func rows(_ database: Database) async throws -> Int {
        try await database.read { sql in try await count(sql) }
    }

    @Test func aFileDatabaseReadsOnItsOwnConnectionsAnInMemoryOneThroughTheWriter() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            let backend = try #require(database.sqliteBackend)
            #expect(backend.readsConcurrently)
        }
        let memory = try await Database.open(url: "sqlite::memory:")
        #expect(memory.sqliteBackend?.readsConcurrently == false)
        try await memory.transaction { sql in
            try await sql.raw("CREATE TABLE t (k TEXT PRIMARY KEY, i INTEGER, r REAL, b BLOB, n TEXT)").run()
            try await sql.raw("INSERT INTO t (k) VALUES ('m')").run()
        }
        #expect(try await Self.rows(memory) == 1)
        try await memory.close()
    }

    /// Every read that starts after a commit returned sees it, with reads and writes interleaved
    /// from many tasks.
    @Test func aReadSeesEveryCommitAcknowledgedBeforeIt() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<16 {
                    group.addTask {
                        for index in 0..<25 {
                            let key = "w\(writer)-\(index)"
                            try await database.transaction { sql in
                                try await sql.raw("INSERT INTO t (k, i) VALUES (\(bind: key), \(bind: index))").run()
                            }
                            let seen = try await database.read { sql in
                                try await sql.raw("SELECT i FROM t WHERE k = \(bind: key)").first()?.decode(
                                    column: "i", as: Int.self)
                            }
                            #expect(seen == index, "\(key)")
                        }
                    }
                }
                try await group.waitForAll()
            }
            #expect(try await Self.rows(database) == 16 * 25)
        }
    }

    /// A write transaction is held open (its body waits); reads meanwhile answer at once and
    /// see nothing of it, and see all of it once it commits.
    @Test(.timeLimit(.minutes(1))) func readsDoNotWaitForAnOpenWriteAndNeverSeeHalfOfIt() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            let started = AsyncStream<Void>.makeStream()
            let release = AsyncStream<Void>.makeStream()
            let writer = Task {
                try await database.transaction { sql in
                    try await sql.raw("INSERT INTO t (k, i) VALUES ('half-1', 1)").run()
                    started.continuation.yield()
                    for await _ in release.stream { break }
                    try await sql.raw("INSERT INTO t (k, i) VALUES ('half-2', 2)").run()
                }
            }
            for await _ in started.stream { break }
            for _ in 0..<20 {
                #expect(try await Self.rows(database) == 0)
            }
            release.continuation.yield()
            try await writer.value
            #expect(try await Self.rows(database) == 2)
        }
    }

    /// The statements of one read see one snapshot, even when a write commits between them.
    @Test func aReadOfSeveralStatementsSeesOneSnapshot() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            try await database.transaction { sql in try await sql.raw("INSERT INTO t (k) VALUES ('a')").run() }
            let (before, after) = try await database.read { sql in
                let before = try await Self.count(sql)
                try await database.transaction { sql in try await sql.raw("INSERT INTO t (k) VALUES ('b')").run() }
                return (before, try await Self.count(sql))
            }
            #expect(before == 1)
            #expect(after == 1)
            #expect(try await Self.rows(database) == 2)
        }
    }

    /// A write inside a read fails (the connections are query-only) and changes nothing.
    @Test func aReadCannotWrite() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            await #expect(throws: (any Error).self) {
                try await database.read { sql in try await sql.raw("INSERT INTO t (k) VALUES ('x')").run() }
            }
            await #expect(throws: (any Error).self) {
                try await database.read { sql in try await sql.raw("DELETE FROM t").run() }
            }
            let remaining = try await Self.rows(database)
            #expect(remaining == 0)
        }
    }

    /// A read that fails part-way (a bad statement, a thrown error) or ends its own transaction
    /// and opens another leaves no connection behind in a stale snapshot: later reads see new
    /// commits.
    @Test func aFailedReadLeavesNoStaleConnection() async throws {
        struct Stop: Error {}
        try await SQLiteDirectTests.withDatabase { database in
            for round in 0..<(SQLiteReaders.limit * 2) {
                _ = try? await database.read { sql in try await sql.raw("SELECT * FROM missing_table").all() }
                _ = try? await database.read { sql in
                    _ = try await Self.count(sql)
                    throw Stop()
                }
                _ = try? await database.read { sql in
                    try await sql.raw("COMMIT").run()
                    try await sql.raw("BEGIN").run()
                    _ = try await Self.count(sql)
                }
                try await database.transaction { sql in
                    try await sql.raw("INSERT INTO t (k) VALUES (\(bind: "r\(round)"))").run()
                }
                #expect(try await Self.rows(database) == round + 1)
            }
        }
    }

    /// Many more concurrent reads than connections: each waits its turn, all answer.
    @Test func moreReadsThanConnectionsAllAnswer() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            try await database.transaction { sql in try await sql.raw("INSERT INTO t (k) VALUES ('a')").run() }
            final class Gauge: Sendable {
                let open = Atomic<Int>(0)
                let most = Atomic<Int>(0)
            }
            let gauge = Gauge()
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<(SQLiteReaders.limit * 8) {
                    group.addTask {
                        try await database.read { sql in
                            let now = gauge.open.add(1, ordering: .relaxed).newValue
                            _ = gauge.most.max(now, ordering: .relaxed)
                            defer { gauge.open.subtract(1, ordering: .relaxed) }
                            try await Task.sleep(for: .milliseconds(5))
                            return try await Self.count(sql)
                        }
                    }
                }
                for try await count in group { #expect(count == 1) }
            }
            #expect(gauge.most.load(ordering: .relaxed) <= SQLiteReaders.limit)
            #expect(gauge.most.load(ordering: .relaxed) > 1)
        }
    }

    @Test func aClosedDatabaseRefusesReads() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("readers-\(UUID()).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let database = try await Database.open(url: "sqlite:\(path)")
        #expect(try await database.read { sql in try await sql.raw("SELECT 1 AS one").first() } != nil)
        try await database.close()
        await #expect(throws: (any Error).self) {
            try await database.read { sql in try await sql.raw("SELECT 1 AS one").first() }
        }
    }
}

/// A read on an event loop's thread never waits there for a lock: when another connection
/// holds the database, the loop stays free and the read waits (up to the busy timeout) on
/// Swift's pool instead, then answers.
@Suite struct SQLiteReadsOnAnEventLoopTests {
    /// Jobs run on one event loop's thread.
    final class LoopExecutor: TaskExecutor, @unchecked Sendable {
        let loop: any EventLoop
        init(_ loop: any EventLoop) { self.loop = loop }
        func enqueue(_ job: consuming ExecutorJob) {
            let job = UnownedJob(job)
            loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
        }
    }

    static func busyTimeout(_ sql: any SQLDatabase) async throws -> Int {
        try await sql.raw("PRAGMA busy_timeout").first()?.decode(column: "timeout", as: Int.self) ?? -1
    }

    @Test func onTheLoopAReadNeverWaitsForALockAndABusyOneRunsAgainOnThePool() async throws {
        try await SQLiteDirectTests.withDatabase { database in
            try await database.transaction { sql in try await sql.raw("INSERT INTO t (k) VALUES ('a')").run() }
            let executor = LoopExecutor(MultiThreadedEventLoopGroup.singleton.next())
            // Off any loop: waits up to the busy timeout.
            let offLoop = try await database.read { sql in try await Self.busyTimeout(sql) }
            #expect(offLoop == Int(SQLiteBackend.readerBusyTimeoutMilliseconds))
            // On a loop: does not wait at all; SQLite busy (as when another process holds the
            // database), the read runs again, off the loop, allowed to wait.
            let attempts = Mutex<[(busyTimeout: Int, onLoop: Bool)]>([])
            let answer = try await Task(executorPreference: executor) {
                try await database.read { sql in
                    let attempt = (
                        try await Self.busyTimeout(sql), MultiThreadedEventLoopGroup.currentEventLoop != nil
                    )
                    let first = attempts.withLock {
                        $0.append(attempt)
                        return $0.count == 1
                    }
                    if first { throw SQLiteHandle.Failure(code: SQLITE_BUSY, message: "database is locked") }
                    return try await SQLiteReadersTests.count(sql)
                }
            }.value
            #expect(answer == 1)
            let seen = attempts.withLock { $0 }
            #expect(seen.map(\.busyTimeout) == [0, Int(SQLiteBackend.readerBusyTimeoutMilliseconds)])
            #expect(seen.map(\.onLoop) == [true, false])
            // Any other failure is the answer: not run again.
            final class Count: Sendable { let value = Mutex(0) }
            let others = Count()
            await #expect(throws: SQLiteHandle.Failure.self) {
                try await Task(executorPreference: executor) {
                    try await database.read { _ -> Int in
                        others.value.withLock { $0 += 1 }
                        throw SQLiteHandle.Failure(code: SQLITE_CONSTRAINT, message: "constraint")
                    }
                }.value
            }
            #expect(others.value.withLock { $0 } == 1)
        }
    }
}
