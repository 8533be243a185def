import Foundation
import GooglePlay
import JWTKit
import LocalAppStore
import StoreKeeperCatalog
import Synchronization

/// A faithful fake of Google Play's server side for tests, the demo and zero-config serve
/// (google-play.md): purchases with Google's states, acknowledgement and its 3-day refund,
/// subscriptions renewing on a store clock (grace, hold, pause, cancel, upgrade with
/// `linkedPurchaseToken`), voided purchases, refund reviews, and Real-time developer
/// notifications queued for Pub/Sub pushes. `LocalGooglePlayServer` serves it over HTTP at
/// Google's paths.
public actor LocalGooglePlay {
    public struct Configuration: Sendable {
        public var packageName: String
        public var catalog: Catalog
        /// Grace period and account hold after a failed renewal.
        public var gracePeriod: TimeInterval = 3 * 86_400
        public var accountHold: TimeInterval = 30 * 86_400
        /// Unacknowledged purchases are refunded this long after they became PURCHASED.
        public var acknowledgementWindow: TimeInterval = 3 * 86_400
        /// `testPurchase` on every purchase (license testers).
        public var testPurchases = false

        public init(packageName: String, catalog: Catalog) {
            self.packageName = packageName
            self.catalog = catalog
        }
    }

    /// One purchase token's state, as Google keeps it.
    public struct Purchase: Sendable, Hashable {
        public enum Kind: String, Sendable { case oneTime, subscription }
        public var token: String
        public var kind: Kind
        /// Google Play's product id.
        public var productId: String
        public var obfuscatedAccountId: String?
        public var quantity: Int
        public var refundableQuantity: Int
        /// One-time: PURCHASED, PENDING, CANCELLED.
        public var purchaseState: String
        public var acknowledged = false
        public var consumed = false
        public var purchaseTime: Date
        /// When it became PURCHASED/ACTIVE (the acknowledgement window starts then).
        public var paidAt: Date?
        /// A backdated purchase's own start of the acknowledgement window (when it was made
        /// here, not the date it carries).
        public var acknowledgementWindowStart: Date?
        public var test: Bool
        public var orders: [String]
        public var priceMilli: Int64
        public var currency: String
        /// The buyer's country (ISO 3166-1 alpha-2), billed at the catalog's price of its
        /// storefront.
        public var regionCode = "US"
        /// When each order was charged (order id → time), for `orders.get`.
        public var orderTimes: [String: Date] = [:]
        // Subscriptions
        public var subscriptionState: String = SubscriptionState.active
        public var expiry: Date = .distantPast
        public var autoRenew = true
        public var billingFails = false
        public var graceEnds: Date?
        public var holdEnds: Date?
        public var pausedUntil: Date?
        public var linkedPurchaseToken: String?
        /// A resubscription in the Play Store after the old token expired: that token.
        public var expiredPurchaseToken: String?
        public var period: ISODuration = ISODuration(months: 1)
        public var cancellation: String?
        /// Set when Google refunded it (voided).
        public var voided = false

        /// A successful charge: a new order.
        mutating func charge(_ orderId: String, at date: Date) {
            orders.append(orderId)
            orderTimes[orderId] = date
        }
    }

    public let configuration: Configuration
    public let clock: StoreClock
    var purchases: [String: Purchase] = [:]
    var external = ExternalState()
    var voided: [(recordedAt: Date, purchase: VoidedPurchase)] = []
    var pushes: [Push] = []
    var orderCounter = 0
    var reviews: [String: ReviewRefundRequest] = [:]
    /// Order id → purchase token, for `orders.get`.
    /// Orders the developer refunded (`orders.refund`).
    var refundedOrders: Set<String> = []
    var orderOwners: [String: String] = [:]
    var pendingReviews: [String: (orderId: String, token: String)] = [:]
    var messageCounter = 100_000_000_000
    /// Faults injected by tests and the control API, read on every Developer API call without a
    /// hop to the actor (a read is otherwise one hop: the fault check was a second, and the store
    /// serves every purchase's read and acknowledgement).
    struct Faults {
        /// The next `n` calls of the Developer API answer 503 (Google down).
        var apiFailures = 0
        /// The next `n` acknowledge/consume calls answer 503 (reads still work).
        var acknowledgeFailures = 0
        /// The link between this Google and the server is down — the server cannot reach the
        /// Developer API (503) and no push reaches the server (held, retried afterwards as
        /// Pub/Sub does). What a server that is down for a while looks like from Google's side.
        var outage = false
    }
    nonisolated let faults = Mutex(Faults())

    public nonisolated func failNextAPICalls(_ count: Int) { faults.withLock { $0.apiFailures = max(0, count) } }

    public nonisolated func failNextAcknowledgements(_ count: Int) {
        faults.withLock { $0.acknowledgeFailures = max(0, count) }
    }

    nonisolated func injectedAcknowledgeFailure() -> Bool {
        faults.withLock { faults in
            guard faults.acknowledgeFailures > 0 else { return false }
            faults.acknowledgeFailures -= 1
            return true
        }
    }

    public nonisolated var outage: Bool { faults.withLock { $0.outage } }

    public nonisolated func setOutage(_ on: Bool) { faults.withLock { $0.outage = on } }

    /// Whether this call fails (and counts it).
    nonisolated func injectedFailure() -> Bool {
        faults.withLock { faults in
            if faults.outage { return true }
            guard faults.apiFailures > 0 else { return false }
            faults.apiFailures -= 1
            return true
        }
    }

    /// A Real-time developer notification waiting for its Pub/Sub push.
    public struct Push: Sendable, Hashable {
        public var messageId: String
        public var notification: DeveloperNotification
        public var publishTime: Date
        public var attempts = 0
        public var nextAttempt: Date
    }

    public init(configuration: Configuration, clock: StoreClock = StoreClock()) {
        self.configuration = configuration
        self.clock = clock
    }

    public enum Refusal: Error, Sendable, Equatable {
        case notFound
        /// 400 `invalidPurchaseState`.
        case invalidPurchaseState(String)
        case invalid(String)
    }

    // MARK: Buying

    /// A purchase in the app (Play Billing's purchase flow): the account id the app set with
    /// `setObfuscatedAccountId`, `pending` for a slow payment method. Returns the token.
    /// `purchasedAt` dates the purchase (its order, its payment, a subscription's start) in the
    /// past — history for a demo's charts; Google's acknowledgement window still starts now.
    public func buy(
        _ productId: String, obfuscatedAccountId: String?, quantity: Int = 1, pending: Bool = false,
        linkedPurchaseToken: String? = nil, regionCode: String = "US", purchasedAt: Date? = nil
    ) throws(Refusal) -> String {
        guard let product = configuration.catalog.product(store: "google_play", storeProductId: productId) else {
            throw .invalid("no product '\(productId)' in the catalog")
        }
        guard (1...100).contains(quantity) else { throw .invalid("quantity must be 1…100") }
        if let id = obfuscatedAccountId, id.count > 64 { throw .invalid("obfuscatedAccountId is over 64 characters") }
        guard let storefront = RegionCode.alpha3(regionCode) else {
            throw .invalid("regionCode must be an ISO 3166-1 alpha-2 country code")
        }
        let paidNow = clock.now()
        let now = min(purchasedAt ?? paidNow, paidNow)
        let token = Self.newToken()
        let price = product.price(in: storefront)
        let milli = Int64(truncating: (price.price * 1000) as NSDecimalNumber)
        var purchase = Purchase(
            token: token, kind: product.type == .autoRenewable ? .subscription : .oneTime, productId: productId,
            obfuscatedAccountId: obfuscatedAccountId, quantity: product.type == .consumable ? quantity : 1,
            refundableQuantity: product.type == .consumable ? quantity : 1,
            purchaseState: pending ? ProductPurchaseV2.pending : ProductPurchaseV2.purchased, purchaseTime: now,
            paidAt: pending ? nil : now, test: configuration.testPurchases, orders: [], priceMilli: milli,
            currency: price.currency)
        purchase.regionCode = regionCode.uppercased()
        if purchasedAt != nil { purchase.acknowledgementWindowStart = paidNow }
        if !pending { purchase.charge(newOrderId(), at: now) }
        if purchase.kind == .subscription {
            purchase.period = product.period ?? ISODuration(months: 1)
            purchase.subscriptionState = pending ? SubscriptionState.pending : SubscriptionState.active
            purchase.expiry = pending ? now : purchase.period.added(to: now)
            if let old = linkedPurchaseToken {
                guard purchases[old]?.kind == .subscription else {
                    throw .invalid("no subscription '\(old)' to replace")
                }
                // An upgrade or downgrade (or a re-signup before expiry): a new token names
                // the old one, which ends once the new one is paid — a pending replacement
                // (a slow payment method) leaves it running, and an abandoned one leaves it be.
                purchase.linkedPurchaseToken = old
                if !pending { endReplaced(old, at: now) }
            }
        }
        purchases[token] = purchase
        if !pending { notifyPurchased(purchase) }
        return token
    }

    /// The subscription a paid replacement names ends now.
    func endReplaced(_ token: String, at now: Date) {
        guard var previous = purchases[token] else { return }
        previous.subscriptionState = SubscriptionState.expired
        previous.autoRenew = false
        previous.expiry = now
        previous.cancellation = "replacementCancellation"
        purchases[token] = previous
    }

    /// The customer resubscribes in the Play Store's subscriptions center after `expiredToken`
    /// expired: a new token with no `linkedPurchaseToken` and no obfuscated account id, only
    /// `outOfAppPurchaseContext` naming the expired one until it is acknowledged.
    public func resubscribeInPlayStore(_ expiredToken: String, productId: String? = nil) throws(Refusal) -> String {
        guard let expired = purchases[expiredToken], expired.kind == .subscription else { throw .notFound }
        guard expired.subscriptionState == SubscriptionState.expired else {
            throw .invalidPurchaseState("the subscription has not expired: restore it instead")
        }
        let token = try buy(productId ?? expired.productId, obfuscatedAccountId: nil, regionCode: expired.regionCode)
        purchases[token]?.expiredPurchaseToken = expiredToken
        return token
    }

    /// A pending purchase is paid (or, with `paid: false`, abandoned).
    public func completePending(_ token: String, paid: Bool = true) throws(Refusal) {
        guard var purchase = purchases[token] else { throw .notFound }
        guard purchase.purchaseState == ProductPurchaseV2.pending else {
            throw .invalidPurchaseState("not pending")
        }
        let now = clock.now()
        if paid {
            purchase.purchaseState = ProductPurchaseV2.purchased
            purchase.paidAt = now
            purchase.charge(newOrderId(), at: now)
            if purchase.kind == .subscription {
                purchase.subscriptionState = SubscriptionState.active
                purchase.expiry = purchase.period.added(to: now)
                if let old = purchase.linkedPurchaseToken { endReplaced(old, at: now) }
            }
            purchases[token] = purchase
            notifyPurchased(purchase)
        } else {
            purchase.purchaseState = ProductPurchaseV2.cancelled
            if purchase.kind == .subscription {
                purchase.subscriptionState = SubscriptionState.pendingPurchaseCanceled
                purchases[token] = purchase
                notify(subscription: 20, token)
            } else {
                purchases[token] = purchase
                notify(oneTime: 2, purchase)
            }
        }
    }

    func notifyPurchased(_ purchase: Purchase) {
        if purchase.kind == .subscription {
            notify(subscription: 4, purchase.token)
        } else {
            notify(oneTime: 1, purchase)
        }
    }

    // MARK: Acknowledgement

    public func acknowledge(productId: String, token: String) throws(Refusal) {
        guard var purchase = purchases[token], purchase.productId == productId else { throw .notFound }
        guard purchase.purchaseState == ProductPurchaseV2.purchased, !purchase.voided else {
            throw .invalidPurchaseState("The purchase is not in a valid state to perform the desired operation.")
        }
        purchase.acknowledged = true
        purchases[token] = purchase
    }

    public func consume(productId: String, token: String) throws(Refusal) {
        guard var purchase = purchases[token], purchase.productId == productId, purchase.kind == .oneTime else {
            throw .notFound
        }
        guard purchase.purchaseState == ProductPurchaseV2.purchased, !purchase.consumed, !purchase.voided else {
            throw .invalidPurchaseState("The purchase is not in a valid state to perform the desired operation.")
        }
        purchase.consumed = true
        purchase.acknowledged = true
        purchases[token] = purchase
    }

    // MARK: Subscriptions' life

    /// The customer cancels in Play: no renewal; access until expiry.
    public func cancel(_ token: String) throws(Refusal) {
        guard var purchase = purchases[token], purchase.kind == .subscription else { throw .notFound }
        guard purchase.subscriptionState == SubscriptionState.active else { throw .invalidPurchaseState("not active") }
        purchase.autoRenew = false
        purchase.subscriptionState = SubscriptionState.canceled
        purchase.cancellation = "userInitiatedCancellation"
        purchases[token] = purchase
        notify(subscription: 3, token)
    }

    /// `purchases.subscriptionsv2.defer`: the developer moves the next billing date (and the
    /// access that goes with it) by 1 day to 1 year; the subscription must be active (or
    /// canceled but not yet expired) and `etag` its current one. Google notifies
    /// `SUBSCRIPTION_DEFERRED` (9). Returns the new expiry.
    public func deferSubscription(_ token: String, seconds: TimeInterval, etag: String?) throws(Refusal) -> Date {
        guard var purchase = purchases[token], purchase.kind == .subscription else { throw .notFound }
        guard (86_400...366 * 86_400).contains(seconds) else {
            throw .invalid("deferDuration must be between 1 day and 1 year")
        }
        guard [SubscriptionState.active, SubscriptionState.canceled].contains(purchase.subscriptionState),
            purchase.expiry > clock.now()
        else { throw .invalidPurchaseState("the subscription is not active: nothing to defer") }
        if let etag, etag != subscriptionPurchaseV2(token)?.etag {
            throw .invalid("The etag does not match the subscription's current state.")
        }
        purchase.expiry = purchase.expiry.addingTimeInterval(seconds)
        purchases[token] = purchase
        notify(subscription: 9, token)
        return purchase.expiry
    }

    /// The customer restores a canceled, unexpired subscription (same token).
    public func restart(_ token: String) throws(Refusal) {
        guard var purchase = purchases[token], purchase.kind == .subscription else { throw .notFound }
        guard purchase.subscriptionState == SubscriptionState.canceled else {
            throw .invalidPurchaseState("not canceled")
        }
        purchase.autoRenew = true
        purchase.subscriptionState = SubscriptionState.active
        purchase.cancellation = nil
        purchases[token] = purchase
        notify(subscription: 7, token)
    }

    public func setBillingFails(_ token: String, _ fails: Bool) throws(Refusal) {
        guard var purchase = purchases[token], purchase.kind == .subscription else { throw .notFound }
        purchase.billingFails = fails
        purchases[token] = purchase
    }

    /// Pauses at the next renewal for `duration` (here: at once, for simplicity of tests).
    public func pause(_ token: String, for duration: TimeInterval) throws(Refusal) {
        guard var purchase = purchases[token], purchase.kind == .subscription else { throw .notFound }
        guard purchase.subscriptionState == SubscriptionState.active else { throw .invalidPurchaseState("not active") }
        purchase.subscriptionState = SubscriptionState.paused
        purchase.pausedUntil = clock.now().addingTimeInterval(duration)
        purchases[token] = purchase
        notify(subscription: 10, token)
    }

    /// Google refunds: one-time purchases by quantity (`nil`: all that is left), a subscription
    /// by revoking it (access ends now). A voided purchase is listed and notified.
    public func refund(_ token: String, quantity: Int? = nil, reason: Int = 1) throws(Refusal) {
        guard var purchase = purchases[token] else { throw .notFound }
        guard purchase.purchaseState == ProductPurchaseV2.purchased, !purchase.voided,
            purchase.refundableQuantity > 0, let orderId = purchase.orders.last
        else { throw .invalidPurchaseState("nothing to refund") }
        let now = clock.now()
        let count = min(quantity ?? purchase.refundableQuantity, purchase.refundableQuantity)
        guard count > 0 else { throw .invalid("quantity must be positive") }
        purchase.refundableQuantity -= count
        let full = purchase.refundableQuantity == 0
        if full { purchase.voided = true }
        if purchase.kind == .subscription {
            purchase.subscriptionState = SubscriptionState.expired
            purchase.autoRenew = false
            purchase.expiry = now
            purchase.cancellation = "developerInitiatedCancellation"
        }
        purchases[token] = purchase
        voided.append(
            (
                now,
                VoidedPurchase(
                    purchaseToken: token, purchaseTimeMillis: Int64(purchase.purchaseTime.timeIntervalSince1970 * 1000),
                    voidedTimeMillis: Int64(now.timeIntervalSince1970 * 1000), orderId: orderId, voidedSource: 0,
                    voidedReason: reason, voidedQuantity: full && quantity == nil ? nil : count)
            ))
        var notification = newNotification()
        notification.voidedPurchaseNotification = .init(
            purchaseToken: token, orderId: orderId, productType: purchase.kind == .subscription ? 1 : 2,
            refundType: full ? 1 : 2)
        enqueue(notification)
    }

    /// `purchases.subscriptionsv2.revoke`: the developer refunds the latest charge — in full, or
    /// what is left of its period (`prorated`) — and the subscription ends now: expired, no
    /// renewal, `SUBSCRIPTION_REVOKED` (12). A full refund also voids the purchase (listed and
    /// notified as Google's own refunds are); a prorated one refunds part of the order and voids
    /// nothing. An expired subscription has nothing left to revoke.
    public func revokeSubscription(_ token: String, prorated: Bool) throws(Refusal) {
        guard var purchase = purchases[token], purchase.kind == .subscription else { throw .notFound }
        let now = clock.now()
        guard purchase.subscriptionState != SubscriptionState.expired, !purchase.voided, purchase.expiry > now,
            let orderId = purchase.orders.last
        else { throw .invalidPurchaseState("The subscription has already expired or been revoked.") }
        refundedOrders.insert(orderId)
        if prorated {
            purchase.subscriptionState = SubscriptionState.expired
            purchase.autoRenew = false
            purchase.expiry = now
            purchase.cancellation = "developerInitiatedCancellation"
            purchases[token] = purchase
        } else {
            try refund(token, reason: 0)
        }
        notify(subscription: 12, token)
    }

    /// The customer disputes a charge: Google asks for the developer's review.
    public func requestRefundReview(_ token: String) throws(Refusal) -> String {
        guard let purchase = purchases[token], let orderId = purchase.orders.last else { throw .notFound }
        let reviewToken = "review-" + Self.newToken().prefix(24)
        pendingReviews[reviewToken] = (orderId, token)
        var notification = newNotification()
        notification.pendingRefundReviewNotification = .init(
            pendingRefundToken: reviewToken, orderId: orderId, refundReason: 7,
            obfuscatedAccountId: purchase.obfuscatedAccountId)
        enqueue(notification)
        return reviewToken
    }

    /// `orders.reviewrefund`: the first answer per review is kept.
    public func reviewRefund(orderId: String, _ request: ReviewRefundRequest) throws(Refusal) {
        guard let token = request.pendingRefundToken, let review = pendingReviews[token], review.orderId == orderId
        else { throw .notFound }
        guard request.sampleContentProvided != nil,
            ["DECLINE", "APPROVE", "NEUTRAL"].contains(request.refundPreference ?? "")
        else { throw .invalid("sampleContentProvided and refundPreference are required") }
        if let share = request.consumptionPercentageMilliunits, !(0...100_000).contains(share) {
            throw .invalid("consumptionPercentageMilliunits must be 0…100000")
        }
        if reviews[token] == nil { reviews[token] = request }
    }

    public func review(_ pendingRefundToken: String) -> ReviewRefundRequest? { reviews[pendingRefundToken] }

    /// `orders.refund`: the developer refunds an order. With `revoke` the purchase is voided
    /// (what it bought is taken back; a subscription ends at once) and appears, as Google's own
    /// refunds do, in the voided purchases and a voided-purchase notification. An order already
    /// refunded is refused as Google refuses it.
    public func refund(orderId: String, revoke: Bool) throws(Refusal) {
        if orderOwners[orderId] == nil {
            orderOwners = [:]
            for purchase in purchases.values {
                for order in purchase.orders { orderOwners[order] = purchase.token }
            }
        }
        guard let token = orderOwners[orderId], let purchase = purchases[token] else { throw .notFound }
        guard !purchase.voided, !refundedOrders.contains(orderId) else {
            throw .invalidPurchaseState("the order is already refunded")
        }
        refundedOrders.insert(orderId)
        if revoke { try refund(token, reason: 0) }
    }

    /// `orders.batchGet`: 1–1000 distinct orders in the order asked; one unknown id fails the
    /// whole call, as at Google.
    public func orders(_ orderIds: [String]) throws(Refusal) -> [GoogleOrder] {
        guard !orderIds.isEmpty, orderIds.count <= 1000 else {
            throw .invalid("orderIds must name 1 to 1000 orders.")
        }
        guard Set(orderIds).count == orderIds.count else { throw .invalid("orderIds must be distinct.") }
        var orders: [GoogleOrder] = []
        for id in orderIds { orders.append(try order(id)) }
        return orders
    }

    /// `orders.get` (google-play.md §6.2): what an order charged — a one-time purchase's price
    /// for all its units, a subscription's period at its recurring price — with tax left at
    /// zero (the catalog's prices are what the buyer pays) and the refund state.
    public func order(_ orderId: String) throws(Refusal) -> GoogleOrder {
        if orderOwners[orderId] == nil {
            // Orders are added in many places: the index is rebuilt when it misses one.
            orderOwners = [:]
            for purchase in purchases.values {
                for order in purchase.orders { orderOwners[order] = purchase.token }
            }
        }
        guard let token = orderOwners[orderId], let purchase = purchases[token],
            let charged = purchase.orderTimes[orderId]
        else { throw .notFound }
        let units = purchase.kind == .oneTime ? Int64(purchase.quantity) : 1
        let total = GoogleMoney(currencyCode: purchase.currency, milliunits: purchase.priceMilli * units)
        let zero = GoogleMoney(currencyCode: purchase.currency, milliunits: 0)
        let keeps: Int64 = purchase.kind == .subscription ? 85 : 70
        let latest = purchase.orders.last == orderId
        let state: String =
            if purchase.voided && (latest || purchase.kind == .oneTime) {
                GoogleOrder.State.refunded
            } else if purchase.kind == .oneTime && purchase.refundableQuantity < purchase.quantity {
                GoogleOrder.State.partiallyRefunded
            } else {
                GoogleOrder.State.processed
            }
        var line = GoogleOrder.LineItem()
        line.productId = purchase.productId
        line.listingPrice = GoogleMoney(currencyCode: purchase.currency, milliunits: purchase.priceMilli)
        line.total = total
        line.tax = zero
        if purchase.kind == .subscription {
            let end = purchase.orders.firstIndex(of: orderId).flatMap { index in
                purchase.orders.indices.contains(index + 1)
                    ? purchase.orderTimes[purchase.orders[index + 1]] : purchase.expiry
            }
            line.subscriptionDetails = .init(
                basePlanId: "base", servicePeriodStartTime: GoogleTime.format(charged),
                servicePeriodEndTime: end.map(GoogleTime.format))
        } else {
            line.oneTimePurchaseDetails = .init(quantity: purchase.quantity)
        }
        var order = GoogleOrder()
        order.orderId = orderId
        order.purchaseToken = purchase.token
        order.state = state
        order.createTime = GoogleTime.format(charged)
        order.lastEventTime = GoogleTime.format(charged)
        order.total = total
        order.tax = zero
        order.developerRevenueInBuyerCurrency = GoogleMoney(
            currencyCode: purchase.currency, milliunits: purchase.priceMilli * units * keeps / 100)
        order.lineItems = [line]
        return order
    }

    // MARK: Time

    /// Moves Google's clock: renewals, grace and hold, expiries, resumes, and the refund of
    /// purchases left unacknowledged past the window.
    public func advance(by interval: TimeInterval) {
        clock.advance(by: interval)
        runDue()
    }

    public func runDue() {
        let now = clock.now()
        for token in purchases.keys.sorted() {
            guard var purchase = purchases[token] else { continue }
            if purchase.purchaseState == ProductPurchaseV2.purchased, !purchase.acknowledged, !purchase.voided,
                let paid = purchase.acknowledgementWindowStart ?? purchase.paidAt,
                paid.addingTimeInterval(configuration.acknowledgementWindow) <= now
            {
                // Google's rule: never acknowledged within three days → refunded and revoked.
                try? refund(token, reason: 8)
                continue
            }
            guard purchase.kind == .subscription, !purchase.voided else { continue }
            var changed = true
            while changed {
                changed = false
                switch purchase.subscriptionState {
                case SubscriptionState.active where purchase.expiry <= now:
                    if purchase.billingFails {
                        purchase.subscriptionState = SubscriptionState.inGracePeriod
                        purchase.graceEnds = purchase.expiry.addingTimeInterval(configuration.gracePeriod)
                        purchases[token] = purchase
                        notify(subscription: 6, token)
                    } else {
                        purchase.charge(renewalOrderId(purchase), at: purchase.expiry)
                        purchase.expiry = purchase.period.added(to: purchase.expiry)
                        purchases[token] = purchase
                        notify(subscription: 2, token)
                    }
                    changed = true
                case SubscriptionState.inGracePeriod:
                    if !purchase.billingFails {
                        recover(&purchase, now: now)
                        changed = true
                    } else if let ends = purchase.graceEnds, ends <= now {
                        purchase.subscriptionState = SubscriptionState.onHold
                        purchase.holdEnds = ends.addingTimeInterval(configuration.accountHold)
                        purchases[token] = purchase
                        notify(subscription: 5, token)
                        changed = true
                    }
                case SubscriptionState.onHold:
                    if !purchase.billingFails {
                        recover(&purchase, now: now)
                        changed = true
                    } else if let ends = purchase.holdEnds, ends <= now {
                        purchase.subscriptionState = SubscriptionState.expired
                        purchase.cancellation = "systemInitiatedCancellation"
                        purchases[token] = purchase
                        notify(subscription: 13, token)
                    }
                case SubscriptionState.canceled where purchase.expiry <= now:
                    purchase.subscriptionState = SubscriptionState.expired
                    purchases[token] = purchase
                    notify(subscription: 13, token)
                case SubscriptionState.paused where (purchase.pausedUntil ?? now) <= now:
                    purchase.subscriptionState = SubscriptionState.active
                    purchase.charge(renewalOrderId(purchase), at: now)
                    purchase.expiry = purchase.period.added(to: now)
                    purchase.pausedUntil = nil
                    purchases[token] = purchase
                    notify(subscription: 1, token)
                default:
                    break
                }
            }
        }
    }

    func recover(_ purchase: inout Purchase, now: Date) {
        purchase.subscriptionState = SubscriptionState.active
        purchase.charge(renewalOrderId(purchase), at: now)
        purchase.expiry = purchase.period.added(to: now)
        purchase.graceEnds = nil
        purchase.holdEnds = nil
        purchases[purchase.token] = purchase
        notify(subscription: 1, purchase.token)
    }

    // MARK: Notifications

    func newNotification() -> DeveloperNotification {
        DeveloperNotification(
            packageName: configuration.packageName,
            eventTimeMillis: Int64(clock.now().timeIntervalSince1970 * 1000))
    }

    func notify(subscription type: Int, _ token: String) {
        var notification = newNotification()
        notification.subscriptionNotification = .init(notificationType: type, purchaseToken: token)
        enqueue(notification)
    }

    func notify(oneTime type: Int, _ purchase: Purchase) {
        var notification = newNotification()
        notification.oneTimeProductNotification = .init(
            notificationType: type, purchaseToken: purchase.token, sku: purchase.productId)
        enqueue(notification)
    }

    /// Play Console's "Send test message".
    public func sendTestNotification() {
        var notification = newNotification()
        notification.testNotification = .init()
        enqueue(notification)
    }

    func enqueue(_ notification: DeveloperNotification) {
        messageCounter += 1
        pushes.append(
            Push(
                messageId: String(messageCounter), notification: notification, publishTime: clock.now(),
                nextAttempt: clock.now()))
    }

    /// Pushes due now (taken off the queue: the sender puts back what was not acknowledged).
    public func takeDuePushes() -> [Push] {
        guard !outage else { return [] }
        let now = clock.now()
        let due = pushes.filter { $0.nextAttempt <= now }
        pushes.removeAll { $0.nextAttempt <= now }
        return due
    }

    /// Pub/Sub's retry: exponential backoff from 10 s to 600 s, for 7 days.
    public func retry(_ push: Push) {
        var push = push
        push.attempts += 1
        guard clock.now().timeIntervalSince(push.publishTime) < 7 * 86_400 else { return }
        push.nextAttempt = clock.now().addingTimeInterval(min(600, 10 * pow(2, Double(push.attempts - 1))))
        pushes.append(push)
    }

    public func pendingPushes() -> [Push] { pushes }

    // MARK: Ids

    static func newToken() -> String {
        // Google's tokens are long opaque strings; ours are too (no ':' so paths parse).
        (0..<3).map { _ in UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "") }
            .joined(separator: ".")
    }

    func newOrderId() -> String {
        orderCounter += 1
        return String(
            format: "GPA.%04d-%04d-%04d-%05d", 3300 + orderCounter % 100, orderCounter % 10_000, 1234, orderCounter)
    }

    func renewalOrderId(_ purchase: Purchase) -> String {
        let base = purchase.orders.first.map { $0.components(separatedBy: "..").first ?? $0 } ?? newOrderId()
        return "\(base)..\(purchase.orders.count - 1)"
    }
}
