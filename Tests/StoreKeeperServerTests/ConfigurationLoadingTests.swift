import AppStoreModels
import AppStoreSigning
import CryptoExtras
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import NIOCore
import StoreKeeperStorage
import Synchronization
import Testing

@testable import StoreKeeperServer

@Suite struct ConfigurationLoadingTests {
    @Test func demoModeOnlyWithoutAnyConfiguration() async throws {
        let demo = try await ServerConfiguration.load(file: nil, environment: ["DATABASE_URL": "sqlite:x.sqlite"])
        #expect(demo.mode == .demo)
        #expect(demo.usesLocalAppStore)
        // One APPLE_* variable is a configuration: Apple's rules apply, so appAppleId is required.
        await #expect(throws: ServerConfiguration.Invalid.self) {
            _ = try await ServerConfiguration.load(file: nil, environment: ["APPLE_BUNDLEID": "com.example.game"])
        }
        let configured = try await ServerConfiguration.load(
            file: nil, environment: ["APPLE_BUNDLEID": "com.example.game", "APPLE_APPAPPLEID": "42"])
        #expect(configured.mode == .configured)
        #expect(!configured.usesLocalAppStore)
        #expect(configured.bundleId == "com.example.game")
        #expect(configured.appAppleId == 42)
        let trust = try TrustPolicy(configuration: configured)
        #expect(trust.roots.map(\.subject).contains { $0.contains("Apple Root CA - G3") })
        #expect(trust.roots.map(\.subject).contains { $0.contains("Apple Root CA") && !$0.contains("G3") })
        // A misspelt APPLE_ variable is named, with a suggestion.
        do {
            _ = try await ServerConfiguration.load(
                file: nil, environment: ["APPLE_BUNDLE_IDD": "x", "APPLE_APPAPPLEID": "42"])
            Issue.record("accepted a misspelt variable")
        } catch let error as ServerConfiguration.Invalid {
            #expect(error.key == "APPLE_BUNDLE_IDD")
            #expect(error.message.contains("APPLE_BUNDLE_ID"))
        }
    }

    /// Found by the `config` fuzz target: a key that is itself an object or a list trapped in
    /// Yams' `load`; it is an error naming the file now. So are aliases and absurd nesting.
    @Test func hostileYAMLIsAnErrorNotACrash() async throws {
        let cases = [
            "http: { {a: 1}: 2 }",
            "? [a, b]\n: 1",
            "base: &b { port: 1 }\nhttp: *b",
            String(repeating: "[", count: 200) + String(repeating: "]", count: 200),
            "apple:\n  " + String(repeating: "{a: ", count: 80) + "1" + String(repeating: "}", count: 80),
        ]
        for yaml in cases {
            await #expect(throws: ServerConfiguration.Invalid.self, "\(yaml.prefix(40))") {
                _ = try await ServerConfiguration.load(
                    contents: Data(yaml.utf8), name: "hostile.yaml", environment: [:])
            }
        }
    }

    @Test func inlineCatalogInYAMLAndJSON() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cfg-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let yaml = directory.appendingPathComponent("c.yaml")
        try Data(
            """
            apple: { bundleId: com.example.game, environments: [Sandbox] }
            catalog:
              products:
                - id: coins_60
                  type: consumable
                  grants: { currency: coins, amount: 60 }
                - { id: pro_monthly, type: auto_renewable, group: pro, grants: { entitlement: pro } }
            """.utf8
        ).write(to: yaml)
        let fromYAML = try await ServerConfiguration.load(file: yaml.path, environment: [:])
        #expect(fromYAML.catalog?.products.map(\.id) == ["coins_60", "pro_monthly"])
        #expect(fromYAML.environments == [.sandbox])
        let json = directory.appendingPathComponent("c.json")
        try Data(
            #"""
            {"apple": {"bundleId": "com.example.game", "appAppleId": "1234", "environments": ["Production"]},
             "http": {"port": 9090},
             "catalog": {"products": [{"id": "coins_60", "type": "consumable", "grants": {"currency": "coins", "amount": 60}}]}}
            """#.utf8
        ).write(to: json)
        let fromJSON = try await ServerConfiguration.load(file: json.path, environment: [:])
        #expect(fromJSON.catalog?.products.map(\.id) == ["coins_60"])
        #expect(fromJSON.port == 9090)
        #expect(fromJSON.appAppleId == 1234)
        // The environment wins over the file.
        let overridden = try await ServerConfiguration.load(file: json.path, environment: ["HTTP_PORT": "7070"])
        #expect(overridden.port == 7070)
        // A broken inline catalog names its key.
        try Data(
            #"{"apple": {"bundleId": "b", "environments": ["Sandbox"]}, "catalog": {"products": [{"id": "x"}]}}"#.utf8
        )
        .write(to: json)
        do {
            _ = try await ServerConfiguration.load(file: json.path, environment: [:])
            Issue.record("accepted a broken catalog")
        } catch let error as ServerConfiguration.Invalid {
            #expect(error.key == "catalog.products")
        }
    }
}

/// `apps`: several apps, two stores (docs/api.md "Several apps, two stores").
@Suite struct AppsConfigurationTests {
    static func keyFile() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("sa-\(UUID()).json").path
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let json = """
            {"type":"service_account","project_id":"p","private_key_id":"k1","private_key":\(String(decoding: try JSONEncoder().encode(key.pkcs8PEMRepresentation), as: UTF8.self)),
             "client_email":"play@p.iam.gserviceaccount.com","token_uri":"https://oauth2.googleapis.com/token"}
            """
        try Data(json.utf8).write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        return path
    }

    static func load(_ yaml: String) async throws -> ServerConfiguration {
        try await ServerConfiguration.load(contents: Data(yaml.utf8), name: "test.yaml", environment: [:])
    }

    @Test func anAppStoreAppAndTwoGooglePlayAppsAreReadAndShown() async throws {
        let key = try Self.keyFile()
        let configuration = try await Self.load(
            """
            database: { url: "sqlite:x.sqlite" }
            apps:
              - { id: ios, store: app_store, bundleId: com.example.game, appAppleId: 42, environments: [Production] }
              - id: android
                store: google_play
                packageName: com.example.game
                serviceAccountKeyFile: \(key)
                pushAudience: https://api.example.com/v1/notifications/google
                pushServiceAccount: pubsub@p.iam.gserviceaccount.com
              - { id: android-lite, store: google_play, packageName: com.example.lite, serviceAccountKeyFile: \(key),
                  pushAudience: "https://x", pushServiceAccount: "a@b", apiBaseURL: "http://127.0.0.1:9" }
            """)
        #expect(configuration.bundleId == "com.example.game")
        #expect(configuration.appAppleId == 42)
        #expect(configuration.environments == [.production])
        #expect(configuration.googlePlayApps.map(\.id) == ["android", "android-lite"])
        #expect(configuration.allApps.map(\.id) == ["ios", "android", "android-lite"])
        #expect(configuration.appId(for: "google_play", given: nil) == nil)
        #expect(configuration.appId(for: "google_play", given: "android") == "android")
        let shown = configuration.effectiveValues.filter { $0.key.hasPrefix("apps.") }
        #expect(shown.count == 3)
        #expect(shown.contains { $0.key == "apps.android" && $0.value.contains("pubsub@p.iam.gserviceaccount.com") })
        #expect(!configuration.productionProblems.contains { $0.contains("localGooglePlay") })
        var local = configuration
        local.localGooglePlayEnabled = true
        #expect(local.productionProblems.contains { $0.contains("localGooglePlay.enabled") })
    }

    @Test func aDeveloperAPIAddressTheClientCannotUseIsRefusedAtLoad() async throws {
        let key = try Self.keyFile()
        for url in ["http://user@127.0.0.1:9", "ftp://127.0.0.1", "http://127.0.0.1:99999", "not a url"] {
            await #expect(throws: (any Error).self, "\(url)") {
                try await Self.load(
                    """
                    database: { url: "sqlite:x.sqlite" }
                    apps:
                      - { id: android, store: google_play, packageName: com.example.game, serviceAccountKeyFile: \(key),
                          pushAudience: "https://x", pushServiceAccount: "a@b", apiBaseURL: "\(url)" }
                    """)
            }
        }
        let fine = try await Self.load(
            """
            database: { url: "sqlite:x.sqlite" }
            apps:
              - { id: android, store: google_play, packageName: com.example.game, serviceAccountKeyFile: \(key),
                  pushAudience: "https://x", pushServiceAccount: "a@b", apiBaseURL: "https://[::1]:8443/base" }
            """)
        #expect(fine.googlePlayApps.first?.apiBaseURL == "https://[::1]:8443/base")
    }

    @Test func severalAppStoreAppsAreReadTrustedAndShown() async throws {
        let configuration = try await Self.load(
            """
            database: { url: "sqlite:x.sqlite" }
            apps:
              - { id: ios, store: app_store, bundleId: com.example.game, appAppleId: 42 }
              - { id: ipad, store: app_store, bundleId: com.example.game.hd, appAppleId: 43 }
              - { id: mac, store: app_store, bundleId: com.example.game.mac, appAppleId: "44" }
            """)
        #expect(configuration.allApps.map(\.id) == ["ios", "ipad", "mac"])
        #expect(configuration.allApps.allSatisfy { $0.store == "app_store" })
        #expect(configuration.otherAppStoreApps.map(\.appAppleId) == [43, 44])
        #expect(configuration.appId(for: "app_store", given: nil) == nil)
        #expect(configuration.appId(for: "app_store", given: "mac") == "mac")
        #expect(configuration.appId(for: "app_store", given: "tv") == nil)
        #expect(configuration.bundleId(ofApp: "ipad") == "com.example.game.hd")
        #expect(configuration.bundleId(ofApp: "ios") == "com.example.game")
        #expect(
            configuration.appDirectory.apps == [
                "com.example.game": "ios", "com.example.game.hd": "ipad", "com.example.game.mac": "mac",
            ])
        let shown = configuration.effectiveValues.filter { $0.key.hasPrefix("apps.") }
        #expect(shown.map(\.key) == ["apps.ios", "apps.ipad", "apps.mac"])
        #expect(shown[1].value.contains("bundleId com.example.game.hd, appAppleId 43"))
        // One verifier accepts each app's data against its own App Store id.
        let trust = try TrustPolicy(configuration: configuration)
        #expect(trust.lines.contains { $0.contains("also bundleId: com.example.game.mac, appAppleId: 44") })
        let verifier = try trust.signedDataVerifier()
        #expect(verifier.configuration.otherApps.map(\.bundleId) == ["com.example.game.hd", "com.example.game.mac"])
        #expect(try trust.receiptVerifier().otherBundleIds == ["com.example.game.hd", "com.example.game.mac"])
    }

    @Test func onlyGooglePlayAppsNeedNoAppleKeys() async throws {
        let key = try Self.keyFile()
        let configuration = try await Self.load(
            """
            apps:
              - { id: android, store: google_play, packageName: com.example.game, serviceAccountKeyFile: \(key),
                  pushAudience: "https://x", pushServiceAccount: "a@b" }
            """)
        #expect(!configuration.hasAppStoreApp)
        #expect(configuration.allApps.map(\.store) == ["google_play"])
        // `config check` and `serve` build the trust set from it.
        _ = try TrustPolicy(configuration: configuration)
    }

    @Test(arguments: [
        ("apps: []", "apps"),
        ("apps: [1]", "apps[0]"),
        ("apps: [{ store: google_play, packageName: a.b }]", "apps[0].id"),
        ("apps: [{ id: a, store: amazon }]", "apps[0].store"),
        ("apps: [{ id: 'a b', store: google_play, packageName: a.b }]", "apps[0].id"),
        ("apps: [{ id: a, store: google_play }]", "apps[0].packageName"),
        ("apps: [{ id: a, store: google_play, packageName: a.b, colour: red }]", "apps[0].colour"),
        ("apps: [{ id: a, store: google_play, packageName: 'not a package' }]", "packageName"),
        ("apps: [{ id: a, store: google_play, packageName: a.b }]", "serviceAccountKeyFile"),
        (
            "apps: [{ id: a, store: google_play, packageName: a.b, serviceAccountKeyFile: /nonexistent }]",
            "serviceAccountKeyFile"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x.y, appAppleId: 1 }, { id: b, store: app_store, bundleId: y.z }]",
            "apps[b].appAppleId"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x.y, appAppleId: 1 }, { id: b, store: app_store, appAppleId: 2 }]",
            "apps[1].bundleId"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x.y, appAppleId: 1 }, { id: b, store: app_store, bundleId: x.y, appAppleId: 2 }]",
            "configured twice"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x.y, appAppleId: 1 }, { id: b, store: app_store, bundleId: y.z, appAppleId: 2, environments: [Sandbox] }]",
            "apps[1].environments"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x.y, appAppleId: 1 }, { id: a, store: app_store, bundleId: y.z, appAppleId: 2 }]",
            "apps[1].id"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x.y, appAppleId: 1 }, { id: b, store: app_store, bundleId: 'y z', appAppleId: 2 }]",
            "bundleId"
        ),
        (
            "apps: [{ id: a, store: app_store, bundleId: x, appAppleId: 1 }, { id: a, store: google_play }]",
            "apps[1].id"
        ),
        ("apps: [{ id: a, store: app_store, bundleId: x, appAppleId: 1, environments: [Xcode] }]", "environments"),
    ])
    func badAppsAreRefusedNamingTheKey(yaml: String, key: String) async throws {
        do {
            _ = try await Self.load(yaml)
            Issue.record("accepted: \(yaml)")
        } catch let error as ServerConfiguration.Invalid {
            #expect(error.key.contains(key) || error.message.contains(key), "\(error)")
        }
    }
}
