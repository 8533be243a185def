import Foundation

/// An auto-renewable subscription's status, as docs/api.md lists it.
public enum SubscriptionStatus: String, Sendable, Hashable, Codable, CaseIterable {
    case active
    case gracePeriod = "grace_period"
    case billingRetry = "billing_retry"
    case expired
    case revoked
    /// Google Play's PAUSED: no access until it resumes.
    case paused

    /// Active and grace period give access; billing retry, expired, revoked and paused do not.
    public var entitles: Bool { self == .active || self == .gracePeriod }

    /// Apple's `status` in Get All Subscription Statuses (1 active, 2 expired, 3 billing retry,
    /// 4 grace period, 5 revoked).
    public init?(appleStatus: Int) {
        switch appleStatus {
        case 1: self = .active
        case 2: self = .expired
        case 3: self = .billingRetry
        case 4: self = .gracePeriod
        case 5: self = .revoked
        default: return nil
        }
    }
}

/// One subscription (per `originalTransactionId`) as far as the events applied so far say.
public struct SubscriptionState: Sendable, Hashable {
    public var originalTransactionId: String
    public var productId: String
    public var status: SubscriptionStatus
    public var expiresAt: Date?
    public var autoRenew: Bool
    /// The product it renews into (`autoRenewProductId`): another one after a downgrade or
    /// crossgrade, effective at the next renewal.
    public var nextProductId: String?
    public var offerType: StoreTransaction.OfferKind?
    public var offerIdentifier: String?
    public var gracePeriodEndsAt: Date?
    public var renewalPrice: Int64?
    public var currency: String?
    /// The latest transaction of the subscription, and the one a refund revoked (so a
    /// REFUND_REVERSED reinstates exactly it).
    public var latestTransactionId: String?
    public var revokedTransactionId: String?
    /// The `signedDate` of the newest event applied: older ones are stale.
    public var signedDate: Date
    /// A monthly plan with a 12-month commitment (`billingPlanType` MONTHLY): this period's
    /// number, how many the commitment has, when it ends, and whether a new commitment starts
    /// after it (`commitmentAutoRenewStatus`). Nil for a plan billed up front.
    public var commitment: Commitment?

    public struct Commitment: Sendable, Hashable {
        public var period: Int
        public var periods: Int
        public var expiresAt: Date?
        /// Whether the commitment renews at its end (nil: not known yet).
        public var renews: Bool?

        public init(period: Int, periods: Int, expiresAt: Date?, renews: Bool? = nil) {
            self.period = period
            self.periods = periods
            self.expiresAt = expiresAt
            self.renews = renews
        }

        /// Billing goes on to the last period whatever the customer cancels.
        public var isBinding: Bool { period < periods }
    }

    /// Whether it bills again: inside a commitment always (cancelling stops only the next
    /// commitment), otherwise as auto-renew says.
    public var willRenew: Bool {
        if let commitment, commitment.isBinding { return true }
        if let commitment, commitment.renews == false { return false }
        return autoRenew
    }

    /// When access ends for good if nothing changes: a cancelled commitment at its end, a
    /// cancelled plan at its period's end; nil while it renews.
    public var endsAt: Date? {
        if let commitment {
            if commitment.renews == false { return commitment.expiresAt ?? expiresAt }
            if commitment.isBinding { return nil }
        }
        return autoRenew ? nil : expiresAt
    }

    public init(
        originalTransactionId: String, productId: String, status: SubscriptionStatus, expiresAt: Date?,
        autoRenew: Bool, signedDate: Date
    ) {
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.status = status
        self.expiresAt = expiresAt
        self.autoRenew = autoRenew
        self.signedDate = signedDate
    }

    /// Whether it gives access at `now`: active until it expires, grace period until the grace
    /// ends.
    public func entitles(at now: Date) -> Bool {
        switch status {
        case .active: return expiresAt.map { $0 > now } ?? true
        case .gracePeriod: return (gracePeriodEndsAt ?? expiresAt).map { $0 > now } ?? true
        case .billingRetry, .expired, .revoked, .paused: return false
        }
    }
}

