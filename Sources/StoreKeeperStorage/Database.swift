import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresKit
import PostgresNIO
import SQLKit
import Synchronization

/// The database behind StoreKeeper: SQLite (default, one file, WAL) or PostgreSQL (to scale
/// out). Both speak the same SQL through SQLKit; every write happens in `transaction`.
public final class Database: Sendable {
    public enum Kind: String, Sendable { case sqlite, postgres }

    public struct InvalidURL: Error, CustomStringConvertible {
        public var description: String
    }

    public let kind: Kind
    private let backend: any Backend
    /// A streaming replica for reads that tolerate staleness (`readStale`), when attached.
    let replica = Mutex<ReadReplica?>(nil)

    /// `sqlite:PATH`, `sqlite::memory:`, or `postgres://user:pass@host:port/db`.
    public static func open(url: String, logger: Logger = Logger(label: "storekeeper.database")) async throws
        -> Database
    {
        if url.hasPrefix("sqlite:") {
            let path = String(url.dropFirst("sqlite:".count))
            guard !path.isEmpty else {
                throw InvalidURL(description: "sqlite URL needs a path: sqlite:storekeeper.sqlite")
            }
            return Database(kind: .sqlite, backend: try await SQLiteBackend(path: path, logger: logger))
        }
        if url.hasPrefix("postgres://") || url.hasPrefix("postgresql://") {
            return Database(kind: .postgres, backend: try PostgresBackend(url: url, logger: logger))
        }
        throw InvalidURL(description: "database.url must start with sqlite: or postgres:// (got '\(url.prefix(40))')")
    }

    /// Checks a `database.url` without connecting: its form, and for PostgreSQL its `sslmode`
    /// and `sslrootcert`.
    public static func validate(url: String) throws {
        if url.hasPrefix("sqlite:") {
            guard url.count > "sqlite:".count else {
                throw InvalidURL(description: "sqlite URL needs a path: sqlite:storekeeper.sqlite")
            }
            return
        }
        guard url.hasPrefix("postgres://") || url.hasPrefix("postgresql://"),
            let components = URLComponents(string: url),
            let host = components.host, components.user != nil, components.path.count > 1
        else { throw InvalidURL(description: "database.url must be sqlite:PATH or postgres://user:pass@host:port/db") }
        _ = try PostgresBackend.tls(components, host: host)
    }

    private init(kind: Kind, backend: any Backend) {
        self.kind = kind
        self.backend = backend
    }

    /// Runs `body` in one database transaction: committed if it returns, rolled back if it throws.
    /// A database that cannot answer throws `StorageUnavailable` (never hangs: PostgreSQL work
    /// runs under a deadline — 30 s, or `deadline` for work known to be long, like a migration
    /// building an index on a large table — SQLite under its busy timeout).
    public func transaction<T: Sendable>(
        deadline: Duration? = nil, _ body: @escaping @Sendable (any SQLDatabase) async throws -> T
    ) async throws -> T {
        do {
            if let deadline, let postgres = backend as? PostgresBackend {
                return try await postgres.transaction(deadline: deadline, body)
            }
            return try await backend.transaction(body)
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    /// Runs read-only work: on SQLite in a read transaction on a connection of its own (one
    /// snapshot, never behind the writer), on PostgreSQL outside an explicit transaction.
    public func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        do {
            return try await backend.read(body)
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    /// One round trip, answered or failed within `deadline` (`/healthz`, startup).
    public func ping(deadline: Duration = .seconds(2)) async throws {
        // On SQLite through the writing connection: it answers only if writes can get through.
        try await raceDeadline(deadline, what: "a database round trip") {
            try await self.onWritingConnection { sql in _ = try await sql.raw("SELECT 1 AS one").first() }
        }
    }

    var sqliteBackend: SQLiteBackend? { backend as? SQLiteBackend }

    /// PostgreSQL: whether repeated statements are still prepared (`prepare=off`, or a pooler
    /// seen, says no); nil on SQLite.
    public var preparesStatements: Bool? { (backend as? PostgresBackend)?.prepared.enabled }

    /// SQLite: `body` on the connection that writes, outside a transaction (`ping`, and
    /// per-connection settings such as a test's `PRAGMA query_only`); PostgreSQL: a read.
    func onWritingConnection<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T)
        async throws -> T
    {
        guard let sqlite = sqliteBackend else { return try await read(body) }
        do {
            return try await sqlite.onWriter(body)
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    /// SQLite only: the write-ahead log's size in bytes, and a checkpoint that truncates it.
    public var walBytes: Int64? { (backend as? SQLiteBackend)?.walBytes }

    /// Checkpoints SQLite's WAL into the database and truncates it; nil on PostgreSQL.
    /// Returns whether the checkpoint completed (false: readers kept it from finishing).
    @discardableResult
    public func checkpoint() async throws -> Bool? {
        guard let sqlite = backend as? SQLiteBackend else { return nil }
        return try await transactionless(sqlite)
    }

    /// SQLite: the checkpoints the log's own connection has run (nil: none has one).
    var checkpointsElsewhere: Int? { (backend as? SQLiteBackend)?.checkpointsElsewhere }

    private func transactionless(_ sqlite: SQLiteBackend) async throws -> Bool {
        do {
            return try await sqlite.checkpoint()
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    public func close() async throws {
        if let replica = replica.withLock({ $0 }) { try? await replica.database.close() }
        try await backend.close()
    }
}
