import AppStoreAdapter
import AppStoreModels
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import StoreKeeperCore
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// The operator dashboard over HTTP on the real server and database: sign-in, the session
/// cookie, CSRF and origin checks, every page, the anomaly action and its audit, escaping.
/// (`Tests/Browser/dashboard_test.py` drives the same pages in a real browser.)
@Suite struct DashboardTests {
    // MARK: Sessions and charts (pure)

    @Test func sessionsExpireWhenIdleOrOldAndRefuseTampering() throws {
        let sessions = DashboardSessions(secretKeys: ["key-one", "key-two"], idleSeconds: 600, maximumSeconds: 3600)
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let token = sessions.issue(keyIndex: 1, now: start)
        guard case .valid(let session) = sessions.check(token, now: start.addingTimeInterval(599)) else {
            Issue.record("a fresh session is valid")
            return
        }
        #expect(session.keyIndex == 1)
        // Idle past 10 minutes: expired. Seen again within: renewed, valid up to the maximum.
        #expect(sessions.check(token, now: start.addingTimeInterval(601)) == .expired)
        #expect(sessions.renewed(session, now: start.addingTimeInterval(100)) == nil)
        let renewed = try #require(sessions.renewed(session, now: start.addingTimeInterval(500)))
        guard case .valid = sessions.check(renewed, now: start.addingTimeInterval(1000)) else {
            Issue.record("a renewed session is valid")
            return
        }
        #expect(sessions.check(renewed, now: start.addingTimeInterval(3601)) == .expired)
        // Tampering: any changed field, a future lastSeen, another server's key, garbage.
        var parts = token.split(separator: ".").map(String.init)
        parts[2] = String(Int(parts[2])! + 500)
        #expect(sessions.check(parts.joined(separator: "."), now: start) == .invalid)
        let other = DashboardSessions(secretKeys: ["key-three"], idleSeconds: 600, maximumSeconds: 3600)
        #expect(other.check(token, now: start) == .invalid)
        let rotated = DashboardSessions(secretKeys: ["key-one"], idleSeconds: 600, maximumSeconds: 3600)
        #expect(rotated.check(token, now: start) == .invalid)
        for garbage in ["", "v1", "v1.1.1.zz.zz", String(repeating: "a", count: 5000), token + "0"] {
            #expect(sessions.check(garbage, now: start) == .invalid)
        }
        // CSRF: the session's own token only.
        let csrf = sessions.csrfToken(session)
        #expect(sessions.csrfValid(csrf, session: session))
        #expect(!sessions.csrfValid(nil, session: session))
        #expect(!sessions.csrfValid(String(csrf.reversed()), session: session))
        guard case .valid(let second) = sessions.check(sessions.issue(keyIndex: 0, now: start), now: start) else {
            Issue.record("a second session is valid")
            return
        }
        #expect(!sessions.csrfValid(csrf, session: second))
    }

    @Test func chartsScaleToRoundTicksAndEscapeLabels() {
        #expect(BarChart.niceCeiling(0) == 1)
        #expect(BarChart.niceCeiling(7) == 10)
        #expect(BarChart.niceCeiling(180) == 200)
        #expect(BarChart.niceCeiling(2_400) == 2_500)
        let chart = BarChart(
            title: "A <b>chart</b>", labels: ["<x>", "b"],
            series: [
                .init(name: "n\"", cssClass: "s1", values: [10, 5]), .init(name: "m", cssClass: "s2", values: [0, 0]),
            ])
        let svg = chart.svg()
        #expect(svg.hasPrefix("<svg") && svg.hasSuffix("</svg>"))
        #expect(!svg.contains("<b>") && svg.contains("A &lt;b&gt;chart&lt;/b&gt;") && svg.contains("&lt;x&gt;"))
        #expect(svg.contains("n&quot;"))
        // Two series → a legend; the top tick is 12 for a maximum of 10 (whole-number ticks).
        #expect(svg.contains(">12</text>"))
        #expect(svg.components(separatedBy: "<rect").count - 1 == 4 + 2)
    }

    // MARK: Over HTTP

