import AppStoreModels
import AppStoreVerification
import Configuration
import Crypto
import Foundation
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Yams

/// Everything `storekeeper serve` reads, with docs/api.md's keys. One file (JSON or YAML) and the
/// environment (`apple.bundleId` ↔ `APPLE_BUNDLEID`); the environment wins.
public struct ServerConfiguration: Sendable {
    /// Demo mode runs and trusts the built-in local App Store; it is chosen only when there is
    /// no configuration at all. Any configuration is `configured`: Apple's roots, no fake store.
    public enum Mode: String, Sendable {
        case demo
        case configured
    }

    /// Built programmatically (tests, embedding), a configuration is `configured`: production is
    /// the default, and a caller who wants the local App Store says so.
    public var mode: Mode = .configured
    public var host = "127.0.0.1"
    public var port = 8080
    public var databaseURL = "sqlite:storekeeper.sqlite"
    /// `database.readReplicaURL`: a PostgreSQL streaming replica for analytics, exports and the
    /// dashboard's overview; `database.maxReplicaLagSeconds` past which they read the primary.
    public var readReplicaURL: String?
    public var maxReplicaLagSeconds = 10
    public var bundleId: String?
    public var appAppleId: Int64?
    public var environments: Set<AppStoreEnvironment> = [.production, .sandbox]
    /// PEM/DER files; empty means Apple's roots (G3 and Apple Inc. Root).
    public var rootCertificateFiles: [String] = []
    public var serverAPIIssuerId: String?
    public var serverAPIKeyId: String?
    public var serverAPIPrivateKeyFile: String?
    public var serverAPIBaseURL: String?
    public var verifyReceiptProductionURL: String?
    public var verifyReceiptSandboxURL: String?
    public var sharedSecret: String?
    public var secretKeys: [String] = []
    /// `auth.keys`: scoped operator keys (`auth.secretKeys` are admin keys of every app).
    public var operatorKeys: [OperatorKey] = []
    public var clientTokenSecret: String?
    /// Ed25519 private key (PEM, or the path of a PEM file) that signs answers to account reads
    /// and purchases (`StoreKeeper-Signature`); generated in demo mode.
    public var responseSigningKey: String?
    /// `auth.responseSigningKeys`: several keys (PEM or paths) — the first signs, every one is
    /// published in `GET /v1/status` so app builds can carry the next key before a rotation.
    /// `auth.responseSigningKey` (one key) stays accepted.
    public var responseSigningKeys: [String] = []

