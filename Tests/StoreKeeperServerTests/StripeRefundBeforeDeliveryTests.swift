import Foundation
import HTTPTypes
import LocalStripe
import SQLKit
import StoreKeeperCatalog
import StoreKeeperStorage
import Stripe
import Testing

@testable import StoreKeeperServer

/// The outside audit's HIGH (three ways): a Stripe payment refunded or charged back before it
/// was delivered was delivered afterwards, in full. Stripe now states what it took back before
/// the claim through the one refund path, and the delivery path honours it as for every store.
extension StripeTests {
    /// The code of an account-less order once its payment is applied.
    static func redemptionCode(_ web: Web, order: String) async throws -> String {
        let paid = try await API.call(web.client, .get, "/v1/orders/\(order)")
        return try #require(paid.json["redemptionCode"] as? String, "\(paid.json)")
    }

    /// The charge that paid a session: its payment intent's, or (a subscription) its first
    /// invoice's payment's.
    static func anyCharge(_ web: Web, session id: String) throws -> String {
        let session = try web.stripe.session(id, expand: [])
        var intent = session["payment_intent"] as? String
        if intent == nil, let invoice = session["invoice"] as? String {
            let payments = try web.stripe.invoice(invoice, expand: ["payments"])["payments"] as? [String: Any]
            let first = (payments?["data"] as? [[String: Any]])?.first
            intent = (first?["payment"] as? [String: Any])?["payment_intent"] as? String
        }
        let paid = try #require(intent)
        return try #require(try web.stripe.paymentIntent(paid, expand: [])["latest_charge"] as? String)
    }

    static func undeliveredRefunds(_ web: Web) async throws -> [String] {
        try await web.app.database.read { sql in
            try await sql.raw("SELECT transaction_id FROM undelivered_refunds").all().map {
                try $0.decode(column: "transaction_id", as: String.self)
            }
        }
    }

    /// A paywall purchase without an account, refunded before its code is redeemed: the redeemer
    /// gets nothing (coins, and a subscription).
    @Test(arguments: API.databases)
    func aPaymentRefundedBeforeItsCodeIsRedeemedIsNeverDelivered(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            for product in ["coins_300", "pro_monthly"] {
                let (order, session) = try await web.buy(nil, product)
                try await web.deliver()
                let code = try await Self.redemptionCode(web, order: order)
                let charge = try Self.anyCharge(web, session: session)
                _ = try web.stripe.refund(
                    paymentIntent: nil, charge: charge, amount: nil, reason: "requested_by_customer",
                    idempotencyKey: nil)
                try await web.deliver()
                let redeemer = "r-\(product)"
                let redeemed = try await API.call(
                    web.client, .post, "/v1/redemptions/\(code)", token: try await API.clientToken(redeemer),
                    body: "{}")
                #expect(redeemed.status == .ok, "\(redeemed.json)")
                #expect((redeemed.json["outcome"] as? String)?.contains("refused (revoked") == true, "\(redeemed.json)")
                #expect(try await web.balance(redeemer) == 0)
                #expect(try await web.entitlements(redeemer).isEmpty)
                // Webhooks replayed later change nothing.
                try await web.deliver(twice: true)
                #expect(try await web.balance(redeemer) == 0)
                #expect(try await web.entitlements(redeemer).isEmpty)
            }
        }
    }

    /// The same after a lost chargeback: the non-consumable is never granted — whether the
    /// dispute's events arrived (`eventsLost` false) or were lost and the delivery reads the
    /// charge, finds the lost dispute and honours it.
    @Test(arguments: API.databases, [false, true])
    func aPaymentChargedBackBeforeItsCodeIsRedeemedIsNeverDelivered(kind: String, eventsLost: Bool) async throws {
        try await Self.withStripe(kind) { web in
            let (order, session) = try await web.buy(nil, "remove_ads")
            try await web.deliver()
            let code = try await Self.redemptionCode(web, order: order)
            let dispute = try web.stripe.openDispute(charge: try web.charge(ofSession: session), inquiry: false)
            _ = try web.stripe.closeDispute(try #require(dispute["id"] as? String), outcome: "lost")
            if eventsLost {
                _ = web.server.takeDeliveries(secrets: [Self.secrets[0]])
            } else {
                try await web.deliver()
            }
            let redeemed = try await API.call(
                web.client, .post, "/v1/redemptions/\(code)", token: try await API.clientToken("r-ads"), body: "{}")
            #expect(redeemed.status == .ok, "\(redeemed.json)")
            #expect(try await web.entitlements("r-ads").isEmpty)
        }
    }

    /// An ordinary order whose `charge.refunded` arrives before `checkout.session.completed`:
    /// nothing kept, the refund on record.
    @Test(arguments: API.databases)
    func aRefundThatArrivesBeforeTheCompletionIsHonoured(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (order, session) = try await web.buy("w-early", "coins_300")
            let charge = try web.charge(ofSession: session)
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: nil, reason: nil, idempotencyKey: nil)
            // Newest first: the refund's events before the completion.
            try await web.deliver(reverse: true)
            #expect(try await web.balance("w-early") == 0)
            let intent = try #require(try web.stripe.session(session, expand: [])["payment_intent"] as? String)
            #expect(try await Self.undeliveredRefunds(web).contains("stripe:\(intent)"))
            // Found by its id as Stripe's, refunded before delivery (its store recorded with the
            // refund, never guessed as the App Store).
            let found = try await API.call(web.client, .get, "/v1/transactions/\(intent)")
            #expect(found.status == .ok, "\(found.json)")
            #expect((found.json["transaction"] as? [String: Any])?["store"] as? String == "stripe", "\(found.json)")
            let audit = try await web.app.store.anomalies.audit().filter { $0.subject == "stripe:\(intent)" }
            #expect(audit.contains { $0.detail.contains("before anyone claimed it") }, "\(audit.map(\.detail))")
            let status = try await API.call(web.client, .get, "/v1/orders/\(order)").json["status"] as? String
            #expect(status != "delivered")
            // Replayed in order: still nothing.
            try await web.deliver(twice: true)
            #expect(try await web.balance("w-early") == 0)
        }
    }

    /// A partial refund before the claim: the delivery gives, and at once takes back, the
    /// refunded share (the one refund path's rule for every store).
    @Test(arguments: API.databases)
    func aPartialRefundBeforeTheClaimDeliversOnlyWhatWasNotRefunded(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, session) = try await web.buy("w-part", "coins_300", quantity: 2)
            let charge = try web.charge(ofSession: session)
            // 998 cents: a quarter (249) refunded before the completion is applied.
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: 249, reason: nil, idempotencyKey: nil)
            try await web.deliver(reverse: true)
            #expect(try await web.balance("w-part") == 451)
            try await web.deliver(twice: true)
            #expect(try await web.balance("w-part") == 451)
        }
    }
}