/// What changes a subscription: a notification, a transaction an app submitted, or Apple's
/// answer to Get All Subscription Statuses. Each carries the `signedDate` Apple signed it with.
public struct SubscriptionEvent: Sendable {
    public enum Source: Sendable, Hashable {
        /// A store's notification, read by its adapter (`label`: the store's own name for it,
        /// kept in what is recorded).
        case notification(StoreNotice, label: String)
        /// A signed transaction submitted by an app (or found in the transaction history).
        case submittedTransaction
        /// Get All Subscription Statuses: Apple's `status` for the subscription.
        case appleStatus(Int)
        /// A web subscription's period ended and the app's backend reported no payment for the
        /// next one (only this server's own record: no store renews a web subscription).
        case lapsed
        /// A store's current state, read back from its API (Google Play's subscriptionsv2):
        /// the status, whether it renews; the transaction carries the period. A snapshot, so
        /// it is newer than anything applied before it.
        case storeState(SubscriptionStatus, autoRenew: Bool)
        /// A store refunded (or revoked) one of its transactions (`RefundEvent`, any store): the
        /// transaction and the end of its period when known. An older period's refund leaves
        /// the current one.
        case refunded(transactionId: String, periodEnd: Date?)
        /// The store took a refund back; the period's end when known.
        case refundReversed(periodEnd: Date?)
        /// No word from the store past the paid period and its longest retry window
        /// (`SubscriptionMachine.status`): it ended. Signed at that window's end, so any word the
        /// store did send within it is newer.
        case silent
    }

    public var source: Source
    public var signedDate: Date
    public var transaction: StoreTransaction?
    public var renewalInfo: StoreRenewal?

    public init(
        _ source: Source, signedDate: Date, transaction: StoreTransaction? = nil,
        renewalInfo: StoreRenewal? = nil
    ) {
        self.source = source
        self.signedDate = signedDate
        self.transaction = transaction
        self.renewalInfo = renewalInfo
    }
}

/// The subscription engine's decisions: `apply(state, event) -> (state, effects)`, no I/O.
/// Events apply in `signedDate` order; an older one than the state's is recorded and never
/// applied (a late DID_RENEW cannot undo a REFUND, a late EXPIRED cannot undo a later renewal).
public enum SubscriptionMachine {
    /// The longest a store keeps retrying a lapsed payment (Apple's billing retry: 60 days;
    /// Google's grace and account hold together are shorter). Past its paid period plus this,
    /// with no word from the store, a subscription has ended whatever its last event said.
    public static let silenceWindow: TimeInterval = 60 * 86_400

    /// The status to show at `now`: what the last event said, unless the store has been silent
    /// past the paid period plus `silenceWindow` (a lost EXPIRED notification), then expired.
    public static func status(_ status: SubscriptionStatus, expiresAt: Date?, at now: Date) -> SubscriptionStatus {
        switch status {
        case .active, .gracePeriod, .billingRetry:
            guard let expiresAt, expiresAt.addingTimeInterval(silenceWindow) <= now else { return status }
            return .expired
        case .expired, .revoked, .paused:
            return status
        }
    }

    public enum Effect: Sendable, Hashable {
        /// The status moved (a `subscription_status_changed` event).
        case statusChanged(from: SubscriptionStatus?, to: SubscriptionStatus)
        /// Access to `productId` is now granted until `expiresAt` (nil: no end), or removed.
        case entitlementGranted(productId: String, expiresAt: Date?)
        case entitlementRemoved(productId: String)
        /// Older than what was applied already: kept, not applied.
        case stale
        /// Nothing for the subscription's state (TEST, CONSUMPTION_REQUEST, REFUND_DECLINED, an
        /// unknown type…): recorded as deliberately ignored, with why.
        case ignored(String)
    }

