import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// The StoreKeeper server: API.md's HTTP API over the purchase store.
public struct StoreKeeperApp: Sendable {
    public let configuration: ServerConfiguration
    public let database: Database
    public let store: PurchaseStore
    public let jobs: JobStore
    public let catalog: Catalog
    /// Where `transactionId` submissions are looked up; nil when no Apple key is configured.
    let transactionSource: (any TransactionSource)?
    /// How long a submission waits for Apple before the lookup becomes a durable job.
    let lookupDeadline: Duration
    let verifier: SignedDataVerifier
    let receiptVerifier: AppReceiptVerifier
    let authenticator: Authenticator
    let limiter: RateLimiter
    /// The in-process local App Store of zero-config mode.
    public let localAppStore: LocalAppStore?
    let logger: Logger
    public let metrics = ServerMetrics()

    /// The trust set every verifier of this server was built from.
    public let trust: TrustPolicy
    public let rejectedProofs: RejectedProofStore
    /// The last comparison of this server's clock with Apple's (after a 401).
    let clock = ClockState()

    /// Checks the configuration, opens the database, applies migrations and builds the
    /// verifiers from the trust policy.
    public static func make(
        _ configuration: ServerConfiguration, dataDirectory: URL = URL(fileURLWithPath: "storekeeper-data"),
        logger: Logger = Logger(label: "storekeeper"), transactionSource: (any TransactionSource)? = nil,
        lookupDeadline: Duration = .seconds(2),
        rateLimitClock: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }
    ) async throws -> StoreKeeperApp {
        try configuration.validate()
        var localAppStore: LocalAppStore?
        var localRoots: [[UInt8]]?
        let catalog = configuration.catalog ?? .demo
        let localDirectory = dataDirectory.appendingPathComponent("local-store", isDirectory: true)
        if configuration.usesLocalAppStore {
            let pki = try PKIStore.loadOrCreate(dataDirectory: localDirectory)
            localAppStore = LocalAppStore(
                configuration: .init(
                    bundleId: configuration.bundleId ?? "com.example.app",
                    appAppleId: configuration.appAppleId ?? 1_234_567_890, catalog: catalog),
                pki: pki)
            localRoots = pki.trustRootsDER
        }
        let trust = try TrustPolicy(configuration: configuration, localAppStoreRoots: localRoots)
        if configuration.mode == .demo {
            logger.notice(
                "demo mode: no configuration found, so the built-in local App Store runs and is trusted — for trying StoreKeeper out only; any configuration (a file or an APPLE_* variable) trusts Apple instead",
                metadata: [
                    "localAppStore": "http://\(configuration.host):\(configuration.port)/local-app-store",
                    "keys": "\(localDirectory.path)",
                ])
        } else if configuration.localAppStoreEnabled {
            logger.warning(
                "localAppStore.enabled: the built-in local App Store is trusted beside Apple; its control API needs a secret key. Never in production."
            )
        }
        for line in trust.lines { logger.notice("trust: \(line)") }
        if configuration.catalog == nil {
            logger.warning("no catalog configured (catalog.file or catalog.products): using the demo catalog")
        }
        let verifier = try trust.signedDataVerifier()
        let receiptVerifier = try trust.receiptVerifier()
        let database = try await Database.open(url: configuration.databaseURL, logger: logger)
        try await waitForDatabase(database, configuration: configuration, logger: logger)

        var secretKeys = configuration.secretKeys
        if secretKeys.isEmpty, configuration.mode == .demo {
            secretKeys = [try developmentKey(in: dataDirectory, logger: logger)]
        } else if secretKeys.isEmpty {
            logger.warning("no auth.secretKeys configured: operator and back-end endpoints cannot be reached")
        }
        var source = transactionSource
        if source == nil, let pem = try configuration.serverAPIPrivateKeyPEM(),
            let issuerId = configuration.serverAPIIssuerId, let keyId = configuration.serverAPIKeyId
        {
            let credentials = ServerAPICredentials(
                issuerId: issuerId, keyId: keyId, privateKeyPEM: pem, bundleId: trust.bundleId)
            let production = try await AppStoreServerAPIClient(
                configuration: .init(
                    credentials: credentials, environment: .production, baseURL: configuration.serverAPIBaseURL,
                    timeout: .seconds(10), retryPolicy: .none))
            let sandbox =
                configuration.environments.contains(.sandbox)
                ? try await AppStoreServerAPIClient(
                    configuration: .init(
                        credentials: credentials, environment: .sandbox, baseURL: configuration.serverAPIBaseURL,
                        timeout: .seconds(10), retryPolicy: .none)) : nil
            source = ServerAPITransactionSource(production: production, sandbox: sandbox)
        } else if source == nil, let localAppStore {
            source = LocalTransactionSource(store: localAppStore)
        }
        return StoreKeeperApp(
            configuration: configuration, database: database, store: PurchaseStore(database: database),
            jobs: JobStore(database: database), catalog: catalog, transactionSource: source,
            lookupDeadline: lookupDeadline,
            verifier: verifier, receiptVerifier: receiptVerifier,
            authenticator: await Authenticator(
                secretKeys: secretKeys, clientTokenSecret: configuration.clientTokenSecret,
                clientTokenMaxLifetimeSeconds: configuration.clientTokenMaxLifetimeSeconds,
                metricsToken: configuration.metricsToken),
            limiter: RateLimiter(
                clientPerSecond: configuration.clientRequestsPerSecond,
                secretPerSecond: configuration.secretRequestsPerSecond, clock: rateLimitClock),
            localAppStore: localAppStore, logger: logger, trust: trust,
            rejectedProofs: RejectedProofStore(database: database))
    }

    /// The database did not answer within `database.startupTimeoutSeconds`: `serve` exits non-zero.
    public struct StartupFailure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Applies migrations, waiting for the database up to `database.startupTimeoutSeconds`
    /// (a warning every 5 s), then gives up with a clear message.
    static func waitForDatabase(_ database: Database, configuration: ServerConfiguration, logger: Logger)
        async throws
    {
        let started = ContinuousClock.now
        let limit = Duration.seconds(configuration.databaseStartupTimeoutSeconds)
        var lastWarning = started
        while true {
            do {
                try await raceDeadline(.seconds(5), what: "migrations") { try await Migrations.run(on: database) }
                return
            } catch let error where StorageUnavailable.classify(error) != nil {
                let waited = ContinuousClock.now - started
                guard waited < limit else {
                    try? await database.close()
                    throw StartupFailure(
                        description:
                            "the database (\(database.kind.rawValue)) did not answer within database.startupTimeoutSeconds (\(configuration.databaseStartupTimeoutSeconds) s): \(error)"
                    )
                }
                if ContinuousClock.now - lastWarning >= .seconds(5) || lastWarning == started {
                    lastWarning = ContinuousClock.now
                    logger.warning(
                        "waiting for the database",
                        metadata: ["waited": "\(waited.components.seconds) s", "error": "\(error)"])
                }
                try await Task.sleep(for: .milliseconds(500))
            }
        }
    }

    /// Demo mode's operator key: generated once into `dev-secret-key` beside the data. Only its
    /// path is logged; the key itself never reaches a log.
    static func developmentKey(in dataDirectory: URL, logger: Logger) throws -> String {
        let keyFile = dataDirectory.appendingPathComponent("dev-secret-key")
        if let existing = FileManager.default.contents(atPath: keyFile.path) {
            let key = String(decoding: existing, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            logger.notice("demo mode: the development secret key is in \(keyFile.path)")
            return key
        }
        var generator = SystemRandomNumberGenerator()
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789")
        let key = "sk_dev_" + String((0..<40).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] })
        try FileManager.default.createDirectory(at: dataDirectory, withIntermediateDirectories: true)
        guard
            FileManager.default.createFile(
                atPath: keyFile.path, contents: Data(key.utf8), attributes: [.posixPermissions: 0o600])
        else { throw ServerConfiguration.Invalid(key: "auth.secretKeys", "cannot write \(keyFile.path)") }
        logger.notice(
            "demo mode: generated a development secret key (not for production) into \(keyFile.path) — read it with: cat \(keyFile.path)"
        )
        return key
    }

    // MARK: Application

    /// API.md's routes behind the request deadline: what the server (and the tests) run.
    public func router() -> DeadlineRouter {
        DeadlineRouter(
            router: routes(), limit: .seconds(configuration.requestTimeoutSeconds),
            maxInFlight: configuration.maxInFlightRequests, metrics: metrics)
    }

    func routes() -> Router<BasicRequestContext> {
        let router = Router()
        router.add(middleware: RequestObservation(metrics: metrics))
        router.add(middleware: ErrorMiddleware())
        router.get("healthz") { _, _ in try await self.health() }
        router.get("metrics") { request, _ in
            try await self.authenticator.authenticateMetrics(request)
            self.metrics.jobsPending.record(try await self.jobs.pendingCount())
            self.metrics.anomaliesOpen.record(try await self.store.openAnomalyCount())
            self.metrics.webhooksPending.record(try await OutboxStore(database: self.database).pendingCount())
            self.metrics.walBytes.record(self.database.walBytes ?? 0)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
                body: .init(byteBuffer: ByteBuffer(string: self.metrics.text())))
        }
        let v1 = router.group("v1")
        v1.post("orders") { request, context in try await self.createOrder(request, context) }
        v1.get("orders/:orderId") { request, context in try await self.getOrder(request, context) }
        v1.post("purchases") { request, context in try await self.submitPurchase(request, context) }
        v1.get("accounts/:accountId") { request, context in
            let caller = try await self.caller(request)
            let accountId = try Self.parameter(context, "accountId")
            try Self.validateAccountId(accountId)
            try caller.require(accountId)
            return try Self.json(try await self.account(accountId))
        }
        v1.post("accounts/:accountId/balances/:currency/debit") { request, context in
            try await self.debit(request, context)
        }
        v1.get("anomalies") { request, _ in try await self.listAnomalies(request) }
        v1.post("anomalies/:id/resolve") { request, context in try await self.resolveAnomaly(request, context) }
        v1.get("status") { request, _ in
            try await self.caller(request).requireSecretKey()
            return try Self.json(StatusJSON(self))
        }
        v1.get("rejected-proofs") { request, _ in try await self.listRejectedProofs(request) }
        v1.post("rejected-proofs/reverify") { request, _ in try await self.reverifyRejectedProofs(request) }
        v1.get("audit") { request, _ in
            try await self.caller(request).requireSecretKey()
            return try Self.json(["entries": try await self.store.audit().map(AuditJSON.init)])
        }
        if let localAppStore {
            // Demo mode: open, for curl and the quick start. Beside a configuration
            // (`localAppStore.enabled`): every route needs a secret key, so no app user can mint
            // purchases next to real data.
            let server = LocalAppStoreServer(unauthenticatedStore: localAppStore)
            let group = router.group("local-app-store")
            if configuration.mode == .demo {
                server.addRoutes(to: group)
            } else {
                server.addRoutes(to: group.add(middleware: SecretKeyRequired(authenticator: authenticator)))
            }
        }
        return router
    }

    public func application(onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in })
        -> some ApplicationProtocol
    {
        var services: [any Service] = [
            OrderExpiry(store: store, ttl: configuration.orderTTL, logger: logger), JobRunner(app: self),
            Housekeeping(
                rejectedProofs: rejectedProofs, retentionDays: configuration.rejectedProofsRetentionDays,
                outbox: OutboxStore(database: database), logger: logger),
        ]
        if let localAppStore { services.append(NotificationSender(store: localAppStore)) }
        if database.kind == .sqlite { services.append(WALCheckpointer(database: database, logger: logger)) }
        if let url = configuration.webhookURL, let secret = configuration.webhookSecret {
            services.append(
                WebhookSender(outbox: OutboxStore(database: database), url: url, secret: secret, logger: logger))
        }
        // Shed on the event loop, before any task or body read (LoadShedder).
        let inFlight = InFlightRequests(limit: configuration.maxInFlightRequests, metrics: metrics)
        return Application(
            router: router(),
            // Idle keep-alive connections, and requests whose head or body stalls, are closed
            // after http.idleTimeoutSeconds: slow or silent sockets cannot pile up.
            server: .http1(
                configuration: .init(
                    additionalChannelHandlers: [LoadShedder(inFlight)],
                    idleTimeout: .seconds(Int64(configuration.idleTimeoutSeconds)))),
            // A deep accept queue (the kernel caps it at net.core.somaxconn): with Hummingbird's
            // 256, a burst of thousands of connections overflowed it and the kernel dropped
            // handshakes, so requests waited 1–7 s for SYN-ACK retransmissions before the server
            // even saw them — no load shedding can answer what it never reads (BENCHMARKS.md).
            configuration: .init(
                address: .hostname(configuration.host, port: configuration.port), serverName: "StoreKeeper",
                backlog: 4096),
            services: services,
            onServerRunning: { channel in await onServerRunning(channel.localAddress?.port ?? configuration.port) },
            logger: logger)
    }

    // MARK: Handlers

    struct HealthJSON: Encodable {
        var status: String
        var database: String
        /// Seconds the oldest submitted delivery has waited for its batch (0: none waiting).
        var oldestPendingDeliverySeconds: Double
        /// Seconds since the oldest pending job (an Apple lookup) was queued (0: none).
        var oldestPendingJobSeconds: Double
    }

    /// 200 when a database round trip completes within 2 s, else 503 — answered within 2 s
    /// either way (API.md).
    func health() async throws -> Response {
        let database = self.database
        let jobs = self.jobs
        let report: Date?
        do {
            report = try await raceDeadline(.seconds(2), what: "/healthz") {
                try await database.ping(deadline: .seconds(2))
                return try await jobs.oldestPending()
            }
        } catch {
            var failure = APIError(
                .serviceUnavailable, "storage_unavailable", "the database does not answer within 2 s", retryable: true)
            failure.headers[.retryAfter] = "1"
            throw failure
        }
        let waiting = store.oldestWaitingDelivery.map { Double($0.components.seconds) } ?? 0
        return try Self.json(
            HealthJSON(
                status: "ok", database: database.kind.rawValue, oldestPendingDeliverySeconds: waiting,
                oldestPendingJobSeconds: report.map { max(0, Date().timeIntervalSince($0)) } ?? 0))
    }

    struct CreateOrderBody: Decodable {
        var accountId: String
        var productId: String
        var quantity: Int?
    }

    func createOrder(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let caller = try await self.caller(request)
        let body = try await decode(CreateOrderBody.self, request)
        try Self.validateAccountId(body.accountId)
        try caller.require(body.accountId)
        let quantity = body.quantity ?? 1
        guard (1...10).contains(quantity) else { throw APIError.badRequest("field 'quantity' must be 1…10") }
        guard catalog.product(body.productId) != nil else {
            throw APIError(.notFound, "unknown_product", "no product '\(body.productId.prefix(100))' in the catalog")
        }
        let order: Order
        do {
            order = try await store.createOrder(
                accountId: body.accountId, productId: body.productId, quantity: quantity,
                maxOpen: configuration.maxOpenOrdersPerAccount, ttl: configuration.orderTTL, now: Date())
        } catch let error as PurchaseStore.TooManyOpenOrders {
            throw APIError(
                .conflict, "too_many_open_orders",
                "the account has \(error.limit) unpaid orders; pay or let them expire before creating more")
        }
        return try Self.json(OrderJSON(order), status: .created)
    }

    func getOrder(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let caller = try await self.caller(request)
        let orderId = try Self.parameter(context, "orderId")
        guard let order = try await store.order(orderId) else {
            throw APIError.notFound("no order '\(orderId.prefix(64))'")
        }
        try caller.require(order.accountId)
        return try Self.json(OrderJSON(order))
    }

    struct PurchaseBody: Decodable {
        var accountId: String
        var orderId: String?
        var signedTransaction: String?
        var receipt: String?
        var transactionId: String?
    }

    func submitPurchase(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let caller = try await self.caller(request)
        let body = try await decode(PurchaseBody.self, request)
        try Self.validateAccountId(body.accountId)
        try caller.require(body.accountId)
        if let orderId = body.orderId {
            guard orderId.count <= 200 else { throw APIError.badRequest("field 'orderId' must be 1…200 characters") }
            try Self.validateText(orderId, field: "orderId")
        }
        let proofs: [Proof] = [
            body.signedTransaction.map(Proof.signedTransaction), body.receipt.map(Proof.receipt),
            body.transactionId.map(Proof.transactionId),
        ].compactMap { $0 }
        guard proofs.count == 1, let proof = proofs.first else {
            throw APIError.badRequest("exactly one of 'signedTransaction', 'receipt', 'transactionId' is required")
        }

        let transactions: [JWSTransactionDecodedPayload]
        do {
            if case .transactionId(let transactionId) = proof {
                switch try await lookUpOrQueue(transactionId, accountId: body.accountId, orderId: body.orderId) {
                case .found(let transaction): transactions = [transaction]
                case .queued(let retryAfter):
                    struct Pending: Encodable {
                        var status = "pending"
                        var retryAfterSeconds: Int
                    }
                    return try Self.json(Pending(retryAfterSeconds: retryAfter), status: .accepted)
                }
            } else {
                transactions = try await verifyOffline(proof)
            }
        } catch let failure as VerificationFailure {
            metrics.verificationFailure(failure.code)
            logger.warning(
                "proof rejected",
                metadata: ["code": "\(failure.code)", "reason": "\(failure.reason)", "account": "\(body.accountId)"])
            if !failure.isRetryable {
                await keepRejected(proof, failure: failure, accountId: body.accountId, orderId: body.orderId)
            }
            throw APIError.verification(failure)
        }

        let delivered = try await deliverVerified(
            transactions, accountId: body.accountId, orderId: body.orderId, evidence: proof.evidence)
        // A single proof that cannot be delivered is an error; a receipt reports per transaction.
        if transactions.count == 1, let refusal = delivered.refusals.first {
            switch refusal {
            case .revoked:
                throw APIError(.unprocessableContent, "revoked", "the transaction was refunded or revoked by Apple")
            case .ownedByOtherAccount:
                throw APIError(.conflict, "owned_by_other_account", "this purchase belongs to another account")
            case .orderOfAnotherAccount: throw APIError.forbidden("order belongs to another account")
            }
        }
        let results = delivered.results
        // "already_delivered" when nothing in the proof is new: delivered earlier (or refunded since).
        let nothingNew =
            !results.isEmpty && results.allSatisfy { $0.outcome == "already_delivered" || $0.outcome == "refunded" }
        return try Self.json(
            PurchaseJSON(
                status: nothingNew ? "already_delivered" : "delivered", transactions: results,
                account: try await account(body.accountId, state: delivered.account)))
    }

    /// A proof of purchase as submitted: one of the three fields of `POST /v1/purchases`.
    enum Proof: Sendable {
        case signedTransaction(String)
        case receipt(String)
        case transactionId(String)

        var kind: RejectedProofStore.Kind {
            switch self {
            case .signedTransaction: .signedTransaction
            case .receipt: .receipt
            case .transactionId: .transactionId
            }
        }

        /// A bare transaction id proves nothing about who paid (API.md); a JWS or receipt does.
        var evidence: DeliveryPlanner.Evidence {
            if case .transactionId = self { return .lookup }
            return .device
        }

        var text: String {
            switch self {
            case .signedTransaction(let text), .receipt(let text), .transactionId(let text): text
            }
        }

        init(kind: RejectedProofStore.Kind, text: String) {
            switch kind {
            case .signedTransaction: self = .signedTransaction(text)
            case .receipt: self = .receipt(text)
            case .transactionId: self = .transactionId(text)
            }
        }
    }

    /// The transactions a JWS or receipt proves, verified offline under the trust policy.
    func verifyOffline(_ proof: Proof) async throws -> [JWSTransactionDecodedPayload] {
        switch proof {
        case .signedTransaction(let signed):
            return [try await verifier.verifyTransaction(signed)]
        case .receipt(let receipt):
            let verified = try await receiptVerifier.verify(base64: receipt)
            return verified.inAppPurchases.map { Self.transaction(from: $0, receipt: verified) }
        case .transactionId(let transactionId):
            return [try await fetchTransaction(transactionId)]
        }
    }

    /// Delivers verified transactions to `accountId` (and its order), one by one through the
    /// store's delivery path; the single path for submissions and re-verification.
    func deliverVerified(
        _ transactions: [JWSTransactionDecodedPayload], accountId: String, orderId: String?,
        evidence: DeliveryPlanner.Evidence
    ) async throws -> (
        results: [TransactionJSON], refusals: [DeliveryPlanner.Refusal], account: PurchaseStore.AccountState?
    ) {
        var results: [TransactionJSON] = []
        var refusals: [DeliveryPlanner.Refusal] = []
        var committed: PurchaseStore.AccountState?
        let now = Date()
        for transaction in transactions {
            let result = try await store.deliver(
                transaction, submittingAccount: accountId, requestedOrderId: orderId, catalog: catalog,
                policy: configuration.ownershipPolicy, evidence: evidence, now: now)
            if let refusal = result.plan.refusal { refusals.append(refusal) }
            committed = result.account
            switch result.plan.outcome {
            case .delivered: metrics.deliveries.increment()
            case .unattributed: metrics.unattributed.increment()
            case .alreadyDelivered: metrics.duplicatesSuppressed.increment()
            case .refunded, .notDelivered: break
            }
            results.append(TransactionJSON(transaction, result: result, submitter: accountId))
        }
        return (results, refusals, committed)
    }

    enum Lookup {
        case found(JWSTransactionDecodedPayload)
        case queued(retryAfterSeconds: Int)
    }

    /// `transactionId` submissions: ask Apple with a short deadline; if Apple is slow, down or
    /// rate-limiting, the lookup becomes a durable job and the client gets 202 (invariant 5).
    func lookUpOrQueue(_ transactionId: String, accountId: String, orderId: String?) async throws -> Lookup {
        guard transactionId.count <= 64, transactionId.allSatisfy(\.isNumber), !transactionId.isEmpty else {
            throw APIError.badRequest("field 'transactionId' must be an App Store transaction id (digits)")
        }
        guard transactionSource != nil else {
            throw APIError.badRequest("transactionId submissions need apple.serverAPI credentials on this server")
        }
        do {
            let deadline = lookupDeadline
            return .found(try await withDeadline(deadline) { try await self.fetchTransaction(transactionId) })
        } catch let error as AppStoreAPIError where error.isRetryable {
            try await queueLookup(transactionId, accountId: accountId, orderId: orderId, reason: error.description)
            let wait =
                error.retryAfter.map { max(1, Int($0.timeIntervalSinceNow.rounded(FloatingPointRoundingRule.up))) } ?? 2
            return .queued(retryAfterSeconds: wait)
        } catch let failure as VerificationFailure where failure.isRetryable {
            try await queueLookup(transactionId, accountId: accountId, orderId: orderId, reason: failure.description)
            return .queued(retryAfterSeconds: 2)
        } catch let error as AppStoreAPIError {
            if error.errorCode == AppStoreAPIError.transactionIdNotFound {
                throw APIError.notFound("the App Store does not know transaction '\(transactionId)'")
            }
            if error.kind == .unauthorized {
                // A wrong key, or a clock Apple does not believe: either way the purchase waits in
                // the job queue (202) until it is fixed, and the log says which.
                noteAppleRefusal(error)
                try await queueLookup(transactionId, accountId: accountId, orderId: orderId, reason: error.description)
                return .queued(retryAfterSeconds: 60)
            }
            throw APIError.badRequest("the App Store refused the lookup: \(error.message)")
        }
    }

    /// On Apple's 401: compares Apple's `Date` with this clock and logs loudly — a skew makes
    /// every token look expired or not yet valid. `/v1/status` shows the last measurement.
    func noteAppleRefusal(_ error: AppStoreAPIError) {
        guard let appleDate = error.appleDate else {
            logger.error("Apple refused the Server API key (no Date header to compare clocks)")
            return
        }
        let skew = Date().timeIntervalSince(appleDate)
        clock.withLock { $0 = ClockCheck(skewSeconds: skew, measuredAt: Date()) }
        if abs(skew) > 60 {
            logger.critical(
                "Apple refused the Server API token and this server's clock is \(Int(skew)) s \(skew > 0 ? "ahead of" : "behind") Apple's: fix the clock (NTP); lookups wait in the job queue until then",
                metadata: ["skewSeconds": "\(Int(skew))"])
        } else {
            logger.error(
                "Apple refused the Server API key (clocks agree within a minute: check apple.serverAPI.keyId, issuerId, privateKeyFile and the bundle id)",
                metadata: ["skewSeconds": "\(Int(skew))"])
        }
    }

    func queueLookup(_ transactionId: String, accountId: String, orderId: String?, reason: String) async throws {
        let payload = String(
            decoding: try JSONEncoder().encode(
                LookupJob(transactionId: transactionId, accountId: accountId, orderId: orderId)),
            as: UTF8.self)
        let now = Date()
        try await jobs.enqueue(
            kind: "lookup_transaction", dedupeKey: "lookup_transaction|\(transactionId)|\(accountId)", payload: payload,
            runAt: now.addingTimeInterval(1), now: now)
        logger.info(
            "Apple unavailable; lookup queued", metadata: ["transactionId": "\(transactionId)", "reason": "\(reason)"])
    }

    /// The verified transaction, from Apple (or the local App Store).
    func fetchTransaction(_ transactionId: String) async throws -> JWSTransactionDecodedPayload {
        guard let transactionSource else {
            throw APIError.badRequest("no App Store Server API configured")
        }
        return try await verifier.verifyTransaction(try await transactionSource.signedTransaction(transactionId))
    }

    /// A receipt's in-app entry as a transaction payload (receipts carry no appAccountToken).
    static func transaction(from item: AppReceiptInAppPurchase, receipt: AppReceipt) -> JWSTransactionDecodedPayload {
        func milliseconds(_ date: Date?) -> Int64? {
            date.map { Int64(($0.timeIntervalSince1970 * 1000).rounded(.down)) }
        }
        return JWSTransactionDecodedPayload(
            transactionId: item.transactionId, originalTransactionId: item.originalTransactionId ?? item.transactionId,
            webOrderLineItemId: item.webOrderLineItemId, bundleId: receipt.bundleId, productId: item.productId,
            purchaseDate: milliseconds(item.purchaseDate),
            originalPurchaseDate: milliseconds(item.originalPurchaseDate),
            expiresDate: milliseconds(item.subscriptionExpirationDate), quantity: Int32(clamping: item.quantity ?? 1),
            revocationDate: milliseconds(item.cancellationDate), environment: receipt.environment ?? .production)
    }

    struct DebitBody: Decodable {
        var amount: Int64
        var idempotencyKey: String
    }

    func debit(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let caller = try await self.caller(request)
        let accountId = try Self.parameter(context, "accountId")
        try Self.validateAccountId(accountId)
        let currency = try Self.parameter(context, "currency")
        try Self.validateText(currency, field: "currency")
        // Only the app's backend spends: a client token could pre-claim the backend's keys.
        guard caller == .secretKey else {
            throw APIError.forbidden("debits need a secret key (the app's backend), not a client token")
        }
        let body = try await decode(DebitBody.self, request)
        guard body.amount > 0, body.amount <= 1_000_000_000_000 else {
            throw APIError.badRequest("field 'amount' must be a positive integer")
        }
        guard !body.idempotencyKey.isEmpty, body.idempotencyKey.count <= 200 else {
            throw APIError.badRequest("field 'idempotencyKey' must be 1…200 characters")
        }
        try Self.validateText(body.idempotencyKey, field: "idempotencyKey")
        switch try await store.debit(
            accountId: accountId, currency: currency, amount: body.amount, idempotencyKey: body.idempotencyKey,
            now: Date())
        {
        case .debited(let balance): return try Self.json(["balance": balance])
        case .idempotencyConflict:
            throw APIError(
                .conflict, "idempotency_conflict",
                "this idempotencyKey already answered a debit of another account, currency or amount")
        case .insufficient(let balance):
            throw APIError(.conflict, "insufficient_balance", "balance \(balance) is less than \(body.amount)")
        }
    }

    func listAnomalies(_ request: Request) async throws -> Response {
        try await caller(request).requireSecretKey()
        let status = request.uri.query.flatMap { query in
            query.split(separator: "&").first { $0.hasPrefix("status=") }.map { String($0.dropFirst("status=".count)) }
        }
        if let status, !["open", "resolved"].contains(status) {
            throw APIError.badRequest("query 'status' must be open or resolved")
        }
        return try Self.json(["anomalies": try await store.anomalies(status: status).map(AnomalyJSON.init)])
    }

    struct ResolveBody: Decodable {
        var action: String
        var accountId: String?
        var note: String?
    }

    func resolveAnomaly(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        try await caller(request).requireSecretKey()
        let id = try Self.parameter(context, "id")
        let body = try await decode(ResolveBody.self, request)
        guard let anomaly = try await store.anomaly(id) else {
            throw APIError.notFound("no anomaly '\(id.prefix(64))'")
        }
        let note = body.note ?? ""
        switch body.action {
        case "dismiss":
            break
        case "deliver":
            guard anomaly.status == "open" else { return try Self.json(AnomalyJSON(anomaly)) }
            guard let transaction = anomaly.transaction else {
                throw APIError.badRequest("this anomaly holds no transaction to deliver")
            }
            guard let accountId = body.accountId ?? anomaly.accountId else {
                throw APIError.badRequest("field 'accountId' is required to deliver this anomaly")
            }
            try Self.validateAccountId(accountId)
            // The operator decides: delivered to the account named, exactly once (keyed by transactionId).
            let result = try await store.deliver(
                transaction, submittingAccount: accountId, catalog: catalog, policy: .transfer, now: Date())
            try await store.recordAudit(
                actor: "operator", action: "manual_delivery", subject: transaction.transactionId,
                detail: "anomaly \(id) delivered to \(accountId): \(result.plan.outcome.rawValue). \(note)", now: Date()
            )
        default:
            throw APIError.badRequest("field 'action' must be deliver or dismiss")
        }
        guard
            let resolved = try await store.resolveAnomaly(
                id, resolution: body.action, actor: "operator", note: note, now: Date())
        else { throw APIError.notFound("no anomaly '\(id.prefix(64))'") }
        return try Self.json(AnomalyJSON(resolved))
    }

    /// The account as API.md shows it; `state` when the caller already read it.
    func account(_ accountId: String, state: PurchaseStore.AccountState? = nil) async throws -> AccountJSON {
        let now = Date()
        let state = if let state { state } else { try await store.account(accountId) }
        let entitlements = state.entitlements.map {
            AccountJSON.Entitlement(
                id: $0.entitlementId, active: $0.expiresAt.map { $0 > now } ?? true, productId: $0.productId,
                expiresAt: $0.expiresAt.map(Self.iso), originalTransactionId: $0.originalTransactionId)
        }
        return AccountJSON(
            accountId: accountId, entitlements: entitlements, balances: state.balances,
            subscriptions: [])
    }

    // MARK: Helpers

    func caller(_ request: Request) async throws -> Caller {
        let caller = try await authenticator.authenticate(request)
        if let retryAfter = limiter.admit(caller) {
            var error = APIError(.tooManyRequests, "rate_limited", "too many requests", retryable: true)
            error.headers[.retryAfter] = String(retryAfter)
            throw error
        }
        return caller
    }

    func decode<T: Decodable>(_ type: T.Type, _ request: Request) async throws -> T {
        if let length = request.headers[.contentLength].flatMap(Int.init), length > configuration.maxBodyBytes {
            throw APIError(
                .contentTooLarge, "payload_too_large", "request body is over \(configuration.maxBodyBytes) bytes")
        }
        var request = request
        let buffer = try await request.collectBody(upTo: configuration.maxBodyBytes)
        guard buffer.readableBytes > 0 else { throw APIError.badRequest("request body is empty") }
        do {
            return try JSONDecoder().decode(T.self, from: Data(buffer: buffer))
        } catch let error as DecodingError {
            throw APIError.badRequest(ErrorMiddleware<BasicRequestContext>.describe(error))
        }
    }

    /// A path parameter, percent-decoded (`/v1/accounts/player%20one` is account `player one`).
    static func parameter(_ context: BasicRequestContext, _ name: String) throws -> String {
        guard let raw = context.parameters.get(name), let value = raw.removingPercentEncoding else {
            throw APIError.badRequest("path parameter '\(name)' is missing or not valid percent-encoding")
        }
        guard !value.isEmpty, value.count <= 200 else {
            throw APIError.badRequest("path parameter '\(name)' must be 1…200 characters")
        }
        try validateText(value, field: name)
        return value
    }

    static func validateAccountId(_ accountId: String) throws {
        guard !accountId.isEmpty, accountId.count <= 128 else {
            throw APIError.badRequest("field 'accountId' must be 1…128 characters")
        }
        try validateText(accountId, field: "accountId")
    }

    /// Ids are printable text: no control characters (NUL, newlines, escapes) that could forge
    /// log lines or break a database driver.
    static func validateText(_ value: String, field: String) throws {
        guard !value.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw APIError.badRequest("field '\(field)' must not contain control characters")
        }
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: try encoder.encode(value))))
    }

    static func iso(_ date: Date) -> String {
        date.formatted(
            .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
    }
}

