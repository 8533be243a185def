import AppStoreModels
import Foundation
import GooglePlay
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import LocalGooglePlay
import NIOCore
import SQLKit
import StoreKeeperCatalog
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// Google Play beside the App Store (docs/api.md "Several apps, two stores"): the real server on
/// SQLite and PostgreSQL, the local Google Play over HTTP as Google, through the Play
/// Developer API client.
@Suite struct GooglePlayServerTests {
    typealias API = ServerAPITests
    static let audience = "https://storekeeper.test/v1/notifications/google"
    static let pushAccount = "play-push@storekeeper-test.iam.gserviceaccount.com"

    struct Play {
        let app: StoreKeeperApp
        let client: any TestClientProtocol
        let store: LocalGooglePlay
        let server: LocalGooglePlayServer

        /// Pushes every due notification to the server as Pub/Sub would; returns the statuses.
        @discardableResult
        func push() async throws -> [HTTPResponse.Status] {
            var statuses: [HTTPResponse.Status] = []
            for push in await store.takeDuePushes() {
                let (body, authorization) = try await server.pushRequest(
                    push, audience: GooglePlayServerTests.audience, serviceAccount: GooglePlayServerTests.pushAccount)
                statuses.append(try await post(body, authorization: authorization))
            }
            return statuses
        }

        func post(_ body: Data, authorization: String?) async throws -> HTTPResponse.Status {
            var headers: HTTPFields = [.contentType: "application/json"]
            if let authorization { headers[.authorization] = authorization }
            return try await client.execute(
                uri: "/v1/notifications/google", method: .post, headers: headers, body: ByteBuffer(bytes: body)
            ) { $0.status }
        }

        func runJobs(now: Date = Date()) async {
            let runner = JobRunner(app: app)
            while await runner.runDueCounting(now: now).claimed > 0 {}
        }

