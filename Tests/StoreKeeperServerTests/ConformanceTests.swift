import AppStoreModels
import Foundation
import HTTPTypes
import HummingbirdTesting
import LocalAppStore
import LocalGooglePlay
import LocalStripe
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Stripe
import Testing

@testable import StoreKeeperServer

/// One store's local fake, driven as the store and the device drive the server: a payment made
/// at the store, the claim (the device's submission or the store's webhook), the store's own
/// refunds and chargebacks, and what the account then holds.
protocol ConformanceDriver: Sendable {
    var store: Store { get }
    /// Pays for `quantity` of `product` for `account` at the store (a test payment when
    /// `sandbox`); nothing reaches the server yet. Returns the payment's handle.
    func pay(_ account: String, _ product: String, quantity: Int, sandbox: Bool) async throws -> String
    /// The payment reaches the server `times` times (the last claims first when `reversed`).
    func claim(_ payment: String, account: String, times: Int, reversed: Bool) async throws
    /// The store refunds `share` (0…1) of the payment's price in all (nil: the rest), and says so.
    func refund(_ payment: String, total share: Double?) async throws
    /// A chargeback the developer lost.
    func chargebackLost(_ payment: String) async throws
    func balance(_ account: String) async throws -> Int
    func entitlements(_ account: String) async throws -> [String]
    func anomalies() async throws -> [String]
    /// Subscribes `account` to `product` (paid, claimed); returns its handle.
    func subscribe(_ account: String, _ product: String) async throws -> String
    /// Two renewals at the store; the store's word of them reaches the server newest first,
    /// each twice.
    func renewTwiceNewestFirst(_ subscription: String) async throws
    /// The account's subscription as the server shows it: its status and expiry.
    func subscription(_ account: String) async throws -> (status: String?, expiresAt: Date?)
}

/// "Every store is one adapter": the money rules decided once in the core, run as one table
/// against every store through its local fake, on SQLite and PostgreSQL. A scenario a store
/// cannot have is declared in code (`Store.cannotHave`) and listed, not run.
@Suite struct ConformanceTests {
    typealias API = ServerAPITests

    static let stores: [Store] = [.appStore, .googlePlay, .stripe]

    static var cases: [(Store, MoneyScenario, String)] {
        var all: [(Store, MoneyScenario, String)] = []
        for store in stores {
            for scenario in MoneyScenario.allCases where store.cannotHave[scenario] == nil {
                for kind in API.databases { all.append((store, scenario, kind)) }
            }
        }
        return all
    }