    public static func apply(_ state: SubscriptionState?, _ event: SubscriptionEvent)
        -> (SubscriptionState?, [Effect])
    {
        if let state, event.signedDate < state.signedDate { return (state, [.stale]) }
        guard var next = state ?? start(event) else {
            return (nil, [.ignored("no subscription to apply it to, and nothing to start one from")])
        }
        let before = state
        switch event.source {
        case .notification(let notice, let label):
            guard let reason = notification(&next, notice, label, event) else { break }
            return (state.map { advanced($0, to: event.signedDate) }, [.ignored(reason)])
        case .submittedTransaction:
            submitted(&next, event)
        case .appleStatus(let code):
            guard let status = SubscriptionStatus(appleStatus: code) else {
                return (state, [.ignored("unknown Apple status \(code)")])
            }
            renewal(&next, event.renewalInfo)
            if let transaction = event.transaction, !isEndedOlderPeriod(transaction, than: next, at: event.signedDate) {
                take(&next, transaction)
            }
            next.status = status
        case .storeState(let status, let autoRenew):
            // A late event about a period that ended before the one held (Stripe's `invoice.paid`
            // of last month arriving after this month's) never moves the subscription back.
            if let transaction = event.transaction, !isEndedOlderPeriod(transaction, than: next, at: event.signedDate) {
                take(&next, transaction)
            }
            next.autoRenew = autoRenew
            next.status = status
            // Google's grace has no end date in the resource; the next snapshot ends it (at
            // most 30 days, Google's longest grace).
            next.gracePeriodEndsAt = status == .gracePeriod ? event.signedDate.addingTimeInterval(30 * 86_400) : nil
            if status != .revoked { next.revokedTransactionId = nil }
        case .refunded(let id, let periodEnd):
            if id != next.latestTransactionId, let periodEnd, let current = next.expiresAt, periodEnd < current {
                return (
                    state.map { advanced($0, to: event.signedDate) },
                    [.ignored("refund of an older period (transaction \(id)): recorded; the current period stays")]
                )
            }
            next.revokedTransactionId = id
            next.status = .revoked
        case .refundReversed(let periodEnd):
            guard next.status == .revoked else {
                return (
                    state.map { advanced($0, to: event.signedDate) },
                    [.ignored("a refund taken back of a subscription that is not revoked")]
                )
            }
            next.revokedTransactionId = nil
            let expires = periodEnd ?? next.expiresAt
            next.expiresAt = expires
            next.status = expires.map { $0 > event.signedDate } ?? true ? .active : .expired
        case .silent:
            let status = Self.status(
                next.status, expiresAt: next.gracePeriodEndsAt ?? next.expiresAt, at: event.signedDate)
            guard status != next.status else {
                return (state, [.ignored("the store's retry window has not passed")])
            }
            next.status = status
            next.gracePeriodEndsAt = nil
        case .lapsed:
            guard next.status == .active || next.status == .gracePeriod,
                let expires = next.gracePeriodEndsAt ?? next.expiresAt, expires <= event.signedDate
            else {
                return (state, [.ignored("the paid period has not ended, or the subscription is not active")])
            }
            next.status = .expired
            next.gracePeriodEndsAt = nil
        }
        // The store's silence is the passage of time, not word from the store: it never moves
        // the watermark, so a genuine event the store signed before it and delivered late (a
        // renewal still queued, a notification retried for days) still applies.
        if event.source != .silent { next.signedDate = event.signedDate }
        return (next, effects(from: before, to: next))
    }

    /// The state an event starts when none exists yet (the first transaction of the
    /// subscription), nil when it carries no transaction.
    static func start(_ event: SubscriptionEvent) -> SubscriptionState? {
        guard let transaction = event.transaction, let productId = transaction.productId,
            let original = transaction.originalTransactionId ?? transaction.transactionId
        else { return nil }
        var state = SubscriptionState(
            originalTransactionId: original, productId: productId, status: .active,
            expiresAt: transaction.expiresDate.map(Date.init(storeMilliseconds:)),
            autoRenew: event.renewalInfo?.autoRenew != false, signedDate: event.signedDate)
        // Its first transaction is its latest: an extension or a refund without a transaction
        // needs it from the start.
        take(&state, transaction)
        return state
    }