    /// A client that keeps the session cookie, like a browser.
    final class Browser: @unchecked Sendable {
        let client: any TestClientProtocol
        var cookie: String?

        init(_ client: any TestClientProtocol) { self.client = client }

        struct Page {
            var status: HTTPResponse.Status
            var body: String
            var headers: HTTPFields
            var location: String? { headers[.location] }
            var csrf: String? {
                guard let range = body.range(of: #"name="_csrf" value=""#) else { return nil }
                return String(body[range.upperBound...].prefix(64))
            }
        }

        func get(_ path: String) async throws -> Page { try await send(.get, path, form: nil) }

        func post(_ path: String, _ form: [String: String], headers extra: HTTPFields = [:]) async throws -> Page {
            let body = form.map {
                "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")"
            }
            .joined(separator: "&")
            return try await send(.post, path, form: body, headers: extra)
        }

        func send(_ method: HTTPRequest.Method, _ path: String, form: String?, headers extra: HTTPFields = [:])
            async throws -> Page
        {
            var headers = extra
            if form != nil { headers[.contentType] = "application/x-www-form-urlencoded" }
            if let cookie { headers[.cookie] = "\(DashboardSessions.cookieName)=\(cookie)" }
            let page = try await client.execute(
                uri: path, method: method, headers: headers, body: form.map { ByteBuffer(string: $0) }
            ) { response in
                Page(status: response.status, body: String(buffer: response.body), headers: response.headers)
            }
            for value in page.headers[values: .setCookie] {
                let pair = value.split(separator: ";")[0]
                if pair.hasPrefix("\(DashboardSessions.cookieName)=") {
                    let token = String(pair.dropFirst(DashboardSessions.cookieName.count + 1))
                    cookie = token.isEmpty ? nil : token
                }
            }
            return page
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func operatorSignsInDeliversAnUnattributedPurchaseAndForgeriesAreRefused(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let browser = Browser(client)
            // Not signed in: every page sends to the sign-in page.
            for path in ["/dashboard", "/dashboard/anomalies", "/dashboard/accounts/x", "/dashboard/webhooks"] {
                let page = try await browser.get(path)
                #expect(page.status == .seeOther && page.location == "/dashboard/login", "\(path)")
            }
            #expect(try await browser.get("/dashboard/login").body.contains(#"type="password""#))
            // A wrong key: 401, no cookie.
            let wrong = try await browser.post("/dashboard/login", ["key": "sk_wrong"])
            #expect(wrong.status == .unauthorized)
            #expect(wrong.body.contains("not one of this server"))
            #expect(browser.cookie == nil)
            // The right key: a cookie that scripts cannot read and other sites cannot send.
            let signedIn = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            #expect(signedIn.status == .seeOther && signedIn.location == "/dashboard")
            let setCookie = try #require(signedIn.headers[.setCookie])
            for attribute in ["HttpOnly", "SameSite=Strict", "Path=/dashboard"] {
                #expect(setCookie.contains(attribute))
            }
            #expect(!setCookie.contains("Secure"))
            let overTLS = try await Browser(client).post(
                "/dashboard/login", ["key": ServerAPITests.secret],
                headers: [HTTPField.Name("X-Forwarded-Proto")!: "https"])
            #expect(overTLS.headers[.setCookie]?.contains("; Secure") == true)

            // A purchase paid with no order and no account: an unattributed anomaly.
            let store = try #require(app.localAppStore)
            let bought = try await store.buy("stranger", items: [.init(productId: "coins_60")])
            let orphan = try await app.store.deliver(
                StoreTransaction(apple: bought.transactions[0]), submittingAccount: nil, catalog: app.catalog,
                now: Date())
            #expect(orphan.plan.outcome == .unattributed)
            let anomaly = try #require(try await app.store.anomalies.anomalies(status: "open").first)

            let overview = try await browser.get("/dashboard")
            #expect(overview.status == .ok)
            #expect(overview.headers[.contentType] == "text/html; charset=utf-8")
            #expect(
                overview.headers[HTTPField.Name("Content-Security-Policy")!]?.contains("default-src 'none'") == true)
            #expect(overview.body.contains(#"id="open-anomalies">1<"#))
            #expect(overview.body.components(separatedBy: "<svg").count - 1 >= 3)
            #expect(overview.body.contains("<table>"))
            let list = try await browser.get("/dashboard/anomalies")
            #expect(list.body.contains("anomaly-\(anomaly.id)") && list.body.contains("unattributed_transaction"))
            let csrf = try #require(list.csrf)
            let resolve = "/dashboard/anomalies/\(anomaly.id)/resolve"
            let deliver = ["action": "deliver", "accountId": "dana", "note": "ticket 7"]

            // Forgeries change nothing: no CSRF token, another session's token, another site.
            #expect(try await browser.post(resolve, deliver).status == .forbidden)
            let otherSession = Browser(client)
            _ = try await otherSession.post("/dashboard/login", ["key": ServerAPITests.secret])
            let otherCSRF = try #require(try await otherSession.get("/dashboard/anomalies").csrf)
            if otherCSRF != csrf {
                #expect(
                    try await browser.post(resolve, deliver.merging(["_csrf": otherCSRF]) { $1 }).status == .forbidden)
            }
            let crossSite = try await browser.post(
                resolve, deliver.merging(["_csrf": csrf]) { $1 }, headers: [.origin: "https://evil.example"])
            #expect(crossSite.status == .forbidden)
            // An expired session: refused, sent to sign in again.
            let stale = Browser(client)
            stale.cookie = app.dashboardSessions.issue(keyIndex: 0, now: Date().addingTimeInterval(-7200))
            #expect(try await stale.get("/dashboard").location == "/dashboard/login?expired=1")
            let stalePost = try await stale.post(resolve, deliver.merging(["_csrf": csrf]) { $1 })
            #expect(stalePost.status == .unauthorized)
            #expect(try await app.store.anomalies.anomaly(anomaly.id)?.status == "open")
            #expect(try await app.store.accounts.balances(of: "dana").isEmpty)

