import Foundation
import HummingbirdTesting
import Testing

@testable import StoreKeeperServer

/// Scoped operator keys (`auth.keys`): `read` reads, `support` adds the support actions,
/// `admin` everything; a key of some apps sees their rows only; every action names the key in the
/// audit log.
@Suite struct KeyScopeTests {
    typealias API = ServerAPITests
    static let reader = "rk_reader_0123456789abcdefghijklmnop"
    static let desk = "rk_support_0123456789abcdefghijklmno"
    static let otherApp = "rk_other_app_0123456789abcdefghijklm"

    static func withKeys(
        _ kind: String, _ body: @Sendable (StoreKeeperApp, any TestClientProtocol) async throws -> Void
    )
        async throws
    {
        try await API.withServer(
            kind,
            configure: {
                $0.operatorKeys = [
                    OperatorKey(label: "bi-dashboard", scope: .read, secret: reader),
                    OperatorKey(label: "support-desk", scope: .support, secret: desk),
                    OperatorKey(label: "android-team", scope: .support, apps: ["android"], secret: otherApp),
                ]
            }, body)
    }

    @Test(arguments: API.databases)
    func aReadKeyReadsAndIsRefusedEveryWrite(kind: String) async throws {
        try await Self.withKeys(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "u1", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            // Reads.
            for path in ["/v1/accounts/u1", "/v1/transactions/\(id)", "/v1/anomalies?status=all", "/v1/audit"] {
                let read = try await API.call(client, .get, path, token: Self.reader)
                #expect(read.status == .ok, "\(path): \(read.json)")
            }
            // Writes: 403 forbidden, and nothing changed.
            let expires = StoreKeeperApp.iso(Date().addingTimeInterval(86_400))
            let writes: [(String, String)] = [
                ("/v1/accounts/u1/balances/coins/credit", #"{"amount":5,"idempotencyKey":"r1","reason":"try"}"#),
                ("/v1/accounts/u1/balances/coins/debit", #"{"amount":5,"idempotencyKey":"r2"}"#),
                ("/v1/accounts/u1/grants", #"{"entitlement":"pro","expiresAt":"\#(expires)"}"#),
                ("/v1/orders", #"{"accountId":"u1","productId":"coins_60"}"#),
                ("/v1/purchases", #"{"accountId":"u1","signedTransaction":"\#(bought.signedTransactions[0])"}"#),
            ]
            for (path, body) in writes {
                let write = try await API.call(client, .post, path, token: Self.reader, body: body)
                #expect(write.status == .forbidden && write.errorCode == "forbidden", "\(path): \(write.json)")
                let message = (write.json["error"] as? [String: Any])?["message"] as? String ?? ""
                #expect(message.contains("bi-dashboard") && message.contains("read"), "\(message)")
            }
            let account = try await API.call(client, .get, "/v1/accounts/u1")
            #expect((account.json["balances"] as? [String: Int])?["coins"] == 60)
            #expect((account.json["entitlements"] as? [Any])?.isEmpty ?? true)
        }
    }

    @Test(arguments: API.databases)
    func aSupportKeyActsAndIsNamedInTheAuditButIsNoBackend(kind: String) async throws {
        try await Self.withKeys(kind) { app, client in
            let credit = try await API.call(
                client, .post, "/v1/accounts/u2/balances/coins/credit", token: Self.desk,
                body: #"{"amount":50,"idempotencyKey":"t-7","reason":"ticket 7"}"#)
            #expect(credit.status == .ok, "\(credit.json)")
            let audit = try await app.store.audit().first { $0.action == "balance_credited" }
            #expect(audit?.actor == "operator:support-desk (support)")
            // Orders and purchases on an account's behalf are the backend's (admin).
            let order = try await API.call(
                client, .post, "/v1/orders", token: Self.desk, body: #"{"accountId":"u2","productId":"coins_60"}"#)
            #expect(order.status == .forbidden)
        }
    }

    @Test(arguments: API.databases)
    func aKeyOfOtherAppsDoesNotSeeThisAppsTransactions(kind: String) async throws {
        try await Self.withKeys(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "u3", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            let hidden = try await API.call(client, .get, "/v1/transactions/\(id)", token: Self.otherApp)
            #expect(hidden.status == .notFound)
            let shown = try await API.call(client, .get, "/v1/transactions/\(id)", token: Self.desk)
            #expect(shown.status == .ok)
        }
    }

    @Test func keysAreReadFromTheConfigurationAndMistakesNamed() async throws {
        let configuration = try await AppsConfigurationTests.load(
            """
            database: { url: "sqlite:x.sqlite" }
            apple: { bundleId: com.example.game, appAppleId: 42 }
            auth:
              secretKeys: ["sk_admin_0123456789abcdefghijklmnopq"]
              keys:
                - { label: bi, key: "\(Self.reader)", scopes: [read] }
                - { label: desk, key: "\(Self.desk)", scopes: [read, support] }
            """)
        #expect(configuration.operatorKeys.map(\.label) == ["bi", "desk"])
        #expect(configuration.operatorKeys.map(\.scope) == [.read, .support])
        let report = configuration.effectiveValues.map { "\($0.key) \($0.value)" }.joined(separator: "\n")
        #expect(report.contains("bi (read)") && report.contains("desk (support)"))
        #expect(!report.contains(Self.reader))
        for (yaml, message) in [
            (#"- { label: bi, key: "\#(Self.reader)", scopes: [reader] }"#, "unknown scope 'reader'"),
            (#"- { label: bi, key: "short", scopes: [read] }"#, "at least 32"),
            (#"- { label: bi, key: "\#(Self.reader)", scope: [read] }"#, "did you mean 'scopes'"),
            (#"- { label: bi, key: "\#(Self.reader)", scopes: [read], apps: [nope] }"#, "unknown app 'nope'"),
        ] {
            await #expect {
                _ = try await AppsConfigurationTests.load(
                    """
                    database: { url: "sqlite:x.sqlite" }
                    apple: { bundleId: com.example.game, appAppleId: 42 }
                    auth:
                      keys:
                        \(yaml)
                    """)
            } throws: { error in
                "\(error)".contains(message)
            }
        }
    }
}

/// "Did you mean" inside `apps[]` as everywhere else.
@Suite struct AppsKeySuggestionTests {
    @Test func aMisspelledAppKeyIsNamedWithTheKeyItMeant() async throws {
        await #expect {
            _ = try await AppsConfigurationTests.load(
                """
                database: { url: "sqlite:x.sqlite" }
                apps:
                  - { id: ios, store: app_store, bundelId: com.example.game, appAppleId: 42 }
                """)
        } throws: { error in
            "\(error)".contains("apps[0].bundelId") && "\(error)".contains("did you mean 'bundleId'")
        }
    }

    @Test func aStripeAppReportsOnlyToAConfiguredGooglePlayApp() async throws {
        let key = try AppsConfigurationTests.keyFile()
        let google = """
              - { id: android, store: google_play, packageName: com.example.game, serviceAccountKeyFile: \(key),
                  pushAudience: "https://x", pushServiceAccount: "a@b" }
            """
        let stripe = """
              - { id: web, store: stripe, secretKeyFile: /dev/null, webhookSecrets: [whsec_abc], googlePlayAppId: NAME }
            """
        let good = try await AppsConfigurationTests.load(
            "database: { url: \"sqlite:x.sqlite\" }\napps:\n" + google + "\n"
                + stripe.replacingOccurrences(of: "NAME", with: "android"))
        #expect(good.stripeApps.first?.googlePlayAppId == "android")
        // Listed by `config check`, never with a secret.
        let line = try #require(good.effectiveValues.first { $0.key == "apps.web" }?.value)
        #expect(line.contains("stripe") && line.contains("reports to Google Play app android"))
        #expect(!line.contains("whsec_abc"))
        await #expect {
            _ = try await AppsConfigurationTests.load(
                "database: { url: \"sqlite:x.sqlite\" }\napps:\n" + google + "\n"
                    + stripe.replacingOccurrences(of: "NAME", with: "andriod"))
        } throws: { error in
            "\(error)".contains("googlePlayAppId") && "\(error)".contains("andriod")
        }
    }
}