    /// Applies a notification; returns why it was ignored, or nil when applied.
    static func notification(
        _ state: inout SubscriptionState, _ notice: StoreNotice, _ label: String, _ event: SubscriptionEvent
    ) -> String? {
        renewal(&state, event.renewalInfo)
        // A notification carries the subscription's latest transaction. One with a later period
        // than the state holds means an event in between was missed or is still on its way
        // (a renewal dropped while the store was down, then the expiry first): the period is
        // taken from it, whatever the notice says about the status. Found by `storekeeper chaos`.
        if let transaction = event.transaction, transaction.revocationDate == nil,
            let expires = transaction.expiresDate.map(Date.init(storeMilliseconds:)),
            state.expiresAt.map({ expires > $0 }) ?? true
        {
            take(&state, transaction)
        }
        switch notice {
        case .newPeriod:
            // A new period (first buy, resubscribe, renewal, billing recovery, an offer, an
            // extension), or an immediate upgrade: the transaction says the product and expiry.
            if let transaction = event.transaction { take(&state, transaction) }
            state.status = .active
            state.gracePeriodEndsAt = nil
        case .renewalFailed(let gracePeriod):
            if gracePeriod {
                state.status = .gracePeriod
                state.gracePeriodEndsAt =
                    event.renewalInfo?.gracePeriodExpiresDate.map(Date.init(storeMilliseconds:))
                    ?? state.gracePeriodEndsAt
            } else {
                state.status = .billingRetry
            }
        case .gracePeriodEnded:
            state.status = .billingRetry
        case .expired:
            state.status = .expired
            state.autoRenew = false
        case .autoRenewChanged(let on):
            // Inside a commitment the customer cancels the next commitment, not the months
            // committed to: they keep billing to the last period, then it ends.
            if let commitment = state.commitment, commitment.isBinding || commitment.renews != nil {
                if event.renewalInfo?.commitmentRenews == nil, let on {
                    state.commitment?.renews = on
                }
                if commitment.isBinding { break }
            }
            if let on { state.autoRenew = on }
        case .planChanged(let immediate):
            // An upgrade takes effect at once (its transaction is the new product's); a
            // downgrade or crossgrade at the next renewal (the renewal's next product, above).
            if immediate, let transaction = event.transaction { take(&state, transaction) }
        case .priceIncrease:
            break  // renewal price and currency, above
        case .refunded:
            // A refund (or Family Sharing revoke) of a period that had already ended before the
            // current one: recorded (the refund path takes back what it refunded), the current
            // period and its access stay. One of the current period revokes it.
            if let transaction = event.transaction, isOlderPeriod(transaction, than: state) {
                return
                    "\(label) of an older period (transaction \(transaction.transactionId ?? "?")): recorded; the current period stays"
            }
            state.revokedTransactionId = event.transaction?.transactionId ?? state.latestTransactionId
            state.status = .revoked
        case .refundReversed:
            guard state.status == .revoked else { return "\(label) for a subscription that is not revoked" }
            state.revokedTransactionId = nil
            let expires = event.transaction?.expiresDate.map(Date.init(storeMilliseconds:)) ?? state.expiresAt
            state.expiresAt = expires
            state.status = expires.map { $0 > event.signedDate } ?? true ? .active : .expired
        case .refundDeclined:
            return "\(label): recorded, nothing changes"
        case .consumptionRequest:
            return "\(label): answered through the job queue, not a state change"
        case .extensionSummary:
            return "\(label): a mass extension's summary; each subscription gets its own extension"
        case .test:
            return label
        case .oneTimePurchase, .consentRescinded, .externalPurchaseToken, .other, .unknown:
            return "\(label) does not change a subscription"
        }
        return nil
    }

    /// Whether `transaction` is a period that ended before the one the state holds (not its
    /// latest transaction, and expiring earlier).
    static func isOlderPeriod(_ transaction: StoreTransaction, than state: SubscriptionState) -> Bool {
        guard transaction.transactionId != state.latestTransactionId,
            let expires = transaction.expiresDate.map(Date.init(storeMilliseconds:)), let current = state.expiresAt
        else { return false }
        return expires < current
    }

    /// Whether `transaction` is an older period than the state's that had already ended when
    /// the event was signed: its period is history, never the subscription's current one. (An
    /// immediate plan change to a shorter period ends later than now: it is taken.)
    static func isEndedOlderPeriod(_ transaction: StoreTransaction, than state: SubscriptionState, at signed: Date)
        -> Bool
    {
        guard isOlderPeriod(transaction, than: state),
            let expires = transaction.expiresDate.map(Date.init(storeMilliseconds:))
        else { return false }
        return expires <= signed
    }