            // The real form: delivered once, audited, shown on the account page.
            let done = try await browser.post(resolve, deliver.merging(["_csrf": csrf]) { $1 })
            #expect(done.status == .seeOther)
            #expect(done.location == "/dashboard/accounts/dana?done=delivered")
            let again = try await browser.post(resolve, deliver.merging(["_csrf": csrf]) { $1 })
            #expect(again.status == .seeOther)
            #expect(try await app.store.accounts.balances(of: "dana") == ["coins": 60])
            #expect(try await app.store.anomalies.anomaly(anomaly.id)?.status == "resolved")
            let account = try await browser.get(try #require(done.location))
            #expect(account.body.contains(#"<td class="num balance">60</td>"#))
            #expect(account.body.contains(#"data-action="manual_delivery""#))
            #expect(account.body.contains("ticket 7 (dashboard)"))
            #expect(account.body.contains("Delivered."))
            #expect(account.body.contains("Consent to share consumption data with Apple: <strong>not asked</strong>"))
            _ = try await app.store.accounts.setConsent("dana", consumptionData: true, source: "app", now: Date())
            #expect(
                try await browser.get("/dashboard/accounts/dana").body.contains(
                    "Consent to share consumption data with Apple: <strong>yes</strong> (app)"))
            // Search: a transaction id leads to its account.
            let transactionId = try #require(bought.transactions[0].transactionId)
            #expect(
                try await browser.get("/dashboard/search?q=\(transactionId)").location == "/dashboard/accounts/dana")
            let nothing = try await browser.get("/dashboard/search?q=no-such-id")
            #expect(nothing.status == .ok && nothing.body.contains("Nothing has the id"))

