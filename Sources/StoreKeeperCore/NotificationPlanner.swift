import Foundation
import StoreKeeperCatalog

/// A store's verified notification as it is kept and applied: what it means (`notice`, read by
/// the store's adapter), the store's own names for it (`type`, `subtype`, kept in the record
/// and the audit log) and the verified objects inside it.
public struct NotificationRecord: Sendable, Hashable {
    public var notificationUUID: String
    public var type: String
    public var subtype: String?
    public var notice: StoreNotice
    /// The payload's `signedDate` (epoch ms): the order events of one subscription apply in.
    public var signedDate: Int64
    public var environment: String?
    /// The store's subscription status as of `signedDate` (Apple's `data.status`), when sent.
    public var storeStatus: Int?
    public var consumptionRequestReason: String?
    public var transaction: StoreTransaction?
    public var renewalInfo: StoreRenewal?
    /// RESCIND_CONSENT: the verified app transaction's `appTransactionId` (the store account
    /// whose consent was withdrawn) and the app's identity.
    public var appTransactionId: String?
    public var appBundleId: String?
    /// EXTERNAL_PURCHASE_TOKEN: the token.
    public var externalToken: ExternalToken?

    public init(
        notificationUUID: String, type: String, subtype: String?, notice: StoreNotice, signedDate: Int64,
        environment: String?, storeStatus: Int? = nil, consumptionRequestReason: String? = nil,
        transaction: StoreTransaction? = nil, renewalInfo: StoreRenewal? = nil, appTransactionId: String? = nil,
        appBundleId: String? = nil, externalToken: ExternalToken? = nil
    ) {
        self.notice = notice
        self.appTransactionId = appTransactionId
        self.appBundleId = appBundleId
        self.externalToken = externalToken
        self.notificationUUID = notificationUUID
        self.type = type
        self.subtype = subtype
        self.signedDate = signedDate
        self.environment = environment
        self.storeStatus = storeStatus
        self.consumptionRequestReason = consumptionRequestReason
        self.transaction = transaction
        self.renewalInfo = renewalInfo
    }

    /// The store's name for it: `TYPE` or `TYPE (SUBTYPE)`.
    public var label: String { subtype.map { "\(type) (\($0))" } ?? type }

    /// The subscription (or one-time purchase) the notification is about: events of one
    /// subject apply one at a time, in `signedDate` order. Nil when it has no transaction.
    /// A consent withdrawal and an external purchase token have their own: the store account
    /// (`consent:<appTransactionId>`) and the token (`external:<externalPurchaseId>`).
    public var subject: String? {
        if let transaction { return transaction.originalTransactionId ?? transaction.transactionId }
        switch notice {
        case .consentRescinded: return appTransactionId.map { "consent:\($0)" }
        case .externalPurchaseToken:
            return externalToken?.externalPurchaseId.flatMap { $0.isEmpty ? nil : "external:\($0)" }
        default: return nil
        }
    }

    /// The subscription machine's event for this notification.
    public var subscriptionEvent: SubscriptionEvent {
        SubscriptionEvent(
            .notification(notice, label: type),
            signedDate: Date(timeIntervalSince1970: Double(signedDate) / 1000), transaction: transaction,
            renewalInfo: renewalInfo)
    }
}

/// What each notification does: a pure routing decision, one place, so every notice is either
/// applied or deliberately ignored.
public enum NotificationPlanner {
    public enum Action: Sendable, Hashable {
        /// A purchase or a subscription event: the transaction goes through delivery (exactly
        /// once, to the bound account), and an auto-renewable's state through SubscriptionMachine.
        case deliver
        /// A refund or revocation: reverse what the transaction delivered.
        case refund
        /// A refund taken back: reinstate exactly what the refund reversed.
        case refundReversed
        /// The store asks what was consumed: answered through the job queue when configured and
        /// the customer consented.
        case consumptionRequest
        /// Consent withdrawn: recorded, the accounts' consent withdrawn, the app's backend told.
        case rescindConsent
        /// An external purchase token: recorded; an unreported one reported.
        case externalPurchaseToken
        /// Recorded, nothing to apply: the reason is kept with the notification.
        case ignored(String)
    }

