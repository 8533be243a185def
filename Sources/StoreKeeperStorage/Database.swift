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
    /// A database that cannot answer throws `StorageUnavailable` (never hangs: PostgreSQL work
    /// runs under `deadline`, SQLite under its busy timeout).
    public func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws
        -> T
    {
        do {
            return try await backend.transaction(body)
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    /// Runs read-only work outside an explicit transaction.
    public func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        do {
            return try await backend.read(body)
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    /// One round trip, answered or failed within `deadline` (`/healthz`, startup).
    public func ping(deadline: Duration = .seconds(2)) async throws {
        try await raceDeadline(deadline, what: "a database round trip") {
            try await self.read { sql in _ = try await sql.raw("SELECT 1 AS one").first() }
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

    private func transactionless(_ sqlite: SQLiteBackend) async throws -> Bool {
        do {
            return try await sqlite.checkpoint()
        } catch {
            throw StorageUnavailable.classify(error) ?? error
        }
    }

    public func close() async throws { try await backend.close() }
}

/// The database cannot answer now — down, restarting, unreachable, disk full, read-only,
/// locked past the busy timeout, a connection lost or a deadline passed. Retryable: the
/// request is answered 503 `storage_unavailable`, the job retried, and the server recovers by
/// itself when the database does.
public struct StorageUnavailable: Error, CustomStringConvertible, Sendable {
    public var reason: String

    public init(_ reason: String) {
        self.reason = reason
    }

    public var description: String { "storage unavailable: \(reason)" }

    /// `error` as a storage outage, or nil when it is something else (a constraint, a bug).
    public static func classify(_ error: any Error) -> StorageUnavailable? {
        switch error {
        case let unavailable as StorageUnavailable:
            return unavailable
        case let failure as SQLiteHandle.Failure:
            // BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL: the file or the
            // machine, not the statement.
            let primary = failure.code & 0xFF
            return [5, 6, 7, 8, 10, 13, 14, 15].contains(primary)
                ? StorageUnavailable("SQLite: \(failure.message)") : nil
        case let error as PSQLError:
            if error.code == .server {
                let state = error.serverInfo?[.sqlState] ?? ""
                // 08 connection, 53 resources (disk full), 57 operator intervention (shutdown,
                // crash recovery, cannot connect now), 58 system, 25006 read-only (deadlocks are conflicts: retried one by one).
                let unavailable =
                    ["08", "53", "57", "58"].contains(String(state.prefix(2)))
                    || state == "25006"
                return unavailable ? StorageUnavailable("PostgreSQL \(state)") : nil
            }
            if [
                .clientClosedConnection, .serverClosedConnection, .connectionError, .uncleanShutdown, .poolClosed,
                .queryCancelled, .sslUnsupported, .failedToAddSSLHandler,
            ].contains(error.code) {
                return StorageUnavailable("PostgreSQL connection: \(error.code)")
            }
            return nil
        case is CancellationError:
            return StorageUnavailable("cancelled")
        default:
            // The connection pool's own errors (a lease that timed out or was cancelled).
            let type = String(describing: Swift.type(of: error))
            return type.contains("ConnectionPoolError") || type.contains("ChannelError")
                ? StorageUnavailable(type) : nil
        }
    }
}

/// True for the first caller of `claim()` only.
final class FirstClaim: Sendable {
    private let claimed = Mutex(false)

    func claim() -> Bool {
        claimed.withLock { claimed in
            defer { claimed = true }
            return !claimed
        }
    }
}

/// A check part-way to a deadline: at `after`, give up already when `stillWaiting()` (say,
/// no database connection could be had) instead of waiting for the whole deadline.
public struct EarlyDeadline: Sendable {
    public var after: Duration
    public var what: String
    public var stillWaiting: @Sendable () -> Bool

    public init(after: Duration, what: String, stillWaiting: @escaping @Sendable () -> Bool) {
        self.after = after
        self.what = what
        self.stillWaiting = stillWaiting
    }
}

/// A way to end a `raceDeadline` early from outside, as if its deadline had passed.
public final class DeadlineHandle: Sendable {
    private let expiry = Mutex<(@Sendable (String) -> Void)?>(nil)

    public init() {}

    func arm(_ expire: @escaping @Sendable (String) -> Void) { expiry.withLock { $0 = expire } }

    /// Fails the race now with `StorageUnavailable(reason)` (nothing when it has ended).
    public func expire(_ reason: String) { expiry.withLock { $0 }?(reason) }
}

/// `body`'s result, or `StorageUnavailable` at `deadline` (or at `early`, when its check says
/// so, or when `handle` is expired) without waiting for `body` any longer (it is cancelled,
/// and `onTimeout` runs in the background).
public func raceDeadline<T: Sendable>(
    _ deadline: Duration, what: String, early: EarlyDeadline? = nil, handle: DeadlineHandle? = nil,
    onTimeout: @escaping @Sendable () async -> Void = {},
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let once = FirstClaim()
    let work = Task { try await body() }
    do {
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let giveUp: @Sendable (String) -> Bool = { reason in
                    guard once.claim() else { return false }
                    work.cancel()
                    Task { await onTimeout() }
                    continuation.resume(throwing: StorageUnavailable(reason))
                    return true
                }
                handle?.arm { reason in _ = giveUp(reason) }
                let timer = Task {
                    var failure = "\(what) took longer than \(deadline)"
                    if let early, early.after < deadline {
                        try? await Task.sleep(for: early.after)
                        if early.stillWaiting() {
                            failure = "\(early.what) within \(early.after)"
                        } else {
                            try? await Task.sleep(for: deadline - early.after)
                        }
                    } else {
                        try? await Task.sleep(for: deadline)
                    }
                    guard !Task.isCancelled else { return }
                    _ = giveUp(failure)
                }
                Task {
                    let result = await work.result
                    timer.cancel()
                    guard once.claim() else { return }
                    continuation.resume(with: result)
                }
            }
        } onCancel: {
            work.cancel()
        }
    } catch {
        throw StorageUnavailable.classify(error) ?? error
    }
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
    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
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
        self.path = path
        handle = try SQLiteHandle(path: path)
        database = SQLiteDirectDatabase(
            handle: handle, logger: logger, eventLoop: MultiThreadedEventLoopGroup.singleton.any())
        try await serialized { sql in
            // WAL for concurrent readers; FULL so a commit is on disk before it is acknowledged.
            try await sql.raw("PRAGMA journal_mode=WAL").run()
            try await sql.raw("PRAGMA synchronous=FULL").run()
            try await sql.raw("PRAGMA foreign_keys=ON").run()
            try await sql.raw("PRAGMA busy_timeout=10000").run()
            // A WAL left large after a burst (or failed checkpoints) is cut back to this.
            try await sql.raw("PRAGMA journal_size_limit=67108864").run()
        }
    }

    let path: String

    var walBytes: Int64? {
        (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? NSNumber)?.int64Value ?? 0
    }

    func checkpoint() async throws -> Bool {
        try await serialized { sql in
            let row = try await sql.raw("PRAGMA wal_checkpoint(TRUNCATE)").first()
            return try row?.decode(column: "busy", as: Int.self) == 0
        }
    }

    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await serialized { sql in try await inTransaction(sql, begin: "BEGIN IMMEDIATE", body) }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
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
    /// The pool in use, and its run task. When a call passes its deadline the whole pool is
    /// replaced (at most every few seconds): connections wedged by a restart are never
    /// handed out again, and new ones are made as soon as the server accepts them.
    private struct Pool {
        var client: PostgresClient
        var runner: Task<Void, Never>
        var createdAt: ContinuousClock.Instant
    }
    private let pool: Mutex<Pool>
    private let configuration: PostgresClient.Configuration
    private let logger: Logger

    var client: PostgresClient { pool.withLock { $0.client } }

    private static func start(_ configuration: PostgresClient.Configuration, logger: Logger) -> Pool {
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        return Pool(client: client, runner: Task { await client.run() }, createdAt: .now)
    }

    /// Replaces the pool after a deadline passed (not more than once every 5 s), or at once
    /// (`force`) after a restart.
    func replacePool(after failed: PostgresClient, force: Bool = false) {
        let old = pool.withLock { pool -> Task<Void, Never>? in
            guard pool.client === failed, force || ContinuousClock.now - pool.createdAt >= .seconds(5) else {
                return nil
            }
            let old = pool.runner
            pool = Self.start(configuration, logger: logger)
            return old
        }
        if let old {
            if !force { logger.warning("PostgreSQL calls passed their deadline: replaced the connection pool") }
            old.cancel()
        }
    }

    init(url: String, logger: Logger) throws {
        guard let components = URLComponents(string: url), let host = components.host, let user = components.user,
            let database = components.path.split(separator: "/").first.map(String.init)
        else { throw Database.InvalidURL(description: "database.url is not postgres://user:pass@host:port/db") }
        let configuration = PostgresClient.Configuration(
            host: host, port: components.port ?? 5432, username: user, password: components.password,
            database: database, tls: try Self.tls(components, host: host))
        self.configuration = configuration
        self.logger = logger
        pool = Mutex(Self.start(configuration, logger: logger))
        let watch = Task { [weak self] in _ = await self?.watchForRestarts() }
        self.watch.withLock { $0 = watch }
    }

    private let watch = Mutex<Task<Void, Never>?>(nil)

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

    /// Every transaction and read ends within this: a statement on a dying connection (a
    /// restart) would otherwise never complete.
    let deadline: Duration = .seconds(30)

    /// A connection is had within this, or the database is taken to be unreachable (down,
    /// restarting, refusing connections): the caller gets 503 at once rather than at `deadline`.
    /// The pool hands out connections in microseconds when it has any; only connecting takes
    /// long, and PostgresNIO retries that in the background.
    let leaseDeadline: Duration = .seconds(5)

    /// The connection a piece of work holds, so the deadline can close it: a closed connection
    /// fails its pending statement at once and is never handed out again by the pool.
    final class Held: Sendable {
        let connection = Mutex<PostgresConnection?>(nil)
        func close() async {
            if let connection = self.connection.withLock({ $0 }) { try? await connection.close() }
        }
    }

    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await withDeadline { connection in
            let sql = connection.sql()
            try await sql.raw("BEGIN").run()
            do {
                let result = try await body(sql)
                try await sql.raw("COMMIT").run()
                return result
            } catch {
                await Self.abandon(connection, after: error)
                throw error
            }
        }
    }

    /// Ends a failed transaction so the connection goes back to the pool clean, or closes the
    /// connection so it never does. A connection the server dropped or is shutting down gets no
    /// ROLLBACK (PostgreSQL rolls back by itself; a statement sent on a dying connection may
    /// never be answered); a ROLLBACK that fails or takes longer than 2 s closes it too.
    static func abandon(_ connection: PostgresConnection, after error: any Error) async {
        if StorageUnavailable.classify(error) == nil {
            do {
                try await raceDeadline(.seconds(2), what: "ROLLBACK") {
                    try await connection.sql().raw("ROLLBACK").run()
                }
                return
            } catch {}
        }
        Task { try? await connection.close() }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await withDeadline { connection in try await body(connection.sql()) }
    }

    /// The work on a pooled connection, answered or failed by `deadline` — never waiting for a
    /// call that does not return: at the deadline the connection is closed (in the background:
    /// closing a dying connection may itself hang) and the caller gets `StorageUnavailable`.
    private func withDeadline<T: Sendable>(
        _ run: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let client = self.client
        let held = Held()
        let handle = DeadlineHandle()
        let id = inFlight.enter(handle, pool: client)
        defer { inFlight.leave(id) }
        return try await raceDeadline(
            deadline, what: "a PostgreSQL call",
            early: EarlyDeadline(
                after: leaseDeadline, what: "no PostgreSQL connection",
                stillWaiting: { held.connection.withLock { $0 == nil } }),
            handle: handle,
            onTimeout: { [weak self] in
                self?.replacePool(after: client)
                await held.close()
            }
        ) {
            try await client.withConnection { connection in
                held.connection.withLock { $0 = connection }
                return try await run(connection)
            }
        }
    }

    /// The calls in flight, each with when it began and the pool it used: a restart watch
    /// (`watchForRestarts`) fails those left on a replaced pool's connections.
    final class InFlight: Sendable {
        struct Call {
            var began: ContinuousClock.Instant
            var pool: ObjectIdentifier
            var handle: DeadlineHandle
        }
        private let calls = Mutex<(next: UInt64, running: [UInt64: Call])>((0, [:]))

        func enter(_ handle: DeadlineHandle, pool: PostgresClient) -> UInt64 {
            calls.withLock { calls in
                calls.next += 1
                calls.running[calls.next] = Call(began: .now, pool: ObjectIdentifier(pool), handle: handle)
                return calls.next
            }
        }

        func leave(_ id: UInt64) { _ = calls.withLock { $0.running.removeValue(forKey: id) } }

        var oldest: ContinuousClock.Instant? { calls.withLock { $0.running.values.map(\.began).min() } }

        /// Fails every call for which `stale` holds; how many.
        func expire(_ reason: String, where stale: (Call) -> Bool) -> Int {
            let handles = calls.withLock { $0.running.values.filter(stale).map(\.handle) }
            for handle in handles { handle.expire(reason) }
            return handles.count
        }
    }

    /// A restart leaves the calls that were on the old server's connections waiting: most fail
    /// with the dropped connection, but PostgresNIO was seen to leave a statement pending
    /// forever — on a connection it had in use, or on an idle one handed out just after the
    /// restart. Whenever a call has run for more than 2 s, this asks the server how long it has
    /// been up (its own clock: `now() - pg_postmaster_start_time()`, no skew). When it started
    /// after the pool was made, the pool is replaced, so no old connection is handed out again.
    /// A call on a replaced pool that began before the restart, or has run for 2 s, is failed
    /// (its connection closed). Deliveries resume within seconds of a restart, not at the 30 s
    /// deadline.
    func watchForRestarts() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(1))
            guard let oldest = inFlight.oldest, ContinuousClock.now - oldest > .seconds(2) else { continue }
            let client = self.client
            let asked = ContinuousClock.now
            let uptime: Double?? = try? await raceDeadline(.seconds(2), what: "PostgreSQL's uptime") {
                try await client.withConnection { connection in
                    try await connection.sql().raw(
                        "SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())::float8 AS uptime"
                    ).first()?.decode(column: "uptime", as: Double.self)
                }
            }
            var restarted: ContinuousClock.Instant?
            if let uptime = uptime ?? nil {
                let instant = asked - .milliseconds(Int64(uptime * 1000))
                if pool.withLock({ $0.createdAt }) < instant {
                    restarted = instant
                    replacePool(after: client, force: true)
                    logger.warning("PostgreSQL restarted \(uptime) s ago: replaced the connection pool")
                }
            }
            let current = ObjectIdentifier(self.client)
            let failed = inFlight.expire("a PostgreSQL call left on a connection from before a restart") { call in
                call.pool != current && (asked - call.began > .seconds(2) || restarted.map { call.began < $0 } == true)
            }
            if failed > 0 {
                logger.warning("failed \(failed) PostgreSQL call(s) left on connections from before a restart")
            }
        }
    }

    private let inFlight = InFlight()

    func close() async throws {
        watch.withLock { $0 }?.cancel()
        pool.withLock { $0.runner }.cancel()
    }
}
