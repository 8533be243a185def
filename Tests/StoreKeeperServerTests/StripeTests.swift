import AppStoreModels
import Foundation
import GooglePlay
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import LocalGooglePlay
import LocalStripe
import NIOCore
import SQLKit
import StoreKeeperCatalog
import StoreKeeperKitCore
import StoreKeeperSimulator
import StoreKeeperStorage
import Stripe
import Testing

@testable import StoreKeeperServer

/// Stripe, the third store (docs/stripe.md): the real server on SQLite and PostgreSQL, the
/// local Stripe over HTTP as Stripe's API, its webhooks posted as Stripe signs them.
@Suite struct StripeTests {
    typealias API = ServerAPITests
    static let secrets = ["whsec_test_current_0123456789", "whsec_test_rolled_9876543210"]
    /// A support key limited to another app than the Stripe one.
    static let iosDeskKey = "sk_ios_desk_0123456789abcdefghijklmnop"

    struct Web {
        let app: StoreKeeperApp
        let client: any TestClientProtocol
        let stripe: LocalStripe
        let server: LocalStripeServer
        let stripeBaseURL: String
        /// The local Google Play the Stripe app reports to (`google: true`).
        var play: LocalGooglePlay? = nil

        /// Every new event posted as Stripe sends it (signed with the current secret only, or
        /// `secrets`), in order, newest first, or twice; returns the statuses.
        @discardableResult
        func deliver(secrets: [String] = [StripeTests.secrets[0]], reverse: Bool = false, twice: Bool = false)
            async throws -> [HTTPResponse.Status]
        {
            var deliveries = server.takeDeliveries(secrets: secrets)
            if reverse { deliveries.reverse() }
            var statuses: [HTTPResponse.Status] = []
            for delivery in deliveries {
                for _ in 0..<(twice ? 2 : 1) {
                    statuses.append(try await post(delivery.body, signature: delivery.header))
                }
            }
            await runJobs()
            return statuses
        }

        func post(_ body: Data, signature: String?) async throws -> HTTPResponse.Status {
            var headers: HTTPFields = [.contentType: "application/json; charset=utf-8"]
            if let signature { headers[HTTPField.Name("Stripe-Signature")!] = signature }
            return try await client.execute(
                uri: "/v1/notifications/stripe", method: .post, headers: headers, body: ByteBuffer(bytes: body)
            ) { $0.status }
        }

        func runJobs(now: Date = Date()) async {
            let runner = JobRunner(app: app)
            while await runner.runDueCounting(now: now).claimed > 0 {}
        }