    /// A transaction an app submitted: a newer period (a renewal the server learns of from the
    /// device) moves the subscription forward; a revoked one revokes it.
    static func submitted(_ state: inout SubscriptionState, _ event: SubscriptionEvent) {
        guard let transaction = event.transaction else { return }
        let expires = transaction.expiresDate.map(Date.init(storeMilliseconds:))
        // An older period than the one the state holds never moves it back, revoked or not
        // (a refunded period of last year does not end this year's access).
        let isOlder =
            transaction.transactionId != state.latestTransactionId
            && expires.flatMap { expires in state.expiresAt.map { expires < $0 } } == true
        if transaction.revocationDate != nil {
            guard !isOlder else { return }
            state.revokedTransactionId = transaction.transactionId
            state.status = .revoked
            return
        }
        if let expires, let current = state.expiresAt, expires <= current { return }
        take(&state, transaction)
        state.status = expires.map { $0 > event.signedDate } ?? true ? .active : .expired
        state.gracePeriodEndsAt = nil
    }

    /// The product, expiry, offer and transaction of `transaction`.
    static func take(_ state: inout SubscriptionState, _ transaction: StoreTransaction) {
        if let productId = transaction.productId { state.productId = productId }
        if let expires = transaction.expiresDate { state.expiresAt = Date(storeMilliseconds: expires) }
        state.offerType = transaction.offerType
        state.offerIdentifier = transaction.offerIdentifier
        if let id = transaction.transactionId { state.latestTransactionId = id }
        if transaction.billingPlan == .monthly, let info = transaction.commitment {
            state.commitment = SubscriptionState.Commitment(
                period: Int(info.billingPeriodNumber ?? 1), periods: Int(info.totalBillingPeriods ?? 12),
                expiresAt: info.commitmentExpiresDate.map(Date.init(storeMilliseconds:)),
                renews: state.commitment?.renews)
        } else if transaction.billingPlan != nil {
            state.commitment = nil
        }
    }

    /// What the renewal info says about the next renewal.
    static func renewal(_ state: inout SubscriptionState, _ info: StoreRenewal?) {
        guard let info else { return }
        if let on = info.autoRenew { state.autoRenew = on }
        if let next = info.nextProductId { state.nextProductId = next }
        if let price = info.renewalPrice { state.renewalPrice = price }
        if let currency = info.currency { state.currency = currency }
        if let grace = info.gracePeriodExpiresDate { state.gracePeriodEndsAt = Date(storeMilliseconds: grace) }
        if let renews = info.commitmentRenews { state.commitment?.renews = renews }
    }

    static func advanced(_ state: SubscriptionState, to signedDate: Date) -> SubscriptionState {
        var state = state
        state.signedDate = max(state.signedDate, signedDate)
        return state
    }

    /// Status changes and what access they grant or remove: one entitlement per subscription,
    /// for its current product.
    static func effects(from before: SubscriptionState?, to after: SubscriptionState) -> [Effect] {
        var effects: [Effect] = []
        if before?.status != after.status { effects.append(.statusChanged(from: before?.status, to: after.status)) }
        let had = before.map { $0.status.entitles } ?? false
        let has = after.status.entitles
        if had, let before, !has || before.productId != after.productId {
            effects.append(.entitlementRemoved(productId: before.productId))
        }
        if has,
            !had || before?.productId != after.productId || before?.expiresAt != after.expiresAt
                || before?.gracePeriodEndsAt != after.gracePeriodEndsAt
        {
            let until = after.status == .gracePeriod ? after.gracePeriodEndsAt ?? after.expiresAt : after.expiresAt
            effects.append(.entitlementGranted(productId: after.productId, expiresAt: until))
        }
        return effects
    }
}

extension Date {
    /// The stores' timestamps: milliseconds since 1970.
    public init(storeMilliseconds value: Int64) {
        self.init(timeIntervalSince1970: Double(value) / 1000)
    }
}