/// The two other money rules Stripe's adapter decided for itself: an older period's late
/// `invoice.paid` moved the expiry backwards, and a test-mode payment was delivered by a server
/// that accepts only Production. Both are the core's now, for every store.
extension StripeTests {
    @Test(arguments: API.databases)
    func aLateInvoiceOfAnOlderPeriodNeverMovesTheSubscriptionBack(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            _ = try await web.buy("w-late", "pro_monthly")
            // The first period's events, kept to be sent again late.
            let first = web.server.takeDeliveries(secrets: [Self.secrets[0]])
            for delivery in first { #expect(try await web.post(delivery.body, signature: delivery.header) == .ok) }
            await web.runJobs()
            web.stripe.advance(seconds: 32 * 86_400)
            try await web.deliver()
            let renewed = try #require((try await web.account("w-late")["subscriptions"] as? [[String: Any]])?.first)
            let renewedEnd = try #require(renewed["expiresAt"] as? String)
            // Stripe retries the first invoice's event (a different delivery of the same event).
            let late = try #require(first.first { $0.type == "invoice.paid" })
            let again = web.server.signedDelivery(late.body, secrets: [Self.secrets[0]])
            #expect(try await web.post(again.body, signature: again.header) == .ok)
            await web.runJobs()
            let after = try #require((try await web.account("w-late")["subscriptions"] as? [[String: Any]])?.first)
            #expect(after["expiresAt"] as? String == renewedEnd, "\(after)")
            #expect(after["status"] as? String == "active")
            #expect(try await web.entitlements("w-late") == ["pro"])
        }
    }

    @Test(arguments: API.databases)
    func aTestModePaymentIsRefusedByAServerThatAcceptsOnlyProduction(kind: String) async throws {
        try await Self.withStripe(kind, environments: [.production]) { web in
            let (order, _) = try await web.buy("w-test", "coins_300")
            try await web.deliver()
            #expect(try await web.balance("w-test") == 0)
            let events = try await StripeStore(database: web.app.database).events()
            let completed = events.first { $0.type == "checkout.session.completed" }
            #expect(completed?.outcome?.contains("wrong_environment") == true, "\(completed?.outcome ?? "-")")
            let status = try await API.call(web.client, .get, "/v1/orders/\(order)").json["status"] as? String
            #expect(status != "delivered")
        }
        // Live mode on the same server: delivered.
        try await Self.withStripe(kind, livemode: true, environments: [.production]) { web in
            _ = try await web.buy("w-live", "coins_300")
            try await web.deliver()
            #expect(try await web.balance("w-live") == 300)
        }
    }
}

