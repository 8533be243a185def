import Foundation
import LocalStripe
import StoreKeeperServer

extension DemoStory {
    // MARK: The web (the built-in local Stripe, its webhooks sent to the server over HTTP)

    var localStripe: LocalStripe {
        get throws {
            guard let stripe = app.localStripe?.stripe else { throw DemoFailure("no local Stripe") }
            return stripe
        }
    }

    /// A web paywall before install: paid on Stripe for nobody, redeemed in the app with the
    /// code from the success page, renewed a month later on Stripe's clock.
    func webPaywallRedeemedInTheApp() async throws -> String {
        let opened = try await call(.POST, "/v1/orders", ["productId": "pro_monthly", "appId": "stripe"])
        guard opened.status == 201, let orderId = opened.json["orderId"] as? String,
            let session = (opened.json["checkout"] as? [String: Any])?["sessionId"] as? String
        else { throw DemoFailure("POST /v1/orders (stripe) answered \(opened.status) \(opened.json)") }
        _ = try localStripe.pay(session: session)
        var code = ""
        try await eventually("the redemption code") {
            code = try await call(.GET, "/v1/orders/\(orderId)").json["redemptionCode"] as? String ?? ""
            return !code.isEmpty
        }
        let redeemed = try await call(.POST, "/v1/redemptions/\(code)", ["accountId": "webby"])
        guard redeemed.status == 200 else { throw DemoFailure("the redemption answered \(redeemed.status)") }
        let again = try await call(.POST, "/v1/redemptions/\(code)", ["accountId": "someone-else"])
        guard again.code == "already_redeemed" else { throw DemoFailure("a second redemption was not refused") }
        let first = try await subscription("webby")?["expiresAt"] as? String ?? ""
        try localStripe.advance(seconds: 32 * 86_400)
        try await eventually("the web renewal") {
            (try await subscription("webby")?["expiresAt"] as? String ?? "") > first
        }
        return "paid on the web, redeemed by webby (code \(code.prefix(4))…, once), renewed on Stripe's clock"
    }

    /// Coins bought on the web by a signed-in player, then refunded from Stripe: taken back.
    func webCoinsRefunded() async throws -> String {
        let opened = try await call(
            .POST, "/v1/orders", ["accountId": "webby", "productId": "coins_300", "appId": "stripe"])
        guard opened.status == 201,
            let session = (opened.json["checkout"] as? [String: Any])?["sessionId"] as? String
        else { throw DemoFailure("POST /v1/orders (stripe) answered \(opened.status) \(opened.json)") }
        _ = try localStripe.pay(session: session)
        try await eventually("the web purchase") { try await balance("webby") == 300 }
        let intent = try localStripe.session(session, expand: ["payment_intent"])["payment_intent"] as? [String: Any]
        guard let charge = intent?["latest_charge"] as? String else { throw DemoFailure("no charge") }
        _ = try localStripe.refund(
            paymentIntent: nil, charge: charge, amount: nil, reason: "requested_by_customer", idempotencyKey: nil)
        try await eventually("the refund") { try await balance("webby") == 0 }
        return "300 coins bought on the web, refunded in Stripe's dashboard: taken back"
    }
}