    /// What the table leaves out, and why: printed with the suite's output.
    @Test func theTableListsWhatEachStoreCannotHave() {
        for store in Store.allCases {
            for (scenario, why) in store.cannotHave.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                print("conformance: \(store.rawValue) cannot have \(scenario.rawValue): \(why)")
            }
        }
        #expect(Store.stripe.cannotHave.isEmpty)
        #expect(Store.appStore.cannotHave[.refundBeforeDelivery] == nil)
    }

    @Test(arguments: cases)
    func theScenarioHoldsForTheStore(store: Store, scenario: MoneyScenario, kind: String) async throws {
        let sandboxOnly = scenario == .wrongEnvironment
        let catalog = scenario == .unknownProduct ? Self.withoutCoins300 : Catalog.demo
        try await Self.withDriver(store, kind: kind, productionOnly: sandboxOnly, catalog: catalog) { driver in
            try await Self.run(scenario, driver)
        }
    }

    /// The demo catalog where coins_300 is sold by no store (the stores' fakes still sell it).
    static let withoutCoins300: Catalog = {
        var catalog = Catalog.demo
        catalog.products.removeAll { $0.id == "coins_300" }
        return catalog
    }()

    static func run(_ scenario: MoneyScenario, _ driver: any ConformanceDriver) async throws {
        let account = "c-\(scenario.rawValue)"
        switch scenario {
        case .buy:
            let payment = try await driver.pay(account, "coins_60", quantity: 1, sandbox: false)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 60)
        case .duplicateAndReorder:
            let payment = try await driver.pay(account, "coins_60", quantity: 2, sandbox: false)
            try await driver.claim(payment, account: account, times: 2, reversed: true)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 120)
            let ads = try await driver.pay(account, "remove_ads", quantity: 1, sandbox: false)
            try await driver.claim(ads, account: account, times: 2, reversed: true)
            #expect(try await driver.entitlements(account) == ["no_ads"])
        case .refundBeforeDelivery:
            let payment = try await driver.pay(account, "coins_60", quantity: 1, sandbox: false)
            try await driver.refund(payment, total: nil)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 0)
            let ads = try await driver.pay(account, "remove_ads", quantity: 1, sandbox: false)
            try await driver.refund(ads, total: nil)
            try await driver.claim(ads, account: account, times: 2, reversed: false)
            #expect(try await driver.entitlements(account).isEmpty)
        case .partialRefunds:
            let payment = try await driver.pay(account, "coins_60", quantity: 4, sandbox: false)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 240)
            try await driver.refund(payment, total: 0.25)
            #expect(try await driver.balance(account) == 180)
            try await driver.refund(payment, total: 0.5)
            let after = try await driver.balance(account)
            #expect(after == 120, "balance \(after) after refunds of 25 % and 50 % in all")
        case .partialRefundBeforeDelivery:
            let payment = try await driver.pay(account, "coins_60", quantity: 4, sandbox: false)
            try await driver.refund(payment, total: 0.25)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 180)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 180)
        case .chargebackLost:
            let payment = try await driver.pay(account, "remove_ads", quantity: 1, sandbox: false)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.entitlements(account) == ["no_ads"])
            try await driver.chargebackLost(payment)
            #expect(try await driver.entitlements(account).isEmpty)
        case .wrongEnvironment:
            // The server accepts Production only; the store's test payment is refused.
            let payment = try await driver.pay(account, "coins_60", quantity: 1, sandbox: true)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 0)
        case .olderRenewalLate:
            let subscription = try await driver.subscribe(account, "pro_monthly")
            let first = try await driver.subscription(account)
            #expect(first.status == "active")
            let firstEnd = try #require(first.expiresAt)
            try await driver.renewTwiceNewestFirst(subscription)
            let after = try await driver.subscription(account)
            #expect(after.status == "active", "\(after)")
            // Two more months: never the first renewal's end, whatever arrived last.
            #expect(
                (after.expiresAt ?? .distantPast) > firstEnd.addingTimeInterval(55 * 86_400),
                "\(after), first \(firstEnd)")
            #expect(try await driver.entitlements(account) == ["pro"])
        case .unknownProduct:
            let payment = try await driver.pay(account, "coins_300", quantity: 1, sandbox: false)
            try await driver.claim(payment, account: account, times: 1, reversed: false)
            #expect(try await driver.balance(account) == 0)
            let anomalies = try await driver.anomalies()
            #expect(anomalies.contains("unknown_product"), "\(anomalies)")
        }
    }

    static func withDriver(
        _ store: Store, kind: String, productionOnly: Bool, catalog: Catalog,
        _ body: @Sendable (any ConformanceDriver) async throws -> Void
    ) async throws {
        let environments: Set<AppStoreEnvironment> = productionOnly ? [.production] : [.production, .sandbox]
        switch store {
        case .appStore:
            try await API.withServer(kind, environments: environments, configure: { $0.catalog = catalog }) {
                app, client in
                try await body(AppStoreDriver(app: app, client: client))
            }
        case .googlePlay:
            // A license tester's purchases are Google's test payments (Sandbox).
            try await GooglePlayServerTests.withPlay(
                kind, testPurchases: productionOnly, environments: environments, configure: { $0.catalog = catalog }
            ) { play in
                try await body(GooglePlayDriver(play: play))
            }
        case .stripe:
            try await StripeTests.withStripe(
                kind, disputePolicy: "revoke_when_lost", catalog: catalog, environments: environments
            ) { web in
                try await body(StripeDriver(web: web))
            }
        case .web:
            Issue.record("web has no local fake in this table")
        }
    }
}