/// Stripe's money, as the fourth audit read it against Stripe's API reference: proceeds from the
/// balance transaction's net and currency always (a charge settled in another currency counted
/// its gross), three-decimal currencies (10× too large).
extension StripeTests {
    @Test(arguments: API.databases)
    func proceedsOfAChargeSettledInAnotherCurrencyAreStripesNet(kind: String) async throws {
        try await Self.withStripe(kind, livemode: true, settlement: ("eur", ["usd": 0.92])) { web in
            _ = try await web.buy("w-fx", "coins_300")
            try await web.deliver()
            #expect(try await web.balance("w-fx") == 300)
            // 4.99 USD settled as 4.59 EUR, Stripe's fee 0.43 EUR: net 4.16 EUR, 90.6 % of the
            // gross; the developer keeps 4.99 × 416 / 459 = 4.522 USD — never the gross 4.99.
            let revenue = try await API.call(web.client, .get, "/v1/revenue")
            let usd = (revenue.json["currencies"] as? [[String: Any]])?.first { $0["currency"] as? String == "USD" }
            #expect(usd?["grossMilli"] as? Int == 4990, "\(revenue.json)")
            #expect(usd?["proceedsMilli"] as? Int == 4522, "\(revenue.json)")
        }
    }

    @Test func threeDecimalCurrenciesAreMilliunitsAsTheyAre() {
        // 1.000 KWD is 1000 fils; 1.00 USD 100 cents; 100 JPY 100 yen: each 1000 milliunits a unit.
        #expect(StripeReading.milliunits(1000, currency: "kwd") == 1000)
        #expect(StripeReading.milliunits(5250, currency: "BHD") == 5250)
        #expect(StripeReading.milliunits(100, currency: "usd") == 1000)
        #expect(StripeReading.milliunits(100, currency: "jpy") == 100_000)
        #expect(StripeReading.milliunits(1, currency: "tnd") == 1)
    }
}

extension StripeTests {
    /// Reconciliation resumes where its last complete run ended: an outage longer than the three
    /// days a fixed window looked back loses nothing; it pages to the end and lists only the
    /// types it applies.
    @Test(arguments: API.databases)
    func reconciliationResumesAfterAnOutageLongerThanItsWindow(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let reconciler = StripeReconciler(app: web.app)
            let first = await reconciler.run()
            #expect(first.errors.isEmpty, "\(first.errors)")
            // Bought, every webhook lost; the server comes back five days later.
            for index in 0..<3 { _ = try await web.buy("w-out\(index)", "coins_60") }
            _ = web.server.takeDeliveries(secrets: [Self.secrets[0]])
            let later = await reconciler.run(now: Date().addingTimeInterval(5 * 86_400))
            #expect(later.errors.isEmpty, "\(later.errors)")
            #expect(later.recorded == 3, "\(later)")
            await web.runJobs(now: Date().addingTimeInterval(5 * 86_400 + 60))
            for index in 0..<3 { #expect(try await web.balance("w-out\(index)") == 60) }
            // Only what the adapter applies was listed (no payment_intent.*, no charge.succeeded).
            let types = Set(try await StripeStore(database: web.app.database).events().map(\.type))
            #expect(types == ["checkout.session.completed"], "\(types)")
        }
    }
}

