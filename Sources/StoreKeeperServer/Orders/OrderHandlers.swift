import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// Orders before payment: `POST /v1/orders`, `GET /v1/orders/{orderId}`.
extension StoreKeeperApp {
    struct CreateOrderBody: RequestBody {
        /// Nil only for a Stripe checkout opened with an operator's key for a buyer without an
        /// account yet (its purchase gets a redemption code).
        var accountId: String?
        var productId: String
        var quantity: Int?
        var offerId: String?
        /// A win-back offer (Apple applies it; the catalog's policy decides whether to ask).
        var winBackOfferId: String?
        var appTransactionId: String?
        /// The app the order is for (required when several apps are configured).
        var appId: String?
        /// A Stripe checkout opened from an app under a store's link-out program: Apple's
        /// external purchase token (`externalPurchaseId`) and Google Play's external transaction
        /// token, each reported to its store with every payment, renewal and refund.
        var externalPurchaseToken: String?
        var externalTransactionToken: String?

        func validate() throws {
            if let accountId { try StoreKeeperApp.validateAccountId(accountId) }
            guard (1...10).contains(quantity ?? 1) else { throw APIError.badRequest("field 'quantity' must be 1…10") }
            if let appTransactionId {
                // Apple issues it as digits; nothing else reaches storage, anomalies or the dashboard.
                guard StoreKeeperApp.isAppleNumericId(appTransactionId) else {
                    throw APIError.badRequest("field 'appTransactionId' must be an App Store id: 1…64 digits 0-9")
                }
            }
            if let offerId { try StoreKeeperApp.validateText(offerId, field: "offerId") }
            if let appId {
                guard !appId.isEmpty, appId.unicodeScalars.count <= 64 else {
                    throw APIError.badRequest("field 'appId' must be 1…64 characters")
                }
                try StoreKeeperApp.validateText(appId, field: "appId")
            }
            if let externalPurchaseToken {
                guard !externalPurchaseToken.isEmpty, externalPurchaseToken.unicodeScalars.count <= 128 else {
                    throw APIError.badRequest("field 'externalPurchaseToken' must be 1…128 characters")
                }
                try StoreKeeperApp.validateText(externalPurchaseToken, field: "externalPurchaseToken")
            }
            if let externalTransactionToken {
                // Stripe keeps metadata values up to 500 characters.
                guard !externalTransactionToken.isEmpty, externalTransactionToken.unicodeScalars.count <= 500,
                    externalTransactionToken.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F })
                else {
                    throw APIError.badRequest(
                        "field 'externalTransactionToken' must be 1…500 printable ASCII characters (Google Play Billing's token)"
                    )
                }
            }
            if let winBackOfferId {
                try StoreKeeperApp.validateText(winBackOfferId, field: "winBackOfferId")
                guard offerId == nil else {
                    throw APIError.badRequest("give 'offerId' or 'winBackOfferId', not both")
                }
            }
        }
    }
}