        /// `extra`: more fields of the order's JSON (`,"externalPurchaseToken":"…"`).
        func order(_ account: String?, _ product: String, quantity: Int = 1, extra: String = "") async throws
            -> API.Reply
        {
            let owner = account.map { #""accountId":"\#($0)","# } ?? ""
            return try await API.call(
                client, .post, "/v1/orders",
                body: #"{\#(owner)"productId":"\#(product)","appId":"web","quantity":\#(quantity)\#(extra)}"#)
        }

        /// An order paid on the hosted page: (orderId, sessionId).
        func buy(
            _ account: String?, _ product: String, outcome: String = "paid", quantity: Int = 1, extra: String = ""
        ) async throws
            -> (order: String, session: String)
        {
            let reply = try await order(account, product, quantity: quantity, extra: extra)
            #expect(reply.status == .created, "\(reply.json)")
            let checkout = try #require(reply.json["checkout"] as? [String: Any])
            let session = try #require(checkout["sessionId"] as? String)
            _ = try stripe.pay(session: session, outcome: outcome)
            return (reply.json["orderId"] as? String ?? "", session)
        }

        func account(_ id: String) async throws -> [String: Any] {
            try await API.call(client, .get, "/v1/accounts/\(id)").json
        }

        func balance(_ id: String) async throws -> Int {
            (try await account(id)["balances"] as? [String: Int])?["coins"] ?? 0
        }

        func entitlements(_ id: String) async throws -> [String] {
            (try await account(id)["entitlements"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        }

        /// The id of the object of the latest event of `type`.
        func lastObjectId(of type: String) throws -> String? {
            guard let summary = stripe.eventSummaries().last(where: { $0.type == type }) else { return nil }
            let data = try stripe.event(summary.id)["data"] as? [String: Any]
            return (data?["object"] as? [String: Any])?["id"] as? String
        }

        func charge(ofSession id: String) throws -> String {
            let session = try stripe.session(id, expand: ["payment_intent"])
            let intent = try #require(session["payment_intent"] as? [String: Any])
            return try #require(intent["latest_charge"] as? String)
        }
    }

    /// `appleReporting`: Apple's External Purchase reports on (to the local App Store);
    /// `google`: a Google Play app served by a local Google Play that the Stripe app reports to.
    static func withStripe(
        _ kind: String, disputePolicy: String? = nil, catalog: Catalog = .demo, livemode: Bool = false,
        appleReporting: Bool = false, google: Bool = false,
        environments: Set<AppStoreEnvironment> = [.production, .sandbox],
        settlement: (currency: String, rates: [String: Double])? = nil, secondApp: Bool = false,
        _ body: @Sendable (Web) async throws -> Void
    ) async throws {
        var stripeConfiguration = LocalStripe.Configuration(catalog: .demo)
        stripeConfiguration.livemode = livemode
        stripeConfiguration.settlementCurrency = settlement?.currency
        stripeConfiguration.exchangeRates = settlement?.rates ?? [:]
        let stripe = LocalStripe(configuration: stripeConfiguration)
        let server = LocalStripeServer(stripe: stripe)
        let running = try await server.start()
        var play: LocalGooglePlay?
        var playServer: LocalGooglePlayServer?
        var playRunning: LocalGooglePlayServer.Running?
        if google {
            let store = LocalGooglePlay(
                configuration: .init(packageName: "com.example.android", catalog: .demo),
                clock: StoreClock(start: Date(), scale: 0))
            play = store
            playServer = try await LocalGooglePlayServer(store: store)
            playRunning = try await playServer?.start()
        }
        let googleKey = playRunning.flatMap { running in playServer?.serviceAccountKey(baseURL: running.baseURL) }
        let googleBase = playRunning?.baseURL
        let localPlay = play
        do {
            try await API.withServer(
                kind,
                configure: { configuration in
                    configuration.externalPurchaseReporting = appleReporting
                    configuration.environments = environments
                    if let googleKey, let googleBase {
                        var android = GooglePlayAppConfiguration(id: "android", packageName: "com.example.android")
                        android.serviceAccountKey = googleKey
                        android.apiBaseURL = googleBase
                        android.pushAudience = GooglePlayServerTests.audience
                        android.pushServiceAccount = GooglePlayServerTests.pushAccount
                        android.pushCertificatesURL = googleBase + "/oauth2/v3/certs"
                        configuration.googlePlayApps = [android]
                    }
                    var web = StripeAppConfiguration(id: "web")
                    web.googlePlayAppId = googleKey == nil ? nil : "android"
                    web.secretKey = server.secretKey
                    web.apiBaseURL = running.baseURL
                    web.webhookSecrets = secrets
                    web.successURL = "https://game.example.com/paid"
                    web.cancelURL = "https://game.example.com/cancelled"
                    web.disputePolicy = disputePolicy
                    configuration.stripeApps = [web]
                    if secondApp {
                        // Another app on the same Stripe account, its own endpoint and secret.
                        var other = web
                        other.id = "web2"
                        other.webhookSecrets = ["whsec_test_second_app_0123456789"]
                        configuration.stripeApps.append(other)
                    }
                    configuration.catalog = catalog
                    configuration.port = 0
                    configuration.operatorKeys = [
                        OperatorKey(label: "ios-desk", scope: .support, apps: ["ios"], secret: StripeTests.iosDeskKey)
                    ]
                }
            ) { app, client in
                try await body(
                    Web(
                        app: app, client: client, stripe: stripe, server: server, stripeBaseURL: running.baseURL,
                        play: localPlay))
            }
        } catch {
            await running.stop()
            await playRunning?.stop()
            throw error
        }
        await running.stop()
        await playRunning?.stop()
    }

    // MARK: The signature scheme

    @Test func theSignatureIsStripesOwnOverTheRawBytes() throws {
        // Stripe's scheme: HMAC-SHA256 keyed with the whole whsec_ string, over "<t>.<body>".
        let body = Array(#"{"id":"evt_test","object":"event"}"#.utf8)
        let at = Date(timeIntervalSince1970: 1_767_225_600)
        let current = "v1=d2bbf379811dab6c152c152084ca7753ada8839e7528ed5cdf70eff429cf16c7"
        let rolled = "v1=2129fbcafdbc8b24c918c067116ea1ed739359a0a3321082416024c64bd406f2"
        #expect(
            StripeSignature.header(body: body, secrets: ["whsec_test_secret"], timestamp: 1_767_225_600)
                == "t=1767225600,\(current)")
        #expect(
            (try? StripeSignature.verify(
                header: "t=1767225600,\(current)", body: body, secrets: ["whsec_test_secret"], now: at))
                == 1_767_225_600)
        // Rotation: either secret's v1 verifies against either configured secret.
        let both =
            "t=1767225600,\(current),\(rolled),v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
        #expect((try? StripeSignature.verify(header: both, body: body, secrets: ["whsec_old_secret"], now: at)) != nil)
        #expect(
            (try? StripeSignature.verify(
                header: "t=1767225600,\(rolled)", body: body, secrets: ["whsec_test_secret", "whsec_old_secret"],
                now: at)) != nil)
        // Refusals, each for its reason.
        func failure(
            _ header: String?, _ bytes: [UInt8] = body, secrets: [String] = ["whsec_test_secret"], now: Date = at
        )
            -> StripeSignature.Failure?
        {
            do {
                try StripeSignature.verify(header: header, body: bytes, secrets: secrets, now: now)
                return nil
            } catch { return error }
        }
        #expect(failure(nil) == .notSigned)
        #expect(
            failure("t=1767225600,\(current)", Array(#"{"id":"evt_test","object":"event" }"#.utf8))
                == .noMatchingSignature)
        #expect(failure("t=1767225600,\(current)", now: at.addingTimeInterval(301)) == .timestampOutsideTolerance)
        #expect(failure("t=1767225600,\(current)", now: at.addingTimeInterval(-301)) == .timestampOutsideTolerance)
        #expect(failure("t=1767225600,\(current)", now: at.addingTimeInterval(299)) == nil)
        #expect(
            failure("t=1767225600,v0=d2bbf379811dab6c152c152084ca7753ada8839e7528ed5cdf70eff429cf16c7")
                == .noV1Signature)
        #expect(failure("t=1767225600,\(current)", secrets: ["whsec_other"]) == .noMatchingSignature)
        #expect(failure("t=1767225600,\(current)", secrets: ["whsec_test_secre"]) == .noMatchingSignature)
        #expect(failure("v1=abc") == .malformedHeader)
        #expect(failure("t=17672256xx,\(current)") == .malformedHeader)
        #expect(failure("garbage") == .malformedHeader)
        // The base64-decoded secret is not the key (a common mistake).
        #expect(failure("t=1767225600,\(current)", secrets: ["dGVzdF9zZWNyZXQ="]) == .noMatchingSignature)
    }

    @Test(arguments: API.databases)
    func aWebhookThatDoesNotVerifyIsRefusedAndNothingIsRecorded(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            _ = try await web.buy("w1", "coins_60")
            let deliveries = web.server.takeDeliveries(secrets: [Self.secrets[0]])
            let completed = try #require(deliveries.first { $0.type == "checkout.session.completed" })
            // Tampered (one byte), stale, signed with an unknown secret, unsigned: 400 each.
            var tampered = completed.body
            tampered[tampered.count - 3] ^= 0x01
            #expect(try await web.post(tampered, signature: completed.header) == .badRequest)
            let stale = web.server.signedDelivery(
                completed.body, secrets: [Self.secrets[0]], at: Date().addingTimeInterval(-400))
            #expect(try await web.post(stale.body, signature: stale.header) == .badRequest)
            let foreign = web.server.signedDelivery(completed.body, secrets: ["whsec_someone_else"])
            #expect(try await web.post(foreign.body, signature: foreign.header) == .badRequest)
            #expect(try await web.post(completed.body, signature: nil) == .badRequest)
            await web.runJobs()
            #expect(try await StripeStore(database: web.app.database).events().isEmpty)
            #expect(try await web.balance("w1") == 0)
            // Signed with the rolled secret only (both configured): accepted.
            let rolled = web.server.signedDelivery(completed.body, secrets: [Self.secrets[1]])
            #expect(try await web.post(rolled.body, signature: rolled.header) == .ok)
            await web.runJobs()
            #expect(try await web.balance("w1") == 60)
        }
    }

