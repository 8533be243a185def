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
    public func transaction<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await backend.transaction(body)
    }

    /// Runs read-only work outside an explicit transaction.
    public func read<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await backend.read(body)
    }

    public func close() async throws { try await backend.close() }
}

/// `begin` … `COMMIT`, or `ROLLBACK` when `body` throws.
func inTransaction<T: Sendable>(
    _ sql: any SQLDatabase, begin: String, _ body: @Sendable (any SQLDatabase) async throws -> T
) async throws -> T {
    try await sql.raw(SQLQueryString(begin)).run()
    do {
        let result = try await body(sql)
        try await sql.raw("COMMIT").run()
        return result
    } catch {
        try? await sql.raw("ROLLBACK").run()
        throw error
    }
}

protocol Backend: Sendable {
    func transaction<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func read<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func close() async throws
}

/// One connection, work serialized: SQLite has one writer anyway, and a single connection
/// makes `BEGIN IMMEDIATE … COMMIT` the unit of atomicity. (An actor is not enough: it is
/// reentrant at every `await`, and a second BEGIN would land inside the first transaction.)
/// Every transaction runs on the backend's own thread, statement after statement without a
/// thread hop, and its commit's fsync blocks that thread only.
final class SQLiteBackend: Backend {
    let handle: SQLiteHandle
    let database: SQLiteDirectDatabase
    let executor = ThreadExecutor(name: "storekeeper-sqlite")
    let lock = AsyncLock()

    init(path: String, logger: Logger) async throws {
        handle = try SQLiteHandle(path: path)
        database = SQLiteDirectDatabase(
            handle: handle, logger: logger, eventLoop: MultiThreadedEventLoopGroup.singleton.any())
        try await serialized { sql in
            // WAL for concurrent readers; FULL so a commit is on disk before it is acknowledged.
            try await sql.raw("PRAGMA journal_mode=WAL").run()
            try await sql.raw("PRAGMA synchronous=FULL").run()
            try await sql.raw("PRAGMA foreign_keys=ON").run()
            try await sql.raw("PRAGMA busy_timeout=10000").run()
        }
    }

    func transaction<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await serialized { sql in try await inTransaction(sql, begin: "BEGIN IMMEDIATE", body) }
    }

    func read<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await serialized(body)
    }

    private func serialized<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await withTaskExecutorPreference(executor) {
            try await lock.withLock { try await body(database) }
        }
    }

    func close() async throws {
        _ = try? await serialized { _ in handle.close() }
        executor.stop()
    }
}

/// A FIFO async mutex: one holder at a time, waiters resumed in arrival order.
final class AsyncLock: Sendable {
    private struct State {
        var locked = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    func withLock<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let acquired = state.withLock { state -> Bool in
                if state.locked {
                    state.waiters.append(continuation)
                    return false
                }
                state.locked = true
                return true
            }
            if acquired { continuation.resume() }
        }
    }

    private func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.locked = false
                return nil
            }
            return state.waiters.removeFirst()  // ownership passes straight to the next waiter
        }
        next?.resume()
    }
}

/// PostgresNIO's connection pool; each transaction on one pooled connection.
final class PostgresBackend: Backend {
    let client: PostgresClient
    let runner: Task<Void, Never>

    init(url: String, logger: Logger) throws {
        guard let components = URLComponents(string: url), let host = components.host, let user = components.user,
            let database = components.path.split(separator: "/").first.map(String.init)
        else { throw Database.InvalidURL(description: "database.url is not postgres://user:pass@host:port/db") }
        let configuration = PostgresClient.Configuration(
            host: host, port: components.port ?? 5432, username: user, password: components.password,
            database: database, tls: try Self.tls(components, host: host))
        client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let client = self.client
        runner = Task { await client.run() }
    }

    /// The `sslmode` of `database.url`, as libpq names them.
    public enum SSLMode: String, Sendable, CaseIterable {
        /// Never TLS.
        case disable
        /// TLS when the server offers it, without verifying its certificate.
        case prefer
        /// TLS or no connection; the certificate is not verified (libpq's meaning).
        case require
        /// TLS, the certificate chained to a trusted root (`sslrootcert`, else the system's).
        case verifyCA = "verify-ca"
        /// TLS, the certificate chained to a trusted root and naming the host.
        case verifyFull = "verify-full"
    }

    /// `sslmode` from the URL; without one, `require` for any host but loopback (where
    /// nothing crosses a network) — a password never leaves the machine in clear text by default.
    static func sslMode(_ components: URLComponents, host: String) throws -> SSLMode {
        guard let value = components.queryItems?.last(where: { $0.name.lowercased() == "sslmode" })?.value else {
            return isLoopback(host) ? .disable : .require
        }
        guard let mode = SSLMode(rawValue: value.lowercased()) else {
            throw Database.InvalidURL(
                description:
                    "database.url: sslmode must be one of \(SSLMode.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return mode
    }

    static func isLoopback(_ host: String) -> Bool {
        let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")).lowercased()
        return bare == "localhost" || bare == "::1" || bare.hasPrefix("127.")
    }

    static func tls(_ components: URLComponents, host: String) throws -> PostgresClient.Configuration.TLS {
        let mode = try sslMode(components, host: host)
        var tls = TLSConfiguration.makeClientConfiguration()
        switch mode {
        case .disable:
            return .disable
        case .prefer, .require:
            tls.certificateVerification = .none
        case .verifyCA, .verifyFull:
            tls.certificateVerification = mode == .verifyFull ? .fullVerification : .noHostnameVerification
            if let rootFile = components.queryItems?.last(where: { $0.name.lowercased() == "sslrootcert" })?.value {
                do {
                    tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(rootFile))
                } catch {
                    throw Database.InvalidURL(
                        description: "database.url: sslrootcert \(rootFile) is not a PEM certificate")
                }
            }
        }
        return mode == .prefer ? .prefer(tls) : .require(tls)
    }

    func transaction<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await client.withConnection { connection in try await inTransaction(connection.sql(), begin: "BEGIN", body)
        }
    }

    func read<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await client.withConnection { connection in try await body(connection.sql()) }
    }

    func close() async throws {
        runner.cancel()
    }
}
