import AppStoreModels
import AppStoreSigning
import ArgumentParser
import Foundation
import Hummingbird
import LocalAppStore
import StoreKeeperCatalog

/// `storekeeper local-store …`: the local App Store's tools.
struct LocalStoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "local-store",
        abstract: "The local App Store: a faithful fake of Apple with its own certificate authority.",
        subcommands: [LocalStoreServeCommand.self, RootCertificateCommand.self, SignTransactionCommand.self]
    )
}

struct DataDirectoryOption: ParsableArguments {
    @Option(name: .customLong("data-dir"), help: "Where the local App Store keeps its keys and state.")
    var dataDirectory: String = "storekeeper-data/local-store"

    func loadPKI() throws -> ApplePKI {
        do {
            return try PKIStore.loadOrCreate(dataDirectory: URL(fileURLWithPath: dataDirectory, isDirectory: true))
        } catch let error as PKIStore.Corrupt {
            throw ValidationError(error.description)
        }
    }
}

/// Prints the roots that verify everything this local App Store signs.
struct RootCertificateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "root-certificate",
        abstract: "Print the trust roots (PEM) that verify what the local App Store signs.",
        discussion: """
            Two certificates: first the root of signed transactions and notifications (P-384, like \
            Apple Root CA - G3), then the root of app receipts (RSA, like Apple Inc. Root). Give the \
            file to `storekeeper verify --root` or to the server's apple.rootCertificates. Apple's real \
            roots never verify what the local App Store signs.
            """
    )

    @OptionGroup var data: DataDirectoryOption

    func run() throws {
        print(try PKIStore.rootsPEM(data.loadPKI()), terminator: "")
    }
}

/// Signs one transaction, for curl tests and support reproductions.
struct SignTransactionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign-transaction",
        abstract: "Print a signed JWS transaction, as the App Store would sign it."
    )

    @OptionGroup var data: DataDirectoryOption

    @Option(name: .customLong("bundle-id"), help: "The app's bundle id.")
    var bundleId: String

    @Option(name: .customLong("product"), help: "The product id.")
    var productId: String

    @Option(help: "Units bought (consumables), 1…10.")
    var quantity: Int32 = 1

    @Option(name: .customLong("app-account-token"), help: "The appAccountToken (a UUID) the app attached.")
    var appAccountToken: String?

    @Option(help: "Sandbox or Production.")
    var environment: String = "Production"

    @Option(help: "Consumable, Non-Consumable, Auto-Renewable Subscription or Non-Renewing Subscription.")
    var type: String = "Consumable"

    func validate() throws {
        guard !bundleId.isEmpty, !productId.isEmpty else {
            throw ValidationError("--bundle-id and --product must not be empty")
        }
        guard (1...10).contains(quantity) else { throw ValidationError("--quantity must be 1…10") }
        guard ["Sandbox", "Production"].contains(environment) else {
            throw ValidationError("--environment must be Sandbox or Production")
        }
        guard ProductType(rawValue: type).isKnown else {
            throw ValidationError(
                "--type must be one of: \(ProductType.knownValues.map(\.rawValue).joined(separator: ", "))")
        }
        if let appAccountToken, UUID(uuidString: appAccountToken) == nil {
            throw ValidationError("--app-account-token must be a UUID")
        }
    }

    func run() throws {
        let pki = try data.loadPKI()
        let purchase = TransactionIssuer.Purchase(
            bundleId: bundleId, productId: productId, type: ProductType(rawValue: type), quantity: quantity,
            appAccountToken: appAccountToken.flatMap(UUID.init(uuidString:)),
            environment: AppStoreEnvironment(rawValue: environment))
        let payload = TransactionIssuer().transaction(for: purchase, at: Date(), id: TransactionIds.next())
        print(try pki.jwsSigner.sign(payload))
    }
}