    /// The signing keys as configured, the signing one first (either key spelling).
    public var signingKeySources: [String] {
        responseSigningKeys.isEmpty ? (responseSigningKey.map { [$0] } ?? []) : responseSigningKeys
    }
    public var catalog: Catalog?
    public var maxBodyBytes = 1_048_576
    /// Unpaid, unexpired orders an account may hold (409 `too_many_open_orders` above).
    public var maxOpenOrdersPerAccount = 100
    /// Orders an account may create in 24 hours, whatever became of them (cancelled and expired
    /// included): 429 `too_many_orders` above.
    public var maxOrdersPerAccountPerDay = 500
    /// Cancelled and expired unpaid orders are deleted this many days after their creation.
    public var orderRetentionDays = 90
    /// External purchase tokens Apple has not yet reported that one account may register.
    public var maxUnconfirmedExternalTokensPerAccount = 20
    /// A registered token Apple has not reported within this many days is deleted.
    public var unconfirmedExternalTokenDays = 7
    /// Unconfirmed external purchase tokens the whole server keeps (503 above).
    public var maxUnconfirmedExternalTokens = 100_000
    /// Requests answered at once; above, 503 `overloaded`.
    public var maxInFlightRequests = 512
    /// `serve` waits this long for the database at start, then exits non-zero.
    public var databaseStartupTimeoutSeconds = 60
    /// SIGTERM: in-flight work gets this long, then the process exits.
    public var shutdownGraceSeconds = 10
    /// Idle connections, and requests whose head is not complete, are closed after this.
    public var idleTimeoutSeconds = 30
    /// Client tokens may expire at most this far ahead.
    public var clientTokenMaxLifetimeSeconds = 86_400
    /// A bearer token for `/metrics` only (besides the secret keys).
    public var metricsToken: String?
    public var clientRequestsPerSecond = 20
    public var secretRequestsPerSecond: Int?
    /// Longest a request may take before it is answered 503 (retryable).
    public var requestTimeoutSeconds = 30
    public var ownershipPolicy: OwnershipPolicy = .firstBinder
    public var orderTTL: TimeInterval = 24 * 3600
    public var webhookURL: String?
    public var webhookSecret: String?
    /// Run and trust the built-in local App Store beside a configuration (tests, staging).
    public var localAppStoreEnabled = false
    /// `localGooglePlay.enabled`: the built-in local Google Play runs at `/local-google-play`
    /// and is trusted (its service account and push signer), like the local App Store.
    public var localGooglePlayEnabled = false
    /// Stripe apps (`apps` entries with `store: stripe`).
    public var stripeApps: [StripeAppConfiguration] = []
    /// The built-in local Stripe (`localStripe.enabled`; always in demo mode).
    public var localStripeEnabled = false
    /// Google Play apps (`apps` entries with `store: google_play`).
    public var googlePlayApps: [GooglePlayAppConfiguration] = []
    /// The App Store app's id (`apps` entry with `store: app_store`; default its bundle id).
    public var appStoreAppId: String?
    /// The further App Store apps (`apps` entries after the first `store: app_store`).
    public var otherAppStoreApps: [AppStoreAppConfiguration] = []
    /// False when `apps` lists only Google Play apps.
    public var hasAppStoreApp = true
    /// How long proofs that failed verification are kept for re-verification.
    public var rejectedProofsRetentionDays = 90
    /// Bytes of rejected proofs stored per UTC day and in all (`RejectedProofStore`).
    public var rejectedProofsMaxBytesPerDay = 64 * 1_048_576
    public var rejectedProofsMaxBytesTotal = 1_024 * 1_048_576
    /// Answer Apple's CONSUMPTION_REQUEST with Send Consumption Information (the customer
    /// consented in the refund request; needs the Server API key).
    public var consumptionEnabled = false
    /// Set App Account Token when an account claims a purchase made outside the app (needs the
    /// Server API key; docs/external-purchases.md).
    public var setAppAccountToken = true
    /// Finish Transaction on the server after each delivery (for apps that never call
    /// `finish()` themselves; off by default: the SDK finishes on the device).
    public var finishTransactions = false
    /// External Purchase Server API reports: on when the app sells outside the App Store
    /// under an external purchase entitlement.
    public var externalPurchaseReporting = false
    /// Enrolled in Apple's App Store Small Business Program: 85 % of every price is kept.
    public var smallBusinessProgram = false
    /// Analytics (docs/analytics.md): the time zone of days, weeks and months; the reporting
    /// currency; the rates converting the others into it (inline, or a JSON file re-read when
    /// it changes).
    public var analyticsTimeZone = TimeZone(identifier: "UTC")!
    public var analyticsCurrency = "USD"
    public var analyticsRates: [String: Double] = [:]
    public var analyticsRatesFile: String?
    /// A webhook event still refused after this long moves to the dead-letter list.
    public var webhookMaxAttemptHours = 72
    /// The In-App Purchase key that signs offers (default: the `apple.serverAPI` key).
    public var offersIssuerId: String?
    public var offersKeyId: String?
    public var offersPrivateKeyFile: String?
    /// Who decides introductory offers: Apple (per Apple ID), or StoreKeeper once per account.
    public enum IntroductoryOffers: String, Sendable {
        case apple
        case oncePerAccount = "once_per_account"
    }
    public var introductoryOffers: IntroductoryOffers = .apple
    /// One Apple Account on more app accounts than this raises `shared_apple_id`.
    public var sharedAppleIdAccounts = 3
    /// The operator dashboard at `/dashboard` (sign-in with a secret key).
    public var dashboardEnabled = true
    /// A dashboard session ends after this long without a request…
    public var dashboardSessionIdleSeconds = 1_800
    /// …and this long after sign-in in any case.
    public var dashboardSessionMaxHours = 12