    public static func action(for record: NotificationRecord) -> Action {
        let label = record.type
        switch record.notice {
        case .newPeriod, .renewalFailed, .gracePeriodEnded, .expired, .autoRenewChanged, .planChanged, .priceIncrease,
            .oneTimePurchase:
            guard record.transaction != nil else { return .ignored("\(label) without a signed transaction") }
            return .deliver
        case .refunded:
            guard record.transaction != nil else { return .ignored("\(label) without a signed transaction") }
            return .refund
        case .refundReversed:
            guard record.transaction != nil else { return .ignored("\(label) without a signed transaction") }
            return .refundReversed
        case .consumptionRequest:
            guard record.transaction != nil else { return .ignored("\(label) without a signed transaction") }
            return .consumptionRequest
        case .refundDeclined:
            return .ignored("\(label): the store declined the refund; nothing was reversed, nothing changes")
        case .extensionSummary:
            return .ignored(
                "\(record.label): a mass extension's summary or failure; each extended subscription gets its own RENEWAL_EXTENDED"
            )
        case .test:
            return .ignored("\(label): a test notification, acknowledged")
        case .externalPurchaseToken:
            guard record.externalToken?.externalPurchaseId?.isEmpty == false else {
                return .ignored("\(label) without an externalPurchaseId")
            }
            return .externalPurchaseToken
        case .consentRescinded:
            guard record.appTransactionId != nil else {
                return .ignored("\(label) without a signed app transaction: no store account to find")
            }
            return .rescindConsent
        case .other(let why):
            return .ignored("\(label): \(why)")
        case .unknown:
            return .ignored("\(label): a type this server does not know yet, stored and ignored")
        }
    }
}

/// What a refund (or a Family Sharing revocation) takes back, and what its reversal gives
/// back — pure: storage reads the delivery and the account's balance, commits the plan.
///
/// A refund takes back what it refunded, once (docs/architecture.md invariant 7): a full refund or
/// a Family Sharing revocation everything, a `REFUND_PRORATED` one `revocationPercentage` of
/// the credit, rounded down (never more than the refunded share). What was taken back so far
/// is stored, so a repeated refund takes nothing more, a later larger one only the difference,
/// and REFUND_REVERSED gives back exactly that.
public enum RefundPlanner {
    /// A full share, in Apple's milliunits of a percent.
    public static let wholeShare: Int32 = 100_000

    /// What storage knows about the refunded transaction.
    public struct Context: Sendable, Hashable {
        /// The delivery recorded for the transaction (nil: it was never delivered here).
        public var delivery: DeliveryPlanner.Delivery?
        /// Whether the delivery is refunded now (a repeated REFUND changes nothing).
        public var refunded: Bool
        /// The currency the delivery credited, and how much (its ledger entry), if any.
        public var credited: Credit?
        /// The account's balance of that currency now.
        public var balance: Int64
        /// The entitlement the product grants, if any.
        public var entitlement: String?
        public var productType: Product.Kind?
        /// The share refunded so far (milliunits; `wholeShare` for a refund recorded before
        /// prorated refunds existed) and the units of `credited` taken back so far.
        public var refundedShare: Int32
        public var takenBack: Int64
        /// The policy for an indivisible non-consumable: a prorated refund of at least this
        /// share removes it (milliunits; the catalog's `refunds.revokeNonConsumableAt`).
        public var revokeNonConsumableAt: Int32

        public init(
            delivery: DeliveryPlanner.Delivery?, refunded: Bool, credited: Credit?,
            balance: Int64, entitlement: String?, productType: Product.Kind?, refundedShare: Int32? = nil,
            takenBack: Int64? = nil, revokeNonConsumableAt: Int32 = 50_000
        ) {
            self.delivery = delivery
            self.refunded = refunded
            self.credited = credited
            self.balance = balance
            self.entitlement = entitlement
            self.productType = productType
            self.refundedShare = refundedShare ?? (refunded ? RefundPlanner.wholeShare : 0)
            self.takenBack = takenBack ?? (refunded ? credited?.amount ?? 0 : 0)
            self.revokeNonConsumableAt = revokeNonConsumableAt
        }
    }

    /// What a delivery credited: its ledger entry.
    public struct Credit: Sendable, Hashable {
        public var currency: String
        public var amount: Int64