    // MARK: Purchases

    @Test(arguments: API.databases)
    func aPaidCheckoutIsDeliveredOnceWhateverTheWebhooksDo(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let reply = try await web.order("w2", "coins_60", quantity: 2)
            #expect(reply.status == .created, "\(reply.json)")
            let checkout = try #require(reply.json["checkout"] as? [String: Any])
            let session = try #require(checkout["sessionId"] as? String)
            #expect((checkout["url"] as? String)?.contains(session) == true)
            #expect(checkout["expiresAt"] as? String != nil)
            // What Stripe was asked: the order as reference, its token in the session's and the
            // payment intent's metadata (Stripe copies neither).
            let created = try web.stripe.session(session, expand: [])
            #expect(created["client_reference_id"] as? String == reply.json["orderId"] as? String)
            #expect(
                (created["metadata"] as? [String: String])?["storekeeper_token"] == reply.json["appAccountToken"]
                    as? String)
            // Nothing before payment.
            #expect(try await web.deliver().allSatisfy { $0 == .ok })
            #expect(try await web.balance("w2") == 0)
            _ = try web.stripe.pay(session: session)
            // Newest first, each twice: delivered once.
            let statuses = try await web.deliver(reverse: true, twice: true)
            #expect(!statuses.isEmpty && statuses.allSatisfy { $0 == .ok })
            #expect(try await web.balance("w2") == 120)
            // A replay from Stripe's event list (reconciliation) changes nothing either.
            let events = try await StripeStore(database: web.app.database).events()
            #expect(events.contains { $0.type == "checkout.session.completed" && $0.status == "applied" })
            // The transaction, by its id: store stripe, the order, the price and Stripe's net.
            let intent = try #require((try web.stripe.session(session, expand: [])["payment_intent"]) as? String)
            let lookup = try await API.call(web.client, .get, "/v1/transactions/stripe:\(intent)")
            #expect(lookup.status == .ok, "\(lookup.json)")
            #expect(lookup.json["accountId"] as? String == "w2")
            #expect(lookup.json["orderId"] as? String == reply.json["orderId"] as? String)
            let transaction = try #require(lookup.json["transaction"] as? [String: Any])
            #expect(transaction["store"] as? String == "stripe")
            let order = try await API.call(web.client, .get, "/v1/orders/\(reply.json["orderId"] as? String ?? "")")
            #expect(order.json["status"] as? String == "delivered", "\(order.json)")
        }
    }

    @Test(arguments: API.databases)
    func anUnpaidCompletionWaitsForTheDelayedPayment(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, session) = try await web.buy("w3", "coins_300", outcome: "async")
            try await web.deliver()
            #expect(try await web.balance("w3") == 0)
            let events = try await StripeStore(database: web.app.database).events()
            #expect(
                events.first { $0.type == "checkout.session.completed" }?.outcome?.contains("not paid yet") == true)
            try web.stripe.settleAsync(session: session, succeeded: true)
            try await web.deliver()
            #expect(try await web.balance("w3") == 300)
            // A failed one delivers nothing.
            let (_, other) = try await web.buy("w3b", "coins_300", outcome: "async")
            try web.stripe.settleAsync(session: other, succeeded: false)
            try await web.deliver()
            #expect(try await web.balance("w3b") == 0)
        }
    }

    @Test(arguments: API.databases)
    func eachRefundTakesBackWhatItRefundedOnce(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, session) = try await web.buy("w4", "coins_300", quantity: 2)
            try await web.deliver()
            #expect(try await web.balance("w4") == 600)
            let charge = try web.charge(ofSession: session)
            // 998 cents paid: a quarter refunded, then another quarter, each applied once.
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: 249, reason: nil, idempotencyKey: nil)
            try await web.deliver(twice: true)
            #expect(try await web.balance("w4") == 451)
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: 250, reason: nil, idempotencyKey: nil)
            try await web.deliver(reverse: true)
            // Cumulative: 499 of 998 cents is half of the 600 coins, whatever each step rounded.
            #expect(try await web.balance("w4") == 300)
            // The rest: everything taken back.
            let (rest, _) = try web.stripe.refund(
                paymentIntent: nil, charge: charge, amount: nil, reason: nil, idempotencyKey: nil)
            try await web.deliver()
            #expect(try await web.balance("w4") == 0)
            // That last refund fails (the card was closed): the money is the developer's again,
            // and so are the coins it took — once, whichever event says so and however often.
            try web.stripe.failRefund(try #require(rest["id"] as? String))
            try await web.deliver(twice: true)
            #expect(try await web.balance("w4") == 300)
            try await web.deliver(reverse: true, twice: true)
            #expect(try await web.balance("w4") == 300)
        }
    }

    @Test(arguments: API.databases)
    func disputesFollowThePolicyAndInquiriesNeverRevoke(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            _ = try await web.buy("w5", "remove_ads", outcome: "inquiry")
            try await web.deliver()
            #expect(try await web.entitlements("w5") == ["no_ads"])
            let (_, session) = try await web.buy("w6", "remove_ads", outcome: "dispute")
            try await web.deliver()
            // Opened: kept (revoke_when_lost); lost: revoked.
            #expect(try await web.entitlements("w6") == ["no_ads"])
            let charge = try web.charge(ofSession: session)
            let dispute = try #require(try web.lastObjectId(of: "charge.dispute.created"))
            #expect(try web.stripe.dispute(dispute)["charge"] as? String == charge)
            _ = try web.stripe.closeDispute(dispute, outcome: "lost")
            try await web.deliver()
            #expect(try await web.entitlements("w6") == [])
        }
        // The catalog's policy (refunds.disputes), and an app's own overriding it.
        var strict = Catalog.demo
        strict.refunds.disputes = .revokeWhenOpened
        try await Self.withStripe(kind, catalog: strict) { web in
            let (_, session) = try await web.buy("w7", "remove_ads", outcome: "dispute")
            try await web.deliver()
            #expect(try await web.entitlements("w7") == [])
            // Won: given back.
            _ = session
            let dispute = try #require(try web.lastObjectId(of: "charge.dispute.created"))
            _ = try web.stripe.closeDispute(dispute, outcome: "won")
            try await web.deliver()
            let outcomes = try await StripeStore(database: web.app.database).events().map {
                "\($0.type): \($0.outcome ?? "-")"
            }
            #expect(try await web.entitlements("w7") == ["no_ads"], "\(outcomes)")
        }
        try await Self.withStripe(kind, disputePolicy: "revoke_when_lost", catalog: strict) { web in
            _ = try await web.buy("w7b", "remove_ads", outcome: "dispute")
            try await web.deliver()
            #expect(try await web.entitlements("w7b") == ["no_ads"])
        }
    }

    @Test(arguments: API.databases)
    func subscriptionsRenewOnTheTestClockAndFailedPaymentsEndAccess(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, sessionId) = try await web.buy("w8", "pro_monthly")
            try await web.deliver(reverse: true)
            #expect(try await web.entitlements("w8") == ["pro"])
            let first = try #require((try await web.account("w8")["subscriptions"] as? [[String: Any]])?.first)
            #expect(first["status"] as? String == "active", "\(first)")
            let firstEnd = first["expiresAt"] as? String
            // A month passes: renewed by invoice.paid, a new period.
            web.stripe.advance(seconds: 32 * 86_400)
            try await web.deliver(reverse: true)
            let renewed = try #require((try await web.account("w8")["subscriptions"] as? [[String: Any]])?.first)
            #expect(renewed["status"] as? String == "active")
            #expect((renewed["expiresAt"] as? String ?? "") > (firstEnd ?? "~"), "\(renewed)")
            // The card starts failing: past_due is billing retry (no access), then canceled.
            let subscription = try #require(try web.stripe.session(sessionId, expand: [])["subscription"] as? String)
            try web.stripe.setCardFails(subscription: subscription, true)
            web.stripe.advance(seconds: 32 * 86_400)
            try await web.deliver()
            let failed = try #require((try await web.account("w8")["subscriptions"] as? [[String: Any]])?.first)
            #expect(failed["status"] as? String == "billing_retry", "\(failed)")
            #expect(try await web.entitlements("w8") == [])
            web.stripe.advance(seconds: 10 * 86_400)
            try await web.deliver()
            let ended = try #require((try await web.account("w8")["subscriptions"] as? [[String: Any]])?.first)
            #expect(ended["status"] as? String == "expired", "\(ended)")
            // The billing portal of the account's Stripe customer.
            let portal = try await API.call(web.client, .post, "/v1/accounts/w8/billing-portal", body: "{}")
            #expect(portal.status == .ok, "\(portal.json)")
            #expect((portal.json["url"] as? String)?.contains("/portal/") == true)
            let none = try await API.call(web.client, .post, "/v1/accounts/nobody-here/billing-portal", body: "{}")
            #expect(none.errorCode == "no_stripe_customer")
        }
    }

    @Test(arguments: API.databases)
    func aPurchaseWithoutAnAccountIsRedeemedOnceByTheFirstAccount(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            // A client token cannot open a checkout for nobody; a key can.
            let token = try await API.clientToken("w9")
            let refused = try await API.call(
                web.client, .post, "/v1/orders", token: token, body: #"{"productId":"coins_60","appId":"web"}"#)
            #expect(refused.status == .forbidden)
            let (order, _) = try await web.buy(nil, "coins_60")
            // Before payment is applied: no code to show.
            let before = try await API.call(web.client, .get, "/v1/orders/\(order)")
            #expect(before.json["redemptionCode"] == nil)
            try await web.deliver()
            let paid = try await API.call(web.client, .get, "/v1/orders/\(order)")
            let code = try #require(paid.json["redemptionCode"] as? String, "\(paid.json)")
            #expect(paid.json["accountId"] == nil)
            let created = try web.stripe.session(
                try #require((paid.json["checkout"] as? [String: Any])?["sessionId"] as? String), expand: [])
            #expect((created["success_url"] as? String)?.contains("redemption=\(code)") == true)
            // Delivered to nobody yet.
            let intent = try web.stripe.session(created["id"] as? String ?? "", expand: [])["payment_intent"] as? String
            #expect(
                try await API.call(web.client, .get, "/v1/transactions/stripe:\(intent ?? "")").json["accountId"] == nil
            )
            let redeemed = try await API.call(web.client, .post, "/v1/redemptions/\(code)", token: token, body: "{}")
            #expect(redeemed.status == .ok, "\(redeemed.json)")
            #expect(try await web.balance("w9") == 60)
            let again = try await API.call(
                web.client, .post, "/v1/redemptions/\(code)", token: try await API.clientToken("w10"), body: "{}")
            #expect(again.status == .conflict)
            #expect(again.errorCode == "already_redeemed")
            #expect(try await web.balance("w10") == 0)
            // The redeemer again (its first answer lost): the same purchase, delivered once.
            let retried = try await API.call(web.client, .post, "/v1/redemptions/\(code)", token: token, body: "{}")
            #expect(retried.status == .ok, "\(retried.json)")
            #expect(try await web.balance("w9") == 60)
            // Webhooks replayed later keep it with the redeemer.
            try await web.deliver(twice: true)
            #expect(try await web.balance("w9") == 60)
            let unknown = try await API.call(
                web.client, .post, "/v1/redemptions/ABCDEFGHJKLM", token: token, body: "{}")
            #expect(unknown.status == .notFound)
        }
    }

    @Test(arguments: API.databases)
    func supportRefundsAStripePaymentThroughStripe(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, session) = try await web.buy("w11", "coins_60")
            try await web.deliver()
            #expect(try await web.balance("w11") == 60)
            let intent = try #require(try web.stripe.session(session, expand: [])["payment_intent"] as? String)
            let refund = try await API.call(
                web.client, .post, "/v1/transactions/stripe:\(intent)/refund",
                body: #"{"reason":"ticket 12: double charge","idempotencyKey":"t12"}"#)
            #expect(refund.status == .ok, "\(refund.json)")
            #expect(try await web.balance("w11") == 0)
            let charge = try web.charge(ofSession: session)
            #expect(try web.stripe.charge(charge, expand: [])["refunded"] as? Bool == true)
            // Stripe's own events about it change nothing more.
            try await web.deliver(twice: true)
            #expect(try await web.balance("w11") == 0)
        }
    }
}