            // Hostile ids are text, never markup; unknown ids are answered, never a crash.
            let hostile = try await browser.get("/dashboard/accounts/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
            #expect(hostile.status == .ok)
            #expect(!hostile.body.contains("<script>") && hostile.body.contains("&lt;script&gt;"))
            let missing = try await browser.post(
                "/dashboard/anomalies/no-such/resolve", ["_csrf": csrf, "action": "dismiss"])
            #expect(missing.status == .notFound && missing.body.contains("no anomaly"))
            let badAction = try await browser.post(resolve, ["_csrf": csrf, "action": "explode"])
            #expect(badAction.status == .badRequest)
            let webhooks = try await browser.get("/dashboard/webhooks")
            #expect(webhooks.status == .ok && webhooks.body.contains("No dead letters"))
            // No webhooks.url here: the page says so plainly.
            #expect(webhooks.body.contains("No webhook URL is configured"))
            let style = try await browser.get("/dashboard/static/style.css")
            #expect(style.headers[.contentType] == "text/css; charset=utf-8")

            // The figures behind the overview, from the database.
            let figures = try await app.store.reports.dashboardOverview(
                days: 14, now: Date(), smallBusinessProgram: false)
            #expect(figures.days.count == 14)
            #expect(figures.days.last?.deliveries == 1)
            #expect(figures.days.last?.proceedsMilli.values.reduce(0, +) ?? 0 > 0)
            #expect(figures.openAnomalies == 0)

            // Signing out ends the cookie.
            let out = try await browser.post("/dashboard/logout", ["_csrf": csrf])
            #expect(out.location == "/dashboard/login")
            #expect(browser.cookie == nil)
            #expect(try await browser.get("/dashboard").location == "/dashboard/login")
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func theOverviewLeadsWithAnalyticsOwnFiguresSaysWhenThereIsNoDataAndStraysGetAPage(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let browser = Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            // Nothing delivered yet: a sentence, not empty charts.
            let empty = try await browser.get("/dashboard")
            #expect(empty.status == .ok)
            #expect(empty.body.contains(#"id="empty-overview""#) && !empty.body.contains("<svg"))
            // A stray address: a page in the dashboard's style, 404, not the API's JSON.
            for path in ["/dashboard/nope", "/dashboard/accounts/x/nothing/here"] {
                let stray = try await browser.get(path)
                #expect(stray.status == .notFound, "\(path)")
                #expect(stray.headers[.contentType] == "text/html; charset=utf-8")
                #expect(stray.body.contains("Not found") && stray.body.contains(#"href="/dashboard""#))
            }
            // Purchases delivered: the headline figures are analytics' own for today and the month.
            let store = try #require(app.localAppStore)
            for (account, product) in [("fig-1", "coins_300"), ("fig-2", "pro_monthly"), ("fig-3", "coins_60")] {
                let bought = try await store.buy(account, items: [.init(productId: product)])
                _ = try await app.store.deliver(
                    StoreTransaction(apple: bought.transactions[0]), submittingAccount: account, catalog: app.catalog,
                    now: Date())
            }
            let overview = try await browser.get("/dashboard")
            #expect(!overview.body.contains(#"id="empty-overview""#) && overview.body.contains("<svg"))
            func shown(_ id: String) throws -> String {
                let range = try #require(overview.body.range(of: #"id="\#(id)">"#))
                return String(overview.body[range.upperBound...].prefix { $0 != "<" })
            }
            let today = AnalyticsCalendar(timeZone: app.configuration.analyticsTimeZone).day(of: Date()).description
            func api(_ metric: String, interval: String, from: String) async throws -> String {
                let reply = try await ServerAPITests.call(
                    client, .get, "/v1/analytics/\(metric)?from=\(from)&to=\(today)&interval=\(interval)")
                let points = try #require(reply.json["points"] as? [[String: Any]])
                let value = Decimal(string: "\(points.last?["value"] ?? 0)") ?? 0
                return "\(DashboardController.money(value)) \(reply.json["currency"] as? String ?? "")"
            }
            #expect(try shown("headline-mrr") == (try await api("mrr", interval: "day", from: today)))
            #expect(try shown("headline-today") == (try await api("proceeds", interval: "day", from: today)))
            #expect(
                try shown("headline-month")
                    == (try await api("proceeds", interval: "month", from: String(today.prefix(8)) + "01")))
            #expect(DashboardController.money(1_234_567.891) == "1,234,567.89")
            #expect(DashboardController.money(-0.5) == "−0.50")
        }
    }

    @Test func aDisabledDashboardIsNotServed() async throws {
        try await ServerAPITests.withServer("sqlite", configure: { $0.dashboardEnabled = false }) { _, client in
            let page = try await Browser(client).get("/dashboard/login")
            #expect(page.status == .notFound)
        }
    }
}

