import Foundation
import SQLKit
import Testing

@testable import StoreKeeperStorage

/// `RowsInsert`, the delivery path's multi-row inserts: the same rows stored on SQLite (run
/// straight on the connection, cached by shape) and PostgreSQL (through SQLKit), NULLs of every
/// type, conflicts as the suffix says, `RETURNING` rows read back, and statements of one shape
/// with different values never mixed up.
@Suite struct RowsInsertTests {
    static func table(_ sql: any SQLDatabase) async throws {
        try await sql.raw(
            "CREATE TABLE rows_insert_test (k TEXT PRIMARY KEY, i BIGINT, t TEXT, r DOUBLE PRECISION, n BIGINT NOT NULL DEFAULT 0)"
        ).run()
    }

    static func insert(_ rows: [(String, Int64?, String?, Double?)], suffix: String = "") -> RowsInsert {
        var insert = RowsInsert(into: "rows_insert_test", columns: ["k", "i", "t", "r"], suffix: suffix)
        for (k, i, t, r) in rows { insert.append([.text(k), .integer(i), .text(t), .real(r)]) }
        return insert
    }

    static func stored(_ database: Database) async throws -> [String] {
        try await database.read { sql in
            try await sql.raw("SELECT k, i, t, r, n FROM rows_insert_test ORDER BY k").all().map { row in
                let i = try row.decode(column: "i", as: Int64?.self).map(String.init) ?? "nil"
                let t = try row.decode(column: "t", as: String?.self) ?? "nil"
                let r = try row.decode(column: "r", as: Double?.self).map { "\($0)" } ?? "nil"
                return
                    "\(try row.decode(column: "k", as: String.self))|\(i)|\(t)|\(r)|\(try row.decode(column: "n", as: Int64.self))"
            }
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func rowsAreStoredAsGivenOnBothDatabases(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            try await database.transaction { sql in try await Self.table(sql) }
            try await database.transaction { sql in
                // Every column NULL in one row, none in another; text that is one Character but
                // several scalars, quotes and a question mark (never a placeholder in a value).
                try await sql.execute(
                    sql: Self.insert([
                        ("a", nil, nil, nil), ("b", Int64.min, "e\u{301} 'x' \"y\" ?", 2.5), ("c", 7, "", -0.5),
                    ])
                ) { _ in }
            }
            #expect(
                try await Self.stored(database) == [
                    "a|nil|nil|nil|0", "b|\(Int64.min)|e\u{301} 'x' \"y\" ?|2.5|0", "c|7||-0.5|0",
                ])
            // The same shape again with other values: the cached statement binds the new ones.
            try await database.transaction { sql in
                try await sql.execute(
                    sql: Self.insert([("d", 1, "one", nil), ("e", 2, "two", nil), ("f", 3, "three", nil)])
                ) { _ in }
            }
            #expect(try await Self.stored(database).suffix(3) == ["d|1|one|nil|0", "e|2|two|nil|0", "f|3|three|nil|0"])
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func conflictsFollowTheSuffixAndReturningRowsAreRead(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            try await database.transaction { sql in try await Self.table(sql) }
            try await database.transaction { sql in
                try await sql.execute(sql: Self.insert([("a", 1, "first", nil)])) { _ in }
            }
            // Ignored: the first row stays as it was.
            try await database.transaction { sql in
                try await sql.execute(
                    sql: Self.insert(
                        [("a", 2, "second", nil), ("b", 3, nil, nil)], suffix: "ON CONFLICT (k) DO NOTHING")
                ) { _ in }
            }
            #expect(try await Self.stored(database) == ["a|1|first|nil|0", "b|3|nil|nil|0"])
            // An upsert of the same shape with another suffix is another statement.
            let returned = try await database.transaction { sql in
                try await Self.insert(
                    [("a", 5, "upserted", nil), ("c", 6, nil, 1)],
                    suffix:
                        "ON CONFLICT (k) DO UPDATE SET i = excluded.i, n = rows_insert_test.n + 1 RETURNING k, n"
                ).fetch(on: sql).all().map {
                    "\(try $0.decode(column: "k", as: String.self))=\(try $0.decode(column: "n", as: Int64.self))"
                }
            }
            #expect(returned.sorted() == ["a=1", "c=0"])
            #expect(try await Self.stored(database) == ["a|5|first|nil|1", "b|3|nil|nil|0", "c|6|nil|1.0|0"])
            // A write that breaks a constraint fails whole and leaves nothing of its rows.
            await #expect(throws: (any Error).self) {
                try await database.transaction { sql in
                    try await sql.execute(sql: Self.insert([("z", 1, nil, nil), ("b", 2, nil, nil)])) { _ in }
                }
            }
            #expect(try await Self.stored(database).count == 3)
        }
    }

    @Test func theStatementsShapeNamesItsText() {
        let two = Self.insert([("a", 1, nil, nil), ("b", 2, nil, nil)])
        let twoOther = Self.insert([("x", nil, "t", 1), ("y", 9, nil, nil)])
        let three = Self.insert([("a", 1, nil, nil), ("b", 2, nil, nil), ("c", 3, nil, nil)])
        let ignoring = Self.insert([("a", 1, nil, nil), ("b", 2, nil, nil)], suffix: "ON CONFLICT (k) DO NOTHING")
        #expect(two.shapeKey == twoOther.shapeKey && two.sqliteText == twoOther.sqliteText)
        #expect(Set([two.shapeKey, three.shapeKey, ignoring.shapeKey]).count == 3)
        #expect(
            two.sqliteText == #"INSERT INTO "rows_insert_test" ("k", "i", "t", "r") VALUES (?, ?, ?, ?), (?, ?, ?, ?)"#)
        #expect(ignoring.sqliteText.hasSuffix("(?, ?, ?, ?) ON CONFLICT (k) DO NOTHING"))
        #expect(two.rowCount == 2 && two.values.count == 8)
    }

    /// The Set App Account Token job's payload is written by hand: it reads back as `ClaimJob`
    /// for any account id (quotes, backslashes, controls, several scalars in one Character).
    @Test func aClaimsHandWrittenPayloadDecodesAsItsJob() throws {
        let account = "u\"42\\ \n\u{1}e\u{301}🇫🇷"
        let at = Date(timeIntervalSince1970: 1_767_225_600)
        let insert = try #require(
            AppleAccountStore.claimJobs(
                [("2000000000000001", account, "Sandbox", at)]) as? RowsInsert)
        guard case .text(let payload?) = insert.values[3] else {
            Issue.record("no payload")
            return
        }
        let job = try JSONDecoder().decode(AppleAccountStore.ClaimJob.self, from: Data(payload.utf8))
        #expect(
            job
                == AppleAccountStore.ClaimJob(
                    originalTransactionId: "2000000000000001", accountId: account, environment: "Sandbox"))
    }
}