extension StripeTests {
    @Test(arguments: API.databases)
    func reconciliationAppliesWhatMissedWebhooksWouldHave(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            // The server is down while Stripe gives up: every webhook lost.
            _ = try await web.buy("w12", "coins_60")
            let (_, session) = try await web.buy("w13", "pro_monthly")
            _ = web.server.takeDeliveries(secrets: [Self.secrets[0]])
            web.stripe.advance(seconds: 32 * 86_400)
            _ = web.server.takeDeliveries(secrets: [Self.secrets[0]])
            #expect(try await web.balance("w12") == 0)
            let report = await StripeReconciler(app: web.app).run(since: Date().addingTimeInterval(-86_400))
            #expect(report.errors.isEmpty, "\(report.errors)")
            // Only the types the adapter applies are listed (no payment_intent.*, charge.succeeded…).
            #expect(report.recorded == report.listed && report.listed > 4, "\(report)")
            await web.runJobs()
            #expect(try await web.balance("w12") == 60)
            #expect(try await web.entitlements("w13") == ["pro"])
            // Both invoices delivered: the first period and the renewal.
            let subscription = try #require(try web.stripe.session(session, expand: [])["subscription"] as? String)
            let lookup = try await API.call(web.client, .get, "/v1/transactions/stripe:\(subscription)")
            #expect(lookup.status == .ok || lookup.status == .notFound)
            // A second pass records nothing new.
            let again = await StripeReconciler(app: web.app).run(since: Date().addingTimeInterval(-86_400))
            #expect(again.recorded == 0 && again.listed == report.listed, "\(again)")
        }
    }
}