        public init(currency: String, amount: Int64) {
            self.currency = currency
            self.amount = amount
        }
    }

    /// How much Apple refunded, from the signed transaction.
    public struct Revocation: Sendable, Hashable {
        public var type: StoreTransaction.RevocationKind?
        public var percentage: Int32?
        /// A refund by quantity (Google Play's quantity-based partial refunds): `unitsRefunded`
        /// of `units` in all so far. Exact: the credit taken back is `credit × refunded / units`.
        public var unitsRefunded: Int64?
        public var units: Int64?

        public init(type: StoreTransaction.RevocationKind?, percentage: Int32?) {
            self.type = type
            self.percentage = percentage
        }

        /// `refunded` of `units` units refunded so far (clamped to 0…units).
        public init(unitsRefunded refunded: Int64, of units: Int64) {
            self.type = refunded >= units ? .refundFull : .refundProrated
            self.units = max(1, units)
            self.unitsRefunded = min(max(0, refunded), max(1, units))
        }

        /// What of `amount` this refund takes back: by units when given, else by `share`.
        public func portion(of amount: Int64) -> Int64 {
            if let units, let refunded = unitsRefunded {
                guard amount > 0, refunded > 0 else { return 0 }
                guard refunded < units else { return amount }
                return units.dividingFullWidth(amount.multipliedFullWidth(by: refunded)).quotient
            }
            return RefundPlanner.portion(of: amount, share: share)
        }

        public init(_ transaction: StoreTransaction) {
            self.init(type: transaction.revocationType, percentage: transaction.revocationPercentage)
        }

        /// The refunded share in milliunits: `revocationPercentage` (clamped to 0…100 %) for
        /// `REFUND_PRORATED`; everything for a full refund, a family revocation, an unknown
        /// type or a refund from before December 2025 (no type at all).
        public var share: Int32 {
            if let units, let refunded = unitsRefunded {
                return refunded >= units ? RefundPlanner.wholeShare : Int32(refunded * 100_000 / units)
            }
            guard type == .refundProrated, let percentage else { return RefundPlanner.wholeShare }
            return min(max(percentage, 0), RefundPlanner.wholeShare)
        }

        public var isPartial: Bool { share < RefundPlanner.wholeShare }

        /// The same revocation, from the values it is stored as.
        public init(type: StoreTransaction.RevocationKind?, percentage: Int32?, unitsRefunded: Int64?, units: Int64?) {
            self.type = type
            self.percentage = percentage
            self.unitsRefunded = unitsRefunded
            self.units = units
        }
    }

    public struct Plan: Sendable, Hashable {
        /// Nothing to do, and why (never delivered, already refunded, not refunded).
        public var skipped: String?
        public var accountId: String?
        public var ledger: [LedgerEntry] = []
        /// Remove (refund) or reinstate (reversal) the entitlement of the transaction.
        public var removeEntitlement: String?
        public var reinstateEntitlement: String?
        /// A non-renewing subscription prorated: its window shortened by this share of its length.
        public var shortenEntitlement: Shortening?
        /// The delivery's new refund state, and its order's status.
        public var refunded: Bool?
        /// The share refunded and the units taken back after this plan (both 0 on a reversal).
        public var refundedShare: Int32?
        public var takenBack: Int64?
        public var orderStatus: Order.Status?
        public var anomalies: [AnomalyDraft] = []
        /// Refunded before it was ever delivered here: record it as delivered with nothing
        /// (quantity 0) and refunded, so a late notification or submission of it never
        /// delivers it.
        public var recordUndelivered = false
        /// Refunded before anyone claimed it: what the store refunded, kept by transaction id
        /// for the delivery path (`DeliveryPlanner.Context.refundedBeforeDelivery`) — a whole
        /// refund is never delivered, a partial one delivers only what was not refunded.
        public var refundedBeforeDelivery: Revocation?

        public struct Shortening: Sendable, Hashable {
            public var id: String
            public var share: Int32
        }
    }

