import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Crypto
import EventLoopPinning
import Foundation
import GooglePlay
import Hummingbird
import HummingbirdCore
import KeyFiles
import LocalAppStore
import LocalGooglePlay
import LocalStripe
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// The StoreKeeper server: docs/api.md's HTTP API over the purchase store.
public struct StoreKeeperApp: Sendable {
    public let configuration: ServerConfiguration
    public let database: Database
    public let store: PurchaseStore
    public let jobs: JobStore
    public let notifications: NotificationStore
    public let catalog: Catalog
    /// Where `transactionId` submissions are looked up; nil when no Apple key is configured.
    let transactionSource: (any TransactionSource)?
    /// The App Store Server API (production, then sandbox), when a key is configured:
    /// reconciliation's source.
    let appleAPI: EnvironmentFallback?
    /// How long a submission waits for Apple before the lookup becomes a durable job.
    let lookupDeadline: Duration
    let verifier: SignedDataVerifier
    let receiptVerifier: AppReceiptVerifier
    let authenticator: Authenticator
    /// The dashboard's signed sessions, keyed from the same secret keys.
    let dashboardSessions: DashboardSessions
    let limiter: RateLimiter
    /// The in-process local App Store of zero-config mode.
    public let localAppStore: LocalAppStore?
    /// Signs promotional offers and intro eligibility with the In-App Purchase key; nil when
    /// no key is configured (validation refuses a catalog with offers then).
    let offerSigner: OfferSigner?
    let logger: Logger
    public let metrics = ServerMetrics()
    /// Apple's rate for Set App Account Token, kept on our side (the job runner spends it).
    public let setAppAccountTokenRate = AppleCallRate()

    /// The trust set every verifier of this server was built from.
    public let trust: TrustPolicy
    public let rejectedProofs: RejectedProofStore
    /// Signs answers to account reads and purchases (`auth.responseSigningKey`; demo mode: generated).
    var responseSigner: ResponseSigner? = nil
    /// The keys in use now (`auth.responseSigningKeys`, or the one `auth.responseSigningKey`):
    /// the first signs, every one is published for app builds.
    let responseSigningKeys = ResponseSigningKeys()

    /// Re-reads the answer-signing keys from a freshly loaded configuration and switches to them
    /// at once — what `serve` does on SIGHUP, so a rotation needs no restart. Signing must have
    /// been on at start (turning it on or off takes a restart); on any problem the keys in use
    /// stay and the error says why.
    public func reloadResponseSigningKeys(from configuration: ServerConfiguration) throws -> String {
        guard responseSigner != nil else {
            throw ServerConfiguration.Invalid(
                key: "auth.responseSigningKeys", "answers were not signed at start: turning signing on takes a restart")
        }
        try configuration.validate()
        let signers = try configuration.signingKeySources.map {
            try ServerConfiguration.responseSigner($0, key: "auth.responseSigningKeys")
        }
        guard let current = signers.first else {
            throw ServerConfiguration.Invalid(
                key: "auth.responseSigningKeys", "no key is set: turning signing off takes a restart")
        }
        responseSigningKeys.set(signers)
        let others = signers.dropFirst().map(\.keyId)
        return "answers are signed with key \(current.keyId)"
            + (others.isEmpty ? "" : "; also published: \(others.joined(separator: ", "))")
    }

