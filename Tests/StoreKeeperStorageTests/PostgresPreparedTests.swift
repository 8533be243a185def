import Foundation
import PostgresNIO
import SQLKit
import Testing

@testable import StoreKeeperStorage

/// Repeated statements run prepared on PostgreSQL: the values written into `EXECUTE` are read
/// back exactly whatever they contain, a statement means what it meant unnamed, and a prepared
/// statement that disappears costs one failed call, never a wrong answer or a wedged pool.
@Suite struct PostgresPreparedTests {
    static let hostile = [
        "", "plain", "it's", "a''b", "back\\slash", "\\'; DROP TABLE t; --", "$s$", "$s$$s1$x$s2$", "$", "$$",
        "dollar $s$ inside", "$s", "s$", "x$s", "$s1", "$s$$s1", "$s$x$s1$y$s", "é😀\u{7F}", "line\nbreak\ttab\r",
        "E'\\x41'", String(repeating: "$s$", count: 50),
    ]

    @Test func literalsAreExactAndTypedAsPostgresKitSendsThem() {
        for text in Self.hostile {
            let quoted = PreparedStatements.dollarQuoted(text)
            #expect(quoted.hasPrefix("$s"))
            // The tag that opens is first found again where it closes, as PostgreSQL reads it.
            let open = Array(quoted.utf8.prefix(through: quoted.utf8.dropFirst().firstIndex(of: UInt8(ascii: "$"))!))
            let rest = Array(quoted.utf8.dropFirst(open.count))
            #expect(PreparedStatements.firstOccurrence(of: open, in: rest) == rest.count - open.count, "\(text)")
            #expect(String(decoding: rest.dropLast(open.count), as: UTF8.self) == text)
        }
        // Random texts of tag pieces: the tag chosen is never found before its end.
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let text = String(
                (0..<Int.random(in: 0...12, using: &generator)).map { _ in "$s1x".randomElement(using: &generator)! })
            let quoted = Array(PreparedStatements.dollarQuoted(text).utf8)
            let open = Array(quoted.prefix(through: quoted.dropFirst().firstIndex(of: UInt8(ascii: "$"))!))
            let rest = Array(quoted.dropFirst(open.count))
            #expect(PreparedStatements.firstOccurrence(of: open, in: rest) == rest.count - open.count, "\(text)")
            #expect(rest.dropLast(open.count).elementsEqual(text.utf8))
        }
        #expect(PreparedStatements.literal(Int64(-42))! == ("bigint", "-42"))
        #expect(PreparedStatements.literal(7)! == ("bigint", "7"))
        #expect(PreparedStatements.literal(Int32(7))! == ("integer", "7"))
        #expect(PreparedStatements.literal(true)! == ("boolean", "TRUE"))
        #expect(PreparedStatements.literal(0.1)! == ("double precision", "'0.1'"))
        #expect(PreparedStatements.literal(String?.none)! == ("unknown", "NULL"))
        #expect(PreparedStatements.literal(String?.some("x"))! == ("text", "$s$x$s$"))
        // Anything else runs unnamed, with PostgresKit's binary binds.
        #expect(PreparedStatements.literal(Double.nan) == nil)
        #expect(PreparedStatements.literal("a\u{0}b") == nil)
        // Text longer than a prepared statement takes is never quoted.
        #expect(PreparedStatements.literal(String(repeating: "$s1$", count: 300)) == nil)
        // Every small tag inside the text, and one that only closes across its end: the tag
        // chosen is the first free one.
        let crowded = (0..<50).map { $0 == 0 ? "$s$" : "$s\($0)$" }.joined() + "$s5"
        let quoted = PreparedStatements.dollarQuoted(crowded)
        #expect(quoted.hasPrefix("$s50$") && quoted.hasSuffix("$s50$"))
        #expect(PreparedStatements.dollarQuoted("x$s") == "$s1$x$s$s1$")
        #expect(PreparedStatements.literal(UUID()) == nil)
        #expect(PreparedStatements.literal(Data([1])) == nil)
        #expect(PreparedStatements.literal(UInt64(1)) == nil)
        #expect(PreparedStatements.preparable("  (SELECT 1)"))
        #expect(PreparedStatements.preparable("insert into t values ($1)"))
        #expect(!PreparedStatements.preparable("BEGIN"))
        #expect(!PreparedStatements.preparable("CREATE TABLE x (a int)"))
    }

    @Test func shapesArePreparedTheSecondTimeUpToTheLimit() {
        let registry = PreparedStatements(limit: 2)
        let select = "SELECT * FROM t WHERE k = $1"
        #expect(registry.statement(sql: select, binds: ["a"]) == nil)
        let second = registry.statement(sql: select, binds: ["b"])
        let prefix = registry.prefix
        #expect(second?.name == "\(prefix)0")
        #expect(second?.types == ["text"])
        #expect(second?.execute == "EXECUTE \(prefix)0 ($s$b$s$)")
        // The same SQL with a bind of another type is another statement.
        #expect(registry.statement(sql: select, binds: [1]) == nil)
        #expect(registry.statement(sql: select, binds: [2])?.execute == "EXECUTE \(prefix)1 (2)")
        #expect(registry.statement(sql: select, binds: ["c"])?.name == "\(prefix)0")
        // Another process (registry) never uses these names: behind a pooler, a name can only
        // ever run the statement this process prepared under it.
        let prefixes = Set((0..<50).map { _ in PreparedStatements().prefix })
        #expect(prefixes.count == 50 && !prefixes.contains(prefix))
        #expect(prefix.hasPrefix("sk_") && prefix.hasSuffix("_") && prefix.utf8.count <= 20)
        // Past the limit, a new shape stays unnamed.
        let other = "SELECT * FROM t WHERE n = $1"
        for _ in 0..<3 { #expect(registry.statement(sql: other, binds: [1, 2]) == nil) }
        // Not a query or DML, no binds, too many binds or too many bytes: unnamed.
        let open = PreparedStatements(limit: 10)
        for _ in 0..<2 {
            #expect(open.statement(sql: "LOCK TABLE t", binds: [1]) == nil)
            #expect(open.statement(sql: "SELECT 1", binds: []) == nil)
            #expect(open.statement(sql: select, binds: Array(repeating: 1, count: 33)) == nil)
            #expect(open.statement(sql: select, binds: [String(repeating: "x", count: 1100)]) == nil)
            #expect(PreparedStatements(enabled: false).statement(sql: select, binds: ["a"]) == nil)
        }
    }

    static var postgres: Bool { PurchaseStoreTests.kinds.contains(.postgres) }

    @Test(.enabled(if: postgres)) func hostileValuesRoundTripPreparedAndMeanWhatTheyMeantUnnamed() async throws {
        try await TestDatabase.with(.postgres) { database in
            try await database.transaction { sql in
                try await sql.raw(
                    "CREATE TABLE t (k TEXT PRIMARY KEY, n BIGINT, b BOOLEAN, d DOUBLE PRECISION, o TEXT)"
                )
                .run()
            }
            // Each shape runs more than once, so it runs prepared from the second time.
            for (index, text) in Self.hostile.enumerated() {
                try await database.transaction { sql in
                    try await sql.raw(
                        """
                        INSERT INTO t (k, n, b, d, o) VALUES (\(bind: text), \(bind: index), \(bind: index % 2 == 0),
                        \(bind: Double(index) / 3), \(bind: index % 3 == 0 ? nil : text))
                        """
                    ).run()
                }
            }
            try await database.read { sql in
                for (index, text) in Self.hostile.enumerated() {
                    let row = try #require(try await sql.raw("SELECT * FROM t WHERE k = \(bind: text)").first())
                    #expect(try row.decode(column: "n", as: Int.self) == index)
                    #expect(try row.decode(column: "b", as: Bool.self) == (index % 2 == 0))
                    #expect(try row.decode(column: "d", as: Double.self) == Double(index) / 3)
                    #expect(try row.decode(column: "o", as: String?.self) == (index % 3 == 0 ? nil : text))
                }
                // VALUES columns take their binds' types, as unnamed: bigint compares to bigint.
                for _ in 0..<3 {
                    let rows = try await sql.raw(
                        """
                        SELECT t.k FROM t, (VALUES (\(bind: "plain"), \(bind: 1))) AS v WHERE t.k = v.column1
                        AND t.n = v.column2
                        """
                    ).all()
                    #expect(rows.count == 1)
                }
                let prepared = try await sql.raw(
                    "SELECT COUNT(*) AS n FROM pg_prepared_statements WHERE name LIKE 'sk_%'"
                )
                .first()?.decode(column: "n", as: Int.self)
                #expect((prepared ?? 0) >= 1)
            }
            // Every row went in, none twice, whatever the quoting.
            let count = try await database.read { sql in
                try await sql.raw("SELECT COUNT(*) AS n FROM t").first()?.decode(column: "n", as: Int.self)
            }
            #expect(count == Self.hostile.count)
            // Text with a NUL is refused by PostgreSQL, the second time as the first: an error,
            // never a statement cut short.
            for _ in 0..<3 {
                await #expect(throws: (any Error).self) {
                    try await database.transaction { sql in
                        try await sql.raw("INSERT INTO t (k, n) VALUES (\(bind: "nul\u{0}x"), \(bind: 1))").run()
                    }
                }
            }
        }
    }

    /// A statement prepared on a connection and then missing there is what a pooler in
    /// transaction mode does: preparing turns off for the process and the call runs again
    /// unnamed — no call fails, and nothing runs prepared after.
    @Test(.enabled(if: postgres)) func aStatementThatDisappearedTurnsPreparingOffAndNoCallFails() async throws {
        try await TestDatabase.with(.postgres) { database in
            let query: @Sendable (any SQLDatabase) async throws -> Int? = { sql in
                try await sql.raw("SELECT version FROM schema_migrations WHERE version = \(bind: 1)").first()?.decode(
                    column: "version", as: Int.self)
            }
            // Prepared on every pooled connection, then dropped behind our back (as a pooler
            // that hands out another session would).
            for _ in 0..<20 {
                let value = try await database.read(query)
                #expect(value == 1)
            }
            #expect(database.preparesStatements == true)
            for _ in 0..<20 {
                let value = try await database.read { sql in
                    try await sql.raw("DEALLOCATE ALL").run()
                    return try await query(sql)
                }
                #expect(value == 1)
                let next = try await database.read(query)
                #expect(next == 1)
                // In a transaction too: rolled back, then run again unnamed.
                let written = try await database.transaction { sql in
                    try await sql.raw("DEALLOCATE ALL").run()
                    return try await query(sql)
                }
                #expect(written == 1)
            }
            #expect(database.preparesStatements == false)
        }
    }

    @Test(.enabled(if: postgres)) func prepareOffRunsEverythingUnnamed() async throws {
        try await TestDatabase.with(.postgres) { _, url in
            var components = URLComponents(string: url)!
            components.queryItems = (components.queryItems ?? []) + [URLQueryItem(name: "prepare", value: "off")]
            let database = try await Database.open(url: components.string!)
            defer { Task { try? await database.close() } }
            let prepared = try await database.read { sql in
                for _ in 0..<5 {
                    _ = try await sql.raw("SELECT version FROM schema_migrations WHERE version = \(bind: 1)").all()
                }
                return try await sql.raw("SELECT COUNT(*) AS n FROM pg_prepared_statements").first()?.decode(
                    column: "n", as: Int.self)
            }
            #expect(prepared == 0)
            components.queryItems = [URLQueryItem(name: "prepare", value: "sometimes")]
            await #expect(throws: (any Error).self) { _ = try await Database.open(url: components.string!) }
        }
    }
}