    /// `amount × share / 100 000`, rounded down, without overflow (amount ≥ 0).
    public static func portion(of amount: Int64, share: Int32) -> Int64 {
        guard amount > 0, share > 0 else { return 0 }
        guard share < wholeShare else { return amount }
        let product = amount.multipliedFullWidth(by: Int64(share))
        return Int64(wholeShare).dividingFullWidth(product).quotient
    }

    /// A REFUND or REVOKE of `transactionId`. `key` makes the ledger entries unique (the
    /// notification's UUID): the notification itself is applied once.
    public static func refund(
        _ context: Context, transactionId: String, key: String, reason: String,
        revocation: Revocation = Revocation(type: nil, percentage: nil)
    ) -> Plan {
        let share = revocation.share
        guard let delivery = context.delivery else {
            var plan = Plan(
                skipped:
                    "transaction \(transactionId) was never delivered here: nothing to take back; recorded as refunded so it never is"
            )
            // A whole refund of a purchase whose owner is known is recorded as delivered with
            // nothing; every refund is also kept by transaction id, so a purchase nobody holds
            // yet is never delivered in full afterwards.
            plan.recordUndelivered = !revocation.isPartial
            plan.refundedBeforeDelivery = revocation
            if revocation.isPartial {
                plan.skipped =
                    "transaction \(transactionId) was never delivered here: \(percent(share)) refunded, recorded; a later delivery gives only what was not refunded"
            } else {
                plan.orderStatus = .refunded
            }
            plan.refundedShare = share
            return plan
        }
        guard !context.refunded || share > context.refundedShare else {
            return Plan(
                skipped: "transaction \(transactionId) is refunded already (\(percent(context.refundedShare)))")
        }
        var plan = Plan(
            accountId: delivery.accountId, refunded: true, refundedShare: share, takenBack: context.takenBack,
            orderStatus: share >= wholeShare ? .refunded : .partiallyRefunded)
        if let credited = context.credited, credited.amount > 0 {
            let target = revocation.portion(of: credited.amount)
            let take = max(0, target - context.takenBack)
            plan.takenBack = max(target, context.takenBack)
            if take > 0 {
                plan.ledger.append(
                    LedgerEntry(
                        key: "refund:\(transactionId):\(credited.currency):\(key)", accountId: delivery.accountId,
                        currency: credited.currency, amount: -take))
                let (after, overflow) = context.balance.subtractingReportingOverflow(take)
                if overflow || after < 0 {
                    // The credit was spent (in part) before the money went back: the balance goes
                    // negative and an operator decides.
                    plan.anomalies.append(
                        AnomalyDraft(
                            kind: .refundedAfterDelivery, transactionId: transactionId, orderId: delivery.orderId,
                            accountId: delivery.accountId,
                            detail:
                                "\(reason): \(take) \(credited.currency) of transaction \(transactionId) taken back from account \(delivery.accountId), whose balance was \(context.balance) (now \(overflow ? "below the limit" : String(after))): the credit was already spent"
                        ))
                }
            }
        }
        if let entitlement = context.entitlement {
            switch context.productType {
            case .autoRenewable:
                // Subscriptions lose access through their own state (SubscriptionMachine).
                break
            case .nonRenewing where share < wholeShare:
                plan.shortenEntitlement = Plan.Shortening(id: entitlement, share: share)
            case .nonConsumable where share < context.revokeNonConsumableAt:
                // Indivisible: kept below the policy's share (docs/refunds.md).
                break
            default:
                plan.removeEntitlement = entitlement
            }
        }
        return plan
    }

    /// A REFUND_REVERSED of `transactionId`: gives back exactly what the refund took.
    public static func reversal(_ context: Context, transactionId: String, key: String) -> Plan {
        guard let delivery = context.delivery else {
            return Plan(skipped: "transaction \(transactionId) was never delivered here: nothing to reinstate")
        }
        guard context.refunded else {
            return Plan(skipped: "transaction \(transactionId) is not refunded: nothing to reinstate")
        }
        var plan = Plan(
            accountId: delivery.accountId, refunded: false, refundedShare: 0, takenBack: 0, orderStatus: .delivered)
        if let credited = context.credited, context.takenBack > 0 {
            plan.ledger.append(
                LedgerEntry(
                    key: "refund_reversed:\(transactionId):\(credited.currency):\(key)", accountId: delivery.accountId,
                    currency: credited.currency, amount: context.takenBack))
        }
        if context.productType != .autoRenewable, let entitlement = context.entitlement {
            // Storage reinstates exactly what the refund removed or shortened (nothing if neither).
            plan.reinstateEntitlement = entitlement
        }
        return plan
    }