        func order(_ account: String, _ product: String) async throws -> (id: String, token: String) {
            let reply = try await API.call(
                client, .post, "/v1/orders",
                body: #"{"accountId":"\#(account)","productId":"\#(product)","appId":"android"}"#)
            #expect(reply.status == .created, "\(reply.json)")
            #expect(reply.json["appId"] as? String == "android")
            return (reply.json["orderId"] as? String ?? "", reply.json["appAccountToken"] as? String ?? "")
        }

        func submit(_ account: String, _ product: String, _ token: String, orderId: String? = nil) async throws
            -> API.Reply
        {
            let order = orderId.map { #","orderId":"\#($0)""# } ?? ""
            return try await API.call(
                client, .post, "/v1/purchases",
                body:
                    #"{"store":"google_play","appId":"android","accountId":"\#(account)","productId":"\#(product)","purchaseToken":"\#(token)"\#(order)}"#
            )
        }

        func balance(_ account: String) async throws -> Int {
            (try await API.call(client, .get, "/v1/accounts/\(account)").json["balances"] as? [String: Int])?["coins"]
                ?? 0
        }

        func entitlements(_ account: String) async throws -> [String] {
            (try await API.call(client, .get, "/v1/accounts/\(account)").json["entitlements"] as? [[String: Any]] ?? [])
                .compactMap { $0["id"] as? String }
        }

        func subscriptions(_ account: String) async throws -> [[String: Any]] {
            try await API.call(client, .get, "/v1/accounts/\(account)").json["subscriptions"] as? [[String: Any]] ?? []
        }
    }

    /// `testPurchases`: every purchase a license tester's; `environments`: what the server
    /// accepts; `secondApp`: another Google app (package `com.example.other`, its own push
    /// audience `audience + "/other"`) served by the same local Google Play.
    static func withPlay(
        _ kind: String, testPurchases: Bool = false,
        environments: Set<AppStoreEnvironment> = [.production, .sandbox], secondApp: Bool = false,
        configure extra: @Sendable @escaping (inout ServerConfiguration) -> Void = { _ in },
        _ body: @Sendable (Play) async throws -> Void
    ) async throws {
        var storeConfiguration = LocalGooglePlay.Configuration(packageName: "com.example.android", catalog: .demo)
        storeConfiguration.testPurchases = testPurchases
        let store = LocalGooglePlay(configuration: storeConfiguration, clock: StoreClock(start: Date(), scale: 0))
        let server = try await LocalGooglePlayServer(store: store)
        let running = try await server.start()
        do {
            try await API.withServer(
                kind, environments: environments,
                configure: { configuration in
                    var google = GooglePlayAppConfiguration(id: "android", packageName: "com.example.android")
                    google.serviceAccountKey = server.serviceAccountKey(baseURL: running.baseURL)
                    google.apiBaseURL = running.baseURL
                    google.pushAudience = audience
                    google.pushServiceAccount = pushAccount
                    google.pushCertificatesURL = running.baseURL + "/oauth2/v3/certs"
                    configuration.googlePlayApps = [google]
                    if secondApp {
                        var other = google
                        other.id = "android-other"
                        other.packageName = "com.example.other"
                        other.pushAudience = audience + "/other"
                        configuration.googlePlayApps.append(other)
                    }
                    extra(&configuration)
                }
            ) { app, client in
                try await body(Play(app: app, client: client, store: store, server: server))
            }
        } catch {
            await running.stop()
            throw error
        }
        await running.stop()
    }

    @Test(arguments: API.databases)
    func anAndroidPurchaseIsDeliveredOnceToItsOrderAndAcknowledgedByTheServer(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            // Orders name the app once there are several.
            let missing = try await API.call(
                play.client, .post, "/v1/orders", body: #"{"accountId":"droid","productId":"coins_60"}"#)
            #expect(missing.status == .badRequest)
            let unknown = try await API.call(
                play.client, .post, "/v1/orders",
                body: #"{"accountId":"droid","productId":"coins_60","appId":"ios-nope"}"#)
            #expect((unknown.json["error"] as? [String: Any])?["code"] as? String == "unknown_app")

            let order = try await play.order("droid", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token, quantity: 2)
            let first = try await play.submit("droid", "coins_60", token, orderId: order.id)
            #expect(first.status == .ok, "\(first.json)")
            #expect(first.json["status"] as? String == "delivered")
            let transaction = try #require((first.json["transactions"] as? [[String: Any]])?.first)
            #expect((transaction["transactionId"] as? String)?.hasPrefix("gp:GPA.") == true)
            #expect(transaction["orderId"] as? String == order.id)
            #expect(transaction["store"] as? String == "google_play")
            #expect(transaction["appId"] as? String == "android")
            #expect(try await play.balance("droid") == 120)
            // The app retries, a notification arrives, a second device submits: once.
            #expect(try await play.submit("droid", "coins_60", token).json["status"] as? String == "already_delivered")
            #expect(try await play.push() == [.noContent])
            await play.runJobs()
            #expect(try await play.balance("droid") == 120)
            // Another account submitting the same token gets nothing of it.
            let thief = try await play.submit("thief", "coins_60", token)
            #expect(
                thief.status != .ok
                    || (thief.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String != "delivered")
            #expect(try await play.balance("thief") == 0)
            // The server consumed it at Google (a consumable): never refunded for want of it.
            let purchase = try #require(await play.store.purchase(token))
            #expect(purchase.consumed && purchase.acknowledged)
            await play.store.advance(by: 4 * 86_400)
            #expect(await play.store.purchase(token)?.voided == false)

            // Bad requests: a made-up token, a wrong product, a missing token, no such app.
            let madeUp = try await play.submit("droid", "coins_60", "not-a-token")
            #expect((madeUp.json["error"] as? [String: Any])?["code"] as? String == "invalid_purchase_token")
            let other = try await play.store.buy("remove_ads", obfuscatedAccountId: nil)
            let mismatch = try await play.submit("droid", "coins_60", other)
            #expect((mismatch.json["error"] as? [String: Any])?["code"] as? String == "product_mismatch")
            for bad in [
                #"{"store":"google_play","accountId":"droid","productId":"coins_60"}"#,
                #"{"store":"google_play","accountId":"droid","productId":"coins_60","purchaseToken":"a b"}"#,
                #"{"store":"google_play","accountId":"droid","purchaseToken":"abc"}"#,
                #"{"store":"google_play","accountId":"droid","productId":"coins_60","purchaseToken":"abc","signedTransaction":"x"}"#,
            ] {
                let reply = try await API.call(play.client, .post, "/v1/purchases", body: bad)
                #expect(reply.status == .badRequest, "\(bad) → \(reply.json)")
            }
            let noApp = try await API.call(
                play.client, .post, "/v1/purchases",
                body:
                    #"{"store":"google_play","appId":"ios","accountId":"droid","productId":"coins_60","purchaseToken":"abc"}"#
            )
            #expect((noApp.json["error"] as? [String: Any])?["code"] as? String == "unknown_app")
        }
    }

    /// Google's purchase resources carry no price for one-time products and name the country
    /// in alpha-2: the server reads each paid order's total from the Orders API (after the
    /// delivery, never in its way) and records the country as the App Store's alpha-3, so
    /// proceeds and the `country` filter count Android purchases like iOS ones.
    /// Acknowledgements run as a batch: each purchase acknowledged (a consumable consumed) at
    /// Google once, each audited once, and a purchase Google cannot find fails its own job only.
    @Test(arguments: API.databases)
    func acknowledgementsOfABatchAreEachRecordedOnce(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            var tokens: [String] = []
            for (index, product) in ["coins_60", "remove_ads", "coins_300"].enumerated() {
                let order = try await play.order("batch\(index)", product)
                let token = try await play.store.buy(product, obfuscatedAccountId: order.token)
                #expect(try await play.submit("batch\(index)", product, token, orderId: order.id).status == .ok)
                tokens.append(token)
            }
            await play.runJobs(now: Date().addingTimeInterval(60))
            for (index, token) in tokens.enumerated() {
                let purchase = try #require(await play.store.purchase(token))
                #expect(purchase.acknowledged && purchase.consumed == (index != 1), "\(index)")
            }
            let audits = try await play.app.store.anomalies.audit().filter { $0.action == "google_acknowledged" }
            #expect(audits.count == 3)
            let (acknowledged, pending) = try await play.app.database.read { sql in
                (
                    try await sql.raw("SELECT COUNT(*) AS n FROM google_purchases WHERE acknowledged_at IS NOT NULL")
                        .first()?.decode(column: "n", as: Int.self) ?? 0,
                    try await sql.raw(
                        "SELECT COUNT(*) AS n FROM jobs WHERE kind = 'google_acknowledge' AND status <> 'done'"
                    )
                    .first()?.decode(column: "n", as: Int.self) ?? -1
                )
            }
            #expect(acknowledged == 3 && pending == 0)
            // Again: nothing more is acknowledged or audited.
            await play.runJobs(now: Date().addingTimeInterval(7200))
            #expect(try await play.app.store.anomalies.audit().filter { $0.action == "google_acknowledged" }.count == 3)
        }
    }

    /// Order prices run a claim at a time too: the delivered purchases' orders read in one
    /// `orders.batchGet`, each priced once from its own order, one not delivered yet (held
    /// unattributed) waiting alone; an order Google does not know fails the batch call, and then
    /// each order is read alone and only its own job fails.
    @Test(arguments: API.databases)
    func orderPricesOfABatchAreEachRecordedOnce(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            var tokens: [String] = []
            for quantity in 1...4 {
                let order = try await play.order("prices\(quantity)", "coins_60")
                let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token, quantity: quantity)
                #expect(try await play.submit("prices\(quantity)", "coins_60", token, orderId: order.id).status == .ok)
                tokens.append(token)
            }
            // The order prices wait until after the tampering below, however slow the machine (they
            // are due 5 s after their delivery: a loaded run reached them first).
            try await play.app.database.transaction { sql in
                try await sql.raw(
                    "UPDATE jobs SET run_at = run_at + 3600000 WHERE kind = \(bind: GooglePlayStore.orderPriceJobKind)"
                ).run()
            }
            _ = try await play.store.buy("remove_ads", obfuscatedAccountId: nil)
            _ = try await play.push()
            await play.runJobs()
            func read() async throws -> (prices: [(Int64, Int64?)], jobs: [String]) {
                try await play.app.database.read { sql in
                    (
                        try await sql.raw(
                            "SELECT quantity, price_milli FROM deliveries WHERE product_id = 'coins_60' ORDER BY quantity"
                        ).all().map {
                            (
                                try $0.decode(column: "quantity", as: Int64.self),
                                try $0.decode(column: "price_milli", as: Int64?.self)
                            )
                        },
                        try await sql.raw(
                            "SELECT status, last_error FROM jobs WHERE kind = 'google_order_price' ORDER BY status, last_error"
                        ).all().map {
                            "\(try $0.decode(column: "status", as: String.self)): \(try $0.decode(column: "last_error", as: String?.self) ?? "")"
                        }
                    )
                }
            }
            // The fourth purchase's order, as recorded, is one Google never issued.
            let fourth = tokens[3]
            try await play.app.database.transaction { sql in
                let original = try #require(
                    try await sql.raw("SELECT order_id FROM google_purchases WHERE purchase_token = \(bind: fourth)")
                        .first()?.decode(column: "order_id", as: String.self))
                try await sql.raw(
                    "UPDATE google_purchases SET order_id = 'GPA.0000-0000-0000-00000' WHERE purchase_token = \(bind: fourth)"
                ).run()
                try await sql.raw(
                    "UPDATE deliveries SET transaction_id = 'gp:GPA.0000-0000-0000-00000' WHERE transaction_id = \(bind: "gp:" + original)"
                ).run()
            }
            await play.runJobs(now: Date().addingTimeInterval(3600 + 10))
            let (prices, jobs) = try await read()
            let unit = try #require(prices.first?.1)
            #expect(unit > 0)
            #expect(
                prices.map(\.0) == [1, 2, 3, 4] && prices.map(\.1) == [unit, 2 * unit, 3 * unit, nil], "\(prices)")
            #expect(jobs.count == 5 && jobs.prefix(3).allSatisfy { $0 == "done: " }, "\(jobs)")
            #expect(jobs.dropFirst(3).first?.hasPrefix("failed: Google Play answered 404") == true, "\(jobs)")
            #expect(jobs.last == "pending: not delivered yet", "\(jobs)")
        }
    }

    /// Purchases submitted at once share group-commit batches, whose Google records, accounts
    /// and jobs are written as multi-row statements: each purchase is still delivered once to
    /// its own account, recorded with it, acknowledged once and priced once; a token submitted
    /// twice at once is delivered once; a token a paid replacement retired grants nothing.
    @Test(arguments: API.databases)
    func purchasesSubmittedAtOnceAreEachRecordedDeliveredAndAcknowledgedOnce(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let monthly = try await play.store.buy("pro_monthly", obfuscatedAccountId: nil)
            #expect(try await play.submit("old", "pro_monthly", monthly).status == .ok)
            let yearly = try await play.store.buy(
                "pro_yearly", obfuscatedAccountId: nil, linkedPurchaseToken: monthly)
            #expect(try await play.submit("old", "pro_yearly", yearly).status == .ok)
            var purchases: [(account: String, order: String, token: String)] = []
            for index in 0..<12 {
                let order = try await play.order("at-once\(index)", "coins_60")
                let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
                purchases.append(("at-once\(index)", order.id, token))
            }
            let twice = purchases[0]
            // What each submission answered: its status and its transaction's outcome.
            @Sendable func submit(_ account: String, _ product: String, _ token: String, _ order: String?)
                async throws -> (status: Int, outcome: String?)
            {
                let reply = try await play.submit(account, product, token, orderId: order)
                return (
                    Int(reply.status.code),
                    (reply.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String
                )
            }
            let replies = try await withThrowingTaskGroup(of: (Int, (status: Int, outcome: String?)).self) { group in
                for (index, purchase) in (purchases + [twice]).enumerated() {
                    group.addTask {
                        (index, try await submit(purchase.account, "coins_60", purchase.token, purchase.order))
                    }
                }
                // The retired token again, inside the same burst.
                group.addTask { (-1, try await submit("thief", "pro_monthly", monthly, nil)) }
                var replies: [Int: (status: Int, outcome: String?)] = [:]
                for try await (index, reply) in group { replies[index] = reply }
                return replies
            }
            for index in 0..<12 {
                #expect(replies[index]?.status == 200, "\(String(describing: replies[index]))")
                #expect(try await play.balance(purchases[index].account) == 60, "\(index)")
            }
            let outcomes = [replies[0], replies[12]].compactMap { $0?.outcome }
            #expect(outcomes.sorted() == ["already_delivered", "delivered"], "\(outcomes)")
            #expect(try await play.balance("thief") == 0)
            let entitlements = try await API.call(play.client, .get, "/v1/accounts/thief").json["entitlements"]
            #expect((entitlements as? [Any])?.isEmpty ?? true, "\(entitlements ?? "")")
            let (owners, acknowledgements, prices, deliveries) = try await play.app.database.read { sql in
                (
                    try await sql.raw(
                        "SELECT purchase_token, account_id FROM google_purchases WHERE product_id = 'coins_60'"
                    ).all().map {
                        (
                            try $0.decode(column: "purchase_token", as: String.self),
                            try $0.decode(column: "account_id", as: String?.self)
                        )
                    },
                    try await sql.raw("SELECT COUNT(*) AS n FROM jobs WHERE kind = 'google_acknowledge'")
                        .first()?.decode(column: "n", as: Int.self) ?? -1,
                    try await sql.raw("SELECT COUNT(*) AS n FROM jobs WHERE kind = 'google_order_price'")
                        .first()?.decode(column: "n", as: Int.self) ?? -1,
                    try await sql.raw("SELECT COUNT(*) AS n FROM deliveries WHERE product_id = 'coins_60'")
                        .first()?.decode(column: "n", as: Int.self) ?? -1
                )
            }
            let ownerOf = Dictionary(uniqueKeysWithValues: owners)
            for purchase in purchases { #expect(ownerOf[purchase.token] == purchase.account) }
            // One acknowledgement per token (the 12 coins and the two subscriptions' tokens that
            // were delivered), one price per paid one-time order, one delivery per purchase.
            #expect(
                acknowledgements == 14 && prices == 12 && deliveries == 12, "\((acknowledgements, prices, deliveries))")
            await play.runJobs(now: Date().addingTimeInterval(60))
            for purchase in purchases {
                #expect(await play.store.purchase(purchase.token)?.consumed == true)
            }
        }
    }

    @Test(arguments: API.databases)
    func googlePurchasesCountInAnalyticsWithTheirOrdersPriceAndCountry(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let order = try await play.order("de1", "coins_60")
            let coins = try await play.store.buy(
                "coins_60", obfuscatedAccountId: order.token, quantity: 2, regionCode: "JP")
            #expect(try await play.submit("de1", "coins_60", coins, orderId: order.id).status == .ok)
            let pro = try await play.store.buy("pro_monthly", obfuscatedAccountId: nil, regionCode: "DE")
            #expect(try await play.submit("de1", "pro_monthly", pro).status == .ok)
            let today = String(ISO8601DateFormatter().string(from: Date()).prefix(10))
            func metric(_ name: String, _ query: String) async throws -> [String: Any] {
                let reply = try await API.call(
                    play.client, .get, "/v1/analytics/\(name)?from=\(today)&to=\(today)&store=google_play\(query)")
                #expect(reply.status == .ok, "\(reply.json)")
                return try #require((reply.json["points"] as? [[String: Any]])?.last)
            }
            // Before the price job: the coins count without money (the subscription's recurring
            // price is in its resource).
            var proceeds = try await metric("proceeds", "")
            #expect(proceeds["byCurrency"] as? [String: Double] == ["EUR": 4.666])
            // The job waits a few seconds after the record, then prices the delivery once.
            await play.runJobs(now: Date().addingTimeInterval(10))
            proceeds = try await metric("proceeds", "")
            #expect(proceeds["byCurrency"] as? [String: Double] == ["EUR": 4.666, "JPY": 224])
            await play.runJobs(now: Date().addingTimeInterval(3600))
            #expect(try await metric("proceeds", "&country=JPN")["byCurrency"] as? [String: Double] == ["JPY": 224])
            #expect(try await metric("proceeds", "&country=DEU")["byCurrency"] as? [String: Double] == ["EUR": 4.666])
            #expect(try await metric("active_subscriptions", "&country=DEU")["value"] as? Int == 1)
            #expect(try await metric("active_subscriptions", "&country=JPN")["value"] as? Int == 0)
            let refunds = try await metric("refund_rate", "")
            #expect(refunds["denominator"] as? Int == 2 && refunds["numerator"] as? Int == 0)
            // The export says the same: alpha-3 storefronts, the order's price.
            let jobs = try await play.app.database.read { sql in
                try await sql.raw("SELECT status FROM jobs WHERE kind = 'google_order_price'").all().map {
                    try $0.decode(column: "status", as: String.self)
                }
            }
            #expect(jobs == ["done"])
            let rows = try await play.app.database.read { sql in
                try await sql.raw(
                    "SELECT product_id, storefront, price_milli, currency FROM deliveries ORDER BY product_id"
                ).all().map {
                    [
                        try $0.decode(column: "product_id", as: String.self),
                        try $0.decode(column: "storefront", as: String?.self) ?? "-",
                        String(try $0.decode(column: "price_milli", as: Int64?.self) ?? -1),
                        try $0.decode(column: "currency", as: String?.self) ?? "-",
                    ]
                }
            }
            #expect(rows == [["coins_60", "JPN", "320000", "JPY"], ["pro_monthly", "DEU", "5490", "EUR"]])

            // A purchase delivered before prices were read (no job for it): migration 22 queues
            // one, once however often it runs, and the job prices it.
            let older = try await play.store.buy("coins_60", obfuscatedAccountId: nil, regionCode: "US")
            #expect(try await play.submit("de1", "coins_60", older).status == .ok)
            let migration = try #require(Migrations.all.first { $0.version == 22 })
            try await play.app.database.transaction { sql in
                try await sql.raw("DELETE FROM jobs WHERE kind = 'google_order_price' AND payload = \(bind: older)")
                    .run()
                for _ in 0..<2 {
                    for statement in migration.statements { try await sql.raw(SQLQueryString(statement)).run() }
                }
            }
            let queued = try await play.app.database.read { sql in
                try await sql.raw("SELECT payload FROM jobs WHERE kind = 'google_order_price' AND status = 'pending'")
                    .all().map { try $0.decode(column: "payload", as: String.self) }
            }
            #expect(queued == [older])
            await play.runJobs(now: Date().addingTimeInterval(10))
            #expect(
                try await metric("proceeds", "&country=US")["byCurrency"] as? [String: Double] == ["USD": 0.693])
        }
    }

    /// One account's ledger and entitlements hold both stores: coins bought on Android spend
    /// on iOS; `pro` bought on Android is the entitlement the iOS app reads.
    @Test(arguments: API.databases)
    func oneAccountHoldsPurchasesFromBothStores(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let android = try await play.order("both", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: android.token)
            #expect(try await play.submit("both", "coins_60", token, orderId: android.id).status == .ok)
            let ios = try await API.call(
                play.client, .post, "/v1/orders",
                body: #"{"accountId":"both","productId":"coins_60","appId":"com.example.app"}"#)
            #expect(ios.status == .created, "\(ios.json)")
            let bought = try await play.app.localAppStore!.buy(
                "apple-both", items: [.init(productId: "coins_60")],
                appAccountToken: UUID(uuidString: ios.json["appAccountToken"] as? String ?? ""))
            #expect(
                try await API.submit(play.client, account: "both", signedTransaction: bought.signedTransactions[0])
                    .status == .ok)
            #expect(try await play.balance("both") == 120)
            let spend = try await API.call(
                play.client, .post, "/v1/accounts/both/balances/coins/debit",
                body: #"{"amount":90,"idempotencyKey":"cross-store"}"#)
            #expect(spend.status == .ok)
            #expect(try await play.balance("both") == 30)
            // pro on Android: the one entitlement the iOS app reads.
            let pro = try await play.order("both", "pro_monthly")
            let proToken = try await play.store.buy("pro_monthly", obfuscatedAccountId: pro.token)
            #expect(try await play.submit("both", "pro_monthly", proToken, orderId: pro.id).status == .ok)
            #expect(try await play.entitlements("both") == ["pro"])
            let stores = try await play.subscriptions("both").compactMap { $0["store"] as? String }
            #expect(stores == ["google_play"])
            // The dashboard's account page names each row's store and app.
            let browser = DashboardTests.Browser(play.client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let page = try await browser.get("/dashboard/accounts/both").body
            #expect(page.contains("Google Play · app android"))
            #expect(page.contains("<td>App Store</td>") && page.contains("<td>Google Play</td>"))
        }
    }

    @Test(arguments: API.databases)
    func pushesAreVerifiedRecordedOnceAndOnlyHintsAPendingPurchaseIsDeliveredWhenPaid(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let order = try await play.order("slow", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token, pending: true)
            let pending = try await play.submit("slow", "coins_60", token, orderId: order.id)
            #expect(pending.status == .accepted)
            #expect(pending.json["status"] as? String == "pending")
            #expect(try await play.balance("slow") == 0)

            // Paid later: Google's notification is the hint; the server reads and delivers to
            // the order's account, though no device is there.
            try await play.store.completePending(token)
            let due = await play.store.takeDuePushes()
            #expect(due.count == 1)
            let (body, authorization) = try await play.server.pushRequest(
                due[0], audience: Self.audience, serviceAccount: Self.pushAccount)
            // Forged or missing OIDC: 401, nothing recorded.
            #expect(try await play.post(body, authorization: nil) == .unauthorized)
            let wrong = try await play.server.pushToken(audience: "https://elsewhere", serviceAccount: Self.pushAccount)
            #expect(try await play.post(body, authorization: "Bearer \(wrong)") == .unauthorized)
            #expect(try await GooglePlayStore(database: play.app.database).notifications().isEmpty)
            // Authentic: 204, twice (Pub/Sub redelivers) → recorded and applied once.
            #expect(try await play.post(body, authorization: authorization) == .noContent)
            #expect(try await play.post(body, authorization: authorization) == .noContent)
            #expect(try await GooglePlayStore(database: play.app.database).notifications().count == 1)
            await play.runJobs()
            #expect(try await play.balance("slow") == 60)
            let recorded = try await GooglePlayStore(database: play.app.database).notifications()
            #expect(recorded.first?.status == "applied")
            #expect(recorded.first?.type == "ONE_TIME_PRODUCT_PURCHASED")
            // The device comes back: nothing more.
            #expect(try await play.submit("slow", "coins_60", token).json["status"] as? String == "already_delivered")
            // An authentic push that is not a notification: acknowledged, kept aside.
            var garbage = PubSubPush(
                message: .init(data: "bm90IGpzb24=", messageId: "999", publishTime: nil), subscription: nil)
            #expect(try await play.post(try JSONEncoder().encode(garbage), authorization: authorization) == .noContent)
            garbage.message?.messageId = nil
            #expect(try await play.post(try JSONEncoder().encode(garbage), authorization: authorization) == .badRequest)
        }
    }

    /// Hostile pushes and tokens: answers with a code, nothing recorded or applied wrongly.
    @Test func hostilePushesAndTokensGetClearAnswers() async throws {
        try await Self.withPlay("sqlite") { play in
            let token = try await play.server.pushToken(audience: Self.audience, serviceAccount: Self.pushAccount)
            // Oversized, no messageId, a messageId of 10 kB, not JSON: 413 / 400.
            let huge = Data(repeating: UInt8(ascii: "a"), count: 2 * 1_048_576)
            #expect(try await play.post(huge, authorization: "Bearer \(token)") == .contentTooLarge)
            #expect(try await play.post(Data("{}".utf8), authorization: "Bearer \(token)") == .badRequest)
            let longId = #"{"message":{"messageId":"\#(String(repeating: "9", count: 10_000))","data":"e30="}}"#
            #expect(try await play.post(Data(longId.utf8), authorization: "Bearer \(token)") == .badRequest)
            #expect(try await play.post(Data("not json".utf8), authorization: "Bearer \(token)") == .badRequest)
            // A notification for a package this server does not serve: recorded, never applied.
            var foreign = DeveloperNotification(packageName: "com.other.app", eventTimeMillis: 1)
            foreign.oneTimeProductNotification = .init(notificationType: 1, purchaseToken: "t", sku: "coins_60")
            let body = PubSubPush(
                message: .init(
                    data: try JSONEncoder().encode(foreign).base64EncodedString(), messageId: "m-foreign",
                    publishTime: nil), subscription: nil)
            #expect(try await play.post(try JSONEncoder().encode(body), authorization: "Bearer \(token)") == .noContent)
            await play.runJobs()
            let recorded = try await GooglePlayStore(database: play.app.database).notifications()
            #expect(recorded.map(\.messageId) == ["m-foreign"])
            #expect(recorded.first?.status == "recorded")
            // A token of 5,000 characters or with a space: 400 before Google is asked.
            for bad in [String(repeating: "x", count: 5000), "a b", ""] {
                let reply = try await play.submit("h", "coins_60", bad)
                #expect(reply.status == .badRequest, "\(bad.prefix(10))")
            }
        }
    }

    @Test(arguments: API.databases)
    func googleRefundsGoThroughTheOneRefundPathByQuantity(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let order = try await play.order("buyer", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token, quantity: 3)
            #expect(try await play.submit("buyer", "coins_60", token, orderId: order.id).status == .ok)
            #expect(try await play.balance("buyer") == 180)
            await play.runJobs()
            // One of three refunded: 60 coins back, once, however often it is polled.
            try await play.store.refund(token, quantity: 1)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.balance("buyer") == 120)
            // The backend hears of it like an Apple refund, naming the store.
            let events = try await play.app.database.read { sql in
                try await sql.raw("SELECT payload FROM outbox WHERE event = 'refund'").all()
                    .map { try $0.decode(column: "payload", as: String.self) }
            }
            #expect(events.count == 1)
            #expect(events.first?.contains(#""store":"google_play""#) == true)
            await play.app.runGoogleHousekeeping(now: Date().addingTimeInterval(7200))
            await play.runJobs(now: Date().addingTimeInterval(7200))
            #expect(try await play.balance("buyer") == 120)
            // A crash after the refund committed and before the record was marked: the next poll
            // applies it again — and takes nothing more.
            try await play.app.database.transaction { sql in try await sql.raw("DELETE FROM google_voided").run() }
            await play.app.runGoogleHousekeeping(now: Date().addingTimeInterval(2 * 7200))
            await play.runJobs(now: Date().addingTimeInterval(2 * 7200))
            #expect(try await play.balance("buyer") == 120)
            // The rest: everything back; spent coins go negative with refunded_after_delivery.
            let debit = try await API.call(
                play.client, .post, "/v1/accounts/buyer/balances/coins/debit",
                body: #"{"amount":100,"idempotencyKey":"spend-1"}"#)
            #expect(debit.status == .ok, "\(debit.json)")
            try await play.store.refund(token)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.balance("buyer") == -100)
        }
    }

    @Test(arguments: API.databases)
    func aSubscriptionFollowsGooglesStatesAndAnUpgradeRetiresTheOldToken(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let order = try await play.order("sub", "pro_monthly")
            let token = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            let first = try await play.submit("sub", "pro_monthly", token, orderId: order.id)
            #expect(first.status == .ok, "\(first.json)")
            #expect(try await play.entitlements("sub") == ["pro"])
            _ = try await play.push()
            await play.runJobs()
            #expect(await play.store.purchase(token)?.acknowledged == true)
            // Renewed at Google: the notification re-reads; the period moves; credited to the
            // purchase's account (no device, whoever is logged in elsewhere).
            await play.store.advance(by: 32 * 86_400)
            _ = try await play.push()
            await play.runJobs()
            var subscription = try #require(try await play.subscriptions("sub").first)
            #expect(subscription["status"] as? String == "active")
            #expect(subscription["store"] as? String == "google_play")
            #expect(subscription["appId"] as? String == "android")
            // Billing fails: grace keeps access, hold removes it, recovery restores it.
            try await play.store.setBillingFails(token, true)
            await play.store.advance(by: 31 * 86_400)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.subscriptions("sub").first?["status"] as? String == "grace_period")
            #expect(try await play.entitlements("sub") == ["pro"])
            await play.store.advance(by: 4 * 86_400)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.subscriptions("sub").first?["status"] as? String == "billing_retry")
            #expect(try await play.entitlements("sub").isEmpty)
            try await play.store.setBillingFails(token, false)
            await play.store.advance(by: 60)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.entitlements("sub") == ["pro"])

            // Upgrade to yearly: a new token names the old one. One subscription across the
            // chain (now yearly), one entitlement, and a late notification about the old token
            // grants nothing.
            let upgradeOrder = try await play.order("sub", "pro_yearly")
            let upgraded = try await play.store.buy(
                "pro_yearly", obfuscatedAccountId: upgradeOrder.token, linkedPurchaseToken: token)
            #expect(try await play.submit("sub", "pro_yearly", upgraded, orderId: upgradeOrder.id).status == .ok)
            _ = try await play.push()
            await play.runJobs()
            let all = try await play.subscriptions("sub")
            #expect(all.count == 1)
            #expect(all.filter { $0["status"] as? String == "active" }.count == 1)
            #expect(try await play.entitlements("sub") == ["pro"])
            let old = try await play.submit("sub", "pro_monthly", token)
            #expect((old.json["error"] as? [String: Any])?["code"] as? String == "revoked")
            subscription = try #require(all.first { $0["status"] as? String == "active" })
            #expect(subscription["productId"] as? String == "pro_yearly")
        }
    }

    /// Notifications lost while the server was down: the hourly pass re-reads subscriptions
    /// past their period and polls voided purchases, so renewals, expiries and refunds are
    /// found without a push.
    @Test(arguments: API.databases)
    func reconciliationFindsWhatLostNotificationsMissed(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let order = try await play.order("quiet", "pro_monthly")
            let token = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            #expect(try await play.submit("quiet", "pro_monthly", token, orderId: order.id).status == .ok)
            let coinsOrder = try await play.order("quiet", "coins_60")
            let coins = try await play.store.buy("coins_60", obfuscatedAccountId: coinsOrder.token)
            #expect(try await play.submit("quiet", "coins_60", coins, orderId: coinsOrder.id).status == .ok)
            await play.runJobs()
            let before = try #require(try await play.subscriptions("quiet").first?["expiresAt"] as? String)
            // Renewed, then the coins refunded — every push lost.
            await play.store.advance(by: 32 * 86_400)
            try await play.store.refund(coins)
            _ = await play.store.takeDuePushes()
            let later = Date().addingTimeInterval(33 * 86_400)
            await play.app.runGoogleHousekeeping(now: later)
            await play.runJobs(now: later)
            let after = try #require(try await play.subscriptions("quiet").first?["expiresAt"] as? String)
            #expect(after > before)
            #expect(try await play.balance("quiet") == 0)
            // Apple's reconciliation never asks Apple about Google's subscriptions or charges
            // (found by the chaos run: 'gp:' ids sort after digits).
            let far = Date().addingTimeInterval(400 * 86_400)
            #expect(
                try await play.app.store.reconciliation.overdueSubscriptions(now: far).allSatisfy { !$0.contains(":") })
            #expect(
                try await play.app.store.reconciliation.recentAccounts(since: .distantPast).allSatisfy {
                    !$0.transactionId.contains(":")
                })
        }
    }

    /// Google's refund review, answered within its deadline from the ledger by the catalog's
    /// rules (the same as Apple's consumption answers), once.
    @Test(arguments: API.databases)
    func aRefundReviewIsAnsweredFromTheLedgerByThePolicy(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let order = try await play.order("spender", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            #expect(try await play.submit("spender", "coins_60", token, orderId: order.id).status == .ok)
            let debit = try await API.call(
                play.client, .post, "/v1/accounts/spender/balances/coins/debit",
                body: #"{"amount":45,"idempotencyKey":"spend-1"}"#)
            #expect(debit.status == .ok)
            await play.runJobs()
            let review = try await play.store.requestRefundReview(token)
            _ = try await play.push()
            await play.runJobs()
            let answer = try #require(await play.store.review(review))
            #expect(answer.consumptionPercentageMilliunits == 75_000)
            #expect(answer.refundPreference == "NEUTRAL")
            #expect(answer.sampleContentProvided == false)
            let audit = try await play.app.store.anomalies.audit().filter { $0.action == "google_refund_review" }
            #expect(audit.count == 1)
        }
    }

    /// A purchase without the order's account id (an app that did not set it) is held until
    /// an account claims it — never acknowledged for nobody — then acknowledged.
    @Test(arguments: API.databases)
    func anUnattributedPurchaseIsAcknowledgedOnlyOnceClaimed(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            let token = try await play.store.buy("remove_ads", obfuscatedAccountId: nil)
            _ = try await play.push()
            await play.runJobs()
            let later = Date().addingTimeInterval(2 * 3600)
            await play.app.runGoogleHousekeeping(now: later)
            await play.runJobs(now: later)
            #expect(await play.store.purchase(token)?.acknowledged == false)
            let held =
                (try await API.call(play.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "unattributed_transaction" }
            #expect(held.count == 1)
            #expect(held.first?["store"] as? String == "google_play")
            #expect(held.first?["appId"] as? String == "android")
            // Its price waits for a delivery to price (Google is not asked meanwhile).
            func priceJobs() async throws -> [String] {
                try await play.app.database.read { sql in
                    try await sql.raw(
                        "SELECT status, last_error FROM jobs WHERE kind = 'google_order_price' ORDER BY created_at"
                    ).all().map {
                        "\(try $0.decode(column: "status", as: String.self)): \(try $0.decode(column: "last_error", as: String?.self) ?? "")"
                    }
                }
            }
            #expect(try await priceJobs() == ["pending: not delivered yet"])
            // The device submits it: delivered to its account, then acknowledged.
            #expect(try await play.submit("claimer", "remove_ads", token).status == .ok)
            #expect(try await play.entitlements("claimer") == ["no_ads"])
            await play.runJobs(now: later)
            #expect(await play.store.purchase(token)?.acknowledged == true)
            await play.runJobs(now: later.addingTimeInterval(3600))
            #expect(try await priceJobs() == ["done: not delivered yet"])
            let price = try await play.app.database.read { sql in
                try await sql.raw("SELECT price_milli FROM deliveries WHERE product_id = 'remove_ads'").first()?
                    .decode(column: "price_milli", as: Int64?.self)
            }
            #expect(price == 2990)
            // One never claimed is not retried forever: past Google's window (it refunded it)
            // the acknowledgement job ends, and the sweeper stops asking.
            let stray = try await play.store.buy("remove_ads", obfuscatedAccountId: nil)
            _ = try await play.push()
            await play.runJobs()
            let gone = Date().addingTimeInterval(5 * 86_400)
            await play.app.runGoogleHousekeeping(now: gone)
            await play.runJobs(now: gone)
            let pendingAcks = try await play.app.database.read { sql in
                try await sql.raw(
                    "SELECT COUNT(*) AS n FROM jobs WHERE kind = 'google_acknowledge' AND status = 'pending'"
                )
                .first()?.decode(column: "n", as: Int.self) ?? 0
            }
            #expect(pendingAcks == 0)
            #expect(await play.store.purchase(stray)?.acknowledged == false)
            // ...nor is its price: never delivered, its job ends too.
            #expect(try await priceJobs().last == "failed: never delivered: no price to record")
            // A claim of a Google purchase is no reason to call Apple's Set App Account Token.
            let appleJobs = try await play.app.database.read { sql in
                try await sql.raw("SELECT COUNT(*) AS n FROM jobs WHERE kind = 'set_app_account_token'").first()?
                    .decode(column: "n", as: Int.self) ?? 0
            }
            #expect(appleJobs == 0)
        }
    }

    @Test(arguments: API.databases)
    func theSweeperAcknowledgesWhatNoDeviceBroughtAndAlertsBeforeGoogleRefunds(kind: String) async throws {
        try await Self.withPlay(kind) { play in
            // A purchase whose app crashed before telling the server; the notification is lost.
            let order = try await play.order("crash", "remove_ads")
            let token = try await play.store.buy("remove_ads", obfuscatedAccountId: order.token)
            _ = await play.store.takeDuePushes()
            // Reconciliation finds it (the sync of a token read from Google's side) — here the
            // app's next launch submits it after the server was down a day.
            #expect(try await play.submit("crash", "remove_ads", token).status == .ok)
            // Google is down when the server acknowledges: the job backs off, nothing is lost.
            play.store.failNextAPICalls(1000)
            await play.runJobs()
            let store = GooglePlayStore(database: play.app.database)
            #expect(try await store.purchase(token)?.acknowledgedAt == nil)
            #expect(await play.store.purchase(token)?.acknowledged == false)
            // Still down 49 hours later: an alert (an anomaly for the operator), once.
            let alertAt = Date().addingTimeInterval(49 * 3600)
            await play.app.runGoogleHousekeeping(now: alertAt)
            await play.app.runGoogleHousekeeping(now: alertAt.addingTimeInterval(60))
            let anomalies =
                (try await API.call(play.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "acknowledgement_overdue" }
            #expect(anomalies.count == 1)
            #expect(anomalies.first?["accountId"] as? String == "crash")
            // Google is back: the sweeper's job acknowledges before the 72nd hour.
            play.store.failNextAPICalls(0)
            let later = alertAt.addingTimeInterval(3600)
            await play.app.runGoogleHousekeeping(now: later)
            await play.runJobs(now: later)
            #expect(await play.store.purchase(token)?.acknowledged == true)
            #expect(try await store.purchase(token)?.acknowledgedAt != nil)
            await play.store.advance(by: 4 * 86_400)
            #expect(await play.store.purchase(token)?.voided == false)
        }
    }
}