extension StripeTests {
    @Test(arguments: API.databases)
    func anEventStripesAPICouldNotAnswerForIsAppliedByItsJobLater(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            _ = try await web.buy("w14", "coins_60")
            // Stripe's API down while its webhooks arrive: recorded (200), nothing delivered.
            web.server.injectFaults(count: 1000, status: 503)
            let statuses = try await web.deliver()
            #expect(!statuses.isEmpty && statuses.allSatisfy { $0 == .ok })
            #expect(try await web.balance("w14") == 0)
            let pending = try await StripeStore(database: web.app.database).events()
            #expect(pending.contains { $0.type == "checkout.session.completed" && $0.status == "pending" })
            // Back: the safety-net jobs apply them (a minute later).
            web.server.injectFaults(count: 0)
            await web.runJobs(now: Date().addingTimeInterval(120))
            #expect(try await web.balance("w14") == 60)
            // 500 with Stripe-Should-Retry: false is not retried by the client; 429 lock_timeout is.
            web.server.injectFaults(count: 1, status: 429)
            let client = StripeClient(secretKey: web.server.secretKey, baseURL: web.stripeBaseURL)
            _ = try await client.events(createdAfter: nil, startingAfter: nil, limit: 1)
            web.server.injectFaults(count: 1, status: 500)
            await #expect(throws: StripeError.self) {
                _ = try await client.events(createdAfter: nil, startingAfter: nil)
            }
            web.server.injectFaults(count: 0)
        }
    }
}