    public init() {}

    /// Whether the built-in local App Store runs, is mounted at `/local-app-store` and is trusted.
    public var usesLocalAppStore: Bool { mode == .demo || localAppStoreEnabled }

    /// A configuration problem, naming the key (`serve` and `config check` exit 2 with it).
    public struct Invalid: Error, CustomStringConvertible, Sendable {
        /// The configuration key (or file) at fault.
        public var key: String
        public var message: String

        public init(key: String, _ message: String) {
            self.key = key
            self.message = message
        }

        public var description: String { "\(key): \(message)" }
    }

    /// Every scalar (or list-of-scalars) key this server reads.
    static let keys = [
        "http.host", "http.port", "http.idleTimeoutSeconds", "http.shutdownGraceSeconds", "database.url",
        "database.readReplicaURL", "database.maxReplicaLagSeconds",
        "database.startupTimeoutSeconds", "apple.bundleId", "apple.appAppleId", "apple.environments",
        "apple.rootCertificates", "apple.serverAPI.issuerId", "apple.serverAPI.keyId", "apple.serverAPI.privateKeyFile",
        "apple.serverAPI.baseURL", "apple.verifyReceipt.productionURL", "apple.verifyReceipt.sandboxURL",
        "apple.sharedSecret", "apple.offers.keyId", "apple.offers.privateKeyFile", "apple.offers.issuerId",
        "auth.secretKeys", "auth.clientTokenSecret", "auth.clientTokenMaxLifetimeSeconds", "auth.metricsToken",
        "auth.responseSigningKey", "auth.responseSigningKeys",
        "catalog.file", "limits.maxBodyBytes", "limits.maxOpenOrdersPerAccount", "limits.maxInFlightRequests",
        "limits.maxOrdersPerAccountPerDay", "limits.orderRetentionDays",
        "limits.maxUnconfirmedExternalTokensPerAccount",
        "limits.unconfirmedExternalTokenDays", "limits.maxUnconfirmedExternalTokens",
        "limits.clientRequestsPerSecond", "limits.secretRequestsPerSecond", "limits.requestTimeoutSeconds",
        "ownership.policy", "webhooks.url", "webhooks.secret", "localAppStore.enabled",
        "rejectedProofs.retentionDays", "rejectedProofs.maxBytesPerDay", "rejectedProofs.maxBytesTotal",
        "offers.introductoryOffers", "apple.consumption.enabled", "apple.setAppAccountToken",
        "apple.finishTransactions",
        "apple.externalPurchase.reporting",
        "webhooks.maxAttemptHours", "apple.smallBusinessProgram", "offers.sharedAppleIdAccounts",
        "dashboard.enabled", "dashboard.sessionIdleSeconds", "dashboard.sessionMaxHours", "localGooglePlay.enabled",
        "localStripe.enabled",
        "analytics.timeZone", "analytics.currency", "analytics.ratesFile",
    ]
    /// Keys whose value is a structure read by its own parser (the inline catalog).
    static let structuredKeys = [
        "catalog.products", "catalog.retention", "catalog.refunds", "apps", "analytics.rates", "auth.keys",
    ]
    static let secretKeyNames: Set<String> = [
        "auth.secretKeys", "auth.clientTokenSecret", "auth.metricsToken", "apple.sharedSecret", "webhooks.secret",
        "auth.responseSigningKey", "auth.responseSigningKeys",
    ]

    /// The two environment names of a key: docs/api.md's (`APPLE_BUNDLEID`) and swift-configuration's
    /// camel-case split (`APPLE_BUNDLE_ID`).
    static func environmentNames(_ key: String) -> (apiMd: String, split: String) {
        let apiMd = key.uppercased().replacingOccurrences(of: ".", with: "_")
        var split = ""
        for component in key.split(separator: ".") {
            if !split.isEmpty { split += "_" }
            var previous: Character?
            for char in component {
                if let previous, previous.isLowercase, char.isUppercase { split += "_" }
                split += String(char).uppercased()
                previous = char
            }
        }
        return (apiMd, split)
    }