/// Token buckets per caller: client tokens per account, secret keys only if configured.
final class RateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    let clientPerSecond: Int
    let secretPerSecond: Int?
    let clock: @Sendable () -> ContinuousClock.Instant
    private struct Buckets {
        var byCaller: [Caller: Bucket] = [:]
        var lastSweep: ContinuousClock.Instant?
    }
    private let buckets = Mutex(Buckets())

    init(
        clientPerSecond: Int, secretPerSecond: Int?,
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }
    ) {
        self.clientPerSecond = clientPerSecond
        self.secretPerSecond = secretPerSecond
        self.clock = clock
    }

    static let evictionThreshold = 10_000

    /// Callers currently remembered.
    var trackedCallers: Int { buckets.withLock { $0.byCaller.count } }

    /// nil when admitted; otherwise seconds to wait.
    func admit(_ caller: Caller, now: ContinuousClock.Instant? = nil) -> Int? {
        let now = now ?? clock()
        let rate: Int
        switch caller {
        case .secretKey:
            guard let secretPerSecond else { return nil }
            rate = secretPerSecond
        case .account:
            rate = clientPerSecond
        }
        guard rate > 0 else { return nil }
        return buckets.withLock { state in
            // A bucket untouched for a second is full again: forgetting it changes nothing, and
            // the map stays bounded however many accounts pass by (swept at most once a second).
            if state.byCaller.count >= Self.evictionThreshold,
                state.lastSweep.map({ now - $0 >= .seconds(1) }) ?? true
            {
                state.byCaller = state.byCaller.filter { now - $0.value.updated < .seconds(1) }
                state.lastSweep = now
            }
            var bucket = state.byCaller[caller] ?? Bucket(tokens: Double(rate), updated: now)
            let elapsed = now - bucket.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(Double(rate), bucket.tokens + seconds * Double(rate))
            bucket.updated = now
            defer { state.byCaller[caller] = bucket }
            guard bucket.tokens >= 1 else { return 1 }
            bucket.tokens -= 1
            return nil
        }
    }
}

/// This clock against Apple's, measured on Apple's 401 answers.
struct ClockCheck: Sendable, Encodable {
    /// Positive: this server is ahead of Apple.
    var skewSeconds: Double
    var measuredAt: Date
}

final class ClockState: Sendable {
    private let state = Mutex<ClockCheck?>(nil)
    func withLock<T>(_ body: (inout ClockCheck?) -> T) -> T { state.withLock { body(&$0) } }
}