extension StripeTests {
    /// StoreKeeperKit's `redeem`, over HTTP against the live server: the code binds to the
    /// signed-in account once; the same code from another account is `already_redeemed`.
    @Test func storeKeeperKitRedeemsAWebPurchase() async throws {
        try await Self.withStripe("sqlite") { web in
            let (order, _) = try await web.buy(nil, "coins_300")
            try await web.deliver()
            let code = try #require(
                try await API.call(web.client, .get, "/v1/orders/\(order)").json["redemptionCode"] as? String)
            try await web.app.application().test(.live) { client in
                let backend = HTTPBackend(
                    baseURL: URL(string: "http://127.0.0.1:\(client.port!)")!, transport: AsyncHTTPTransport(),
                    tokens: { account, _ in try await API.clientToken(account) })
                try await backend.redeem(accountId: "kit1", code: code)
                #expect(try await backend.customerInfo(accountId: "kit1").balances["coins"] == 300)
                do {
                    try await backend.redeem(accountId: "kit2", code: code)
                    Issue.record("redeemed twice")
                } catch let BackendError.server(status, code, _, _) {
                    #expect(status == 409)
                    #expect(code == "already_redeemed")
                }
                #expect(try await backend.customerInfo(accountId: "kit2").balances["coins"] == nil)
            }
        }
    }
}

extension StripeTests {
    /// Analytics count Stripe as `store=stripe` with Stripe's own proceeds (the balance
    /// transaction's net: 99 cents less the local Stripe's fee of round(2.9 %) + 30 cents = 66), and
    /// test-mode payments earn nothing.
    @Test(arguments: API.databases)
    func proceedsAreStripesNetAndStripeIsItsOwnStore(kind: String) async throws {
        try await Self.withStripe(kind, livemode: true) { web in
            let (_, session) = try await web.buy("w15", "coins_60")
            try await web.deliver()
            #expect(try await web.balance("w15") == 60)
            let intent = try #require(try web.stripe.session(session, expand: [])["payment_intent"] as? String)
            let store = try await web.app.database.read { sql in
                try await sql.raw(
                    "SELECT store FROM storekeeper_transactions WHERE transaction_id = \(bind: "stripe:\(intent)")"
                ).first()?.decode(column: "store", as: String.self)
            }
            #expect(store == "stripe")
            let today = String(ISO8601DateFormatter().string(from: Date()).prefix(10))
            let proceeds = try await API.call(
                web.client, .get, "/v1/analytics/proceeds?from=\(today)&to=\(today)&store=stripe")
            #expect(proceeds.status == .ok, "\(proceeds.json)")
            let usd = ((proceeds.json["points"] as? [[String: Any]])?.last?["byCurrency"] as? [String: Double])?["USD"]
            #expect(usd.map { abs($0 - 0.66) < 0.0001 } == true, "\(String(describing: usd)) \(proceeds.json)")
            let apple = try await API.call(
                web.client, .get, "/v1/analytics/proceeds?from=\(today)&to=\(today)&store=app_store")
            #expect(
                ((apple.json["points"] as? [[String: Any]])?.last?["byCurrency"] as? [String: Double])?["USD"] == nil)
        }
        try await Self.withStripe(kind) { web in
            _ = try await web.buy("w16", "coins_60")
            try await web.deliver()
            let today = String(ISO8601DateFormatter().string(from: Date()).prefix(10))
            let proceeds = try await API.call(
                web.client, .get, "/v1/analytics/proceeds?from=\(today)&to=\(today)&store=stripe")
            #expect(
                ((proceeds.json["points"] as? [[String: Any]])?.last?["byCurrency"] as? [String: Double])?["USD"] == nil
            )
        }
    }
}

extension StripeTests {
    /// An expired code is 410; support renews it (audited) and it redeems; a used one is not
    /// renewed; a client token cannot renew.
    @Test(arguments: API.databases)
    func anExpiredCodeIsRefusedUntilSupportRenewsIt(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (order, _) = try await web.buy(nil, "coins_60")
            try await web.deliver()
            let code = try #require(
                try await API.call(web.client, .get, "/v1/orders/\(order)").json["redemptionCode"] as? String)
            // An hour and more later.
            try await web.app.database.transaction { sql in
                try await sql.raw("UPDATE stripe_checkouts SET redemption_expires_at = 1").run()
            }
            let token = try await API.clientToken("w17")
            let late = try await API.call(web.client, .post, "/v1/redemptions/\(code)", token: token, body: "{}")
            #expect(late.status == .gone)
            #expect(late.errorCode == "redemption_expired")
            let byClient = try await API.call(web.client, .post, "/v1/redemptions/\(code)/renew", token: token)
            #expect(byClient.status == .forbidden)
            // A key limited to another app neither renews nor redeems it.
            let otherApp = try await API.call(
                web.client, .post, "/v1/redemptions/\(code)/renew", token: Self.iosDeskKey)
            #expect(otherApp.status == .notFound)
            let otherRedeem = try await API.call(
                web.client, .post, "/v1/redemptions/\(code)", token: Self.iosDeskKey, body: #"{"accountId":"w99"}"#)
            #expect(otherRedeem.status == .notFound)
            let renewed = try await API.call(web.client, .post, "/v1/redemptions/\(code)/renew")
            #expect(renewed.status == .ok, "\(renewed.json)")
            #expect(
                try await API.call(web.client, .post, "/v1/redemptions/\(code)", token: token, body: "{}").status == .ok
            )
            #expect(try await web.balance("w17") == 60)
            #expect(
                try await API.call(web.client, .post, "/v1/redemptions/\(code)/renew").errorCode == "already_redeemed")
        }
    }
}

