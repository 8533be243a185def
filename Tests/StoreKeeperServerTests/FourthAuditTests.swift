import AppStoreAdapter
import Foundation
import HTTPTypes
import HummingbirdTesting
import NIOCore
import StoreKeeperCore
import Testing

@testable import StoreKeeperServer

/// The fourth audit's MEDIUM findings: keys limited to some apps read and acted on other apps
/// (every route now filters by the key's apps or refuses with 403 `forbidden`; docs/security.md
/// has the table this test walks), and writes audited as plain `operator` (every write now names
/// the key's label, scope and origin).
@Suite struct FourthAuditTests {
    typealias API = ServerAPITests
    static let iosDesk = "rk_ios_desk_0123456789abcdefghijklmnop"
    static let androidDesk = KeyScopeTests.otherApp
    static let desk = KeyScopeTests.desk
    static let iosApp = "com.example.app"

    static func withLimitedKeys(
        _ kind: String, _ body: @Sendable (StoreKeeperApp, any TestClientProtocol) async throws -> Void
    ) async throws {
        try await API.withServer(
            kind,
            configure: {
                $0.operatorKeys = [
                    OperatorKey(label: "support-desk", scope: .support, secret: desk),
                    OperatorKey(label: "ios-desk", scope: .support, apps: [iosApp], secret: iosDesk),
                    OperatorKey(label: "android-team", scope: .support, apps: ["android"], secret: androidDesk),
                ]
            }, body)
    }