/// Orders before payment, owning what they need: the database and its stores, the catalog, the
/// configuration (apps, limits, lifetimes), the offer signer, Stripe Checkout and the external
/// purchase tokens an order binds.
struct OrdersController: RequestHandling {
    let store: PurchaseStore
    let database: Database
    let catalog: Catalog
    let configuration: ServerConfiguration
    let offerSigner: OfferSigner?
    let checkouts: StripeCheckouts
    let externalTokens: ExternalTokenRegistry
    var maxBodyBytes: Int { configuration.maxBodyBytes }

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.post("orders") { request, context in try await createOrder(request, context) }
        v1.get("orders/:orderId") { request, context in try await getOrder(request, context) }
        v1.post("orders/:orderId/cancel") { request, context in try await cancelOrder(request, context) }
    }

    func createOrder(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let body = try await decode(StoreKeeperApp.CreateOrderBody.self, request)
        // A key limited to some apps opens orders (and checkouts) for its apps only.
        if caller.limitedApps != nil {
            guard let appId = body.appId, caller.covers(app: appId) else {
                throw APIError.forbidden(
                    "key '\(caller.label)' is limited to apps \(caller.limitedApps!.sorted().joined(separator: ", ")): an order names one of them (appId)"
                )
            }
        }
        let stripeApp = try body.appId.flatMap { id in try checkouts.stripe[id].map { _ in try checkouts.app(id) } }
        guard let accountId = body.accountId else {
            // A web paywall before install: a checkout for nobody, redeemed in the app later.
            guard stripeApp != nil else {
                throw APIError.badRequest(
                    "field 'accountId' is required (only a Stripe app's checkout may be opened for nobody yet)")
            }
            try caller.requireScope(.support)
            return try await createOrder(body, accountId: "", stripeApp: stripeApp)
        }
        try caller.require(accountId)
        return try await createOrder(body, accountId: accountId, stripeApp: stripeApp)
    }

    /// `stripeApp`: the Stripe app the order names, if it names one (its payment opens a
    /// Checkout Session); `accountId` empty: a Stripe checkout for nobody yet.
    func createOrder(_ body: StoreKeeperApp.CreateOrderBody, accountId: String, stripeApp: StripeApp?) async throws
        -> Response
    {
        let nobody = accountId.isEmpty
        let quantity = body.quantity ?? 1
        if let appId = body.appId {
            guard configuration.allApps.contains(where: { $0.id == appId }) else {
                throw APIError(.badRequest, "unknown_app", "no app '\(appId.prefix(64))' is configured")
            }
        } else if configuration.allApps.count > 1, configuration.mode != .demo {
            // Demo mode's local Google Play is beside the App Store app: an order without
            // `appId` is the App Store app's (the quick start's iOS path).
            throw APIError.badRequest(
                "field 'appId' is required: this server has several apps (\(configuration.allApps.map(\.id).joined(separator: ", ")))"
            )
        }
        guard let product = catalog.product(body.productId) else {
            throw APIError(.notFound, "unknown_product", "no product '\(body.productId.prefix(100))' in the catalog")
        }
        let now = Date()
        if stripeApp == nil, body.externalPurchaseToken != nil || body.externalTransactionToken != nil {
            throw APIError.badRequest(
                "fields 'externalPurchaseToken' and 'externalTransactionToken' belong to a Stripe app's checkout (the App Store and Google Play report their own sales)"
            )
        }
        if let stripeApp {
            guard body.offerId == nil, body.winBackOfferId == nil, body.appTransactionId == nil else {
                throw APIError.badRequest("offers and appTransactionId are App Store features, not a Stripe checkout's")
            }
            if body.externalTransactionToken != nil, stripeApp.configuration.googlePlayAppId == nil {
                throw APIError(
                    .badRequest, "store_not_configured",
                    "Stripe app '\(stripeApp.configuration.id)' reports nothing to Google Play: set its googlePlayAppId"
                )
            }
            if let token = body.externalPurchaseToken, !nobody {
                // Bound now, as the app's token registration binds it (a buyer without an
                // account binds it when the purchase is delivered).
                try await externalTokens.register(token, accountId: accountId, type: nil)
            }
            guard product.storeProducts?["stripe"] != nil else {
                throw APIError(
                    .unprocessableContent, "unknown_product",
                    "product '\(product.id)' has no Stripe price in the catalog (storeProducts.stripe)")
            }
        }
        let winBack =
            stripeApp != nil
            ? nil
            : try await winBackDecision(
                product: product, offerId: body.winBackOfferId, accountId: accountId, now: now)
        let offers =
            stripeApp != nil
            ? (offer: nil, introductoryAllowed: nil, transactionId: nil, redemptions: 0)
            : try await offerDecision(
                product: product, offerId: body.offerId, accountId: accountId,
                appTransactionId: body.appTransactionId, now: now)
        let token = UUID()
        let nonce = UUID()
        let order: Order
        do {
            order = try await store.orders.createOrder(
                accountId: accountId, productId: body.productId, quantity: quantity,
                maxOpen: nobody ? Int.max : configuration.maxOpenOrdersPerAccount, ttl: configuration.orderTTL,
                appAccountToken: token,
                offerId: offers.offer?.id, offerNonce: offers.offer == nil ? nil : nonce,
                offerLimit: offers.offer?.maxPerAccount.map { $0 - (offers.redemptions) },
                introAllowed: offers.introductoryAllowed == true && offers.transactionId != nil,
                appTransactionId: body.appTransactionId,
                appId: body.appId ?? configuration.appId(for: "app_store", given: nil),
                maxPerDay: nobody ? nil : configuration.maxOrdersPerAccountPerDay, now: now)
        } catch let error as OrderStore.OfferLimitReached {
            throw APIError(
                .forbidden, "offer_not_eligible",
                "offer '\(offers.offer?.id ?? "")' refused by rule maxPerAccount: \(error.outstanding) signed and still redeemable"
            )
        } catch let error as OrderStore.TooManyOrdersToday {
            var refusal = APIError(
                .tooManyRequests, "too_many_orders",
                "the account created \(error.limit) orders in the last 24 hours (limits.maxOrdersPerAccountPerDay)",
                retryable: true)
            refusal.headers[.retryAfter] = "3600"
            throw refusal
        } catch let error as OrderStore.TooManyOpenOrders {
            throw APIError(
                .conflict, "too_many_open_orders",
                "the account has \(error.limit) unpaid orders; pay or let them expire before creating more")
        }
        var json = OrderJSON(order, ttl: configuration.orderTTL)
        if let stripeApp {
            json.checkout = try await checkouts.open(
                order: order, product: product, app: stripeApp,
                reporting: StripeReportTokens(
                    apple: body.externalPurchaseToken, google: body.externalTransactionToken),
                now: now)
            return try StoreKeeperApp.json(json, status: .created)
        }
        json.winBackOffer = winBack.map { OrderJSON.WinBackOfferJSON(id: $0.id) }
        // Signed for the order's app (the signature covers its bundle id) and Apple's product id.
        let signer = offerSigner.map { $0.forBundle(configuration.bundleId(ofApp: order.appId) ?? $0.bundleId) }
        let appStoreProductId = product.storeProducts?["app_store"] ?? product.id
        if let offer = offers.offer, let signer {
            let timestamp = Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
            let v1 = try signer.signV1(
                productId: appStoreProductId, offerId: offer.id, appAccountToken: token, nonce: nonce,
                timestamp: timestamp)
            json.offer = OrderJSON.SignedOffer(
                id: offer.id, keyId: signer.keyId, nonce: nonce.uuidString.lowercased(), timestamp: timestamp,
                signature: v1.signature,
                jws: try signer.promotionalOfferJWS(
                    productId: appStoreProductId, offerId: offer.id, transactionId: offers.transactionId, nonce: nonce,
                    issuedAt: now))
        }
        if let allowed = offers.introductoryAllowed, let transactionId = offers.transactionId, let signer {
            json.introductoryOfferEligibility = OrderJSON.IntroductoryEligibility(
                allowed: allowed,
                jws: try signer.introductoryEligibilityJWS(
                    productId: appStoreProductId, allowed: allowed, transactionId: transactionId, nonce: UUID(),
                    issuedAt: now)
            )
        }
        return try StoreKeeperApp.json(json, status: .created)
    }

    /// What an order may carry: the promotional offer asked for (404 `unknown_offer`, 403
    /// `offer_not_eligible` naming the rule), the once-per-account introductory decision, and
    /// the transaction id the V2 JWS names — all decided by the core from our own records.
    func offerDecision(
        product: Product, offerId: String?, accountId: String, appTransactionId: String?, now: Date
    ) async throws -> (offer: Offer?, introductoryAllowed: Bool?, transactionId: String?, redemptions: Int) {
        var offer: Offer?
        if let offerId {
            try StoreKeeperApp.validateText(offerId, field: "offerId")
            guard let found = catalog.offer(offerId, of: product.id) else {
                throw APIError(
                    .notFound, "unknown_offer",
                    "product '\(product.id)' has no offer '\(offerId.prefix(100))' in the catalog")
            }
            offer = found
        }
        let introPolicy = configuration.introductoryOffers == .oncePerAccount && product.type == .autoRenewable
        guard offer != nil || introPolicy else { return (nil, nil, nil, 0) }
        guard offerSigner != nil else {
            throw APIError(
                .serviceUnavailable, "offers_unavailable",
                "no In-App Purchase key is configured (apple.offers.* or apple.serverAPI.*): offers cannot be signed")
        }
        let history = try await store.offers.offerHistory(
            account: accountId, groupProducts: catalog.group(product.group ?? "").map(\.id), now: now)
        if let offer,
            let refusal = OfferEligibility.refusal(
                offer,
                history: .init(
                    subscriptions: history.subscriptions, redemptions: history.redemptions[offer.id] ?? 0,
                    outstanding: history.outstandingOffers[offer.id] ?? 0),
                now: now)
        {
            throw APIError(.forbidden, "offer_not_eligible", "offer '\(offer.id)' refused by rule \(refusal)")
        }
        let allowed =
            introPolicy
            ? OfferEligibility.introductoryAllowed(
                hadIntroductoryOffer: history.hadIntroductoryOffer, subscriptions: history.subscriptions,
                introductoryOutstanding: history.introductoryOutstanding, now: now)
            : nil
        return (
            offer, allowed, history.latestTransactionId ?? appTransactionId,
            offer.map { history.redemptions[$0.id] ?? 0 } ?? 0
        )
    }

    /// The win-back offer an order asks for, by the catalog's policy: 403 `offer_not_eligible`
    /// naming the rule that refused (the account's subscriptions in the group, its win-back
    /// redemptions under any Apple ID). One the catalog does not list has no policy here: Apple
    /// alone decides (nil, the order goes on).
    func winBackDecision(product: Product, offerId: String?, accountId: String, now: Date) async throws
        -> WinBackOffer?
    {
        guard let offerId, let offer = catalog.winBackOffer(offerId, of: product.id) else { return nil }
        let history = try await store.offers.offerHistory(
            account: accountId, groupProducts: catalog.group(product.group ?? "").map(\.id), latestTransaction: false)
        if let refusal = OfferEligibility.winBackRefusal(
            offer, subscriptions: history.subscriptions, redemptions: history.winBackRedemptions[offer.id] ?? 0,
            now: now)
        {
            throw APIError(.forbidden, "offer_not_eligible", "win-back offer '\(offer.id)' refused by rule \(refusal)")
        }
        return offer
    }

    func getOrder(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let order = try await callersOrder(context)
        var json = OrderJSON(order, ttl: configuration.orderTTL)
        if let appId = order.appId, checkouts.stripe[appId] != nil,
            let checkout = try await StripeStore(database: database).checkout(order: order.orderId)
        {
            json.checkout = StripePayments.CheckoutJSON(
                sessionId: checkout.sessionId, url: checkout.url,
                expiresAt: StoreKeeperApp.iso(Date(timeIntervalSince1970: Double(checkout.expiresAt))))
            json.redemptionCode = checkout.transactionId == nil ? nil : checkout.redemptionCode
            // A checkout for nobody: `paid` once its payment is applied (the code valid), then
            // `redeemed` with the account that redeemed it — as every other order says `delivered`.
            if order.accountId.isEmpty, let paid = checkout.transactionId {
                json.transactionId = json.transactionId ?? paid
                if let redeemer = checkout.redeemedBy {
                    json.status = "redeemed"
                    json.accountId = redeemer
                    json.redemptionCode = nil
                } else if order.status.isOpen {
                    json.status = "paid"
                }
            }
        }
        return try StoreKeeperApp.json(json)
    }

    /// The order of the path, if the caller may act on its account (404 / 403 otherwise).
    func callersOrder(_ context: StoreKeeperContext) async throws -> Order {
        let caller = try context.caller()
        let orderId = try StoreKeeperApp.parameter(context, "orderId")
        guard let order = try await store.orders.order(orderId) else {
            throw APIError.notFound("no order '\(orderId.prefix(64))'")
        }
        try caller.require(order.accountId)
        try caller.requireApp(order.appId, notFound: APIError.notFound("no order '\(orderId.prefix(64))'"))
        return order
    }

    /// `POST /v1/orders/{orderId}/cancel`: the user cancelled at StoreKit, so the order stops
    /// counting against `limits.maxOpenOrdersPerAccount`. Idempotent; 409
    /// `order_not_cancellable` once it is paid (or being verified). A payment that arrives for a
    /// cancelled order is still delivered, as for an expired one.
    func cancelOrder(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let order = try await callersOrder(context)
        switch try await store.orders.cancelOrder(order.orderId) {
        case .cancelled(let cancelled):
            return try StoreKeeperApp.json(OrderJSON(cancelled, ttl: configuration.orderTTL))
        case .notCancellable(let status):
            throw APIError(
                .conflict, "order_not_cancellable",
                "the order is \(status.rawValue): only an unpaid order can be cancelled")
        case .missing:
            throw APIError.notFound("no order '\(order.orderId.prefix(64))'")
        }
    }
}