extension StripeTests {
    /// What the customer does in the billing portal comes back as events: a cancellation at
    /// period end turns auto-renew off (access kept), undoing it turns it on, a plan change
    /// moves the subscription to the new product; one subscription throughout.
    @Test(arguments: API.databases)
    func portalChangesComeBackAsEvents(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            let (_, session) = try await web.buy("w18", "pro_monthly")
            try await web.deliver()
            let subscription = try #require(try web.stripe.session(session, expand: [])["subscription"] as? String)
            func shown() async throws -> [String: Any] {
                try #require((try await web.account("w18")["subscriptions"] as? [[String: Any]])?.first)
            }
            #expect(try await shown()["autoRenew"] as? Bool == true)
            try web.stripe.cancel(subscription: subscription, atPeriodEnd: true)
            try await web.deliver(reverse: true)
            #expect(try await shown()["autoRenew"] as? Bool == false)
            #expect(try await shown()["status"] as? String == "active")
            #expect(try await web.entitlements("w18") == ["pro"])
            try web.stripe.uncancel(subscription: subscription)
            try await web.deliver()
            #expect(try await shown()["autoRenew"] as? Bool == true)
            try web.stripe.changePlan(subscription: subscription, price: "price_pro_yearly")
            try await web.deliver()
            let changed = try await shown()
            #expect(changed["productId"] as? String == "pro_yearly", "\(changed)")
            #expect((try await web.account("w18")["subscriptions"] as? [[String: Any]])?.count == 1)
            // Canceled at once: expired, no access.
            try web.stripe.cancel(subscription: subscription, atPeriodEnd: false)
            try await web.deliver()
            #expect(try await shown()["status"] as? String == "expired")
            #expect(try await web.entitlements("w18") == [])
        }
    }
}

// MARK: Reporting a Stripe payment to the store whose link-out sent the buyer

