import Foundation
import SQLKit
import Testing

@testable import StoreKeeperStorage

/// The SQLite layer under SQLKit: values go in and come out as stored, errors surface as errors
/// (never a crash or a silently dropped statement), and a failed transaction leaves nothing.
@Suite struct SQLiteDirectTests {
    enum Mood: String, Codable { case calm }
    struct Wrapped: Codable { var inner: Int64 }

    static func withDatabase(_ body: (Database) async throws -> Void) async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("sqlite-direct-\(UUID()).sqlite")
        defer {
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path.path + suffix) }
        }
        let database = try await Database.open(url: "sqlite:\(path.path)")
        try await database.transaction { sql in
            try await sql.raw("CREATE TABLE t (k TEXT PRIMARY KEY, i INTEGER, r REAL, b BLOB, n TEXT)").run()
        }
        try await body(database)
        try await database.close()
    }

    @Test func valuesRoundTripWithTheirTypes() async throws {
        try await Self.withDatabase { database in
            let missing: String? = nil
            try await database.transaction { sql in
                try await sql.raw(
                    """
                    INSERT INTO t (k, i, r, b, n) VALUES (\(bind: "ünïcode ✓ \u{0}inside"), \(bind: Int64.min),
                    \(bind: 2.5), \(bind: [UInt8]([0, 1, 255])), \(bind: missing))
                    """
                ).run()
                try await sql.raw(
                    "INSERT INTO t (k, i, r, b, n) VALUES (\(bind: "flags"), \(bind: true), \(bind: Float(1)), \(bind: Data([7])), \(bind: Mood.calm))"
                ).run()
            }
            let rows = try await database.read { sql in try await sql.raw("SELECT * FROM t ORDER BY k").all() }
            #expect(rows.count == 2)
            let flags = rows[0]
            #expect(try flags.decode(column: "i", as: Bool.self) == true)
            #expect(try flags.decode(column: "n", as: Mood.self) == .calm)
            #expect(try flags.decode(column: "r", as: Double.self) == 1)
            let text = rows[1]
            #expect(try text.decode(column: "k", as: String.self) == "ünïcode ✓ \u{0}inside")
            #expect(try text.decode(column: "i", as: Int64.self) == Int64.min)
            #expect(try text.decode(column: "r", as: Double.self) == 2.5)
            #expect(try text.decode(column: "n", as: String?.self) == nil)
            #expect(try text.decodeNil(column: "n"))
            #expect(text.allColumns == ["k", "i", "r", "b", "n"])
            #expect(text.contains(column: "b") && !text.contains(column: "zz"))
            // Wrong types and missing columns are decoding errors, not crashes or guesses.
            #expect(throws: DecodingError.self) { try text.decode(column: "i", as: Int32.self) }
            #expect(throws: DecodingError.self) { try text.decode(column: "n", as: String.self) }
            #expect(throws: DecodingError.self) { try text.decode(column: "zz", as: String.self) }
            #expect(throws: DecodingError.self) { try text.decode(column: "r", as: Wrapped.self) }
        }
    }

    @Test func unsupportedBindsAndSQLMistakesAreErrors() async throws {
        try await Self.withDatabase { database in
            await #expect(throws: SQLiteValueError.self) {
                try await database.transaction { sql in
                    try await sql.raw("INSERT INTO t (k, i) VALUES ('x', \(bind: Wrapped(inner: 1)))").run()
                }
            }
            await #expect(throws: SQLiteValueError.self) {
                try await database.transaction { sql in
                    try await sql.raw("INSERT INTO t (k, i) VALUES ('x', \(bind: UInt64.max))").run()
                }
            }
            // A second statement in one query would be dropped silently; it is refused instead.
            await #expect(throws: SQLiteHandle.Failure.self) {
                try await database.transaction { sql in
                    try await sql.raw("INSERT INTO t (k) VALUES ('a'); INSERT INTO t (k) VALUES ('b')").run()
                }
            }
            await #expect(throws: SQLiteHandle.Failure.self) {
                try await database.read { sql in try await sql.raw("SELEC nonsense").run() }
            }
            let count = try await database.read { sql in
                try await sql.raw("SELECT COUNT(*) AS n FROM t").first()?.decode(column: "n", as: Int.self)
            }
            #expect(count == 0)
        }
    }

    @Test func aFailedTransactionLeavesNothingAndTheConnectionGoesOn() async throws {
        try await Self.withDatabase { database in
            try await database.transaction { sql in try await sql.raw("INSERT INTO t (k) VALUES ('kept')").run() }
            await #expect(throws: SQLiteHandle.Failure.self) {
                try await database.transaction { sql in
                    try await sql.raw("INSERT INTO t (k) VALUES ('rolled back')").run()
                    try await sql.raw("INSERT INTO t (k) VALUES ('kept')").run()  // primary key
                }
            }
            let keys = try await database.read { sql in
                try await sql.raw("SELECT k FROM t ORDER BY k").all().map {
                    try $0.decode(column: "k", as: String.self)
                }
            }
            #expect(keys == ["kept"])
        }
    }

    @Test func manyDistinctStatementsOutgrowTheCacheSafely() async throws {
        try await Self.withDatabase { database in
            // More distinct SQL texts than the statement cache holds: it is emptied and refilled.
            try await database.transaction { sql in
                for index in 0..<1_200 {
                    let keys = (0...(index % 7)).map { "k\(index)-\($0)" }
                    var insert = sql.insert(into: "t").columns("k", "i")
                    for key in keys { insert = insert.values([key, index]) }
                    try await insert.run()
                    _ = try await sql.raw("SELECT k FROM t WHERE i = \(bind: index) AND k <> \(literal: "\(index)")")
                        .all()
                }
            }
            let count = try await database.read { sql in
                try await sql.raw("SELECT COUNT(*) AS n FROM t").first()?.decode(column: "n", as: Int.self)
            }
            #expect(count == (0..<1_200).reduce(0) { $0 + $1 % 7 + 1 })
        }
    }

    @Test func concurrentTransactionsAreSerializedWhole() async throws {
        try await Self.withDatabase { database in
            try await database.transaction { sql in try await sql.raw("INSERT INTO t (k, i) VALUES ('c', 0)").run() }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<64 {
                    group.addTask {
                        try await database.transaction { sql in
                            let value =
                                try await sql.raw("SELECT i FROM t WHERE k = 'c'").first()?.decode(
                                    column: "i", as: Int.self) ?? 0
                            await Task.yield()
                            try await sql.raw("UPDATE t SET i = \(bind: value + 1) WHERE k = 'c'").run()
                        }
                    }
                }
                try await group.waitForAll()
            }
            let value = try await database.read { sql in
                try await sql.raw("SELECT i FROM t WHERE k = 'c'").first()?.decode(column: "i", as: Int.self)
            }
            #expect(value == 64)
        }
    }

    @Test func aClosedDatabaseAnswersWithAnError() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("sqlite-closed-\(UUID()).sqlite")
        defer { try? FileManager.default.removeItem(at: path) }
        let database = try await Database.open(url: "sqlite:\(path.path)")
        try await database.close()
        await #expect(throws: (any Error).self) {
            try await database.read { sql in try await sql.raw("SELECT 1").run() }
        }
    }

    @Test func anUnopenablePathIsAnError() async throws {
        await #expect(throws: SQLiteHandle.Failure.self) {
            _ = try await Database.open(url: "sqlite:/nonexistent-directory-\(UUID())/db.sqlite")
        }
    }
}

