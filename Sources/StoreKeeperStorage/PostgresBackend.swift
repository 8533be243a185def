import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresKit
import PostgresNIO
import SQLKit
import Synchronization

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
    private let probeConfiguration: PostgresConnection.Configuration
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
        var configuration = PostgresClient.Configuration(
            host: host, port: components.port ?? 5432, username: user, password: components.password,
            database: database, tls: try Self.tls(components, host: host))
        configuration.options.maximumConnections = Self.maximumConnections
        self.configuration = configuration
        prepared = PreparedStatements(enabled: try Self.preparing(components))
        probeConfiguration = PostgresConnection.Configuration(
            host: host, port: components.port ?? 5432, username: user, password: components.password,
            database: database, tls: try Self.probeTLS(components, host: host))
        self.logger = logger
        pool = Mutex(Self.start(configuration, logger: logger))
        let watch = Task { [weak self] in _ = await self?.watchForRestarts() }
        self.watch.withLock { $0 = watch }
    }

    private let watch = Mutex<Task<Void, Never>?>(nil)

    /// Repeated statements run prepared (PostgresPrepared.swift) unless `prepare=off`.
    let prepared: PreparedStatements

    static func preparing(_ components: URLComponents) throws -> Bool {
        guard let value = components.queryItems?.last(where: { $0.name.lowercased() == "prepare" })?.value else {
            return true
        }
        switch value.lowercased() {
        case "on", "true", "1": return true
        case "off", "false", "0": return false
        default: throw Database.InvalidURL(description: "database.url: prepare must be on or off")
        }
    }

    /// Connections per pool: twice this machine's cores plus two, at least four and at most
    /// PostgresNIO's default of 20 (on a many-core machine, 2 × cores + 2 would be a hundred and
    /// more per instance). Connections beyond what this process's cores can keep busy only hold
    /// PostgreSQL backends, and several instances on one database add up: four at 20 each came
    /// near PostgreSQL's default `max_connections` of 100. On the 2-core bench host (6
    /// connections) alternating runs showed no throughput difference beyond the host's noise
    /// (BENCHMARKS.md). A request waiting for a connection is still bounded by its deadline.
    static let maximumConnections = min(20, max(4, 2 * ProcessInfo.processInfo.activeProcessorCount + 2))

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
        guard let (prefer, tls) = try tlsConfiguration(components, host: host) else { return .disable }
        return prefer ? .prefer(tls) : .require(tls)
    }

    /// The same TLS for a connection of its own (the probe), outside the pool.
    static func probeTLS(_ components: URLComponents, host: String) throws -> PostgresConnection.Configuration.TLS {
        guard let (prefer, tls) = try tlsConfiguration(components, host: host) else { return .disable }
        let context = try NIOSSLContext(configuration: tls)
        return prefer ? .prefer(context) : .require(context)
    }

    /// nil: no TLS (`disable`); else whether TLS is only preferred, and its configuration.
    static func tlsConfiguration(_ components: URLComponents, host: String) throws -> (Bool, TLSConfiguration)? {
        let mode = try sslMode(components, host: host)
        var tls = TLSConfiguration.makeClientConfiguration()
        switch mode {
        case .disable:
            return nil
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
        return (mode == .prefer, tls)
    }

    /// Every transaction and read ends within this: a statement on a dying connection (a
    /// restart) would otherwise never complete.
    let deadline: Duration = .seconds(30)

    /// A call still waiting for a connection after this, while the restart watch's own
    /// connection attempt has just found the server down (`Reachability`), is answered 503 then
    /// rather than at `deadline`. A pool that is merely busy, a server at `max_connections`, or
    /// one too loaded to take the probe's connection within 5 s, is waited for up to `deadline`.
    let leaseDeadline: Duration = .seconds(3)

    /// The last probe's verdict (`watchForRestarts`): unreachable when its connection was
    /// refused or dropped, or PostgreSQL answered that it is shutting down or starting up
    /// (`ProbeResult.down`). A probe that merely took longer than its 5 s, or was refused for
    /// being at `max_connections`, proves nothing: calls keep waiting, up to their deadline (a
    /// burst of new connections on a loaded host was once slower than that on CI, and three tests
    /// were answered "unreachable" by a server that was up).
    final class Reachability: Sendable {
        private let failed = Mutex<(at: ContinuousClock.Instant, why: String)?>(nil)
        func record(down reason: String?) { failed.withLock { $0 = reason.map { (.now, $0) } } }
        /// Why the last probe, within 5 s, found PostgreSQL down; nil when it did not.
        var down: String? {
            failed.withLock { failed in failed.flatMap { ContinuousClock.now - $0.at < .seconds(5) ? $0.why : nil } }
        }
    }
    let reachability = Reachability()

    /// The connection a piece of work holds, so the deadline can close it: a closed connection
    /// fails its pending statement at once and is never handed out again by the pool.
    final class Held: Sendable {
        let connection = Mutex<PostgresConnection?>(nil)
        func close() async {
            if let connection = self.connection.withLock({ $0 }) { try? await connection.close() }
        }
    }

    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await transaction(deadline: deadline, body)
    }

    func transaction<T: Sendable>(
        deadline: Duration, _ body: @escaping @Sendable (any SQLDatabase) async throws -> T
    ) async throws -> T {
        do {
            return try await transactionOnce(deadline: deadline, body)
        } catch  where PreparedStatements.isLost(error) {
            // Rolled back; preparing is off now: once more, unnamed.
            return try await transactionOnce(deadline: deadline, body)
        }
    }

    private func transactionOnce<T: Sendable>(
        deadline: Duration, _ body: @escaping @Sendable (any SQLDatabase) async throws -> T
    ) async throws -> T {
        try await withDeadline(deadline) { connection in
            let sql = PreparingSQLDatabase(connection: connection, registry: self.prepared)
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
        do {
            return try await withDeadline(deadline) { connection in
                try await body(PreparingSQLDatabase(connection: connection, registry: self.prepared))
            }
        } catch  where PreparedStatements.isLost(error) {
            return try await withDeadline(deadline) { connection in
                try await body(PreparingSQLDatabase(connection: connection, registry: self.prepared))
            }
        }
    }

    /// The work on a pooled connection, answered or failed by `deadline` — never waiting for a
    /// call that does not return: at the deadline the connection is closed (in the background:
    /// closing a dying connection may itself hang) and the caller gets `StorageUnavailable`.
    private func withDeadline<T: Sendable>(
        _ deadline: Duration, _ run: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let client = self.client
        let held = Held()
        let handle = DeadlineHandle()
        let id = inFlight.enter(handle, pool: client)
        defer { inFlight.leave(id) }
        return try await raceDeadline(
            deadline, what: "a PostgreSQL call",
            early: EarlyDeadline(
                after: leaseDeadline, what: "PostgreSQL unreachable: no connection",
                stillWaiting: { [reachability] in
                    held.connection.withLock { $0 == nil } ? reachability.down : nil
                }),
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
            let probe = await probeUptime()
            reachability.record(down: probe.down)
            var restarted: ContinuousClock.Instant?
            if case .up(let uptime) = probe {
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

    /// What the restart watch's probe found.
    enum ProbeResult: Equatable {
        /// PostgreSQL's uptime by its own clock, in seconds.
        case up(Double)
        /// Down: why (the connection refused or dropped, or PostgreSQL shutting down or starting).
        case down(String)
        /// Nothing certain: the probe took longer than its 5 s, or PostgreSQL answered but
        /// refused it for another reason (at `max_connections`: up and busy).
        case unknown

        var down: String? { if case .down(let why) = self { why } else { nil } }
    }

    /// PostgreSQL's uptime, asked on a connection of the probe's own (never the pool's: its
    /// connections may be the ones that hang), within 5 s.
    /// `deadline`: 5 s for the restart watch; the tests give a saturated machine longer.
    func probeUptime(deadline: Duration = .seconds(5)) async -> ProbeResult {
        let configuration = probeConfiguration
        let logger = self.logger
        // The probe's own failure is read inside the race (`raceDeadline` rethrows it classified).
        let result = try? await raceDeadline(deadline, what: "a PostgreSQL probe") { () async -> ProbeResult in
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: configuration, id: 0, logger: logger)
                defer { Task { try? await connection.close() } }
                let uptime = try await connection.sql().raw(
                    "SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())::float8 AS uptime"
                ).first()?.decode(column: "uptime", as: Double.self)
                return uptime.map(ProbeResult.up) ?? .unknown
            } catch {
                return Self.probeFailure(error)
            }
        }
        return result ?? .unknown
    }

    /// Down only on what says so: a connection refused, reset or closed by the server, or
    /// SQLSTATE class 57P (admin or crash shutdown, "the database system is starting up").
    /// Anything else — a deadline, "too many clients" (53300), an error after connecting — is
    /// `unknown`.
    static func probeFailure(_ error: any Error) -> ProbeResult {
        guard let error = error as? PSQLError else { return .unknown }
        switch error.code {
        case .connectionError:
            if case .connectTimeout = error.underlying as? ChannelError { return .unknown }
            return .down("connection failed: \(error.underlying.map { String(describing: $0) } ?? "no detail")")
        case .serverClosedConnection, .uncleanShutdown:
            return .down("the server closed the connection")
        case .server:
            guard let state = error.serverInfo?[.sqlState], state.hasPrefix("57P") else { return .unknown }
            return .down("\(state): \(error.serverInfo?[.message] ?? "")")
        default:
            return .unknown
        }
    }

    func close() async throws {
        watch.withLock { $0 }?.cancel()
        pool.withLock { $0.runner }.cancel()
    }
}

extension PostgresBackend {
    /// Why a connection to `url` cannot be made, in the operator's terms (nil: it connects):
    /// one connection of its own (never a pool, which retries a refused password until its
    /// deadline), within `deadline`. What `config check --connect` and `serve`'s start report.
    static func connectionProblem(url: String, deadline: Duration) async -> Database.ConnectionProblem? {
        guard let components = URLComponents(string: url), let host = components.host, let user = components.user,
            let database = components.path.split(separator: "/").first.map(String.init)
        else { return .init(message: "database.url is not postgres://user:pass@host:port/db", isPermanent: true) }
        let port = components.port ?? 5432
        let configuration: PostgresConnection.Configuration
        do {
            var made = PostgresConnection.Configuration(
                host: host, port: port, username: user, password: components.password, database: database,
                tls: try probeTLS(components, host: host))
            made.options.connectTimeout = .seconds(Int64(max(1, deadline.components.seconds)))
            configuration = made
        } catch {
            return .init(message: "\(error)", isPermanent: true)
        }
        let logger = Logger(label: "storekeeper.database.check")
        let outcome: Database.ConnectionProblem?? = try? await raceDeadline(
            deadline, what: "a PostgreSQL connection check"
        ) { () async -> Database.ConnectionProblem? in
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: configuration, id: 0, logger: logger)
                try? await connection.close()
                return nil
            } catch {
                return describeConnectionFailure(error, host: host, port: port, user: user, database: database)
            }
        }
        switch outcome {
        case .some(let problem): return problem
        case .none:
            return .init(
                message: "no answer from \(host):\(port) within \(deadline): is the host right, and a firewall open?",
                isPermanent: false)
        }
    }

    /// A connection failure in the operator's words: authentication, a missing database, a
    /// refused or unreachable server, TLS.
    static func describeConnectionFailure(_ error: any Error, host: String, port: Int, user: String, database: String)
        -> Database.ConnectionProblem
    {
        guard let error = error as? PSQLError else {
            return .init(message: "cannot connect to \(host):\(port): \(error)", isPermanent: false)
        }
        if let state = error.serverInfo?[.sqlState] {
            let message = error.serverInfo?[.message] ?? ""
            switch state {
            case "28P01":
                return .permanent(
                    "password authentication failed for user '\(user)' (PostgreSQL 28P01): check the password in database.url"
                )
            case "28000":
                return .permanent(
                    "PostgreSQL refused user '\(user)' (28000: \(message)): check pg_hba.conf and the user in database.url"
                )
            case "3D000":
                return .permanent(
                    "database '\(database)' does not exist on \(host):\(port) (3D000): create it (createdb \(database)) or fix database.url"
                )
            case "53300":
                return .transient("PostgreSQL has too many connections (53300): raise max_connections or use PgBouncer")
            case let state where state.hasPrefix("57P"):
                return .transient(
                    "PostgreSQL is starting up or shutting down (\(state): \(message)): try again shortly")
            default:
                return .permanent("PostgreSQL refused the connection (\(state): \(message))")
            }
        }
        let underlying = error.underlying.map { String(describing: $0) } ?? String(describing: error.code)
        switch error.code {
        case .connectionError:
            let text = underlying.lowercased()
            if text.contains("refused") {
                return .transient("connection refused at \(host):\(port): is PostgreSQL running and listening there?")
            }
            if text.contains("timeout") || text.contains("timed out") {
                return .transient("no answer from \(host):\(port): is the host right, and a firewall open?")
            }
            if text.contains("resolve") || text.contains("name") || text.contains("dns") {
                return .transient("cannot resolve host '\(host)': check database.url")
            }
            return .transient("cannot connect to \(host):\(port): \(underlying)")
        case .sslUnsupported:
            return .permanent(
                "TLS: \(host):\(port) does not offer TLS, which sslmode requires (set sslmode=disable only on a trusted network)"
            )
        default:
            if underlying.lowercased().contains("certificate") || underlying.lowercased().contains("tls")
                || underlying.lowercased().contains("ssl")
            {
                return .permanent("TLS failed with \(host):\(port): \(underlying) (check sslmode and sslrootcert)")
            }
            return .transient("cannot connect to \(host):\(port): \(underlying)")
        }
    }
}

extension Database {
    /// Why a database cannot be connected to, in the operator's words. `isPermanent`: waiting
    /// will not help (a wrong password, a missing database, TLS refused); otherwise the server
    /// may come (refused, unreachable, starting up).
    public struct ConnectionProblem: Sendable, Hashable, CustomStringConvertible {
        public var message: String
        public var isPermanent: Bool
        public var description: String { message }

        static func permanent(_ message: String) -> Self { .init(message: message, isPermanent: true) }
        static func transient(_ message: String) -> Self { .init(message: message, isPermanent: false) }
    }

    /// Why `url` cannot be connected to (nil: it connects, or it is SQLite): PostgreSQL's
    /// authentication, a missing database, a refused or unreachable server, TLS — each within
    /// seconds, never a pool's retries until a deadline.
    public static func connectionProblem(url: String, deadline: Duration = .seconds(10)) async -> ConnectionProblem? {
        guard url.hasPrefix("postgres://") || url.hasPrefix("postgresql://") else { return nil }
        return await PostgresBackend.connectionProblem(url: url, deadline: deadline)
    }
}
