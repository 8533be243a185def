import AppStoreModels
import AppStoreSigning
import ArgumentParser
import Foundation
import LocalAppStore

/// `storekeeper local-store …`: the local App Store's tools.
struct LocalStoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "local-store",
        abstract: "The local App Store: a faithful fake of Apple with its own certificate authority.",
        subcommands: [RootCertificateCommand.self, SignTransactionCommand.self]
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
