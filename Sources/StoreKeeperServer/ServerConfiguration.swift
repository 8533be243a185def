import AppStoreModels
import Configuration
import Foundation
import StoreKeeperCatalog
import StoreKeeperCore
import SystemPackage
import Yams

/// Everything `storekeeper serve` reads, with API.md's keys. One file (JSON or YAML) and the
/// environment (`apple.bundleId` ↔ `APPLE_BUNDLEID`); the environment wins.
public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 8080
    public var databaseURL = "sqlite:storekeeper.sqlite"
    public var bundleId: String?
    public var appAppleId: Int64?
    public var environments: Set<AppStoreEnvironment> = [.production, .sandbox]
    /// PEM/DER files; empty means Apple's roots (or the local App Store's in zero-config mode).
    public var rootCertificateFiles: [String] = []
    public var serverAPIIssuerId: String?
    public var serverAPIKeyId: String?
    public var serverAPIPrivateKeyFile: String?
    public var serverAPIBaseURL: String?
    public var verifyReceiptProductionURL: String?
    public var verifyReceiptSandboxURL: String?
    public var sharedSecret: String?
    public var secretKeys: [String] = []
    public var clientTokenSecret: String?
    public var catalog: Catalog?
    public var maxBodyBytes = 1_048_576
    public var clientRequestsPerSecond = 20
    public var secretRequestsPerSecond: Int?
    /// Longest a request may take before it is answered 503 (retryable).
    public var requestTimeoutSeconds = 30
    public var ownershipPolicy: OwnershipPolicy = .firstBinder
    public var orderTTL: TimeInterval = 24 * 3600
    public var webhookURL: String?
    public var webhookSecret: String?

    public init() {}

    /// Zero-config mode: no Apple credentials and no trust roots configured, so the server runs
    /// the local App Store in-process and trusts only it.
    public var usesLocalAppStore: Bool {
        serverAPIPrivateKeyFile == nil && rootCertificateFiles.isEmpty
    }

    /// Every key this server reads.
    static let keys = [
        "http.host", "http.port", "database.url", "apple.bundleId", "apple.appAppleId", "apple.environments",
        "apple.rootCertificates", "apple.serverAPI.issuerId", "apple.serverAPI.keyId", "apple.serverAPI.privateKeyFile",
        "apple.serverAPI.baseURL", "apple.verifyReceipt.productionURL", "apple.verifyReceipt.sandboxURL",
        "apple.sharedSecret", "auth.secretKeys", "auth.clientTokenSecret", "catalog.file", "limits.maxBodyBytes",
        "limits.clientRequestsPerSecond", "limits.secretRequestsPerSecond", "limits.requestTimeoutSeconds",
        "ownership.policy", "webhooks.url",
        "webhooks.secret",
    ]

    /// API.md names environment variables by upper-casing the key (`apple.bundleId` ↔
    /// `APPLE_BUNDLEID`); swift-configuration splits camelCase (`APPLE_BUNDLE_ID`). Both work.
    static func aliasingAPIMdNames(in environment: [String: String]) -> [String: String] {
        var result = environment
        for key in keys {
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
            if let value = environment[apiMd], environment[split] == nil { result[split] = value }
        }
        return result
    }

    public struct Invalid: Error, CustomStringConvertible {
        public var description: String
    }

    /// Reads `file` (optional) and the process environment.
    public static func load(file: String?, environment: [String: String] = ProcessInfo.processInfo.environment)
        async throws -> ServerConfiguration
    {
        var providers: [any ConfigProvider] = [
            EnvironmentVariablesProvider(environmentVariables: Self.aliasingAPIMdNames(in: environment))
        ]
        var fileTree: [String: Any] = [:]
        if let file {
            guard FileManager.default.fileExists(atPath: file) else {
                throw Invalid(description: "config file \(file) not found")
            }
            let text = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
            // YAML is a superset of JSON: one parser for both, to reach the nested catalog.
            guard let tree = (try? Yams.load(yaml: text)) as? [String: Any] else {
                throw Invalid(description: "config file \(file) is not a JSON or YAML object")
            }
            fileTree = tree
            let path = FilePath(file)
            if file.hasSuffix(".json") {
                providers.append(try await FileProvider<JSONSnapshot>(filePath: path))
            } else {
                providers.append(try await FileProvider<YAMLSnapshot>(filePath: path))
            }
        }
        let reader = ConfigReader(providers: providers)
        var configuration = ServerConfiguration()
        configuration.host = reader.string(forKey: "http.host", default: configuration.host)
        configuration.port = reader.int(forKey: "http.port", default: configuration.port)
        configuration.databaseURL = reader.string(forKey: "database.url", default: configuration.databaseURL)
        configuration.bundleId = reader.string(forKey: "apple.bundleId")
        configuration.appAppleId = reader.int(forKey: "apple.appAppleId").map(Int64.init)
        if let environments = reader.stringArray(forKey: "apple.environments") {
            let parsed = environments.map { AppStoreEnvironment(rawValue: $0.trimmingCharacters(in: .whitespaces)) }
            guard !parsed.isEmpty, parsed.allSatisfy({ $0 == .production || $0 == .sandbox }) else {
                throw Invalid(description: "apple.environments must list Production and/or Sandbox")
            }
            configuration.environments = Set(parsed)
        }
        configuration.rootCertificateFiles = reader.stringArray(forKey: "apple.rootCertificates") ?? []
        configuration.serverAPIIssuerId = reader.string(forKey: "apple.serverAPI.issuerId")
        configuration.serverAPIKeyId = reader.string(forKey: "apple.serverAPI.keyId")
        configuration.serverAPIPrivateKeyFile = reader.string(forKey: "apple.serverAPI.privateKeyFile")
        configuration.serverAPIBaseURL = reader.string(forKey: "apple.serverAPI.baseURL")
        configuration.verifyReceiptProductionURL = reader.string(forKey: "apple.verifyReceipt.productionURL")
        configuration.verifyReceiptSandboxURL = reader.string(forKey: "apple.verifyReceipt.sandboxURL")
        configuration.sharedSecret = reader.string(forKey: "apple.sharedSecret", isSecret: true)
        configuration.secretKeys = reader.stringArray(forKey: "auth.secretKeys", isSecret: true) ?? []
        configuration.clientTokenSecret = reader.string(forKey: "auth.clientTokenSecret", isSecret: true)
        configuration.maxBodyBytes = reader.int(forKey: "limits.maxBodyBytes", default: configuration.maxBodyBytes)
        configuration.clientRequestsPerSecond = reader.int(
            forKey: "limits.clientRequestsPerSecond", default: configuration.clientRequestsPerSecond)
        configuration.secretRequestsPerSecond = reader.int(forKey: "limits.secretRequestsPerSecond")
        configuration.requestTimeoutSeconds = reader.int(
            forKey: "limits.requestTimeoutSeconds", default: configuration.requestTimeoutSeconds)
        guard configuration.requestTimeoutSeconds > 0 else {
            throw Invalid(description: "limits.requestTimeoutSeconds must be positive")
        }
        if let policy = reader.string(forKey: "ownership.policy") {
            guard let parsed = OwnershipPolicy(rawValue: policy) else {
                throw Invalid(description: "ownership.policy must be first_binder or transfer")
            }
            configuration.ownershipPolicy = parsed
        }
        configuration.webhookURL = reader.string(forKey: "webhooks.url")
        configuration.webhookSecret = reader.string(forKey: "webhooks.secret", isSecret: true)
        if let url = configuration.webhookURL {
            guard let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme?.lowercased() ?? ""),
                parsed.host?.isEmpty == false
            else { throw Invalid(description: "webhooks.url must be an http(s) URL") }
            // Events are always signed: a backend must be able to tell them from forgeries.
            guard let secret = configuration.webhookSecret, secret.utf8.count >= 16 else {
                throw Invalid(description: "webhooks.secret (at least 16 bytes) is required with webhooks.url")
            }
        }
        if let secret = configuration.clientTokenSecret, secret.utf8.count < 32 {
            throw Invalid(description: "auth.clientTokenSecret must be at least 32 bytes (HS256 needs a 256-bit key)")
        }
        guard (0...65535).contains(configuration.port) else { throw Invalid(description: "http.port must be 0…65535") }
        guard configuration.maxBodyBytes > 0 else { throw Invalid(description: "limits.maxBodyBytes must be positive") }

        do {
            if let catalogFile = reader.string(forKey: "catalog.file") {
                configuration.catalog = try Catalog.load(path: catalogFile)
            } else if let inline = (fileTree["catalog"] as? [String: Any])?["products"] {
                configuration.catalog = try Catalog.parse(yaml: try Yams.dump(object: ["products": inline]))
            }
        } catch let error as CatalogError {
            throw Invalid(description: error.description)
        }
        return configuration
    }
}