    /// `33333` → "33.333 %".
    public static func percent(_ share: Int32) -> String {
        let whole = share / 1000
        let fraction = share % 1000
        return fraction == 0 ? "\(whole) %" : "\(whole).\(String(format: "%03d", fraction)) %"
    }
}

/// The answer to Apple's CONSUMPTION_REQUEST (Send Consumption Information V2), built from our
/// own records only — pure. Sent only when the customer consented (storage checks it before a
/// request is queued and again before it is sent).
public enum ConsumptionPlanner {
    /// What the records say about the transaction Apple asks about.
    public struct Facts: Sendable, Hashable {
        public var delivered: Bool
        public var productType: Product.Kind?
        /// For a consumable: what the delivery credited, and the account's balance now.
        public var credited: Int64?
        public var balance: Int64?
        public var productId: String
        /// The account had no delivery before this transaction.
        public var firstPurchase: Bool
        /// The account's first purchase or order.
        public var accountSince: Date?
        /// For an auto-renewable: the paid period, to tell how much of it has elapsed.
        public var periodStart: Date?
        public var periodEnd: Date?

        public init(
            delivered: Bool, productType: Product.Kind?, credited: Int64?, balance: Int64?, productId: String = "",
            firstPurchase: Bool = true, accountSince: Date? = nil, periodStart: Date? = nil, periodEnd: Date? = nil
        ) {
            self.delivered = delivered
            self.productType = productType
            self.credited = credited
            self.balance = balance
            self.productId = productId
            self.firstPurchase = firstPurchase
            self.accountSince = accountSince
            self.periodStart = periodStart
            self.periodEnd = periodEnd
        }

        /// The share consumed (milliunits): a consumable's spent credit (the balance left over
        /// covers the unspent part), a delivered one-time product in full, an auto-renewable's
        /// elapsed share of its period (for rules only: Apple computes its own), nothing when
        /// undelivered.
        public func consumedShare(at now: Date) -> Int32 {
            guard delivered else { return 0 }
            switch productType {
            case .consumable:
                guard let credited, credited > 0 else { return RefundPlanner.wholeShare }
                let unspent = min(max(balance ?? 0, 0), credited)
                return Int32((credited - unspent) * 100_000 / credited)
            case .autoRenewable:
                guard let start = periodStart, let end = periodEnd, end > start else { return 0 }
                let elapsed = min(max(now.timeIntervalSince(start), 0), end.timeIntervalSince(start))
                return Int32(elapsed / end.timeIntervalSince(start) * 100_000)
            default:
                return RefundPlanner.wholeShare
            }
        }
    }

    /// The answer, in the core's terms (the store's adapter writes it in the store's words):
    /// whether it was delivered, the share consumed (nil for an auto-renewable: a store computes
    /// its own), the refund preference of the rule that chose it (nil: none matched, no
    /// preference stated) with what was adjusted to the store's rules.
    public struct Answer: Sendable, Hashable {
        public var delivered: Bool
        public var sampleContentProvided: Bool
        public var consumedShare: Int32?
        public var preference: RefundPolicy.Preference?
        public var rule: String?
        public var note: String?
    }

    /// Delivery status; for a one-time product the share consumed (never a percentage for an
    /// auto-renewable: Apple refuses it; 0 for anything undelivered); the refund preference of
    /// the catalog's first matching rule, made valid: GRANT_PRORATED of a one-time product needs
    /// 0 < share < 100 %, so nothing consumed becomes GRANT_FULL and everything consumed DECLINE.
    public static func answer(
        _ facts: Facts, policy: RefundPolicy = RefundPolicy(), sampleContentProvided: Bool = false, now: Date = Date()
    ) -> Answer {
        let consumed = facts.consumedShare(at: now)
        var answer = Answer(
            delivered: facts.delivered, sampleContentProvided: sampleContentProvided,
            consumedShare: facts.productType != .autoRenewable ? consumed : nil)
        let rule = policy.decide(
            RefundPolicy.Facts(
                productId: facts.productId, productType: facts.productType, consumedShare: consumed,
                firstPurchase: facts.firstPurchase, accountSince: facts.accountSince, now: now))
        if let rule {
            var preference = rule.preference
            if preference == .grantProrated, facts.productType != .autoRenewable {
                if consumed <= 0 {
                    preference = .grantFull
                    answer.note = "GRANT_PRORATED with nothing consumed is sent as GRANT_FULL"
                } else if consumed >= RefundPlanner.wholeShare {
                    preference = .decline
                    answer.note = "GRANT_PRORATED with everything consumed is sent as DECLINE"
                }
            }
            answer.preference = preference
            answer.rule = rule.name
        }
        return answer
    }
}