/// Runs the local App Store standalone over HTTP.
struct LocalStoreServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the local App Store over HTTP (Server API, verifyReceipt, notifications, control API).",
        discussion: "See docs/local-app-store.md for the endpoints and the control API."
    )

    @OptionGroup var data: DataDirectoryOption

    @Option(help: "Address to listen on.")
    var host: String = "127.0.0.1"

    @Option(help: "Port to listen on (0 picks a free one).")
    var port: Int = 8090

    @Option(name: .customLong("bundle-id"), help: "The app's bundle id.")
    var bundleId: String = "com.example.app"

    @Option(name: .customLong("app-apple-id"), help: "The app's App Store id.")
    var appAppleId: Int64 = 1_234_567_890

    @Option(help: "Production or Sandbox: stamped on everything this store signs.")
    var environment: String = "Production"

    @Option(help: "Product catalog file (YAML or JSON, the server's format). Default: a demo catalog.")
    var catalog: String?

    @Option(name: .customLong("notification-url"), help: "Where to POST App Store Server Notifications V2.")
    var notificationURL: String?

    @Option(
        name: .customLong("clock-scale"),
        help: "Store seconds per real second (43200 = a month per minute; 0 = frozen).")
    var clockScale: Double = 1

    @Option(name: .customLong("grace-period-days"), help: "Billing Grace Period in days (0 = off).")
    var gracePeriodDays: Double = 16

    @Option(name: .customLong("shared-secret"), help: "Require this shared secret on verifyReceipt.")
    var sharedSecret: String?

    @Flag(name: .customLong("retry-sandbox-notifications"), help: "Apply Apple's retry schedule in Sandbox too.")
    var retrySandboxNotifications = false

    func validate() throws {
        guard ["Sandbox", "Production"].contains(environment) else {
            throw ValidationError("--environment must be Sandbox or Production")
        }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be 0…65535") }
        guard clockScale >= 0, gracePeriodDays >= 0 else {
            throw ValidationError("--clock-scale and --grace-period-days must be ≥ 0")
        }
        if let notificationURL, URL(string: notificationURL)?.scheme?.hasPrefix("http") != true {
            throw ValidationError("--notification-url must be an http(s) URL")
        }
    }

    func run() async throws {
        let pki = try data.loadPKI()
        let directory = URL(fileURLWithPath: data.dataDirectory, isDirectory: true)
        let apiKey = try ServerAPIKeyStore.loadOrCreate(dataDirectory: directory)
        let products: Catalog
        do {
            products = try catalog.map(Catalog.load(path:)) ?? .demo
        } catch let error as CatalogError {
            throw ValidationError(error.description)
        }
        let store = LocalAppStore(
            configuration: .init(
                bundleId: bundleId, appAppleId: appAppleId, environment: AppStoreEnvironment(rawValue: environment),
                catalog: products, gracePeriod: gracePeriodDays > 0 ? gracePeriodDays * 86_400 : nil,
                notificationURL: notificationURL, retryNotificationsInSandbox: retrySandboxNotifications,
                serverAPIKey: .init(
                    issuerId: apiKey.issuerId, keyId: apiKey.keyId,
                    publicKeyPEM: try ServerAPIKeyStore.publicKeyPEM(apiKey)),
                sharedSecret: sharedSecret),
            pki: pki, clock: StoreClock(scale: clockScale))
        let server = try await LocalAppStoreServer(store: store)
        let app = server.application(host: host, port: port) { boundPort in
            let lines = [
                "local App Store listening on http://\(host):\(boundPort) (\(environment), bundle \(bundleId))",
                "  trust roots: storekeeper local-store root-certificate --data-dir \(data.dataDirectory)",
                "  Server API key: issuer \(apiKey.issuerId), key id \(apiKey.keyId), \(directory.path)/server-api-key.p8",
                "  notifications: \(notificationURL ?? "history only (no --notification-url)")",
            ]
            FileHandle.standardError.write(Data((lines.joined(separator: "\n") + "\n").utf8))
        }
        try await app.runService()
    }
}