    /// docs/api.md names environment variables by upper-casing the key (`apple.bundleId` ↔
    /// `APPLE_BUNDLEID`); swift-configuration splits camelCase (`APPLE_BUNDLE_ID`). Both work.
    static func aliasingAPIMdNames(in environment: [String: String]) -> [String: String] {
        var result = environment
        for key in keys {
            let names = environmentNames(key)
            if let value = environment[names.apiMd], environment[names.split] == nil { result[names.split] = value }
        }
        return result
    }

    /// Demo mode is chosen only when nothing is configured: no file and no `APPLE_*` variable.
    static func isDemo(file: String?, environment: [String: String]) -> Bool {
        file == nil && !environment.keys.contains { $0.uppercased().hasPrefix("APPLE_") }
    }

    /// A YAML node as plain values (text, numbers, flags, lists, objects keyed by text). Yams'
    /// own `load` traps on a key that is not text (`{ {a: 1}: 2 }`, found by the `config` fuzz
    /// target): a bad file must be an error naming it, never a crash.
    static func plainValue(_ node: Node, key: String, depth: Int) throws -> Any {
        let named = key.isEmpty ? "configuration file" : key
        guard depth < 64 else { throw Invalid(key: named, "nested more than 64 levels deep") }
        switch node {
        case .scalar: return node.any
        case .sequence(let sequence):
            return try sequence.map { try plainValue($0, key: key, depth: depth + 1) }
        case .mapping(let mapping):
            var object: [String: Any] = [:]
            for (name, value) in mapping {
                guard case .scalar(let scalar) = name else {
                    throw Invalid(key: named, "every key must be text (a list or an object is used as a key)")
                }
                let path = key.isEmpty ? scalar.string : "\(key).\(scalar.string)"
                object[scalar.string] = try plainValue(value, key: path, depth: depth + 1)
            }
            return object
        case .alias:
            throw Invalid(key: named, "YAML aliases are not supported")
        }
    }

    /// Reads `file` (optional) and the process environment, then checks the result.
    public static func load(file: String?, environment: [String: String] = ProcessInfo.processInfo.environment)
        async throws -> ServerConfiguration
    {
        guard let file else { return try await load(contents: nil, environment: environment) }
        guard let data = FileManager.default.contents(atPath: file) else {
            throw Invalid(key: file, "the configuration file cannot be read")
        }
        return try await load(contents: data, name: file, environment: environment)
    }

    /// The same from a configuration file's bytes (`name` is how errors refer to it): the
    /// loader the `config` fuzz target feeds hostile bytes to.
    public static func load(
        contents: Data?, name: String = "configuration", environment: [String: String]
    ) async throws -> ServerConfiguration {
        let file = contents == nil ? nil : name
        var configuration = ServerConfiguration()
        configuration.mode = isDemo(file: file, environment: environment) ? .demo : .configured
        var tree: [String: Any] = [:]
        if let file, let data = contents {
            // YAML is a superset of JSON: one parser for both, so the inline catalog (a list of
            // objects, which swift-configuration's file providers do not take) is reachable.
            let parsed: Any?
            do {
                parsed = try Yams.compose(yaml: String(decoding: data, as: UTF8.self)).map {
                    try plainValue($0, key: "", depth: 0)
                }
            } catch let invalid as Invalid {
                throw invalid
            } catch {
                throw Invalid(key: file, "not valid JSON or YAML (\(String(describing: error).prefix(200)))")
            }
            guard let object = parsed as? [String: Any] else {
                throw Invalid(key: file, "the configuration file must hold a JSON or YAML object")
            }
            tree = object
        }
        var flat: [String: ConfigValue] = [:]
        var structured: [String: Any] = [:]
        try flatten(tree, prefix: "", into: &flat, structured: &structured)
        for key in flat.keys where !keys.contains(key) {
            throw Invalid(key: key, "unknown key\(suggestion(for: key))")
        }
        for variable in environment.keys where variable.uppercased().hasPrefix("APPLE_") {
            let known = keys.contains { key in
                let names = environmentNames(key)
                return variable == names.apiMd || variable == names.split
            }
            if !known {
                throw Invalid(
                    key: variable, "unknown environment variable\(suggestion(for: variable, environment: true))")
            }
        }

        var values: [AbsoluteConfigKey: ConfigValue] = [:]
        for (key, value) in flat { values[AbsoluteConfigKey(key.split(separator: ".").map(String.init))] = value }
        let aliased = aliasingAPIMdNames(in: environment)
        let reader = ConfigReader(providers: [
            EnvironmentVariablesProvider(environmentVariables: aliased),
            InMemoryProvider(name: file, values: values),
        ])
        let source = Source(reader: reader, file: flat, environment: aliased)
        try configuration.read(source)
        try configuration.readApps(structured["apps"])
        try configuration.readOperatorKeys(structured["auth.keys"])
        try configuration.readAnalyticsRates(structured["analytics.rates"])

        do {
            if let catalogFile = try source.string("catalog.file") {
                if structured["catalog.products"] != nil {
                    throw Invalid(key: "catalog.products", "give either catalog.file or an inline catalog, not both")
                }
                configuration.catalog = try Catalog.load(path: catalogFile)
            } else if let products = structured["catalog.products"] {
                var inline: [String: Any] = ["products": products]
                if let retention = structured["catalog.retention"] { inline["retention"] = retention }
                if let refunds = structured["catalog.refunds"] { inline["refunds"] = refunds }
                configuration.catalog = try Catalog.parse(yaml: try Yams.dump(object: inline))
            }
        } catch let error as CatalogError {
            let key = structured["catalog.products"] != nil ? "catalog.products" : "catalog.file"
            throw Invalid(key: key, error.description)
        }
        try configuration.validate()
        return configuration
    }

