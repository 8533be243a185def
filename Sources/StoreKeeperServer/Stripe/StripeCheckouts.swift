import Foundation
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Stripe

/// Opening Stripe Checkout for an order: the Stripe apps, the database a session is recorded
/// in, and how long an order stays open (a session never outlives it).
struct StripeCheckouts: Sendable {
    let stripe: [String: StripeApp]
    let database: Database
    let orderTTL: TimeInterval

    /// The Stripe app `appId` names (or the only one), else 400 naming the problem.
    func app(_ appId: String?) throws -> StripeApp {
        guard !stripe.isEmpty else {
            throw APIError(.badRequest, "store_not_configured", "no Stripe app is configured on this server")
        }
        if let appId {
            guard let app = stripe[appId] else {
                throw APIError(.badRequest, "unknown_app", "no Stripe app '\(appId.prefix(64))' is configured")
            }
            return app
        }
        guard stripe.count == 1, let only = stripe.values.first else {
            throw APIError.badRequest("field 'appId' is required: several Stripe apps are configured")
        }
        return only
    }

    /// The Checkout Session an order opens: `client_reference_id` the order, its token in the
    /// session's, payment intent's or subscription's metadata, an expiry inside Stripe's 30 min
    /// to 24 h and the order's own, one idempotency key per order.
    func open(
        order: Order, product: Product, app: StripeApp, reporting: StripeReportTokens = .init(), now: Date
    ) async throws -> StripePayments.CheckoutJSON {
        guard let price = product.storeProducts?["stripe"] else {
            throw APIError(
                .unprocessableContent, "unknown_product",
                "product '\(product.id)' has no Stripe price in the catalog (storeProducts.stripe)")
        }
        let token = order.appAccountToken.uuidString.lowercased()
        let subscription = product.type == .autoRenewable
        let orderEnd = order.createdAt.addingTimeInterval(orderTTL)
        let expires = Int64(
            min(max(orderEnd, now.addingTimeInterval(1860)), now.addingTimeInterval(86_000)).timeIntervalSince1970)
        var form = StripeForm()
        form.add("mode", subscription ? "subscription" : "payment")
        form.add("line_items[0][price]", price)
        form.add("line_items[0][quantity]", String(subscription ? 1 : order.quantity))
        form.add("client_reference_id", order.orderId)
        form.add("metadata[\(stripeTokenKey)]", token)
        form.add("metadata[storekeeper_order]", order.orderId)
        form.add("metadata[\(stripeAppKey)]", app.configuration.id)
        form.add(
            subscription
                ? "subscription_data[metadata][\(stripeAppKey)]" : "payment_intent_data[metadata][\(stripeAppKey)]",
            app.configuration.id)
        form.add(
            subscription
                ? "subscription_data[metadata][\(stripeTokenKey)]" : "payment_intent_data[metadata][\(stripeTokenKey)]",
            token)
        form.add(
            subscription
                ? "subscription_data[metadata][storekeeper_order]" : "payment_intent_data[metadata][storekeeper_order]",
            order.orderId)
        for (key, value) in [(stripeAppleTokenKey, reporting.apple), (stripeGoogleTokenKey, reporting.google)] {
            guard let value else { continue }
            form.add("metadata[\(key)]", value)
            form.add("\(subscription ? "subscription_data" : "payment_intent_data")[metadata][\(key)]", value)
        }
        if order.accountId.isEmpty {
            let on = subscription ? "subscription_data" : "payment_intent_data"
            form.add("metadata[\(stripeRedeemKey)]", "1")
            form.add("\(on)[metadata][\(stripeRedeemKey)]", "1")
            if !subscription { form.add("customer_creation", "always") }
        }
        if !order.accountId.isEmpty,
            let customer = try await StripeStore(database: database).customer(
                appId: app.configuration.id, accountId: order.accountId)
        {
            form.add("customer", customer)
        }
        let separator = app.configuration.successURL.contains("?") ? "&" : "?"
        // A buyer without an account: the code that will bind the purchase, known now so the
        // success page can show it (it redeems nothing until the payment is applied here).
        let code = order.accountId.isEmpty ? StripePayments.redemptionCode() : nil
        form.add(
            "success_url",
            app.configuration.successURL + separator + "order=\(order.orderId)"
                + (code.map { "&redemption=\($0)" } ?? "") + "&session_id={CHECKOUT_SESSION_ID}")
        form.add("cancel_url", app.configuration.cancelURL)
        form.add("expires_at", String(expires))
        let session: StripeCheckoutSession
        do {
            session = try await app.client.createCheckoutSession(form, idempotencyKey: "checkout:\(order.orderId)")
        } catch let error as StripeError {
            throw StripePayments.stripeAPIError(error)
        }
        var checkout = StripeStore.Checkout(
            sessionId: session.id, appId: app.configuration.id, orderId: order.orderId,
            accountId: order.accountId.isEmpty ? nil : order.accountId, productId: product.id,
            appAccountToken: token, url: session.url, expiresAt: session.expiresAt ?? expires,
            createdAt: now.stripeMilliseconds)
        checkout.redemptionCode = code
        try await StripeStore(database: database).recordCheckout(checkout)
        return StripePayments.CheckoutJSON(
            sessionId: session.id, url: session.url,
            expiresAt: StoreKeeperApp.iso(Date(timeIntervalSince1970: Double(session.expiresAt ?? expires))))
    }
}
