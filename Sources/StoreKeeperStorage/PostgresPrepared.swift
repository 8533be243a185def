import Foundation
import Logging
import NIOCore
import PostgresKit
import PostgresNIO
import SQLKit
import Synchronization

/// Runs repeated statements on PostgreSQL as prepared statements: `PREPARE` once per
/// connection, then `EXECUTE` with the values written into it.
///
/// PostgresKit sends every statement unnamed. PostgreSQL then parses, analyses and plans it on
/// every call. `pg_stat_statements` on `bench --retention` showed 175 µs of planning against 54
/// µs of execution for the retention read. Planning was a fifth of the machine's CPU under load.
/// PostgresNIO prepares only statements whose SQL is a compile-time constant; ours are built by
/// SQLKit, so SQL-level `PREPARE` does it here.
///
/// - A statement is prepared the second time this process runs it, so one-off shapes (a batch
///   of an unusual size) cost no extra round trip.
/// - At most `limit` shapes are prepared per process, so the server's memory per connection is
///   bounded.
/// - Each parameter is declared with the type its bind is sent with, as PostgresKit's unnamed
///   statement does (`unknown` for a NULL: inferred from context, as unnamed), so a prepared
///   statement means what the unnamed one meant.
/// - A statement whose binds PostgresNIO cannot encode directly, or that is not a query or DML,
///   goes the unnamed way.
/// - A prepared statement that disappeared (a pooler that does not keep sessions, a schema
///   change that alters its result) fails that one call; the connection's next statement
///   starts with `DEALLOCATE ALL` and prepares again.
///
/// Names are `sk_<random>_<n>`, the random part drawn once per process: a name this process
/// prepared means this process's statement, and no other process ever uses it. Behind a pooler
/// that hands one client's statements to another server connection (PgBouncer in transaction or
/// statement mode; 1.21+ tracks only protocol-level statements, never SQL `PREPARE`), another
/// instance's `sk_5` can therefore never run in place of ours. There, a statement this process
/// prepared is sooner or later missing (26000) on the server connection a call reaches: the
/// first time, preparing is turned off for the rest of the process (logged once) and the call
/// runs again unnamed (`PostgresBackend` repeats the transaction or read). Finding one of our
/// own names already there (42P05) means another of our connections prepared the same statement
/// on that server connection: it is used as is.
///
/// `database.url`'s `prepare=off` turns this off from the start (a transaction-mode pooler).
struct PreparingSQLDatabase: SQLDatabase {
    let connection: PostgresConnection
    let plain: any SQLDatabase
    let registry: PreparedStatements

    init(connection: PostgresConnection, registry: PreparedStatements) {
        self.connection = connection
        self.plain = connection.sql()
        self.registry = registry
    }

    var logger: Logger { plain.logger }
    var eventLoop: any EventLoop { plain.eventLoop }
    var dialect: any SQLDialect { plain.dialect }
    var version: (any SQLDatabaseReportedVersion)? { plain.version }
    var queryLogLevel: Logger.Level? { plain.queryLogLevel }

    func execute(sql query: any SQLExpression, _ onRow: @escaping @Sendable (any SQLRow) -> Void)
        -> EventLoopFuture<Void>
    {
        eventLoop.makeFutureWithTask { try await self.execute(sql: query, onRow) }
    }