    /// Typed reads: a key that is present with the wrong type is an error naming it, never a
    /// silent default.
    struct Source {
        let reader: ConfigReader
        let file: [String: ConfigValue]
        let environment: [String: String]

        func present(_ key: String) -> Bool {
            file[key] != nil || environment[ServerConfiguration.environmentNames(key).split] != nil
        }

        func string(_ key: String) throws -> String? {
            guard present(key) else { return nil }
            let secret = ServerConfiguration.secretKeyNames.contains(key)
            if let value = try? reader.requiredString(forKey: ConfigKey(key), isSecret: secret) { return value }
            if case .int(let number)? = file[key]?.content { return String(number) }
            throw Invalid(key: key, "must be a string")
        }

        func int(_ key: String) throws -> Int? {
            guard present(key) else { return nil }
            if let value = try? reader.requiredInt(forKey: ConfigKey(key)) { return value }
            if case .string(let text)? = file[key]?.content, let value = Int(text) { return value }
            throw Invalid(key: key, "must be an integer")
        }

        func bool(_ key: String) throws -> Bool? {
            guard present(key) else { return nil }
            guard let value = try? reader.requiredBool(forKey: ConfigKey(key)) else {
                throw Invalid(key: key, "must be true or false")
            }
            return value
        }

        func strings(_ key: String) throws -> [String]? {
            guard present(key) else { return nil }
            let secret = ServerConfiguration.secretKeyNames.contains(key)
            if let value = try? reader.requiredStringArray(forKey: ConfigKey(key), isSecret: secret) { return value }
            if let value = try? reader.requiredString(forKey: ConfigKey(key), isSecret: secret) {
                return value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            }
            throw Invalid(key: key, "must be a list of strings")
        }
    }

