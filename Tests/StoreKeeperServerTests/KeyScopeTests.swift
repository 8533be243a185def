import AppStoreAdapter
import Foundation
import HummingbirdTesting
import StoreKeeperCore
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
                    OperatorKey(label: "support-desk", scope: .support, secret: Self.desk),
                    OperatorKey(label: "android-team", scope: .support, apps: ["android"], secret: Self.otherApp),
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
            let audit = try await app.store.anomalies.audit().first { $0.action == "balance_credited" }
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

    /// A key limited to some apps exports those apps' rows only; a key of every app all of them.
    @Test(arguments: API.databases)
    func aKeyOfOtherAppsExportsItsAppsRowsOnly(kind: String) async throws {
        try await API.withServer(
            kind,
            configure: {
                $0.operatorKeys = [
                    OperatorKey(label: "support-desk", scope: .support, secret: Self.desk),
                    OperatorKey(label: "android-team", scope: .support, apps: ["android"], secret: Self.otherApp),
                ]
            }, prepare: { $0.exportSettleSeconds = 0 }
        ) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "u3", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            _ = try await API.call(client, .post, "/v1/orders", body: #"{"accountId":"u3","productId":"coins_60"}"#)
            for export in ["transactions", "orders", "events"] {
                let all = try await Self.text(client, "/v1/export/\(export)", Self.desk)
                let limited = try await Self.text(client, "/v1/export/\(export)", Self.otherApp)
                #expect(all.contains("u3"), "\(export): \(all)")
                // The same columns, no row of another app.
                #expect(
                    !limited.contains("u3")
                        && limited.split(separator: "\r\n").first == all.split(separator: "\r\n").first,
                    "\(export)")
            }
            #expect(try await Self.text(client, "/v1/export/transactions", Self.desk).contains(id))
        }
    }

    static func text(_ client: any TestClientProtocol, _ path: String, _ key: String) async throws -> String {
        try await client.execute(uri: path, method: .get, headers: [.authorization: "Bearer \(key)"]) {
            String(buffer: $0.body)
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
              - { id: web, store: stripe, secretKeyFile: /dev/null, webhookSecrets: [whsec_abc0123456789abcdef], googlePlayAppId: NAME }
            """
        let good = try await AppsConfigurationTests.load(
            "database: { url: \"sqlite:x.sqlite\" }\napps:\n" + google + "\n"
                + stripe.replacingOccurrences(of: "NAME", with: "android"))
        #expect(good.stripeApps.first?.googlePlayAppId == "android")
        // Listed by `config check`, never with a secret.
        let line = try #require(good.effectiveValues.first { $0.key == "apps.web" }?.value)
        #expect(line.contains("stripe") && line.contains("reports to Google Play app android"))
        #expect(!line.contains("whsec_abc0123456789abcdef"))
        await #expect {
            _ = try await AppsConfigurationTests.load(
                "database: { url: \"sqlite:x.sqlite\" }\napps:\n" + google + "\n"
                    + stripe.replacingOccurrences(of: "NAME", with: "andriod"))
        } throws: { error in
            "\(error)".contains("googlePlayAppId") && "\(error)".contains("andriod")
        }
    }
}

/// Support's notes on an account: written with a support key (audited with its label), read
/// with any operator key, never shown to the player's app; the dashboard's form writes them too.
@Suite struct AccountNoteTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func notesAreWrittenBySupportReadByOperatorsAndHiddenFromThePlayer(kind: String) async throws {
        try await KeyScopeTests.withKeys(kind) { app, client in
            let added = try await API.call(
                client, .post, "/v1/accounts/u7/notes", token: KeyScopeTests.desk,
                body: #"{"text":"promised 100 coins if the outage repeats","ticket":"ZD-4411"}"#)
            #expect(added.status == .created, "\(added.json)")
            #expect((added.json["author"] as? String)?.contains("support-desk") == true, "\(added.json)")
            _ = try await API.call(
                client, .post, "/v1/accounts/u7/notes", token: KeyScopeTests.desk, body: #"{"text":"second"}"#)
            // Read with any operator key, newest first.
            let listed = try await API.call(client, .get, "/v1/accounts/u7/notes", token: KeyScopeTests.reader)
            let notes = try #require(listed.json["notes"] as? [[String: Any]])
            #expect(notes.map { $0["text"] as? String } == ["second", "promised 100 coins if the outage repeats"])
            #expect(notes.last?["ticket"] as? String == "ZD-4411")
            // A read key cannot write one; the player's own token can neither write nor read them,
            // and the player's account view does not carry them.
            let refused = try await API.call(
                client, .post, "/v1/accounts/u7/notes", token: KeyScopeTests.reader, body: #"{"text":"x"}"#)
            #expect(refused.status == .forbidden)
            let player = try await API.clientToken("u7")
            #expect(try await API.call(client, .get, "/v1/accounts/u7/notes", token: player).status == .forbidden)
            #expect(
                try await API.call(client, .post, "/v1/accounts/u7/notes", token: player, body: #"{"text":"x"}"#)
                    .status == .forbidden)
            let own = try await API.call(client, .get, "/v1/accounts/u7", token: player)
            #expect(own.status == .ok && own.json["notes"] == nil)
            // Bad input: a 400 each, nothing written.
            for bad in [
                #"{"text":""}"#, #"{"text":"   "}"#, #"{"text":"a\u0007b"}"#, #"{"ticket":"x"}"#,
                #"{"text":"ok","ticket":""}"#, "{\"text\":\"\(String(repeating: "n", count: 2001))\"}",
            ] {
                let reply = try await API.call(
                    client, .post, "/v1/accounts/u7/notes", token: KeyScopeTests.desk, body: bad)
                #expect(reply.status == .badRequest, "\(bad.prefix(60))")
            }
            #expect(try await app.store.accounts.notes(of: "u7").count == 2)
            let audit = try await app.store.anomalies.audit().filter { $0.action == "account_note" }
            #expect(audit.count == 2 && audit.allSatisfy { $0.actor.contains("support-desk") })
        }
    }

    @Test func theDashboardAddsAndShowsNotesEscaped() async throws {
        try await API.withServer("sqlite") { app, client in
            let browser = DashboardTests.Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": API.secret])
            let page = try await browser.get("/dashboard/accounts/u8")
            #expect(page.body.contains(#"id="note-form""#) && page.body.contains("No notes yet."))
            let csrf = try #require(page.csrf)
            let added = try await browser.post(
                "/dashboard/accounts/u8/note", ["_csrf": csrf, "text": "<b>gave</b> 50 coins", "ticket": "T-9"])
            #expect(added.status == .seeOther && added.location?.contains("done=noted") == true)
            let after = try await browser.get("/dashboard/accounts/u8")
            #expect(after.body.contains("&lt;b&gt;gave&lt;/b&gt; 50 coins") && !after.body.contains("<b>gave</b>"))
            #expect(after.body.contains("T-9"))
            let empty = try await browser.post("/dashboard/accounts/u8/note", ["_csrf": csrf, "text": " "])
            #expect(empty.status == .badRequest)
            #expect(try await app.store.accounts.notes(of: "u8").count == 1)
        }
    }
}

/// Grants on the dashboard's account page: listed with their notes and state, ended from there
/// through the API's own path (audited), an answer that says when there was nothing to end.
@Suite struct DashboardGrantTests {
    @Test(arguments: ServerAPITests.databases)
    func anOperatorSeesGrantsWithTheirNotesAndEndsOne(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let browser = DashboardTests.Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let page = try await browser.get("/dashboard/accounts/g1")
            #expect(page.body.contains("No grants."))
            let csrf = try #require(page.csrf)
            let granted = try await browser.post(
                "/dashboard/accounts/g1/grant",
                ["_csrf": csrf, "entitlement": "pro", "days": "7", "note": "ticket 77: outage"])
            #expect(granted.status == .seeOther)
            let shown = try await browser.get("/dashboard/accounts/g1")
            #expect(shown.body.contains(#"id="grants-table""#) && shown.body.contains("ticket 77: outage"))
            #expect(shown.body.contains("running"))
            let grantId = try #require(try await app.store.support.grants(of: "g1").first?.grantId)
            #expect(shown.body.contains("/dashboard/accounts/g1/grants/\(grantId)/end"))
            let account = try await ServerAPITests.call(client, .get, "/v1/accounts/g1")
            #expect(
                (account.json["entitlements"] as? [[String: Any]])?.contains { $0["id"] as? String == "pro" } == true)
            // Ended from the page: the entitlement goes, the audit says who; twice: nothing to end.
            let ended = try await browser.post("/dashboard/accounts/g1/grants/\(grantId)/end", ["_csrf": csrf])
            #expect(ended.status == .seeOther && ended.location?.contains("done=grant_ended") == true)
            let after = try await ServerAPITests.call(client, .get, "/v1/accounts/g1")
            #expect((after.json["entitlements"] as? [[String: Any]])?.contains { $0["id"] as? String == "pro" } != true)
            let again = try await browser.post("/dashboard/accounts/g1/grants/\(grantId)/end", ["_csrf": csrf])
            #expect(again.location?.contains("done=grant_not_running") == true)
            let final = try await browser.get("/dashboard/accounts/g1")
            #expect(final.body.contains("ended ") && !final.body.contains("/grants/\(grantId)/end"))
            #expect(try await app.store.anomalies.audit().filter { $0.action == "grant_ended" }.count == 1)
            // For good: the box ticked, no days needed; the page says so, the API shows no end.
            let forever = try await browser.post(
                "/dashboard/accounts/g1/grant", ["_csrf": csrf, "entitlement": "pro", "forever": "1", "note": "VIP"])
            #expect(forever.status == .seeOther && forever.location?.contains("done=granted") == true)
            #expect(try await browser.get("/dashboard/accounts/g1").body.contains("for good"))
            let view = try await ServerAPITests.call(client, .get, "/v1/accounts/g1")
            let pro = (view.json["entitlements"] as? [[String: Any]])?.first { $0["id"] as? String == "pro" }
            #expect(pro?["active"] as? Bool == true && pro?["expiresAt"] == nil)
        }
    }
}

/// The account page's refunds: what was refunded and Apple's refund requests and answers, as
/// Apple's notifications report them, with the link a player needs to ask Apple.
@Suite struct DashboardRefundTests {
    @Test(arguments: ServerAPITests.databases)
    func theAccountPageShowsRefundsAndApplesRequestsAndAnswers(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            let (_, coins) = try await relay.buy("asker", "coins_60")
            let (_, more) = try await relay.buy("asker", "coins_300")
            _ = try await relay.deliver()
            let browser = DashboardTests.Browser(relay.client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let before = try await browser.get("/dashboard/accounts/asker")
            #expect(before.body.contains("No refunds or refund requests."))
            #expect(before.body.contains("https://reportaproblem.apple.com"))
            // The player asks Apple twice: one refunded, one declined.
            try await store.requestRefund(coins.transactionId!)
            try await store.requestRefund(more.transactionId!)
            _ = try await relay.deliver()
            try await store.refund(coins.transactionId!)
            try await store.declineRefund(more.transactionId!)
            _ = try await relay.deliver()
            let page = try await browser.get("/dashboard/accounts/asker").body
            #expect(page.contains(#"id="refunds-table""#))
            for event in ["CONSUMPTION_REQUEST", "REFUND", "REFUND_DECLINED", "refunded"] {
                #expect(page.contains("<td>\(event)</td>"), "\(event)")
            }
            #expect(page.contains("% refunded"))
            let history = try await relay.app.store.reports.refundHistory(of: "asker")
            #expect(history.filter { $0.event == "CONSUMPTION_REQUEST" }.count == 2)
            #expect(history.filter { $0.event == "refunded" }.map(\.transactionId) == [coins.transactionId!])
        }
    }
}

/// The dashboard signs in with any operator key, shows its forms only to a key that may use
/// them, refuses a read key's form post, names the key in the audit, and shows a key limited to
/// some apps those apps' rows only.
@Suite struct DashboardRoleTests {
    @Test(arguments: ServerAPITests.databases)
    func aReadKeyReadsTheDashboardAndASupportKeyActsUnderItsOwnName(kind: String) async throws {
        try await KeyScopeTests.withKeys(kind) { app, client in
            // A read key: in, every page, no forms; a forged post refused (403), nothing done.
            let reader = DashboardTests.Browser(client)
            let signedIn = try await reader.post("/dashboard/login", ["key": KeyScopeTests.reader])
            #expect(signedIn.status == .seeOther && signedIn.location == "/dashboard")
            let overview = try await reader.get("/dashboard")
            #expect(overview.status == .ok && overview.body.contains("bi-dashboard (read)"))
            let account = try await reader.get("/dashboard/accounts/r1")
            #expect(account.status == .ok && account.body.contains(#"id="read-only""#))
            #expect(!account.body.contains(#"id="credit-form""#) && !account.body.contains(#"id="note-form""#))
            let csrf = try #require(account.csrf)
            let forged = try await reader.post(
                "/dashboard/accounts/r1/credit",
                ["_csrf": csrf, "idempotencyKey": "k1", "currency": "coins", "amount": "5", "reason": "try"])
            #expect(forged.status == .forbidden && forged.body.contains("read scope"))
            let balance = try await ServerAPITests.call(client, .get, "/v1/accounts/r1")
            #expect((balance.json["balances"] as? [String: Int])?["coins"] ?? 0 == 0)
            // Signing out is for every key.
            let out = try await reader.post("/dashboard/logout", ["_csrf": csrf])
            #expect(out.status == .seeOther && out.location == "/dashboard/login")

            // A support key: its forms, and the audit names it.
            let desk = DashboardTests.Browser(client)
            _ = try await desk.post("/dashboard/login", ["key": KeyScopeTests.desk])
            let page = try await desk.get("/dashboard/accounts/r1")
            #expect(page.body.contains(#"id="credit-form""#) && !page.body.contains(#"id="read-only""#))
            let deskCsrf = try #require(page.csrf)
            let credited = try await desk.post(
                "/dashboard/accounts/r1/credit",
                ["_csrf": deskCsrf, "idempotencyKey": "k2", "currency": "coins", "amount": "5", "reason": "ticket 1"])
            #expect(credited.status == .seeOther)
            let audit = try await app.store.anomalies.audit().filter { $0.action.contains("credit") }
            #expect(audit.first?.actor.contains("support-desk") == true, "\(audit.map(\.actor))")

        }
    }

    /// A key limited to some apps signs in and sees its apps' rows only: another app's
    /// purchases, anomalies and data rows are as if they did not exist, its analytics offer its
    /// apps only, and the server-wide webhooks are refused.
    @Test(arguments: ServerAPITests.databases)
    func aKeyLimitedToSomeAppsSeesItsAppsOnly(kind: String) async throws {
        try await GooglePlayServerTests.withPlay(
            kind,
            configure: {
                $0.operatorKeys = [
                    OperatorKey(label: "support-desk", scope: .support, secret: KeyScopeTests.desk),
                    OperatorKey(
                        label: "android-team", scope: .support, apps: ["android"], secret: KeyScopeTests.otherApp),
                ]
            }
        ) { play in
            let (app, client) = (play.app, play.client)
            // An App Store purchase, and an App Store anomaly (the same purchase claimed by another
            // account).
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "remove_ads")])
            let jws = bought.signedTransactions[0]
            let id = try #require(bought.transactions.first?.transactionId)
            #expect(try await ServerAPITests.submit(client, account: "r2", signedTransaction: jws).status == .ok)
            #expect(try await ServerAPITests.submit(client, account: "r3", signedTransaction: jws).status == .conflict)
            let anomaly = try #require(try await app.store.anomalies.anomalies(status: "open", limit: 10).first)

            let desk = DashboardTests.Browser(client)
            _ = try await desk.post("/dashboard/login", ["key": KeyScopeTests.desk])
            #expect(try await desk.get("/dashboard/anomalies").body.contains(anomaly.id))

            let limited = DashboardTests.Browser(client)
            let signedIn = try await limited.post("/dashboard/login", ["key": KeyScopeTests.otherApp])
            #expect(signedIn.status == .seeOther && limited.cookie != nil)
            let overview = try await limited.get("/dashboard")
            #expect(
                overview.status == .ok && overview.body.contains("android-team (support; apps: android)"),
                "\(overview.status) \(overview.body.suffix(600))")
            #expect(!overview.body.contains(#">Webhooks</a>"#))
            // Anomalies, search, data: the App Store's rows are not there.
            let anomalies = try await limited.get("/dashboard/anomalies")
            #expect(anomalies.status == .ok && !anomalies.body.contains(anomaly.id))
            let search = try await limited.get("/dashboard/search?q=\(id)")
            #expect(search.status == .ok && !search.body.contains("r2"), "\(search.body)")
            let today = String(StoreKeeperApp.iso(Date()).prefix(10))
            let data = try await limited.get("/dashboard/data?kind=transactions&since=\(today)")
            #expect(data.status == .ok && !data.body.contains(id))
            let csv = try await limited.get("/dashboard/data/transactions.csv?since=\(today)")
            #expect(csv.status == .ok && !csv.body.contains(id))
            // Analytics: its apps only, never "all".
            let analytics = try await limited.get("/dashboard/analytics")
            #expect(
                analytics.status == .ok && analytics.body.contains(#"<option value="android" selected>"#),
                "\(analytics.body.components(separatedBy: "appId").dropFirst().first?.prefix(400) ?? "")")
            #expect(
                analytics.body.contains(
                    #"<select name="appId"><option value="android" selected>android</option></select>"#))
            // Every store's figures can be picked, web payments' too.
            for store in ["app_store", "google_play", "web"] {
                #expect(analytics.body.contains(#"<option value="\#(store)">"#), "\(store)")
            }
            // Another app's anomaly cannot be resolved; webhooks are the whole server's.
            let csrf = try #require(anomalies.csrf)
            let resolve = try await limited.post(
                "/dashboard/anomalies/\(anomaly.id)/resolve", ["_csrf": csrf, "action": "dismiss"])
            #expect(resolve.status == .notFound)
            #expect(try await app.store.anomalies.anomaly(anomaly.id)?.status == "open")
            #expect(try await limited.get("/dashboard/webhooks").status == .forbidden)
        }
    }
}

/// The dashboard's data page: rows of a date range, paged, and the range as one CSV file.
@Suite struct DashboardDataTests {
    @Test(arguments: ServerAPITests.databases)
    func theDataPageListsARangeAndDownloadsItAsCSV(kind: String) async throws {
        try await ServerAPITests.withServer(
            kind, prepare: { $0.exportSettleSeconds = 0 }
        ) { app, client in
            let store = try #require(app.localAppStore)
            var ids: [String] = []
            for index in 0..<3 {
                let bought = try await store.buy("data-\(index)", items: [.init(productId: "coins_60")])
                _ = try await app.store.deliver(
                    StoreTransaction(apple: bought.transactions[0]), submittingAccount: "data-\(index)",
                    catalog: app.catalog, now: Date())
                ids.append(bought.transactions[0].transactionId!)
            }
            let browser = DashboardTests.Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let today = String(StoreKeeperApp.iso(Date()).prefix(10))
            let tomorrow = String(StoreKeeperApp.iso(Date().addingTimeInterval(86_400)).prefix(10))
            let page = try await browser.get("/dashboard/data?kind=transactions&since=\(today)&until=\(tomorrow)")
            #expect(page.status == .ok)
            #expect(page.body.contains(#"id="data-table""#) && ids.allSatisfy { page.body.contains($0) })
            // An empty range says so; a bad date or kind is a 400 page.
            let empty = try await browser.get("/dashboard/data?kind=transactions&since=2020-01-01&until=2020-01-02")
            #expect(empty.body.contains("No transactions in this range yet."))
            #expect(try await browser.get("/dashboard/data?since=yesterday").status == .badRequest)
            #expect(try await browser.get("/dashboard/data?kind=refunds").status == .badRequest)
            // Orders: the list and its CSV, in creation order.
            var orders: [String] = []
            for index in 0..<2 {
                let order = try await ServerAPITests.call(
                    client, .post, "/v1/orders", body: #"{"accountId":"data-\#(index)","productId":"coins_60"}"#)
                orders.append(try #require(order.json["orderId"] as? String))
            }
            let orderPage = try await browser.get("/dashboard/data?kind=orders&since=\(today)&until=\(tomorrow)")
            #expect(orderPage.status == .ok && orders.allSatisfy { orderPage.body.contains($0) })
            let orderCSV = try await browser.get("/dashboard/data/orders.csv?since=\(today)")
            #expect(orderCSV.body.hasPrefix("order_id,account_id,app_id,product_id,quantity,status,created_at"))
            let lines = orderCSV.body.split(separator: "\r\n")
            #expect(
                lines.count == 3 && lines[1].contains(orders[0]) && lines[2].contains(orders[1]), "\(orderCSV.body)")
            // The CSV: every row of the range, as the export writes it, as an attachment.
            let csv = try await browser.get("/dashboard/data/transactions.csv?since=\(today)&until=\(tomorrow)")
            #expect(csv.status == .ok && csv.headers[.contentType] == "text/csv; charset=utf-8")
            #expect(
                csv.headers[.contentDisposition]?.contains("attachment; filename=\"storekeeper-transactions-") == true)
            #expect(csv.body.hasPrefix("transaction_id,") && ids.allSatisfy { csv.body.contains($0) })
            #expect(try await browser.get("/dashboard/data/transactions.txt").status == .notFound)
        }
    }
}