    /// Routes that span every app: refused to a key limited to some (each cell of the table).
    static let everyAppRoutes: [(HTTPRequest.Method, String, String?)] = [
        (.get, "/v1/revenue", nil),
        (.get, "/v1/audit", nil),
        (.get, "/v1/webhooks/dead-letters", nil),
        (.get, "/v1/rejected-proofs", nil),
        (.get, "/v1/retention/report", nil),
        (.get, "/v1/extensions/00000000-0000-0000-0000-000000000000", nil),
        (.post, "/v1/extensions/mass", #"{"productId":"pro_monthly","days":30,"reason":"service_issue"}"#),
        (.get, "/v1/analytics/mrr", nil),
        (.get, "/v1/analytics/mrr?appId=android", nil),
    ]

    @Test(arguments: API.databases)
    func keysLimitedToSomeAppsAreRefusedWhatSpansEveryApp(kind: String) async throws {
        try await Self.withLimitedKeys(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "u1", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            var routes = Self.everyAppRoutes
            routes.append((.get, "/v1/app-transactions/\(id)", nil))
            for (method, path, body) in routes {
                let refused = try await API.call(client, method, path, token: Self.iosDesk, body: body)
                #expect(refused.status == .forbidden && refused.errorCode == "forbidden", "\(path): \(refused.json)")
                #expect(refused.errorMessage?.contains("ios-desk") == true, "\(path): \(refused.json)")
                // A key of every app is not refused by the limit (whatever else the route answers).
                let unlimited = try await API.call(client, method, path, token: Self.desk, body: body)
                #expect(unlimited.status != .forbidden, "\(path): \(unlimited.json)")
            }
            // Analytics of its own app: answered.
            let own = try await API.call(client, .get, "/v1/analytics/mrr?appId=\(Self.iosApp)", token: Self.iosDesk)
            #expect(own.status == .ok, "\(own.json)")
        }
    }

    @Test(arguments: API.databases)
    func keysLimitedToSomeAppsActOnlyOnTheirApps(kind: String) async throws {
        try await Self.withLimitedKeys(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "pro_monthly")])
            #expect(
                try await API.submit(client, account: "u2", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let original = try #require(bought.transactions.first?.originalTransactionId)
            // Another app's subscription is as if it did not exist: no extension, no list.
            let extend = try await API.call(
                client, .post, "/v1/subscriptions/\(original)/extend", token: Self.androidDesk,
                body: #"{"days":30,"reason":"service_issue"}"#)
            #expect(extend.status == .notFound, "\(extend.json)")
            let list = try await API.call(
                client, .get, "/v1/subscriptions/\(original)/extensions", token: Self.androidDesk)
            #expect(list.status == .notFound)
            #expect(
                try await API.call(client, .get, "/v1/subscriptions/\(original)/extensions", token: Self.iosDesk)
                    .status == .ok)
            let view = try await API.call(client, .get, "/v1/transactions/\(original)", token: Self.androidDesk)
            #expect(view.status == .notFound)
            // Orders for another app, or naming none: refused; for its own app: opened.
            for body in [
                #"{"accountId":"u2","productId":"coins_60","appId":"com.example.app"}"#,
                #"{"accountId":"u2","productId":"coins_60"}"#,
            ] {
                let order = try await API.call(client, .post, "/v1/orders", token: Self.androidDesk, body: body)
                #expect(order.status == .forbidden, "\(order.json)")
            }
            // Nothing was extended.
            let subscription = try await API.call(client, .get, "/v1/accounts/u2")
            let before = (subscription.json["subscriptions"] as? [[String: Any]])?.first?["expiresAt"] as? String
            #expect(before != nil)
        }
    }

    /// `admin` with `apps` is refused at load (an admin key runs what spans every app), as are
    /// two keys with one secret (the audit log could not tell them apart).
    @Test func anAdminKeyCannotBeLimitedAndKeysCannotShareASecret() async throws {
        for (yaml, message) in [
            (
                #"- { label: root, key: "\#(Self.iosDesk)", scopes: [admin], apps: [ios] }"#,
                "an admin key manages every app"
            ),
            (
                #"""
                - { label: one, key: "\#(Self.iosDesk)", scopes: [read] }
                    - { label: two, key: "\#(Self.iosDesk)", scopes: [support] }
                """#, "have the same secret"
            ),
        ] {
            await #expect {
                _ = try await AppsConfigurationTests.load(
                    """
                    database: { url: "sqlite:x.sqlite" }
                    apps:
                      - { id: ios, store: app_store, bundleId: com.example.game, appAppleId: 42 }
                    auth:
                      keys:
                        \(yaml)
                    """)
            } throws: { error in
                "\(error)".contains(message)
            }
        }
        // A support key of some apps loads.
        let loaded = try await AppsConfigurationTests.load(
            """
            database: { url: "sqlite:x.sqlite" }
            apps:
              - { id: ios, store: app_store, bundleId: com.example.game, appAppleId: 42 }
            auth:
              keys:
                - { label: desk, key: "\(Self.iosDesk)", scopes: [support], apps: [ios] }
            """)
        #expect(loaded.operatorKeys.first?.apps == ["ios"])
    }

    /// Every operator write names the key's label, scope and origin; a debit without a reason is
    /// audited too; the app's own spending (a client token) is not an operator's act.
    @Test(arguments: API.databases)
    func everyOperatorWriteNamesItsKeyAndOrigin(kind: String) async throws {
        try await Self.withLimitedKeys(kind) { app, client in
            let credit = try await API.call(
                client, .post, "/v1/accounts/u3/balances/coins/credit", token: Self.desk,
                body: #"{"amount":100,"idempotencyKey":"c1","reason":"ticket 3"}"#)
            #expect(credit.status == .ok)
            // A debit without a reason, by a support key, by the secret key, and the app's own.
            let bySupport = try await API.call(
                client, .post, "/v1/accounts/u3/balances/coins/debit", token: Self.desk,
                body: #"{"amount":10,"idempotencyKey":"d1"}"#)
            #expect(bySupport.status == .ok, "\(bySupport.json)")
            let bySecret = try await API.call(
                client, .post, "/v1/accounts/u3/balances/coins/debit",
                body: #"{"amount":10,"idempotencyKey":"d2","reason":"chargeback"}"#)
            #expect(bySecret.status == .ok)
            // The back end spending the player's coins (the secret key, no reason): not an operator's act.
            let byApp = try await API.call(
                client, .post, "/v1/accounts/u3/balances/coins/debit", body: #"{"amount":10,"idempotencyKey":"d3"}"#)
            #expect(byApp.status == .ok)
            let debits = try await app.store.anomalies.audit().filter { $0.action == "balance_debited" }
            #expect(debits.count == 2, "\(debits)")
            #expect(
                debits.contains {
                    $0.actor == "operator:support-desk (support)" && $0.detail.contains("no reason given")
                }, "\(debits.map(\.actor))")
            #expect(
                debits.contains { $0.actor == "operator:secret key (admin)" && $0.detail.contains("chargeback") },
                "\(debits.map(\.actor))")
            // Through the MCP desk's origin: named as such.
            var headers: HTTPFields = [
                .contentType: "application/json", .authorization: "Bearer \(Self.desk)",
            ]
            headers[HTTPField.Name("StoreKeeper-Origin")!] = "mcp"
            let viaDesk = try await client.execute(
                uri: "/v1/accounts/u3/balances/coins/debit", method: .post, headers: headers,
                body: ByteBuffer(string: #"{"amount":10,"idempotencyKey":"d4"}"#)
            ) { $0.status }
            #expect(viaDesk == .ok)
            let again = try await app.store.anomalies.audit().filter { $0.action == "balance_debited" }
            #expect(again.contains { $0.actor == "operator:support-desk (support, mcp)" }, "\(again.map(\.actor))")
        }
    }
}

extension FourthAuditTests {
    /// `config check`'s checklist: the local Stripe, a Stripe key file others can read and an
    /// `http://` Stripe API to another host are each a problem; credentials carried in URLs are
    /// masked like every secret; a missing App Store Server API key is a warning naming what it
    /// switches off.
    @Test func theChecklistCoversStripeAndMasksCredentialsInURLs() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("checklist-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let keyFile = directory.appendingPathComponent("stripe.key").path
        try Data("sk_live_0123456789".utf8).write(to: URL(fileURLWithPath: keyFile))
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: keyFile)
        var configuration = ServerConfiguration()
        configuration.mode = .configured
        configuration.localStripeEnabled = true
        configuration.bundleId = "com.example.app"
        configuration.webhookURL = "https://hooks.example.com/in?token=s3cr3t-value&team=games"
        var web = StripeAppConfiguration(id: "web")
        web.secretKeyFile = keyFile
        web.apiBaseURL = "http://user:pa55@stripe-proxy.example.net"
        configuration.stripeApps = [web]
        let problems = configuration.productionProblems.joined(separator: "\n")
        #expect(problems.contains("localStripe.enabled is true"), "\(problems)")
        #expect(problems.contains("apps[web].secretKeyFile"), "\(problems)")
        #expect(problems.contains("apps[web].apiBaseURL: http://"), "\(problems)")
        let shown = configuration.effectiveValues.map { "\($0.key) \($0.value)" }.joined(separator: "\n")
        #expect(!shown.contains("s3cr3t-value") && !shown.contains("pa55"), "\(shown)")
        #expect(shown.contains("team=games"))
        #expect(configuration.productionWarnings.contains { $0.contains("apple.serverAPI") && $0.contains("Order ID") })
        // Loopback over http (a local proxy) is no problem.
        configuration.stripeApps[0].apiBaseURL = "http://127.0.0.1:12111"
        #expect(!configuration.productionProblems.contains { $0.contains("apiBaseURL") })
    }
}