    mutating func read(_ source: Source) throws {
        host = try source.string("http.host") ?? host
        port = try source.int("http.port") ?? port
        databaseURL = try source.string("database.url") ?? databaseURL
        readReplicaURL = try source.string("database.readReplicaURL")
        maxReplicaLagSeconds = try source.int("database.maxReplicaLagSeconds") ?? maxReplicaLagSeconds
        bundleId = try source.string("apple.bundleId")
        if let value = try source.string("apple.appAppleId") {
            guard let id = Int64(value), id > 0 else { throw Invalid(key: "apple.appAppleId", "must be a number") }
            appAppleId = id
        }
        if let listed = try source.strings("apple.environments") {
            let parsed = listed.map { AppStoreEnvironment(rawValue: $0.trimmingCharacters(in: .whitespaces)) }
            guard !parsed.isEmpty, parsed.allSatisfy({ $0 == .production || $0 == .sandbox }) else {
                throw Invalid(key: "apple.environments", "must list Production and/or Sandbox")
            }
            environments = Set(parsed)
        }
        rootCertificateFiles = try source.strings("apple.rootCertificates") ?? []
        serverAPIIssuerId = try source.string("apple.serverAPI.issuerId")
        serverAPIKeyId = try source.string("apple.serverAPI.keyId")
        serverAPIPrivateKeyFile = try source.string("apple.serverAPI.privateKeyFile")
        serverAPIBaseURL = try source.string("apple.serverAPI.baseURL")
        verifyReceiptProductionURL = try source.string("apple.verifyReceipt.productionURL")
        verifyReceiptSandboxURL = try source.string("apple.verifyReceipt.sandboxURL")
        sharedSecret = try source.string("apple.sharedSecret")
        secretKeys = try source.strings("auth.secretKeys") ?? []
        clientTokenSecret = try source.string("auth.clientTokenSecret")
        responseSigningKey = try source.string("auth.responseSigningKey")
        responseSigningKeys = try source.strings("auth.responseSigningKeys") ?? []
        maxBodyBytes = try source.int("limits.maxBodyBytes") ?? maxBodyBytes
        maxOpenOrdersPerAccount = try source.int("limits.maxOpenOrdersPerAccount") ?? maxOpenOrdersPerAccount
        maxOrdersPerAccountPerDay = try source.int("limits.maxOrdersPerAccountPerDay") ?? maxOrdersPerAccountPerDay
        orderRetentionDays = try source.int("limits.orderRetentionDays") ?? orderRetentionDays
        maxUnconfirmedExternalTokensPerAccount =
            try source.int("limits.maxUnconfirmedExternalTokensPerAccount") ?? maxUnconfirmedExternalTokensPerAccount
        unconfirmedExternalTokenDays =
            try source.int("limits.unconfirmedExternalTokenDays") ?? unconfirmedExternalTokenDays
        maxUnconfirmedExternalTokens =
            try source.int("limits.maxUnconfirmedExternalTokens") ?? maxUnconfirmedExternalTokens
        idleTimeoutSeconds = try source.int("http.idleTimeoutSeconds") ?? idleTimeoutSeconds
        maxInFlightRequests = try source.int("limits.maxInFlightRequests") ?? maxInFlightRequests
        databaseStartupTimeoutSeconds =
            try source.int("database.startupTimeoutSeconds") ?? databaseStartupTimeoutSeconds
        shutdownGraceSeconds = try source.int("http.shutdownGraceSeconds") ?? shutdownGraceSeconds
        clientTokenMaxLifetimeSeconds =
            try source.int("auth.clientTokenMaxLifetimeSeconds") ?? clientTokenMaxLifetimeSeconds
        metricsToken = try source.string("auth.metricsToken")
        clientRequestsPerSecond = try source.int("limits.clientRequestsPerSecond") ?? clientRequestsPerSecond
        secretRequestsPerSecond = try source.int("limits.secretRequestsPerSecond")
        requestTimeoutSeconds = try source.int("limits.requestTimeoutSeconds") ?? requestTimeoutSeconds
        if let policy = try source.string("ownership.policy") {
            guard let parsed = OwnershipPolicy(rawValue: policy) else {
                throw Invalid(key: "ownership.policy", "must be first_binder or transfer")
            }
            ownershipPolicy = parsed
        }
        webhookURL = try source.string("webhooks.url")
        webhookSecret = try source.string("webhooks.secret")
        localAppStoreEnabled = try source.bool("localAppStore.enabled") ?? false
        localGooglePlayEnabled = try source.bool("localGooglePlay.enabled") ?? false
        localStripeEnabled = try source.bool("localStripe.enabled") ?? false
        rejectedProofsRetentionDays = try source.int("rejectedProofs.retentionDays") ?? rejectedProofsRetentionDays
        rejectedProofsMaxBytesPerDay = try source.int("rejectedProofs.maxBytesPerDay") ?? rejectedProofsMaxBytesPerDay
        rejectedProofsMaxBytesTotal = try source.int("rejectedProofs.maxBytesTotal") ?? rejectedProofsMaxBytesTotal
        consumptionEnabled = try source.bool("apple.consumption.enabled") ?? false
        setAppAccountToken = try source.bool("apple.setAppAccountToken") ?? true
        finishTransactions = try source.bool("apple.finishTransactions") ?? false
        externalPurchaseReporting = try source.bool("apple.externalPurchase.reporting") ?? false
        smallBusinessProgram = try source.bool("apple.smallBusinessProgram") ?? false
        if let zone = try source.string("analytics.timeZone") {
            guard let timeZone = TimeZone(identifier: zone), zone.contains("/") || zone == "UTC" || zone == "GMT" else {
                throw Invalid(key: "analytics.timeZone", "must be an IANA time zone such as Europe/Paris or UTC")
            }
            analyticsTimeZone = timeZone
        }
        if let currency = try source.string("analytics.currency") {
            guard ExchangeRates.isCurrencyCode(currency) else {
                throw Invalid(key: "analytics.currency", "must be an ISO 4217 code such as USD")
            }
            analyticsCurrency = currency
        }
        analyticsRatesFile = try source.string("analytics.ratesFile")
        webhookMaxAttemptHours = try source.int("webhooks.maxAttemptHours") ?? webhookMaxAttemptHours
        offersIssuerId = try source.string("apple.offers.issuerId")
        offersKeyId = try source.string("apple.offers.keyId")
        offersPrivateKeyFile = try source.string("apple.offers.privateKeyFile")
        if let policy = try source.string("offers.introductoryOffers") {
            guard let parsed = IntroductoryOffers(rawValue: policy) else {
                throw Invalid(key: "offers.introductoryOffers", "must be apple or once_per_account")
            }
            introductoryOffers = parsed
        }
        sharedAppleIdAccounts = try source.int("offers.sharedAppleIdAccounts") ?? sharedAppleIdAccounts
        dashboardEnabled = try source.bool("dashboard.enabled") ?? dashboardEnabled
        dashboardSessionIdleSeconds = try source.int("dashboard.sessionIdleSeconds") ?? dashboardSessionIdleSeconds
        dashboardSessionMaxHours = try source.int("dashboard.sessionMaxHours") ?? dashboardSessionMaxHours
    }
}