/// The write-ahead log is checkpointed by a connection of its own, not by the writer's commits.
@Suite struct WALCheckpointWorkerTests {
    @Test func theLogIsCheckpointedOffTheWriterAndNothingIsLost() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("checkpoint-\(UUID()).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        func size(_ file: String) -> Int64 {
            (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? NSNumber)?.int64Value ?? 0
        }
        let database = try await Database.open(url: "sqlite:\(path)")
        try await database.transaction { sql in try await sql.raw("CREATE TABLE blobs (id INTEGER, b TEXT)").run() }
        let start = size(path)
        // 12 MB in 24 transactions: past 1,000 pages (4 MB) of log several times, never past the
        // writer's own limit of 8,000 pages. Only a checkpoint moves pages into the database file.
        let chunk = String(repeating: "x", count: 500_000)
        for index in 0..<24 {
            try await database.transaction { sql in
                try await sql.raw("INSERT INTO blobs (id, b) VALUES (\(bind: index), \(bind: chunk))").run()
            }
        }
        var grown = false
        for _ in 0..<600 where !grown {
            grown = size(path) > start + 4_000_000
            if !grown { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(grown, "the database file is \(size(path)) bytes, the log \(size(path + "-wal"))")
        #expect((database.checkpointsElsewhere ?? 0) > 0)
        try await database.close()
        let reopened = try await Database.open(url: "sqlite:\(path)")
        let count = try await reopened.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n, SUM(LENGTH(b)) AS bytes FROM blobs").first()
        }
        #expect(try count?.decode(column: "n", as: Int.self) == 24)
        #expect(try count?.decode(column: "bytes", as: Int.self) == 24 * 500_000)
        try await reopened.close()
    }
}
