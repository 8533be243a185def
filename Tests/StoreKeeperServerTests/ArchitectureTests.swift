import Foundation
import Testing

/// The shape docs/architecture.md promises, checked on the sources: the core and storage are
/// store-neutral (no store's wire type, no store's module), nothing parses a store out of an id,
/// and no server source file grows past 700 lines.
@Suite struct ArchitectureTests {
    static let root = OpenAPITests.root

    static func swiftFiles(under folder: String) throws -> [URL] {
        let base = root.appendingPathComponent(folder)
        let enumerator = try #require(FileManager.default.enumerator(at: base, includingPropertiesForKeys: nil))
        var files: [URL] = []
        for case let url as URL in enumerator where url.pathExtension == "swift" { files.append(url) }
        return files.sorted { $0.path < $1.path }
    }

    /// The names a store's wire format brings: Apple's signed payloads, notification
    /// vocabulary and report bodies, Google's resources.
    static let wireTypes = [
        "import AppStoreModels", "import AppStoreVerification", "import AppStoreClient", "import GooglePlay",
        "import LocalAppStore", "import LocalGooglePlay", "JWSTransactionDecodedPayload",
        "JWSRenewalInfoDecodedPayload", "ResponseBodyV2", "NotificationType", "NotificationSubtype",
        "AppStoreEnvironment", "InAppOwnershipType", "ExternalPurchaseReport", "ExternalPurchaseLineItem",
        "ConsumptionRequest", "SubscriptionPurchaseV2", "ProductPurchaseV2", "DeveloperNotification",
    ]

    @Test(arguments: ["Sources/StoreKeeperCore", "Sources/StoreKeeperStorage"])
    func theCoreAndStorageNameNoStoreWireType(folder: String) throws {
        let files = try Self.swiftFiles(under: folder)
        #expect(!files.isEmpty)
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            for name in Self.wireTypes {
                #expect(!text.contains(name), "\(file.lastPathComponent) names \(name)")
            }
        }
    }

    /// Which store a row came from is its `store` column or the transaction's `store`; only the
    /// migration that backfilled the column (and the views it replaced) ever read it from an id.
    @Test func nothingParsesAStoreOutOfAnId() throws {
        let patterns = ["LIKE 'gp:%'", "LIKE 'web:%'", "StoreOfTransaction", "hasPrefix(\"gp:", "hasPrefix(\"web:"]
        for folder in ["Sources/StoreKeeperCore", "Sources/StoreKeeperStorage", "Sources/StoreKeeperServer"] {
            for file in try Self.swiftFiles(under: folder)
            where !file.lastPathComponent.hasPrefix("Migrations") && file.lastPathComponent != "AnalyticsViews.swift" {
                let text = try String(contentsOf: file, encoding: .utf8)
                for pattern in patterns {
                    #expect(!text.contains(pattern), "\(file.lastPathComponent) reads a store from an id: \(pattern)")
                }
            }
        }
        let views = try String(
            contentsOf: Self.root.appendingPathComponent("Sources/StoreKeeperStorage/AnalyticsViews.swift"),
            encoding: .utf8)
        let current = try #require(views.range(of: "public static let create = views("))
        #expect(views[current.lowerBound...].prefix(120).contains("s.store"))
    }

    @Test func noServerSourceFileIsOver700Lines() throws {
        for file in try Self.swiftFiles(under: "Sources/StoreKeeperServer") {
            let lines = try String(contentsOf: file, encoding: .utf8).split(
                separator: "\n", omittingEmptySubsequences: false)
            #expect(lines.count <= 700, "\(file.lastPathComponent) has \(lines.count) lines")
        }
    }
}