/// The account page's support forms: credit, debit and grant through the API's own code paths,
/// each audited, a form sent twice acting once.
@Suite struct DashboardSupportTests {
    typealias Browser = DashboardTests.Browser

    @Test(arguments: ServerAPITests.databases)
    func anOperatorCreditsDebitsAndGrantsFromTheAccountPage(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let browser = Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let page = try await browser.get("/dashboard/accounts/player%201")
            #expect(page.status == .ok)
            #expect(page.body.contains(#"id="credit-form""#) && page.body.contains("<option>coins</option>"))
            #expect(page.body.contains(#"action="/dashboard/accounts/player%201/credit""#), "\(page.body)")
            let csrf = try #require(page.csrf)
            let keyRange = try #require(page.body.range(of: #"name="idempotencyKey" value=""#))
            let key = String(page.body[keyRange.upperBound...].prefix(36))
            let form = [
                "_csrf": csrf, "idempotencyKey": key, "currency": "coins", "amount": "150", "reason": "ticket 5",
            ]
            let credited = try await browser.post("/dashboard/accounts/player%201/credit", form)
            #expect(credited.status == .seeOther && credited.location?.contains("done=credited") == true)
            // The same form again (a double click): nothing more.
            let twice = try await browser.post("/dashboard/accounts/player%201/credit", form)
            #expect(twice.status == .seeOther)
            let balance = try await ServerAPITests.call(client, .get, "/v1/accounts/player%201")
            #expect((balance.json["balances"] as? [String: Int])?["coins"] == 150)
            let after = try await browser.get(credited.location ?? "")
            #expect(after.body.contains("Credited"))
            // A debit with its own key; a typo'd currency is refused, nothing changed.
            let debited = try await browser.post(
                "/dashboard/accounts/player%201/debit",
                ["_csrf": csrf, "idempotencyKey": "k-debit", "currency": "coins", "amount": "50", "reason": "ticket 6"])
            #expect(debited.location?.contains("done=debited") == true)
            // Each reason is on the ledger, beside its entry.
            let ledger = try await browser.get("/dashboard/accounts/player%201")
            let rows = ledger.body.components(separatedBy: "<tr>").filter {
                $0.contains("credit:") || $0.contains("debit:")
            }
            #expect(rows.contains { $0.contains("credit:") && $0.contains("ticket 5") }, "\(rows)")
            #expect(rows.contains { $0.contains("debit:") && $0.contains("ticket 6") }, "\(rows)")
            let typo = try await browser.post(
                "/dashboard/accounts/player%201/credit",
                ["_csrf": csrf, "idempotencyKey": "k-typo", "currency": "coin", "amount": "5", "reason": "r"])
            #expect(typo.status == .badRequest && typo.body.contains("coins"))
            let granted = try await browser.post(
                "/dashboard/accounts/player%201/grant",
                ["_csrf": csrf, "entitlement": "pro", "days": "7", "note": "outage"])
            #expect(granted.location?.contains("done=granted") == true)
            let account = try await ServerAPITests.call(client, .get, "/v1/accounts/player%201")
            #expect((account.json["balances"] as? [String: Int])?["coins"] == 100)
            #expect(
                (account.json["entitlements"] as? [[String: Any]])?.contains { $0["id"] as? String == "pro" } == true)
            let audit = try await app.store.anomalies.audit()
            #expect(audit.contains { $0.action == "balance_credited" && $0.detail.contains("ticket 5") })
            // Without the session's CSRF token: refused.
            let forged = try await browser.post(
                "/dashboard/accounts/player%201/credit",
                ["idempotencyKey": "k-x", "currency": "coins", "amount": "5", "reason": "r"])
            #expect(forged.status == .forbidden)
        }
    }
}
