import Foundation
import StoreKeeperCatalog

/// Google Play's decisions, pure (google-play.md §4, §7): what a purchase's state read back from
/// the Play Developer API means for delivery, access and acknowledgement. The adapter reads;
/// this decides; the one delivery path delivers.
public enum GooglePlayPlanner {
    /// A one-time purchase's or a subscription's state, as read.
    public enum Readiness: Sendable, Hashable {
        /// Paid: deliver (once), then acknowledge (or consume) if not yet.
        case paid
        /// Google's PENDING: nothing is delivered until it is paid (202 to the app).
        case pending
        /// Never paid (CANCELLED, PENDING_PURCHASE_CANCELED) or unknown: nothing to deliver.
        case notPaid(String)
    }

    /// `purchaseStateContext.purchaseState` of a one-time purchase.
    public static func readiness(purchaseState: String?) -> Readiness {
        switch purchaseState {
        case "PURCHASED": .paid
        case "PENDING": .pending
        case let other: .notPaid("purchaseState \(other ?? "absent")")
        }
    }

    /// `subscriptionState` of a subscription: what is delivered (its current period) and the
    /// status it puts the subscription in.
    public static func readiness(subscriptionState: String?) -> Readiness {
        switch subscriptionState {
        case "SUBSCRIPTION_STATE_PENDING": .pending
        case "SUBSCRIPTION_STATE_PENDING_PURCHASE_CANCELED", "SUBSCRIPTION_STATE_UNSPECIFIED", nil:
            .notPaid("subscriptionState \(subscriptionState ?? "absent")")
        default: .paid
        }
    }

    /// The status a subscription state gives (§7.1): ACTIVE and CANCELED (until expiry) and
    /// IN_GRACE_PERIOD give access; ON_HOLD is billing retry (no access, payment retried);
    /// PAUSED no access; EXPIRED. A purchase Google voided is `revoked` whatever the state.
    /// Nil for states that say nothing (pending, unknown): the stored state is kept.
    public static func status(subscriptionState: String?, voided: Bool = false) -> SubscriptionStatus? {
        if voided { return .revoked }
        switch subscriptionState {
        case "SUBSCRIPTION_STATE_ACTIVE", "SUBSCRIPTION_STATE_CANCELED": return .active
        case "SUBSCRIPTION_STATE_IN_GRACE_PERIOD": return .gracePeriod
        case "SUBSCRIPTION_STATE_ON_HOLD": return .billingRetry
        case "SUBSCRIPTION_STATE_PAUSED": return .paused
        case "SUBSCRIPTION_STATE_EXPIRED": return .expired
        default: return nil
        }
    }

    /// Whether the server must acknowledge (or, for a consumable, consume) now: paid, and
    /// Google still says it is not acknowledged. Renewals share the first purchase's token and
    /// need nothing; a new token (upgrade, re-signup) needs it again.
    public static func needsAcknowledgement(paid: Bool, acknowledgementState: String?) -> Bool {
        paid && acknowledgementState != "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED"
    }

    /// What Google's voided records of one order refunded, for the one refund path: the units
    /// voided so far of `quantity` (a record without `voidedQuantity` voids everything).
    public static func revocation(voidedQuantities: [Int?], quantity: Int) -> RefundPlanner.Revocation {
        let units = Int64(max(1, quantity))
        if voidedQuantities.contains(where: { $0 == nil }) {
            return .init(unitsRefunded: units, of: units)
        }
        // Google's quantities are at most a purchase's; clamped so no input overflows.
        let refunded = voidedQuantities.reduce(Int64(0)) { sum, quantity in
            min(units, sum + Int64(min(max(0, quantity ?? 0), 1_000_000)))
        }
        return .init(unitsRefunded: refunded, of: units)
    }

    /// How long after payment an unacknowledged purchase is refunded by Google, and when the
    /// sweeper acknowledges (an hour, leaving the app's own path the first go) and alerts.
    public static let acknowledgementWindow: TimeInterval = 3 * 86_400
    public static let sweepAfter: TimeInterval = 3600
    public static let alertAfter: TimeInterval = 48 * 3600
    /// Past this, Google has refunded what was never acknowledged: nothing left to acknowledge.
    public static let acknowledgeUntil: TimeInterval = 4 * 86_400

    /// The transaction ids a Google purchase is delivered under: one per charge (`orderId`;
    /// a purchase without one — promo codes — by its token's digest), and the subscription's
    /// key (its token's digest: renewals share the token).
    public static let prefix = "gp:"

    public static func transactionId(orderId: String?, tokenDigest: String) -> String {
        if let orderId, !orderId.isEmpty { return prefix + orderId }
        return prefix + "t." + tokenDigest
    }

    public static func originalTransactionId(tokenDigest: String) -> String { prefix + "s." + tokenDigest }
}

extension GooglePlayPlanner {
    /// Google's refund review (`orders.reviewrefund`), answered from the ledger by the same
    /// catalog rules as Apple's consumption answers: DECLINE stays DECLINE, GRANT_FULL is
    /// APPROVE, GRANT_PRORATED (Google has none) and no matching rule are NEUTRAL; the share
    /// consumed of a one-time product in milliunits.
    public struct ReviewAnswer: Sendable, Hashable {
        public var refundPreference: String
        public var consumptionPercentageMilliunits: Int?
        public var sampleContentProvided: Bool
        public var rule: String?
    }

    public static func reviewAnswer(
        _ facts: ConsumptionPlanner.Facts, policy: RefundPolicy, sampleContentProvided: Bool, now: Date
    ) -> ReviewAnswer {
        let answer = ConsumptionPlanner.answer(
            facts, policy: policy, sampleContentProvided: sampleContentProvided, now: now)
        let preference: String =
            switch answer.preference {
            case .decline: "DECLINE"
            case .grantFull: "APPROVE"
            case .grantProrated, nil: "NEUTRAL"
            }
        return ReviewAnswer(
            refundPreference: preference,
            consumptionPercentageMilliunits: answer.consumedShare.map { Int(max(0, min(100_000, $0))) },
            sampleContentProvided: sampleContentProvided, rule: answer.rule)
    }
}