    func execute(sql query: any SQLExpression, _ onRow: @escaping @Sendable (any SQLRow) -> Void) async throws {
        let (sql, binds) = serialize(query)
        if let level = queryLogLevel { logger.log(level: level, "Executing query", metadata: ["sql": "\(sql)"]) }
        guard let prepared = registry.statement(sql: sql, binds: binds) else {
            // Unnamed, with the SQL serialized once (PostgresKit would serialize it again).
            guard let bindings = Self.bindings(binds) else { return try await plain.execute(sql: query, onRow) }
            let rows = try await connection.query(PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger)
            for try await row in rows { onRow(row.sql()) }
            return
        }
        let session = registry.session(of: connection)
        do {
            if session.stale {
                // On a direct connection every statement is ours; behind a pooler another client
                // losing one turns preparing off there too.
                _ = try await connection.query("DEALLOCATE ALL", logger: logger).collect()
                session.clear()
            }
            if !session.has(prepared.name) {
                do {
                    _ = try await connection.query(
                        PostgresQuery(
                            unsafeSQL:
                                "PREPARE \(prepared.name) (\(prepared.types.joined(separator: ", "))) AS \(sql)"),
                        logger: logger
                    ).collect()
                } catch let error as PSQLError where error.serverInfo?[.sqlState] == "42P05" {
                    // Ours (the name is this process's): another of our connections prepared it on
                    // the server connection a pooler gave us. Outside a transaction it is the same
                    // statement; inside one, the transaction is aborted, and runs again.
                    registry.poolerSeen(logger)
                    throw PreparedStatements.Lost(underlying: error)
                }
                session.add(prepared.name)
            }
            let rows = try await connection.query(PostgresQuery(unsafeSQL: prepared.execute), logger: logger)
            for try await row in rows { onRow(row.sql()) }
        } catch let error as PSQLError {
            // 26000: a statement this connection prepared is not on the server connection the
            // call reached — a pooler between us. Preparing ends for this process; the call runs
            // again unnamed. 0A000: its result changed with the schema: prepared again.
            switch error.serverInfo?[.sqlState] {
            case "26000":
                registry.poolerSeen(logger)
                throw PreparedStatements.Lost(underlying: error)
            case "0A000":
                session.markStale()
            default:
                break
            }
            throw error
        }
    }

    /// The binds as PostgresKit encodes them (PostgresNIO's own encoding, NULL untyped); nil
    /// when one is of a type only PostgresKit's `Encodable` path handles.
    static func bindings(_ binds: [any Encodable & Sendable]) -> PostgresBindings? {
        var bindings = PostgresBindings(capacity: binds.count)
        for bind in binds {
            if PreparedStatements.isNil(bind) {
                bindings.appendNull()
            } else if let value = bind as? any PostgresThrowingDynamicTypeEncodable {
                guard (try? bindings.append(value, context: .default)) != nil else { return nil }
            } else {
                return nil
            }
        }
        return bindings
    }

    func withSession<R>(_ closure: @escaping @Sendable (any SQLDatabase) async throws -> R) async throws -> R {
        try await closure(self)
    }
}

/// The statements this process prepares, and which of them each connection has.
final class PreparedStatements: Sendable {
    struct Statement {
        var name: String
        var types: [String]
        var execute: String
    }

    /// Prepared only up to this many binds and this many bytes of values: reads and small
    /// writes, where planning is most of PostgreSQL's work. A batch insert (hundreds of binds,
    /// kilobytes of text) plans in little time beside its data, and goes unnamed with binary
    /// binds: prepared, its values written out as text cost more than the plan saved
    /// (`bench --notifications` on PostgreSQL: 2,481–2,745/s against 3,172/s).
    static let maximumBinds = 32
    static let maximumLiterals = 1024

    /// Statement shapes prepared at most, per process.
    let limit: Int
    /// Configured (`prepare=off` says no), and not yet turned off by a pooler.
    var enabled: Bool { configured && !pooled.withLock { $0 } }
    let configured: Bool
    private let pooled = Mutex(false)
    /// This process's names: `sk_<random>_`, drawn once.
    let prefix: String

    /// A prepared statement was missing where this process had prepared it, or found where it had
    /// not: a pooler hands server connections between clients. Preparing is off from now on; the
    /// work that failed may run again (nothing of it was committed).
    struct Lost: Error, CustomStringConvertible {
        var underlying: PSQLError
        var description: String {
            "a prepared statement was lost to a connection pooler (now off): \(String(reflecting: underlying))"
        }
    }

    static func isLost(_ error: any Error) -> Bool { error is Lost }