    /// The public halves (raw, base64) of the keys an app build should hold now: the one answers
    /// are signed with first. Empty when answers are not signed.
    public var responseSigningPublicKeys: [String] { responseSigningKeys.all.map(\.publicKeyBase64) }
    /// Whether a rejected proof was signed by a trusted or Apple root (`TrustPolicy.provenanceVerifiers`).
    var provenance: (signedData: SignedDataVerifier, receipts: AppReceiptVerifier)? = nil
    /// The last comparison of this server's clock with Apple's (after a 401).
    let clock = ClockState()
    /// Analytics' exchange rates (`analytics.rates` or `analytics.ratesFile`).
    public internal(set) var analyticsRates = AnalyticsRatesSource(configuration: ServerConfiguration())
    /// Analytics' "now" (what has ended, the stock metrics' last instant): the server's clock;
    /// tests running a store clock ahead set theirs.
    public internal(set) var analyticsClock: @Sendable () -> Date = { Date() }
    /// The server's time for what account reads show (whether an entitlement is active, a
    /// subscription the store went silent about); tests move it.
    public internal(set) var readClock: @Sendable () -> Date = { Date() }
    /// How SQLite reads a metric's rows (`PurchaseStore.scanPlan`); tests force its parts.
    var analyticsScan: @Sendable () -> AnalyticsScanPolicy = { AnalyticsScanPolicy() }
    /// How long exports hold back the newest rows (a row is dated when its request began and
    /// committed up to a request's deadline later): `limits.requestTimeoutSeconds` + 5 s unless set.
    var exportSettleSeconds: Double? = nil
    /// The listening socket's channel once the server runs (its options, for tests).
    let listening = Listening()
    /// The Google Play apps, by id (`apps` with `store: google_play`).
    public internal(set) var google: [String: GooglePlayApp] = [:]
    /// The built-in local Google Play (demo mode, `localGooglePlay.enabled`).
    public internal(set) var localGooglePlay: LocalGooglePlayServer? = nil
    /// The Stripe apps, by id (`apps` with `store: stripe`).
    public internal(set) var stripe: [String: StripeApp] = [:]
    /// The built-in local Stripe (demo mode, `localStripe.enabled`).
    public internal(set) var localStripe: LocalStripeServer? = nil

