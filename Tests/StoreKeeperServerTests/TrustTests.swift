import AppStoreModels
import AppStoreSigning
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

/// Trust is explicit: a configured server trusts Apple's roots, never its own fake store, and
/// nothing Apple signed is lost to a misconfiguration (kept, then re-verified once fixed).
/// Genuine Apple vectors, on SQLite and PostgreSQL.
@Suite struct TrustTests {
    static let secret = ServerAPITests.secret
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static var appleJWS: String {
        get throws {
            try String(
                contentsOf: fixtures.appendingPathComponent("apple-transaction-sandbox-consumable.jws"), encoding: .utf8
            )
            .trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }
    static var appleReceipt: String {
        get throws {
            try String(contentsOf: fixtures.appendingPathComponent("apple-receipt-production.b64"), encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    /// A fresh database URL of `kind`, and how to give it back.
    static func database(_ kind: String, in directory: URL) async throws -> (
        url: String, drop: @Sendable () async -> Void
    ) {
        guard kind == "postgres", let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] else {
            return ("sqlite:\(directory.path)/storekeeper.sqlite", {})
        }
        let lease = try await ScratchDatabases.shared.lend(base: base)
        return (lease.url, { await ScratchDatabases.shared.giveBack(lease) })
    }

    /// The configuration a production team writes (docs/api.md, docs/configuration.md): identity,
    /// environments, keys, an inline catalog — and no roots, no Server API key.
    static func productionYAML(databaseURL: String, bundleId: String, environments: String = "[Production, Sandbox]")
        -> String
    {
        """
        database:
          url: "\(databaseURL)"
        apple:
          bundleId: \(bundleId)
          appAppleId: 1234567890
          environments: \(environments)
        auth:
          secretKeys: ["\(secret)"]
          clientTokenSecret: "\(ServerAPITests.tokenSecret)"
        catalog:
          products:
            - { id: gh_super_good_ticket_1, type: consumable, grants: { currency: tickets, amount: 5 } }
            - { id: org.getpure.pure.Week, type: non_consumable, grants: { entitlement: pure_week } }
            - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
        """
    }

    static func withConfiguredServer(
        _ text: String, fileName: String = "storekeeper.yaml", directory: URL,
        _ body: @Sendable (StoreKeeperApp, any TestClientProtocol) async throws -> Void
    ) async throws {
        let file = directory.appendingPathComponent(fileName)
        try Data(text.utf8).write(to: file)
        let configuration = try await ServerConfiguration.load(file: file.path, environment: [:])
        try await ServerAPITests.drive(try await StoreKeeperApp.make(configuration, dataDirectory: directory), body)
    }

    /// Drops a test database without waiting (a failed test still cleans up).
    static func dropLater(_ drop: @escaping @Sendable () async -> Void) {
        Task { await drop() }
    }

    static func temporaryDirectory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("trust-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// A purchase signed by a local App Store of our own: a perfect Apple-shaped chain to the
    /// wrong root.
    static func selfMinted(bundleId: String, productId: String, in directory: URL) async throws -> String {
        let pki = try PKIStore.loadOrCreate(dataDirectory: directory.appendingPathComponent("forger"))
        let forger = LocalAppStore(configuration: .init(bundleId: bundleId, catalog: .demo), pki: pki)
        _ = productId
        return try await forger.buy("mallory", items: [.init(productId: "coins_60")]).signedTransactions[0]
    }

    @Test(arguments: ServerAPITests.databases)
    func aProductionShapedConfigDeliversGenuineAppleProofsAndNothingElse(kind: String) async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = try await Self.database(kind, in: directory)
        defer { Self.dropLater(database.drop) }
        let yaml = Self.productionYAML(databaseURL: database.url, bundleId: "com.goodheartapp")
        try await Self.withConfiguredServer(yaml, directory: directory) { app, client in
            #expect(app.trust.mode == .configured)
            #expect(!app.trust.localAppStoreTrusted)
            #expect(app.localAppStore == nil)
            #expect(app.trust.roots.map(\.source) == ["built-in", "built-in"])
            let token = try await ServerAPITests.clientToken("player-1")
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases", token: token,
                body: #"{"accountId":"player-1","signedTransaction":"\#(try Self.appleJWS)"}"#)
            #expect(reply.status == .ok, "\(reply.json)")
            let transaction = (reply.json["transactions"] as? [[String: Any]])?.first
            #expect(transaction?["transactionId"] as? String == "2000000847061981")
            #expect(transaction?["environment"] as? String == "Sandbox")
            #expect(transaction?["outcome"] as? String == "delivered")
            let account = try await ServerAPITests.call(client, .get, "/v1/accounts/player-1", token: token)
            #expect((account.json["balances"] as? [String: Int])?["tickets"] == 5)

            // The fake store is not there, and what it signs is not trusted.
            let control = try await ServerAPITests.call(
                client, .post, "/local-app-store/control/purchases", token: nil,
                body: #"{"appleId":"mallory","productId":"coins_60"}"#)
            #expect(control.status == .notFound)
            let withKey = try await ServerAPITests.call(
                client, .post, "/local-app-store/control/purchases",
                body: #"{"appleId":"mallory","productId":"coins_60"}"#)
            #expect(withKey.status == .notFound)
            let minted = try await Self.selfMinted(bundleId: "com.goodheartapp", productId: "coins_60", in: directory)
            let forged = try await ServerAPITests.call(
                client, .post, "/v1/purchases", token: token,
                body: #"{"accountId":"player-1","signedTransaction":"\#(minted)"}"#)
            #expect(forged.status == .unprocessableContent)
            #expect(forged.errorCode == "invalid_chain")
            let after = try await ServerAPITests.call(client, .get, "/v1/accounts/player-1", token: token)
            #expect((after.json["balances"] as? [String: Int])?["coins"] == nil)

            // The status shows what is trusted.
            let status = try await ServerAPITests.call(client, .get, "/v1/status")
            #expect(status.json["mode"] as? String == "configured")
            #expect(status.json["localAppStoreTrusted"] as? Bool == false)
            #expect(status.json["bundleId"] as? String == "com.goodheartapp")
            #expect(status.json["appAppleId"] as? String == "1234567890")
            #expect(status.json["environments"] as? [String] == ["Production", "Sandbox"])
            #expect(status.json["database"] as? String == kind)
            let roots = status.json["trustedRoots"] as? [[String: Any]] ?? []
            #expect(roots.count == 2)
            #expect(
                roots.contains {
                    ($0["subject"] as? String)?.contains("Apple Root CA - G3") == true
                        && $0["sha256"] as? String
                            == "63343abfb89a6a03ebb57e9b3f5fa7be7c4f5c756f3017b3a8c488c3653e9179"
                })
            let forbidden = try await ServerAPITests.call(client, .get, "/v1/status", token: token)
            #expect(forbidden.status == .forbidden)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aGenuineAppleReceiptDeliversWithTheInlineCatalogInJSON(kind: String) async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = try await Self.database(kind, in: directory)
        defer { Self.dropLater(database.drop) }
        let json = """
            {
              "database": {"url": "\(database.url)"},
              "apple": {"bundleId": "org.getpure.pure-iphone", "appAppleId": 1234567890,
                        "environments": ["Production", "Sandbox"]},
              "auth": {"secretKeys": ["\(Self.secret)"]},
              "catalog": {"products": [
                {"id": "org.getpure.pure.Week", "type": "non_consumable", "grants": {"entitlement": "pure_week"}}
              ]}
            }
            """
        try await Self.withConfiguredServer(json, fileName: "storekeeper.json", directory: directory) { app, client in
            #expect(app.catalog.product("org.getpure.pure.Week") != nil)
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases",
                body: #"{"accountId":"pure-1","receipt":"\#(try Self.appleReceipt)"}"#)
            #expect(reply.status == .ok, "\(reply.json)")
            let transactions = reply.json["transactions"] as? [[String: Any]] ?? []
            #expect(transactions.count == 4)
            #expect(transactions.contains { $0["transactionId"] as? String == "340001196262039" })
            #expect(transactions.allSatisfy { $0["environment"] as? String == "Production" })
            let account = try await ServerAPITests.call(client, .get, "/v1/accounts/pure-1")
            let entitlements = account.json["entitlements"] as? [[String: Any]] ?? []
            #expect(entitlements.contains { $0["id"] as? String == "pure_week" })
        }
    }

    @Test func localAppStoreEnabledBesideAConfigurationNeedsASecretKey() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let yaml =
            Self.productionYAML(databaseURL: "sqlite:\(directory.path)/storekeeper.sqlite", bundleId: "com.example.app")
            + "\nlocalAppStore:\n  enabled: true\n"
        try await Self.withConfiguredServer(yaml, directory: directory) { app, client in
            #expect(app.trust.mode == .configured)
            #expect(app.trust.localAppStoreTrusted)
            #expect(app.trust.roots.filter { $0.source == "local App Store" }.count == 2)
            let body = #"{"appleId":"tester","productId":"coins_60"}"#
            let anonymous = try await ServerAPITests.call(
                client, .post, "/local-app-store/control/purchases", token: nil, body: body)
            #expect(anonymous.status == .unauthorized)
            // Its Server API too: "Bearer x" no longer opens it (nor re-points an appAccountToken).
            let bearerX = try await ServerAPITests.call(
                client, .put, "/local-app-store/inApps/v1/transactions/1/appAccountToken", token: "x",
                body: #"{"appAccountToken":"\#(UUID().uuidString)"}"#)
            #expect(bearerX.status == .unauthorized)
            let token = try await ServerAPITests.clientToken("tester")
            let asApp = try await ServerAPITests.call(
                client, .post, "/local-app-store/control/purchases", token: token, body: body)
            #expect(asApp.status == .forbidden)
            let serverAPI = try await ServerAPITests.call(
                client, .get, "/local-app-store/inApps/v1/transactions/1", token: token)
            #expect(serverAPI.status == .forbidden)
            let bought = try await ServerAPITests.call(client, .post, "/local-app-store/control/purchases", body: body)
            #expect(bought.status == .ok)
            let signed = try #require((bought.json["signedTransactions"] as? [String])?.first)
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases", token: token,
                body: #"{"accountId":"tester","signedTransaction":"\#(signed)"}"#)
            #expect(reply.status == .ok)
            // Apple's genuine proofs still verify beside it.
            #expect(app.trust.roots.filter { $0.source == "built-in" }.count == 2)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aMisconfigurationLosesNothingAndReverifyDeliversOnce(kind: String) async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = try await Self.database(kind, in: directory)
        defer { Self.dropLater(database.drop) }
        let minted = try await Self.selfMinted(bundleId: "com.goodheartapp", productId: "coins_60", in: directory)
        let genuine = try Self.appleJWS
        // 1. A typo in the bundle id: Apple's genuine purchase is refused, and kept.
        let wrong = Self.productionYAML(databaseURL: database.url, bundleId: "com.goodheart.app")
        let orderId = try await withOneServer(wrong, directory) { app, client in
            let order = try await ServerAPITests.call(
                client, .post, "/v1/orders", body: #"{"accountId":"p1","productId":"gh_super_good_ticket_1"}"#)
            let orderId = try #require(order.json["orderId"] as? String)
            let refused = try await ServerAPITests.call(
                client, .post, "/v1/purchases",
                body: #"{"accountId":"p1","orderId":"\#(orderId)","signedTransaction":"\#(genuine)"}"#)
            #expect(refused.status == .unprocessableContent)
            #expect(refused.errorCode == "wrong_bundle")
            // The same proof again is kept once.
            _ = try await ServerAPITests.call(
                client, .post, "/v1/purchases",
                body: #"{"accountId":"p1","orderId":"\#(orderId)","signedTransaction":"\#(genuine)"}"#)
            let forged = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"p2","signedTransaction":"\#(minted)"}"#)
            #expect(forged.errorCode == "invalid_chain")
            let kept = try await ServerAPITests.call(client, .get, "/v1/rejected-proofs")
            let proofs = kept.json["rejectedProofs"] as? [[String: Any]] ?? []
            #expect(proofs.count == 2)
            let genuineRow = proofs.first { $0["code"] as? String == "wrong_bundle" }
            #expect(genuineRow?["accountId"] as? String == "p1")
            #expect(genuineRow?["orderId"] as? String == orderId)
            #expect(genuineRow?["kind"] as? String == "signedTransaction")
            #expect(genuineRow?["serverVersion"] as? String == StoreKeeperVersion.current)
            #expect(genuineRow?["sha256"] as? String == RejectedProofStore.sha256(genuine))
            let filtered = try await ServerAPITests.call(client, .get, "/v1/rejected-proofs?code=invalid_chain")
            #expect((filtered.json["rejectedProofs"] as? [[String: Any]])?.count == 1)
            let future = try await ServerAPITests.call(client, .get, "/v1/rejected-proofs?since=2999-01-01")
            #expect((future.json["rejectedProofs"] as? [[String: Any]])?.isEmpty == true)
            let badCode = try await ServerAPITests.call(client, .get, "/v1/rejected-proofs?code=nope")
            #expect(badCode.status == .badRequest)
            let metrics = try await client.execute(
                uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(Self.secret)"]
            ) { String(buffer: $0.body) }
            #expect(metrics.contains(#"storekeeper_proofs_rejected_total{code="wrong_bundle"} 2"#))
            // Re-verifying under the wrong configuration delivers nothing.
            let early = try await ServerAPITests.call(client, .post, "/v1/rejected-proofs/reverify", body: "{}")
            // (The forgery's chain reaches no trusted or Apple root: kept as its hash, code and
            // account only, so there is nothing of it to re-verify.)
            let forgedRow = proofs.first { $0["code"] as? String == "invalid_chain" }
            #expect(forgedRow?["proofKept"] as? Bool == false)
            #expect(genuineRow?["proofKept"] as? Bool == true)
            #expect(early.json["checked"] as? Int == 1)
            #expect(early.json["delivered"] as? Int == 0)
            #expect(early.json["stillRejected"] as? Int == 1)
            return orderId
        }
        // 2. Fixed: re-verification delivers the genuine proof once, to its account and order.
        let fixed = Self.productionYAML(databaseURL: database.url, bundleId: "com.goodheartapp")
        try await withOneServer(fixed, directory) { app, client in
            let token = try await ServerAPITests.clientToken("p1")
            let denied = try await ServerAPITests.call(
                client, .post, "/v1/rejected-proofs/reverify", token: token, body: "{}")
            #expect(denied.status == .forbidden)
            let first = try await ServerAPITests.call(client, .post, "/v1/rejected-proofs/reverify", body: "")
            #expect(first.status == .ok)
            #expect(first.json["checked"] as? Int == 1)
            #expect(first.json["delivered"] as? Int == 1)
            #expect(first.json["stillRejected"] as? Int == 0)
            let account = try await ServerAPITests.call(client, .get, "/v1/accounts/p1")
            #expect((account.json["balances"] as? [String: Int])?["tickets"] == 5)
            let order = try await ServerAPITests.call(client, .get, "/v1/orders/\(orderId)")
            #expect(order.json["status"] as? String == "delivered")
            #expect(order.json["transactionId"] as? String == "2000000847061981")
            // Again: nothing changes; the forgery stays rejected.
            let second = try await ServerAPITests.call(client, .post, "/v1/rejected-proofs/reverify", body: "{}")
            #expect(second.json["delivered"] as? Int == 0)
            #expect(second.json["stillRejected"] as? Int == 0)
            let again = try await ServerAPITests.call(client, .get, "/v1/accounts/p1")
            #expect((again.json["balances"] as? [String: Int])?["tickets"] == 5)
            let forger = try await ServerAPITests.call(client, .get, "/v1/accounts/p2")
            #expect((forger.json["balances"] as? [String: Int])?.isEmpty ?? true)
            let rows = try await ServerAPITests.call(client, .get, "/v1/rejected-proofs?status=reverified")
            #expect((rows.json["rejectedProofs"] as? [[String: Any]])?.first?["outcome"] as? String == "delivered")
            let audit = try await ServerAPITests.call(client, .get, "/v1/audit")
            #expect(
                (audit.json["entries"] as? [[String: Any]])?.contains { $0["action"] as? String == "reverify" } == true)
            _ = app
        }
    }

    @discardableResult
    func withOneServer<T: Sendable>(
        _ yaml: String, _ directory: URL, _ body: @Sendable (StoreKeeperApp, any TestClientProtocol) async throws -> T
    ) async throws -> T {
        let result = Mutex<T?>(nil)
        try await Self.withConfiguredServer(yaml, directory: directory) { app, client in
            let value = try await body(app, client)
            result.withLock { $0 = value }
        }
        return try #require(result.withLock { $0 })
    }

    @Test func rejectedProofsAreCappedPerAccountPerDay() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = try await Database.open(url: "sqlite:\(directory.path)/s.sqlite")
        try await Migrations.run(on: database)
        var store = RejectedProofStore(database: database)
        store.maxPerAccountPerDay = 3
        let now = Date()
        var results: [RejectedProofStore.KeepResult] = []
        for index in 0..<5 {
            results.append(
                try await store.keep(
                    kind: .signedTransaction, proof: "forgery-\(index)", keepText: true, code: "invalid_chain",
                    reason: "r",
                    accountId: "mallory", orderId: nil, serverVersion: "t", now: now))
        }
        #expect(results == [.kept, .kept, .kept, .capped, .capped])
        #expect(
            try await store.keep(
                kind: .signedTransaction, proof: "forgery-0", keepText: true, code: "invalid_chain", reason: "r",
                accountId: "mallory",
                orderId: nil, serverVersion: "t", now: now) == .duplicate)
        // Another account, or the next day, has its own allowance.
        #expect(
            try await store.keep(
                kind: .receipt, proof: "x", keepText: true, code: "invalid_chain", reason: "r", accountId: "alice",
                orderId: nil,
                serverVersion: "t", now: now) == .kept)
        #expect(
            try await store.keep(
                kind: .receipt, proof: "y", keepText: true, code: "invalid_chain", reason: "r", accountId: "mallory",
                orderId: nil,
                serverVersion: "t", now: now.addingTimeInterval(86_400)) == .kept)
        // Retention prunes what is older than the period.
        #expect(try await store.prune(olderThan: 1, now: now.addingTimeInterval(86_400 + 3600)) == 4)
        #expect(try await store.list().count == 1)
        try await database.close()
    }
}

/// How the configuration is read: the mode, the inline catalog, unknown keys.