    /// Turns preparing off for good, logged once.
    func poolerSeen(_ logger: Logger) {
        let first = pooled.withLock { pooled in
            defer { pooled = true }
            return !pooled
        }
        if first {
            logger.warning(
                "PostgreSQL: prepared statements do not stay on their connection (a pooler such as PgBouncer in transaction mode?): preparing is off from now on; set prepare=off in database.url to skip this"
            )
        }
    }

    /// A statement shape seen, and its number once it is prepared (the second time it runs).
    private struct Registry {
        var shapes: [String: Int?] = [:]
        var prepared = 0
    }
    private let registry = Mutex(Registry())

    /// What one connection has prepared; dropped with the connection.
    final class Session: Sendable {
        weak let connection: PostgresConnection?
        private let state = Mutex<(names: Set<String>, stale: Bool)>(([], false))
        init(_ connection: PostgresConnection) { self.connection = connection }
        func has(_ name: String) -> Bool { state.withLock { $0.names.contains(name) } }
        func add(_ name: String) { _ = state.withLock { $0.names.insert(name) } }
        /// What the server has no longer matches what is recorded here: `DEALLOCATE ALL` first.
        var stale: Bool { state.withLock { $0.stale } }
        func markStale() { state.withLock { $0.stale = true } }
        func clear() { state.withLock { $0 = ([], false) } }
    }
    private let sessions = Mutex<[ObjectIdentifier: Session]>([:])

    init(enabled: Bool = true, limit: Int = 512) {
        self.configured = enabled
        self.limit = limit
        var generator = SystemRandomNumberGenerator()
        prefix = "sk_\(String(generator.next() as UInt64, radix: 36))_"
    }

    func session(of connection: PostgresConnection) -> Session {
        sessions.withLock { sessions in
            let key = ObjectIdentifier(connection)
            if let session = sessions[key], session.connection === connection { return session }
            // A new connection (or one at a dead one's address): forget the connections gone.
            sessions = sessions.filter { $0.value.connection != nil && $0.value.connection?.isClosed == false }
            let session = Session(connection)
            sessions[key] = session
            return session
        }
    }

    /// The prepared statement to run `sql` as, or nil to run it unnamed.
    func statement(sql: String, binds: [any Encodable & Sendable]) -> Statement? {
        guard enabled, !binds.isEmpty, binds.count <= Self.maximumBinds, Self.preparable(sql) else { return nil }
        var types: [String] = []
        var arguments: [String] = []
        types.reserveCapacity(binds.count)
        arguments.reserveCapacity(binds.count)
        var length = 0
        for bind in binds {
            guard let (type, literal) = Self.literal(bind) else { return nil }
            length += literal.utf8.count
            guard length <= Self.maximumLiterals else { return nil }
            types.append(type)
            arguments.append(literal)
        }
        let key = types.joined(separator: ",") + "\u{0}" + sql
        let index = registry.withLock { registry -> Int? in
            switch registry.shapes[key] {
            case .some(.some(let index)):
                return index
            case .some(.none):
                guard registry.prepared < limit else { return nil }
                registry.shapes[key] = registry.prepared
                registry.prepared += 1
                return registry.prepared - 1
            case .none:
                // Shapes seen once are remembered up to a bound: a flood of one-off shapes (IN
                // lists of every length) must not grow this map without end.
                if registry.shapes.count < limit * 8 { registry.shapes[key] = .some(nil) }
                return nil
            }
        }
        guard let index else { return nil }
        return Statement(
            name: "\(prefix)\(index)", types: types,
            execute: "EXECUTE \(prefix)\(index) (\(arguments.joined(separator: ", ")))")
    }