extension ServerConfiguration {
    /// `analytics.rates`: `{EUR: 1.08, GBP: 1.27}` (one unit of each is worth that many of
    /// `analytics.currency`); `analytics.ratesFile` instead, checked here and re-read when it
    /// changes.
    mutating func readAnalyticsRates(_ value: Any?) throws {
        if let value {
            guard let table = value as? [String: Any] else {
                throw Invalid(key: "analytics.rates", "must be an object of currency codes and rates")
            }
            var rates: [String: Double] = [:]
            for (code, rate) in table {
                guard let number = (rate as? Double) ?? (rate as? Int).map(Double.init) else {
                    throw Invalid(key: "analytics.rates.\(code)", "must be a positive number")
                }
                rates[code] = number
            }
            do {
                _ = try ExchangeRates(currency: analyticsCurrency, table: rates, source: "configuration")
            } catch let error as ExchangeRates.Invalid {
                throw Invalid(key: "analytics.rates", error.reason)
            }
            analyticsRates = rates
        }
        if let file = analyticsRatesFile {
            guard value == nil else {
                throw Invalid(key: "analytics.ratesFile", "set analytics.rates or analytics.ratesFile, not both")
            }
            do {
                _ = try ExchangeRates.parse(
                    try Data(contentsOf: URL(fileURLWithPath: file)), currency: analyticsCurrency, source: file)
            } catch let error as ExchangeRates.Invalid {
                throw Invalid(key: "analytics.ratesFile", "\(file): \(error.reason)")
            } catch {
                throw Invalid(key: "analytics.ratesFile", "cannot read \(file)")
            }
        }
    }
}