// MARK: The drivers

/// Shared reads: the account view, the anomalies.
private func accountView(_ client: any TestClientProtocol, _ account: String) async throws -> [String: Any] {
    try await ServerAPITests.call(client, .get, "/v1/accounts/\(account)").json
}

private func coins(_ view: [String: Any]) -> Int { (view["balances"] as? [String: Int])?["coins"] ?? 0 }

private func entitlementIds(_ view: [String: Any]) -> [String] {
    (view["entitlements"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }.sorted()
}

private func subscriptionState(_ view: [String: Any]) -> (status: String?, expiresAt: Date?) {
    let first = (view["subscriptions"] as? [[String: Any]])?.first
    return (
        first?["status"] as? String,
        (first?["expiresAt"] as? String).flatMap { StoreKeeperApp.parseDate($0) }
    )
}

private func anomalyKinds(_ app: StoreKeeperApp) async throws -> [String] {
    try await app.store.anomalies.anomalies(status: "open").map(\.kind)
}

/// The App Store: the local App Store signs; the device submits the JWS; Apple's notifications
/// (REFUND) are relayed to `POST /v1/notifications/apple`.
final class AppStoreDriver: ConformanceDriver, @unchecked Sendable {
    let store = Store.appStore
    let relay: NotificationTests.Relay
    var signed: [String: (jws: String, id: String)] = [:]
    /// A store that sells more than the server's catalog and signs in Sandbox, with the same chain.
    let wider: LocalAppStore
    let sandbox: LocalAppStore

    init(app: StoreKeeperApp, client: any TestClientProtocol) {
        relay = NotificationTests.Relay(app, client)
        let local = app.localAppStore!
        wider = LocalAppStore(
            configuration: .init(bundleId: "com.example.app", appAppleId: 1_234_567_890, catalog: .demo),
            pki: local.pki)
        sandbox = LocalAppStore(
            configuration: .init(
                bundleId: "com.example.app", appAppleId: 1_234_567_890, environment: .sandbox, catalog: .demo),
            pki: local.pki)
    }

    func pay(_ account: String, _ product: String, quantity: Int, sandbox isSandbox: Bool) async throws -> String {
        let seller = isSandbox ? sandbox : relay.app.catalog.product(product) == nil ? wider : relay.store
        let bought = try await seller.buy(
            "apple-\(account)", items: [.init(productId: product, quantity: Int32(quantity))])
        let id = try #require(bought.transactions.first?.transactionId)
        signed[id] = (bought.signedTransactions[0], id)
        return id
    }

    func claim(_ payment: String, account: String, times: Int, reversed: Bool) async throws {
        let jws = try #require(signed[payment]?.jws)
        for _ in 0..<times {
            _ = try await ServerAPITests.submit(relay.client, account: account, signedTransaction: jws)
        }
        try await relay.deliver(reversed: reversed)
    }

    func refund(_ payment: String, total share: Double?) async throws {
        // Apple's revocationPercentage: the share refunded in all, in thousandths of a percent.
        try await relay.store.refund(payment, percentage: share.map { Int32(($0 * 100_000).rounded()) })
        try await relay.deliver()
    }

    func chargebackLost(_ payment: String) async throws {
        Issue.record("declared: the App Store has no chargebacks")
    }

    func subscribe(_ account: String, _ product: String) async throws -> String {
        let (_, transaction) = try await relay.buy(account, product)
        try await relay.deliver()
        return try #require(transaction.originalTransactionId)
    }

    func renewTwiceNewestFirst(_ subscription: String) async throws {
        await relay.store.advance(by: 32 * 86_400)
        await relay.store.advance(by: 31 * 86_400)
        try await relay.deliver(times: 2, reversed: true)
    }

    func subscription(_ account: String) async throws -> (status: String?, expiresAt: Date?) {
        subscriptionState(try await accountView(relay.client, account))
    }

    func balance(_ account: String) async throws -> Int { coins(try await accountView(relay.client, account)) }
    func entitlements(_ account: String) async throws -> [String] {
        entitlementIds(try await accountView(relay.client, account))
    }
    func anomalies() async throws -> [String] { try await anomalyKinds(relay.app) }
}

/// Google Play: the local Google Play over its Developer API; the device submits the token;
/// Real-time developer notifications pushed as Pub/Sub does.
final class GooglePlayDriver: ConformanceDriver, @unchecked Sendable {
    let store = Store.googlePlay
    let play: GooglePlayServerTests.Play
    var quantities: [String: (product: String, quantity: Int, refunded: Int)] = [:]

    init(play: GooglePlayServerTests.Play) { self.play = play }

    func pay(_ account: String, _ product: String, quantity: Int, sandbox: Bool) async throws -> String {
        // (A test payment: the whole store is a license tester's in the wrong-environment run.)
        let token = try await play.store.buy(product, obfuscatedAccountId: nil, quantity: quantity)
        quantities[token] = (product, quantity, 0)
        return token
    }

    func claim(_ payment: String, account: String, times: Int, reversed: Bool) async throws {
        let product = try #require(quantities[payment]?.product)
        var pushes = try await play.push()
        if reversed { pushes.reverse() }
        for _ in 0..<times { _ = try await play.submit(account, product, payment) }
        await play.runJobs()
    }

    func refund(_ payment: String, total share: Double?) async throws {
        let record = try #require(quantities[payment])
        // Google voids units: the share in all, in units.
        let target = share.map { Int(($0 * Double(record.quantity)).rounded()) } ?? record.quantity
        let units = target - record.refunded
        guard units > 0 else { return }
        // The local Google's clock stands still; Google's voided records are told apart by
        // their time (no two refunds of one order in the same millisecond).
        await play.store.advance(by: 1)
        try await play.store.refund(payment, quantity: share == nil ? nil : units)
        quantities[payment]?.refunded = target
        #expect(try await play.push().allSatisfy { $0 == .noContent })
        await play.runJobs()
    }

    func chargebackLost(_ payment: String) async throws {
        Issue.record("declared: Google reports chargebacks as voided purchases")
    }

    func subscribe(_ account: String, _ product: String) async throws -> String {
        let token = try await play.store.buy(product, obfuscatedAccountId: nil)
        #expect(try await play.submit(account, product, token).status == .ok)
        _ = try await play.push()
        await play.runJobs()
        return token
    }

    func renewTwiceNewestFirst(_ subscription: String) async throws {
        await play.store.advance(by: 32 * 86_400)
        let first = await play.store.takeDuePushes()
        await play.store.advance(by: 31 * 86_400)
        let second = await play.store.takeDuePushes()
        for push in (second + first) + (second + first) {
            let (body, authorization) = try await play.server.pushRequest(
                push, audience: GooglePlayServerTests.audience, serviceAccount: GooglePlayServerTests.pushAccount)
            _ = try await play.post(body, authorization: authorization)
        }
        await play.runJobs()
    }

    func subscription(_ account: String) async throws -> (status: String?, expiresAt: Date?) {
        subscriptionState(try await accountView(play.client, account))
    }

    func balance(_ account: String) async throws -> Int { try await play.balance(account) }
    func entitlements(_ account: String) async throws -> [String] { try await play.entitlements(account).sorted() }
    func anomalies() async throws -> [String] { try await anomalyKinds(play.app) }
}

/// Stripe: Checkout paid in the local Stripe; its webhooks posted as Stripe signs them.
final class StripeDriver: ConformanceDriver, @unchecked Sendable {
    let store = Store.stripe
    let web: StripeTests.Web
    var sessions: [String: (session: String, charge: String, amount: Int64)] = [:]
    /// Each payment's own events (its completion), held until its claim.
    var held: [String: [(id: String, type: String, body: Data, header: String)]] = [:]

    init(web: StripeTests.Web) { self.web = web }

    /// Posts `deliveries` (each `times` times, newest first when `reversed`), then the jobs.
    func post(
        _ deliveries: [(id: String, type: String, body: Data, header: String)], times: Int = 1, reversed: Bool = false
    ) async throws {
        var due = deliveries
        if reversed { due.reverse() }
        for delivery in due {
            for _ in 0..<times {
                #expect(try await web.post(delivery.body, signature: delivery.header) == .ok)
            }
        }
        await web.runJobs()
    }

    func pay(_ account: String, _ product: String, quantity: Int, sandbox: Bool) async throws -> String {
        let session: String
        if web.app.catalog.product(product)?.storeProducts?["stripe"] == nil {
            // A price the server's catalog does not map: a session opened at Stripe directly.
            let client = StripeClient(secretKey: web.server.secretKey, baseURL: web.stripeBaseURL)
            var form = StripeForm()
            form.add("mode", "payment")
            form.add("line_items[0][price]", "price_\(product)")
            form.add("line_items[0][quantity]", String(quantity))
            form.add("success_url", "https://game.example.com/paid")
            form.add("cancel_url", "https://game.example.com/cancelled")
            session = try await client.createCheckoutSession(form, idempotencyKey: "conformance-\(UUID())").id
            _ = try web.stripe.pay(session: session)
        } else {
            session = try await web.buy(account, product, quantity: quantity).session
        }
        let charge = try web.charge(ofSession: session)
        let amount = try web.stripe.charge(charge, expand: [])["amount"] as? Int64 ?? 0
        sessions[session] = (session, charge, amount)
        held[session, default: []] += web.server.takeDeliveries(secrets: [StripeTests.secrets[0]])
        return session
    }

    func claim(_ payment: String, account: String, times: Int, reversed: Bool) async throws {
        // The payment's own events, then whatever Stripe sent since.
        let own = held[payment] ?? []
        try await post(
            own + web.server.takeDeliveries(secrets: [StripeTests.secrets[0]]), times: times, reversed: reversed)
    }

    func refund(_ payment: String, total share: Double?) async throws {
        let record = try #require(sessions[payment])
        let refunded = try web.stripe.charge(record.charge, expand: [])["amount_refunded"] as? Int64 ?? 0
        let target = share.map { Int64(($0 * Double(record.amount)).rounded()) } ?? record.amount
        guard target > refunded else { return }
        _ = try web.stripe.refund(
            paymentIntent: nil, charge: record.charge, amount: target - refunded, reason: nil, idempotencyKey: nil)
        try await post(web.server.takeDeliveries(secrets: [StripeTests.secrets[0]]))
    }

    func subscribe(_ account: String, _ product: String) async throws -> String {
        let (_, session) = try await web.buy(account, product)
        try await post(web.server.takeDeliveries(secrets: [StripeTests.secrets[0]]))
        return session
    }

    func renewTwiceNewestFirst(_ subscription: String) async throws {
        web.stripe.advance(seconds: 32 * 86_400)
        let first = web.server.takeDeliveries(secrets: [StripeTests.secrets[0]])
        web.stripe.advance(seconds: 31 * 86_400)
        let second = web.server.takeDeliveries(secrets: [StripeTests.secrets[0]])
        // Stripe retries each event: newest first, then all again.
        try await post(second + first, times: 2, reversed: false)
        try await post((second + first).reversed(), times: 1, reversed: true)
    }

    func subscription(_ account: String) async throws -> (status: String?, expiresAt: Date?) {
        subscriptionState(try await accountView(web.client, account))
    }

    func chargebackLost(_ payment: String) async throws {
        let record = try #require(sessions[payment])
        let dispute = try web.stripe.openDispute(charge: record.charge, inquiry: false)
        _ = try web.stripe.closeDispute(try #require(dispute["id"] as? String), outcome: "lost")
        try await post(web.server.takeDeliveries(secrets: [StripeTests.secrets[0]]))
    }

    func balance(_ account: String) async throws -> Int { try await web.balance(account) }
    func entitlements(_ account: String) async throws -> [String] { try await web.entitlements(account).sorted() }
    func anomalies() async throws -> [String] { try await anomalyKinds(web.app) }
}