extension StripeTests {
    @Test(arguments: API.databases)
    func aPaymentFromAnAppleLinkOutIsReportedToAppleWithEachRefund(kind: String) async throws {
        try await Self.withStripe(kind, appleReporting: true) { web in
            let apple = try #require(web.app.localAppStore)
            let token = await apple.issueExternalPurchaseToken()
            let extra = #","externalPurchaseToken":"\#(token)""#
            // The token rides on the session and its payment intent; it is the buyer's.
            let (_, session) = try await web.buy("linked", "coins_300", quantity: 2, extra: extra)
            let created = try web.stripe.session(session, expand: [])
            #expect((created["metadata"] as? [String: String])?["storekeeper_apple_token"] == token)
            let stolen = try await web.order("someone-else", "coins_300", extra: extra)
            #expect(stolen.errorCode == "token_of_another_account", "\(stolen.json)")
            // Not a Stripe checkout: refused; a malformed token: refused.
            let appStore = try await API.call(
                web.client, .post, "/v1/orders",
                body: #"{"accountId":"linked","productId":"coins_60","appId":"ios"\#(extra)}"#)
            #expect(appStore.status == .badRequest, "\(appStore.json)")
            let blank = try await web.order("linked", "coins_60", extra: #","externalPurchaseToken":"""#)
            #expect(blank.status == .badRequest)

            try await web.deliver(twice: true)
            #expect(try await web.balance("linked") == 600)
            // One report, one BUY of what Stripe charged (998 cents), in the buyer's country.
            var reports = try #require(await apple.externalToken(token)?.reports)
            #expect(reports.count == 1)
            let buy = try #require(await apple.externalReport(reports[0])?.lineItems?.first)
            #expect(buy.eventType == "BUY")
            #expect(buy.amountTaxInclusive == 9980)
            #expect(buy.quantity == 2)
            #expect(buy.productIdentifier == "coins_300")
            #expect(buy.taxCountry == "USA")
            #expect(buy.pricingCurrency == "USD")

            // Two partial refunds and the rest: each its own REFUND line item, referencing the buy.
            let charge = try web.charge(ofSession: session)
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: 249, reason: nil, idempotencyKey: nil)
            try await web.deliver(twice: true)
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: nil, reason: nil, idempotencyKey: nil)
            try await web.deliver(reverse: true)
            reports = try #require(await apple.externalToken(token)?.reports)
            var refunds: [ExternalPurchaseLineItem] = []
            for report in reports.dropFirst() { refunds += await apple.externalReport(report)?.lineItems ?? [] }
            #expect(refunds.map(\.eventType) == ["REFUND", "REFUND"], "\(refunds)")
            #expect(refunds.map(\.amountTaxInclusive) == [2490, 7490])
            #expect(refunds.allSatisfy { $0.referenceLineItemId == buy.lineItemId })
            #expect(try await web.balance("linked") == 0)
            // A replay of every event reports nothing more.
            try await web.deliver(twice: true)
            await web.runJobs()
            #expect(await apple.externalToken(token)?.reports.count == reports.count)

            // A subscription: its start, then each renewal referencing it.
            let monthly = await apple.issueExternalPurchaseToken()
            _ = try await web.buy("linked", "pro_monthly", extra: #","externalPurchaseToken":"\#(monthly)""#)
            try await web.deliver()
            web.stripe.advance(seconds: 32 * 86_400)
            try await web.deliver(reverse: true)
            var items: [ExternalPurchaseLineItem] = []
            for report in await apple.externalToken(monthly)?.reports ?? [] {
                items += await apple.externalReport(report)?.lineItems ?? []
            }
            #expect(items.map(\.subscriptionEvent) == ["SUBSCRIPTION_START", "RENEWAL"], "\(items)")
            #expect(items.last?.referenceLineItemId == items.first?.lineItemId)
            #expect(items.last?.taxCountry == "USA")

            // A chargeback lost: reported as a refund of what it disputed.
            let disputed = await apple.issueExternalPurchaseToken()
            _ = try await web.buy(
                "linked", "remove_ads", outcome: "dispute", extra: #","externalPurchaseToken":"\#(disputed)""#)
            try await web.deliver()
            let dispute = try #require(try web.lastObjectId(of: "charge.dispute.created"))
            _ = try web.stripe.closeDispute(dispute, outcome: "lost")
            try await web.deliver(twice: true)
            var lines: [ExternalPurchaseLineItem] = []
            for report in await apple.externalToken(disputed)?.reports ?? [] {
                lines += await apple.externalReport(report)?.lineItems ?? []
            }
            #expect(lines.map(\.eventType) == ["BUY", "REFUND"], "\(lines)")
            #expect(lines.last?.amountTaxInclusive == lines.first?.amountTaxInclusive)
        }
    }

    @Test(arguments: API.databases)
    func aPaymentFromAGoogleLinkOutIsReportedToGooglePlayWithRenewalsAndRefunds(kind: String) async throws {
        try await Self.withStripe(kind, google: true) { web in
            let play = try #require(web.play)
            let token = await play.issueExternalTransactionToken()
            let extra = #","externalTransactionToken":"\#(token)""#
            let (_, session) = try await web.buy("droid", "coins_300", extra: extra)
            try await web.deliver(reverse: true, twice: true)
            #expect(try await web.balance("droid") == 300)
            // Reported once, under the payment's own id, the token of the link-out, pre-tax.
            var reported = await play.externalTransactions()
            #expect(reported.count == 1)
            let first = try #require(reported.first)
            let intent = try #require(try web.stripe.session(session, expand: [])["payment_intent"] as? String)
            #expect(first.externalTransactionId == "stripe-\(intent)")
            #expect(first.oneTimeTransaction?.externalTransactionToken == token)
            #expect(first.originalPreTaxAmount == .init(priceMicros: "4990000", currency: "USD"))
            #expect(first.userTaxAddress?.regionCode == "US")
            #expect(first.transactionState == "TRANSACTION_REPORTED")

            // Refunded in two steps: a partial refund, then the rest (each once).
            let charge = try web.charge(ofSession: session)
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: 100, reason: nil, idempotencyKey: nil)
            try await web.deliver(twice: true)
            #expect(
                await play.externalTransaction(first.externalTransactionId!)?.currentPreTaxAmount?.priceMicros
                    == "3990000")
            _ = try web.stripe.refund(paymentIntent: nil, charge: charge, amount: nil, reason: nil, idempotencyKey: nil)
            try await web.deliver(reverse: true)
            let refunded = await play.externalTransaction(first.externalTransactionId!)
            #expect(refunded?.transactionState == "TRANSACTION_CANCELED")
            #expect(refunded?.currentPreTaxAmount?.priceMicros == "0")
            let journal = ExternalTransactionStore(database: web.app.database)
            #expect(try await journal.refunds(of: first.externalTransactionId!).allSatisfy { $0.state == "reported" })

            // A subscription: the first payment with the token, each renewal under its id.
            let monthly = await play.issueExternalTransactionToken()
            _ = try await web.buy("droid", "pro_monthly", extra: #","externalTransactionToken":"\#(monthly)""#)
            try await web.deliver()
            web.stripe.advance(seconds: 32 * 86_400)
            try await web.deliver(reverse: true)
            reported = await play.externalTransactions()
            #expect(reported.count == 3, "\(reported)")
            let start = reported[1]
            #expect(start.recurringTransaction?.externalTransactionToken == monthly)
            #expect(start.recurringTransaction?.externalSubscription?.subscriptionType == "RECURRING")
            #expect(reported[2].recurringTransaction?.initialExternalTransactionId == start.externalTransactionId)
            #expect(reported[2].recurringTransaction?.externalTransactionToken == nil)

            // Google down: the report waits in the journal and goes when Google answers.
            play.setOutage(true)
            let later = await play.issueExternalTransactionToken()
            _ = try await web.buy("droid", "coins_60", extra: #","externalTransactionToken":"\#(later)""#)
            try await web.deliver()
            #expect(await play.externalTransactions().count == 3)
            #expect(try await journal.transactions().first?.state == "pending")
            play.setOutage(false)
            await web.runJobs(now: Date().addingTimeInterval(3600))
            #expect(await play.externalTransactions().count == 4)
            #expect(try await journal.transactions().allSatisfy { $0.state == "reported" })

            // A token Google never issued is refused for good and stays in the journal.
            _ = try await web.buy("droid", "coins_60", extra: #","externalTransactionToken":"forged-token""#)
            try await web.deliver()
            #expect(try await journal.transactions().first?.state == "failed")
            #expect(try await journal.transactions().first?.lastError?.contains("token") == true)
            #expect(try await web.balance("droid") == 300 + 60 + 60 - 300)

            // Without a Google app to report to, the token is refused at the order.
            let other = try await API.call(
                web.client, .post, "/v1/orders",
                body: #"{"accountId":"droid","productId":"coins_60","appId":"ios"\#(extra)}"#)
            #expect(other.status == .badRequest)
        }
    }
}

extension StripeTests {
    @Test(arguments: API.databases)
    func eventsDoneWithAreDeletedAMonthOnAndPendingOnesWait(kind: String) async throws {
        try await Self.withStripe(kind) { web in
            _ = try await web.buy("keeper", "coins_60")
            try await web.deliver()
            let events = StripeStore(database: web.app.database)
            let applied = try await events.events()
            #expect(!applied.isEmpty && applied.allSatisfy { $0.status != "pending" })
            // One waiting for its job (Stripe could not be asked) is kept whatever its age.
            _ = try await events.recordEvent(
                id: "evt_waiting", appId: "web", type: "invoice.paid", objectId: "in_missing", created: nil,
                now: Date().addingTimeInterval(-40 * 86_400))
            let housekeeping = Housekeeping(
                rejectedProofs: RejectedProofStore(database: web.app.database), retentionDays: 90,
                outbox: OutboxStore(database: web.app.database), logger: web.app.logger, stripeEvents: events)
            #expect(try await housekeeping.runOnce().proofs == 0)
            #expect(try await events.events().count == applied.count + 1)
            _ = try await housekeeping.runOnce(now: Date().addingTimeInterval(31 * 86_400))
            #expect(try await events.events().map(\.id) == ["evt_waiting"])
            #expect(try await web.balance("keeper") == 60)
        }
    }
}