    /// A bind as the declared type of its parameter (the type PostgresKit would send it with)
    /// and an SQL literal of its value; nil for a type not handled here (run unnamed then).
    ///
    /// `EXECUTE` is a utility statement: it takes no protocol-level parameters, so the values
    /// are written into it. Text goes dollar-quoted with a tag the text does not contain: no
    /// character inside is special, whatever `standard_conforming_strings` says. Numbers are
    /// written by Swift, which writes only digits, a sign, a point and an exponent.
    static func literal(_ bind: Any) -> (type: String, literal: String)? {
        if isNil(bind) { return ("unknown", "NULL") }
        switch bind {
        // A NUL would end the statement's text in the protocol: such text goes unnamed (and
        // PostgreSQL refuses it there, as it always did).
        // Longer text than a prepared statement takes is not quoted at all.
        case let text as String:
            return text.utf8.count > maximumLiterals || text.utf8.contains(0) ? nil : ("text", dollarQuoted(text))
        case let text as Substring: return literal(String(text))
        case let number as Int: return ("bigint", String(number))
        case let number as Int64: return ("bigint", String(number))
        case let number as Int32: return ("integer", String(number))
        case let number as Int16: return ("smallint", String(number))
        case let flag as Bool: return ("boolean", flag ? "TRUE" : "FALSE")
        case let number as Double where number.isFinite: return ("double precision", "'\(number)'")
        case let optional as any AbsentOptional: return optional.wrapped.flatMap(literal)
        default: return nil
        }
    }

    /// `text` between `$s$` tags (or `$sN$` for the smallest N whose tag the text does not
    /// contain, and that is not found across the text's end either, as `$s` + `$s$` would be).
    /// Linear in the text: one pass collects the tags it contains, and at most a couple of
    /// candidates fail at its end.
    static func dollarQuoted(_ text: String) -> String {
        guard text.utf8.contains(UInt8(ascii: "$")) else { return "$s$" + text + "$s$" }
        let bytes = Array(text.utf8)
        var contained: Set<Int> = []
        var index = 0
        while index + 2 < bytes.count {
            defer { index += 1 }
            guard bytes[index] == UInt8(ascii: "$"), bytes[index + 1] == UInt8(ascii: "s") else { continue }
            var end = index + 2
            var number = 0
            while end < bytes.count, end - index < 20, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[end]) {
                number = number * 10 + Int(bytes[end] - UInt8(ascii: "0"))
                end += 1
            }
            if end < bytes.count, bytes[end] == UInt8(ascii: "$") { contained.insert(number) }
        }
        var counter = 0
        while true {
            defer { counter += 1 }
            if contained.contains(counter) { continue }
            let tag = Array((counter == 0 ? "$s$" : "$s\(counter)$").utf8)
            // Only the text's last few bytes can join the tag into an earlier occurrence.
            let tail = Array(bytes.suffix(tag.count)) + tag
            if firstOccurrence(of: tag, in: tail) == tail.count - tag.count {
                let quoted = String(decoding: tag, as: UTF8.self)
                return quoted + text + quoted
            }
        }
    }

    static func firstOccurrence(of needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard needle.count <= haystack.count else { return nil }
        for start in 0...(haystack.count - needle.count)
        where haystack[start..<(start + needle.count)].elementsEqual(needle) {
            return start
        }
        return nil
    }

    /// What `PREPARE` accepts: queries and DML.
    static func preparable(_ sql: String) -> Bool {
        let head = sql.utf8.drop { $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 || $0 == 0x28 }.prefix(7)
        let word = String(decoding: head, as: UTF8.self).uppercased()
        return ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "VALUES"].contains { word.hasPrefix($0) }
    }

    /// A bind that is an absent optional (SQLKit's binds are existentials: a generic `nil`
    /// check does not see through them).
    static func isNil(_ value: Any) -> Bool {
        (value as? any AbsentOptional)?.isAbsent ?? false
    }

}

protocol AbsentOptional {
    var isAbsent: Bool { get }
    /// The value inside, when there is one, as a bind.
    var wrapped: Any? { get }
}

extension Optional: AbsentOptional {
    var isAbsent: Bool { self == nil }
    var wrapped: Any? { self.map { $0 as Any } }
}