/// A store's refund, revocation or reversal of one of its transactions, as neutral values: what
/// the one refund path applies, whichever store it comes from (an App Store notification, a
/// Google voided purchase, a web payment's refund reported by the backend).
public struct RefundEvent: Sendable {
    public enum Kind: String, Sendable, Hashable {
        case refund
        /// Access withdrawn without a refund (Family Sharing).
        case revoke
        /// The store took its refund back (`REFUND_REVERSED`).
        case reversal = "refund_reversed"
    }

    public var kind: Kind
    public var store: Store
    /// What makes it apply once (a notification's UUID, a voided record's key).
    public var key: String
    public var transactionId: String
    public var originalTransactionId: String
    public var productId: String?
    /// The app's store identity (bundle id, package name), for a purchase with no recorded app.
    public var storeIdentity: String?
    public var environment: String?
    public var revocation: RefundPlanner.Revocation
    /// The store's own word for it, kept on the delivery and in the webhook event.
    public var revocationType: String?
    public var reasonCode: Int64?
    public var appTransactionId: String?
    /// When the purchase was made (a non-renewing pass's window is shortened from it).
    public var purchasedAt: Int64?
    /// The end of the refunded period, when the store says (epoch ms).
    public var periodEnd: Int64?
    /// The order token it carries (who owns it, when nothing else says).
    public var appAccountToken: String?
    /// For an auto-renewable: what the refund does to its state.
    public var subscriptionEvent: SubscriptionEvent?

    public init(
        kind: Kind, store: Store, key: String, transactionId: String, originalTransactionId: String? = nil,
        productId: String?, revocation: RefundPlanner.Revocation
    ) {
        self.kind = kind
        self.store = store
        self.key = key
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId ?? transactionId
        self.productId = productId
        self.revocation = revocation
    }

    /// A notification's refund, revocation or reversal (`record.notice`), from its transaction.
    public init?(notification record: NotificationRecord) {
        guard let transaction = record.transaction, let id = transaction.transactionId else { return nil }
        let kind: Kind
        switch record.notice {
        case .refunded(let revoke): kind = revoke ? .revoke : .refund
        case .refundReversed: kind = .reversal
        default: return nil
        }
        self.init(
            kind: kind, store: transaction.store, key: record.notificationUUID, transactionId: id,
            originalTransactionId: transaction.originalTransactionId, productId: transaction.productId,
            revocation: RefundPlanner.Revocation(transaction))
        storeIdentity = transaction.storeIdentity
        environment = transaction.environment?.rawValue
        revocationType = transaction.revocationType?.rawValue
        reasonCode = transaction.revocationReason.map { Int64($0) }
        appTransactionId = transaction.appTransactionId
        purchasedAt = transaction.purchaseDate
        periodEnd = transaction.expiresDate
        appAccountToken = transaction.appAccountToken?.lowercased()
        subscriptionEvent = record.subscriptionEvent
    }

    /// What it does to a subscription, from any store: its transaction revoked, or the refund
    /// taken back (`periodEnd`: the refunded period's end, when the store says).
    public static func subscriptionEvent(_ kind: Kind, transactionId: String, periodEnd: Date?, at now: Date)
        -> SubscriptionEvent
    {
        SubscriptionEvent(
            kind == .reversal
                ? .refundReversed(periodEnd: periodEnd) : .refunded(transactionId: transactionId, periodEnd: periodEnd),
            signedDate: now)
    }
}