    /// Checks the configuration, opens the database, applies migrations and builds the
    /// verifiers from the trust policy.
    public static func make(
        _ configuration: ServerConfiguration, dataDirectory: URL = URL(fileURLWithPath: "storekeeper-data"),
        logger: Logger = LazyMetadataLogHandler.logger(label: "storekeeper"),
        transactionSource: (any TransactionSource)? = nil,
        lookupDeadline: Duration = .seconds(2),
        rateLimitClock: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }
    ) async throws -> StoreKeeperApp {
        try configuration.validate()
        var configuration = configuration
        var localAppStore: LocalAppStore?
        var localRoots: [[UInt8]]?
        let catalog = configuration.catalog ?? .demo
        let localDirectory = dataDirectory.appendingPathComponent("local-store", isDirectory: true)
        var offerKey = try configuration.offerKey()
        if offerKey == nil, configuration.usesLocalAppStore {
            // The local App Store issues the In-App Purchase key, as App Store Connect would.
            let local = try await onThreadOfItsOwn { try ServerAPIKeyStore.loadOrCreate(dataDirectory: localDirectory) }
            offerKey = (local.issuerId, local.keyId, local.privateKeyPEM)
        }
        let offerSigner = try offerKey.map {
            try OfferSigner(
                privateKeyPEM: $0.pem, keyId: $0.keyId, issuerId: $0.issuerId,
                bundleId: configuration.bundleId ?? "com.example.app")
        }
        if configuration.usesLocalAppStore {
            // Generating a PKI takes three RSA keys: not on Swift's pool, which has a thread a core.
            let pki = try await onThreadOfItsOwn { try PKIStore.loadOrCreate(dataDirectory: localDirectory) }
            // The local App Store sends its notifications to this server, as Apple would (not
            // with an ephemeral port, unknown until the server runs).
            let host =
                ["0.0.0.0", "::"].contains(configuration.host)
                ? "127.0.0.1" : configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
            localAppStore = LocalAppStore(
                configuration: .init(
                    bundleId: configuration.bundleId ?? "com.example.app",
                    appAppleId: configuration.appAppleId ?? 1_234_567_890, catalog: catalog,
                    notificationURL: configuration.port == 0
                        ? nil : "http://\(host):\(configuration.port)/v1/notifications/apple",
                    offerKeys: offerSigner.map {
                        [
                            .init(
                                issuerId: $0.issuerId, keyId: $0.keyId,
                                publicKeyPEM: $0.key.publicKey.pemRepresentation)
                        ]
                    } ?? []),
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
        if let replicaURL = configuration.readReplicaURL {
            // Analytics, exports and the dashboard's overview read here within the lag bound.
            database.attach(
                replica: ReadReplica(
                    database: try await Database.open(url: replicaURL, logger: logger),
                    maxLag: TimeInterval(configuration.maxReplicaLagSeconds)))
        }

        var secretKeys = configuration.secretKeys
        if secretKeys.isEmpty, configuration.mode == .demo {
            secretKeys = [try developmentKey(in: dataDirectory, logger: logger)]
        } else if secretKeys.isEmpty {
            logger.warning("no auth.secretKeys configured: operator and back-end endpoints cannot be reached")
        }
        var source = transactionSource
        var appleAPI: EnvironmentFallback?
        if source == nil, let pem = try configuration.serverAPIPrivateKeyPEM(),
            let issuerId = configuration.serverAPIIssuerId, let keyId = configuration.serverAPIKeyId
        {
            // One pair of clients per App Store app: the key is the team's, the token names the app.
            var perApp: [EnvironmentFallback] = []
            for bundleId in [trust.bundleId] + configuration.otherAppStoreApps.map(\.bundleId) {
                let credentials = ServerAPICredentials(
                    issuerId: issuerId, keyId: keyId, privateKeyPEM: pem, bundleId: bundleId)
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
                perApp.append(EnvironmentFallback(production: production, sandbox: sandbox))
            }
            let lookup = EnvironmentFallback(
                production: perApp[0].production, sandbox: perApp[0].sandbox, otherApps: Array(perApp.dropFirst()))
            source = ServerAPITransactionSource(lookup)
            appleAPI = lookup
        } else if source == nil, let localAppStore {
            source = LocalTransactionSource(store: localAppStore)
        }
        let localGooglePlay = try await Self.localGooglePlay(&configuration, catalog: catalog, logger: logger)
        let localStripe = Self.localStripe(&configuration, catalog: catalog, logger: logger)
        var stripeApps: [String: StripeApp] = [:]
        for app in configuration.stripeApps { stripeApps[app.id] = try StripeApp.make(app) }
        var google: [String: GooglePlayApp] = [:]
        for app in configuration.googlePlayApps { google[app.id] = try await GooglePlayApp.make(app) }
        var app = StoreKeeperApp(
            configuration: configuration, database: database,
            store: PurchaseStore(
                database: database, sharedAppleIdLimit: configuration.sharedAppleIdAccounts,
                apps: configuration.appDirectory),
            jobs: JobStore(database: database), notifications: NotificationStore(database: database), catalog: catalog,
            transactionSource: source, appleAPI: appleAPI,
            lookupDeadline: lookupDeadline,
            verifier: verifier, receiptVerifier: receiptVerifier,
            authenticator: await Authenticator(
                secretKeys: secretKeys, operatorKeys: configuration.operatorKeys,
                clientTokenSecret: configuration.clientTokenSecret,
                clientTokenMaxLifetimeSeconds: configuration.clientTokenMaxLifetimeSeconds,
                metricsToken: configuration.metricsToken),
            dashboardSessions: DashboardSessions(
                secretKeys: secretKeys, operatorKeys: configuration.operatorKeys,
                idleSeconds: configuration.dashboardSessionIdleSeconds,
                maximumSeconds: configuration.dashboardSessionMaxHours * 3600),
            limiter: RateLimiter(
                clientPerSecond: configuration.clientRequestsPerSecond,
                secretPerSecond: configuration.secretRequestsPerSecond, clock: rateLimitClock),
            localAppStore: localAppStore, offerSigner: offerSigner, logger: logger, trust: trust,
            rejectedProofs: RejectedProofStore(
                database: database, maxBytesPerDay: configuration.rejectedProofsMaxBytesPerDay,
                maxBytesTotal: configuration.rejectedProofsMaxBytesTotal),
            responseSigner: try responseSigner(configuration, dataDirectory: dataDirectory, logger: logger),
            provenance: try trust.provenanceVerifiers())
        app.google = google
        app.localGooglePlay = localGooglePlay
        app.stripe = stripeApps
        app.localStripe = localStripe
        app.responseSigningKeys.set(
            (app.responseSigner.map { [$0] } ?? [])
                + (try configuration.responseSigningKeys.dropFirst().map {
                    try ServerConfiguration.responseSigner($0, key: "auth.responseSigningKeys")
                }))
        app.analyticsRates = AnalyticsRatesSource(configuration: configuration)
        return app
    }

    /// Demo mode or `localGooglePlay.enabled`: the built-in local Google Play, mounted at
    /// `/local-google-play`, stands in for Google for the (first) Google Play app — created as
    /// `android` (`com.example.android`) when none is configured. Its service account and push
    /// signer are the ones trusted. Needs a known port (not 0): Google's client reaches it
    /// over HTTP like the real Google.
    static func localGooglePlay(_ configuration: inout ServerConfiguration, catalog: Catalog, logger: Logger)
        async throws -> LocalGooglePlayServer?
    {
        guard configuration.mode == .demo || configuration.localGooglePlayEnabled else { return nil }
        guard configuration.port != 0 else {
            logger.notice("local Google Play not started: it needs a fixed http.port")
            return nil
        }
        let host =
            ["0.0.0.0", "::"].contains(configuration.host)
            ? "127.0.0.1" : configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
        var app =
            configuration.googlePlayApps.first
            ?? GooglePlayAppConfiguration(id: "android", packageName: "com.example.android")
        let store = LocalGooglePlay(configuration: .init(packageName: app.packageName, catalog: catalog))
        let server = try await LocalGooglePlayServer(store: store)
        let base = "http://\(host):\(configuration.port)/local-google-play"
        app.serviceAccountKey = server.serviceAccountKey(baseURL: base)
        app.serviceAccountKeyFile = nil
        app.apiBaseURL = base
        app.pushAudience = "http://\(host):\(configuration.port)/v1/notifications/google"
        app.pushServiceAccount = LocalGooglePlayServer.pushServiceAccount
        app.pushCertificatesURL = base + "/oauth2/v3/certs"
        if configuration.googlePlayApps.isEmpty {
            configuration.googlePlayApps = [app]
        } else {
            configuration.googlePlayApps[0] = app
        }
        logger.notice(
            "local Google Play: Google Play app '\(app.id)' (\(app.packageName)) is served by the built-in fake at \(base)"
        )
        return server
    }

    /// `auth.responseSigningKey`, or in demo mode a key generated once into the data directory.
    static func responseSigner(_ configuration: ServerConfiguration, dataDirectory: URL, logger: Logger) throws
        -> ResponseSigner?
    {
        if let first = configuration.signingKeySources.first {
            return try ServerConfiguration.responseSigner(
                first,
                key: configuration.responseSigningKeys.isEmpty ? "auth.responseSigningKey" : "auth.responseSigningKeys")
        }
        guard configuration.mode == .demo else { return nil }
        let file = dataDirectory.appendingPathComponent("response-signing-key.pem")
        if let existing = FileManager.default.contents(atPath: file.path) {
            return ResponseSigner(key: try ResponseSigner.key(pem: String(decoding: existing, as: UTF8.self)))
        }
        let key = Curve25519.Signing.PrivateKey()
        try FileManager.default.createDirectory(at: dataDirectory, withIntermediateDirectories: true)
        do {
            try KeyFiles.writePrivate(Data(ResponseSigner.pem(key).utf8), to: file.path)
        } catch {
            throw ServerConfiguration.Invalid(key: "auth.responseSigningKey", "cannot write \(file.path)")
        }
        let signer = ResponseSigner(key: key)
        logger.notice(
            "demo mode: generated a response signing key into \(file.path); its public key (for the app): \(signer.publicKeyBase64)"
        )
        return signer
    }

    /// The database did not answer within `database.startupTimeoutSeconds`: `serve` exits non-zero.
    public struct StartupFailure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Applies migrations, waiting for the database up to `database.startupTimeoutSeconds`
    /// (a warning every 5 s), then gives up with a clear message. Only reaching the database is
    /// bounded by 5 s a try; the migrations themselves take as long as they take (an index on a
    /// large table), each under its own long deadline.
    static func waitForDatabase(_ database: Database, configuration: ServerConfiguration, logger: Logger)
        async throws
    {
        let started = ContinuousClock.now
        let limit = Duration.seconds(configuration.databaseStartupTimeoutSeconds)
        var lastWarning = started
        while true {
            do {
                try await database.ping(deadline: .seconds(5))
                try await Migrations.run(on: database)
                return
            } catch let error where StorageUnavailable.classify(error) != nil {
                // Why, in PostgreSQL's own terms: a refusal waiting cannot cure (a wrong password,
                // a missing database, TLS) ends the start now, said once; else it is waited for.
                let problem = await Database.connectionProblem(url: configuration.databaseURL, deadline: .seconds(5))
                if let problem, problem.isPermanent {
                    try? await database.close()
                    throw StartupFailure(description: "the database refused this server: \(problem.message)")
                }
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
                        metadata: [
                            "waited": "\(waited.components.seconds) s", "cause": "\(problem?.message ?? "\(error)")",
                        ])
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
        do {
            try KeyFiles.writePrivate(Data(key.utf8), to: keyFile.path)
        } catch {
            throw ServerConfiguration.Invalid(key: "auth.secretKeys", "cannot write \(keyFile.path)")
        }
        logger.notice(
            "demo mode: generated a development secret key (not for production) into \(keyFile.path) — read it with: cat \(keyFile.path)"
        )
        return key
    }

    // MARK: Application

    /// docs/api.md's routes behind the request deadline: what the server (and the tests) run.
    public func router() -> DeadlineRouter<StoreKeeperContext> {
        DeadlineRouter(
            router: routes(), limit: .seconds(configuration.requestTimeoutSeconds),
            maxInFlight: configuration.maxInFlightRequests, metrics: metrics)
    }

    /// The anomaly queue's handlers (the API's and the dashboard's).
    var anomaliesController: AnomaliesController {
        AnomaliesController(store: store, catalog: catalog, maxBodyBytes: maxBodyBytes)
    }

    /// `/healthz`, `/metrics`, `/openapi.json`, `GET /v1/status`, `/v1/revenue`, `/v1/audit`.
    var operationsController: OperationsController {
        OperationsController(
            database: database, store: store, jobs: jobs, notifications: notifications, authenticator: authenticator,
            metrics: metrics, smallBusinessProgram: configuration.smallBusinessProgram,
            status: { [self] in StatusJSON(self) })
    }

    func routes() -> Router<StoreKeeperContext> {
        let router = Router(context: StoreKeeperContext.self)
        router.add(middleware: RequestObservation(metrics: metrics))
        router.add(middleware: ErrorMiddleware())
        // One controller per feature, each owning its routes (docs/api.md's paths). Everything
        // under /v1 is authenticated and rate limited once, by `Authenticate`.
        operationsController.addRoutes(to: router)
        NotificationsController(
            verifier: verifier, notifications: notifications, metrics: metrics, logger: logger,
            maxBodyBytes: maxBodyBytes
        ).addRoutes(to: router)
        GoogleNotificationsController(
            google: google, database: database, maxBodyBytes: configuration.maxBodyBytes, metrics: metrics,
            logger: logger
        ).addRoutes(to: router)
        StripeController(stripe: stripePayments).addWebhook(to: router)
        retentionController.addRoutes(to: router)
        let authenticate = Authenticate(authenticator: authenticator, limiter: limiter)
        let v1 = router.group("v1").add(middleware: authenticate).add(
            middleware: KnownQueryParameters<StoreKeeperContext>())
        // Account reads and purchases: signed answers when a response signing key is set, 401s
        // and 429s included (the signing middleware runs before authentication).
        let signed =
            responseSigner.map { _ in
                router.group("v1").add(
                    middleware: SignResponses(keys: responseSigningKeys, maxBodyBytes: configuration.maxBodyBytes)
                )
                .add(middleware: authenticate).add(middleware: KnownQueryParameters<StoreKeeperContext>())
            } ?? v1
        operationsController.addAPIRoutes(to: v1)
        OrdersController(
            store: store, database: database, catalog: catalog, configuration: configuration,
            offerSigner: offerSigner, checkouts: checkouts, externalTokens: externalTokens
        ).addRoutes(to: v1)
        PurchasesController(purchases: purchases).addRoutes(to: signed)
        AccountsController(book: accountBook, store: store, maxBodyBytes: maxBodyBytes).addRoutes(to: signed)
        anomaliesController.addRoutes(to: v1)
        RejectedProofsController(
            store: rejectedProofs, maxBodyBytes: maxBodyBytes,
            reverify: { [purchases] since, code in try await purchases.reverify(since: since, code: code) }
        ).addRoutes(to: v1)
        WebhooksController(
            outbox: OutboxStore(database: database), audit: store.anomalies, maxBodyBytes: maxBodyBytes
        ).addRoutes(to: v1)
        SupportController(
            support: store.support, accounts: store.accounts, transactions: store.transactions, grants: grants,
            maxBodyBytes: maxBodyBytes,
            extend: { [self] original, body, caller in try await extend(original: original, body: body, caller: caller)
            },
            appTransaction: { [self] id in try await appTransaction(id) }
        ).addRoutes(to: v1)
        TransactionsController(actions: supportActions, maxBodyBytes: maxBodyBytes).addRoutes(to: v1)
        StripeController(stripe: stripePayments).addRoutes(to: v1)
        retentionController.addAPIRoutes(to: v1)
        analyticsController.addRoutes(to: v1)
        if configuration.dashboardEnabled {
            DashboardController(
                dashboardSessions: dashboardSessions, store: store, database: database, configuration: configuration,
                notifications: notifications, catalog: catalog, supportActions: supportActions,
                accountBook: accountBook, grants: grants, exportController: exportController,
                analyticsController: analyticsController, anomaliesController: anomaliesController,
                extend: { [self] original, body, caller in
                    try await extend(original: original, body: body, caller: caller)
                },
                appTransactionFacts: { [self] id in try await appTransactionFacts(id) }
            ).addRoutes(to: router)
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
        if let localStripe {
            let group = router.group("local-stripe")
            localStripe.addRoutes(to: group)
            if configuration.mode == .demo {
                localStripe.addControl(to: group.group("control"))
            } else {
                localStripe.addControl(
                    to: group.group("control").add(middleware: SecretKeyRequired(authenticator: authenticator)))
            }
        }
        if let localGooglePlay {
            let group = router.group("local-google-play")
            localGooglePlay.addGoogleRoutes(to: group)
            if configuration.mode == .demo {
                localGooglePlay.addControl(to: group.group("control"))
            } else {
                localGooglePlay.addControl(
                    to: group.group("control").add(middleware: SecretKeyRequired(authenticator: authenticator)))
            }
        }
        return router
    }

    /// `runJobs: false` leaves the job queue to a runner the caller starts (`bench
    /// --notifications` measures accepting and applying apart).
    public func application(
        runJobs: Bool = true, onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    ) -> some ApplicationProtocol {
        var services: [any Service] = [
            MinuteDuties.orderExpiry(store, ttl: configuration.orderTTL, logger: logger),
            MinuteDuties.webLapses(store, catalog: catalog, logger: logger),
            MinuteDuties.silentSubscriptions(store, catalog: catalog, logger: logger),
            Housekeeping(
                rejectedProofs: rejectedProofs, retentionDays: configuration.rejectedProofsRetentionDays,
                outbox: OutboxStore(database: database), logger: logger, orders: store,
                orderRetention: Double(configuration.orderRetentionDays) * 86_400,
                externalTokens: ExternalPurchaseStore(database: database),
                unconfirmedTokenRetention: Double(configuration.unconfirmedExternalTokenDays) * 86_400,
                stripeEvents: stripe.isEmpty ? nil : StripeStore(database: database)),
        ]
        if configuration.finishTransactions && transactionSource != nil {
            services.append(MinuteDuties.finishTransactions(store, after: 600, logger: logger))
        }
        if !google.isEmpty { services.append(MinuteDuties.googleHousekeeping(JobRunner(app: self), logger: logger)) }
        if runJobs { services.append(JobRunner(app: self)) }
        if let localAppStore { services.append(NotificationSender(store: localAppStore)) }
        if let localGooglePlay, let app = configuration.googlePlayApps.first, let audience = app.pushAudience {
            services.append(
                localGooglePlay.pushSender(
                    endpoint: audience, audience: audience, serviceAccount: LocalGooglePlayServer.pushServiceAccount))
        }
        if let localStripe { services.append(LocalStripeServer.Sender(server: localStripe)) }
        if !stripe.isEmpty { services.append(StripeReconcileService(app: self)) }
        if appleAPI != nil { services.append(ReconcileService(app: self)) }
        if database.kind == .sqlite { services.append(WALCheckpointer(database: database, logger: logger)) }
        if let url = configuration.webhookURL, let secret = configuration.webhookSecret {
            services.append(
                WebhookSender(
                    outbox: OutboxStore(database: database), url: url, secret: secret, logger: logger,
                    maxAttemptAge: TimeInterval(configuration.webhookMaxAttemptHours) * 3600))
        }
        // Shed on the event loop, before any task or body read (LoadShedder).
        let inFlight = InFlightRequests(limit: configuration.maxInFlightRequests, metrics: metrics)
        return Application(
            router: router(),
            // Idle keep-alive connections, and requests whose head or body stalls, are closed
            // after http.idleTimeoutSeconds: slow or silent sockets cannot pile up.
            // Each connection's requests are handled on its event loop (EventLoopPinned).
            server: HTTPServerBuilder { responder in
                EventLoopPinned(
                    inner: HTTP1Channel(
                        responder: responder,
                        configuration: .init(
                            additionalChannelHandlers: [LoadShedder(inFlight)],
                            idleTimeout: .seconds(Int64(configuration.idleTimeoutSeconds)))))
            },
            // A deep accept queue (the kernel caps it at net.core.somaxconn): with Hummingbird's
            // 256, a burst of thousands of connections overflowed it and the kernel dropped
            // handshakes, so requests waited 1–7 s for SYN-ACK retransmissions before the server
            // even saw them — no load shedding can answer what it never reads (BENCHMARKS.md).
            configuration: .init(
                address: .hostname(configuration.host, port: configuration.port), serverName: "StoreKeeper",
                backlog: 4096),
            services: services,
            onServerRunning: { channel in
                await Self.acceptInBatches(channel)
                listening.channel.withLock { $0 = channel }
                await onServerRunning(channel.localAddress?.port ?? configuration.port)
            },
            logger: logger)
    }

}

extension StoreKeeperApp {
    /// Connections accepted up to `acceptBatch` at a time. The listening socket shares its event
    /// loop with the connections it serves, and NIO accepts at most 4 per read by default; under a
    /// flood each read waits for a whole pass of the loop over thousands of busy sockets, and
    /// the rest wait in the kernel's accept queue, their requests unread: measured at 3,000
    /// connections, the queue drained at ~40 connections/s and p99 was 8–9 s (BENCHMARKS.md).
    static let acceptBatch: UInt = 256

    static func acceptInBatches(_ channel: any Channel) async {
        try? await channel.setOption(ChannelOptions.maxMessagesPerRead, value: acceptBatch)
    }

    final class Listening: Sendable {
        let channel = Mutex<(any Channel)?>(nil)
    }
}

/// Blocking work (key generation, file writes with fsync) on a thread of its own, awaited
/// without holding one of Swift's pool threads, which are as many as the cores.
func onThreadOfItsOwn<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try work() }) }
    }
}