extension StripeTests {
    /// The billing portal: a return URL only of the app's own (else 400), a few a minute per
    /// account (429 with Retry-After); after a transfer the new holder never opens the previous
    /// holder's portal (the Stripe customer is the payer's).
    @Test(arguments: API.databases)
    func theBillingPortalIsTheirOwnBoundedAndReturnsOnlyHome(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, session) = try await web.buy("w-portal", "pro_monthly")
            try await web.deliver()
            let path = "/v1/accounts/w-portal/billing-portal"
            let foreign = try await API.call(
                web.client, .post, path, body: #"{"returnURL":"https://evil.example.net/phish"}"#)
            #expect(foreign.status == .badRequest, "\(foreign.json)")
            let lookalike = try await API.call(
                web.client, .post, path, body: #"{"returnURL":"https://game.example.com.evil.net/x"}"#)
            #expect(lookalike.status == .badRequest)
            var statuses: [HTTPResponse.Status] = []
            for _ in 0..<6 {
                statuses.append(
                    try await API.call(
                        web.client, .post, path, body: #"{"returnURL":"https://game.example.com/account"}"#
                    ).status)
            }
            #expect(Array(statuses.prefix(5)) == Array(repeating: .ok, count: 5), "\(statuses)")
            #expect(statuses.last == .tooManyRequests)
            // Moved to another account; it renews there: the new holder has no portal of the payer's.
            let subscription = try #require(try web.stripe.session(session, expand: [])["subscription"] as? String)
            let moved = try await API.call(
                web.client, .post, "/v1/transactions/stripe:\(subscription)/transfer",
                body: #"{"toAccountId":"w-heir","note":"old account"}"#)
            #expect(moved.status == .ok, "\(moved.json)")
            web.stripe.advance(seconds: 32 * 86_400)
            try await web.deliver()
            #expect(try await web.entitlements("w-heir") == ["pro"])
            let heir = try await API.call(web.client, .post, "/v1/accounts/w-heir/billing-portal", body: "{}")
            #expect(heir.errorCode == "no_stripe_customer", "\(heir.json)")
        }
    }
}

extension StripeTests {
    /// A paid checkout of a price the catalog does not sell is an `unknown_product` anomaly for an
    /// operator (as for every store), never silently not delivered.
    @Test(arguments: API.databases)
    func aPaymentOfAPriceTheCatalogDoesNotSellIsAnAnomaly(kind: String) async throws {
        var catalog = Catalog.demo
        if let index = catalog.products.firstIndex(where: { $0.id == "coins_60" }) {
            catalog.products[index].storeProducts?["stripe"] = nil
        }
        try await Self.withStripe(kind, catalog: catalog) { web in
            // A session opened at Stripe for a price this server's catalog does not map.
            let client = StripeClient(secretKey: web.server.secretKey, baseURL: web.stripeBaseURL)
            var form = StripeForm()
            form.add("mode", "payment")
            form.add("line_items[0][price]", "price_coins_60")
            form.add("line_items[0][quantity]", "1")
            form.add("success_url", "https://game.example.com/paid")
            form.add("cancel_url", "https://game.example.com/cancelled")
            let session = try await client.createCheckoutSession(form, idempotencyKey: "unknown-price")
            _ = try web.stripe.pay(session: session.id)
            try await web.deliver()
            let anomalies = try await web.app.store.anomalies.anomalies(status: "open")
            #expect(
                anomalies.contains { $0.kind == "unknown_product" && $0.detail.contains("price_coins_60") },
                "\(anomalies.map { "\($0.kind): \($0.detail)" })")
        }
    }

    /// `cancel_at` (a date chosen in the portal) within the period: the subscription does not
    /// renew, as for `cancel_at_period_end`.
    @Test func aCancelAtWithinThePeriodMeansNoRenewal() throws {
        func subscription(_ json: String) throws -> StripeSubscription {
            try JSONDecoder().decode(StripeSubscription.self, from: Data(json.utf8))
        }
        let items = #""items":{"object":"list","data":[{"id":"si_1","current_period_end":2000}]}"#
        #expect(StripeReading.renews(try subscription(#"{"id":"sub_1",\#(items)}"#)))
        #expect(!StripeReading.renews(try subscription(#"{"id":"sub_1","cancel_at_period_end":true,\#(items)}"#)))
        #expect(!StripeReading.renews(try subscription(#"{"id":"sub_1","cancel_at":1500,\#(items)}"#)))
        #expect(!StripeReading.renews(try subscription(#"{"id":"sub_1","cancel_at":2000,\#(items)}"#)))
        #expect(StripeReading.renews(try subscription(#"{"id":"sub_1","cancel_at":9000,\#(items)}"#)))
    }
}

extension StripeTests {
    /// Two apps sharing one Stripe account: Stripe sends every event to both endpoints; a
    /// payment is applied as the app that sold it (its checkout names it), whichever endpoint
    /// recorded the event first.
    @Test(arguments: API.databases)
    func twoAppsSharingAStripeAccountKeepTheirOwnPayments(kind: String) async throws {
        try await Self.withStripe(kind, secondApp: true) { web in
            let reply = try await API.call(
                web.client, .post, "/v1/orders", body: #"{"accountId":"w-two","productId":"coins_60","appId":"web2"}"#)
            #expect(reply.status == .created, "\(reply.json)")
            let session = try #require((reply.json["checkout"] as? [String: Any])?["sessionId"] as? String)
            _ = try web.stripe.pay(session: session)
            // Received by the first app's endpoint (its secret) only.
            try await web.deliver(secrets: [Self.secrets[0]])
            #expect(try await web.balance("w-two") == 60)
            let intent = try #require(try web.stripe.session(session, expand: [])["payment_intent"] as? String)
            let found = try await API.call(web.client, .get, "/v1/transactions/stripe:\(intent)")
            #expect((found.json["transaction"] as? [String: Any])?["appId"] as? String == "web2", "\(found.json)")
        }
    }
}
