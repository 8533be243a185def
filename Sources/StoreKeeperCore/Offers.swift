import Foundation
import StoreKeeperCatalog

/// Who may have which offer: pure decisions over the subscription states the engine keeps and
/// the redemptions Apple signed (never what a client says). docs/offers-and-retention.md §7: Apple
/// checks only the signature, so this is the whole policy.
public enum OfferEligibility {
    /// One rule that refused, named as the catalog names it.
    public struct Refusal: Error, Hashable, Sendable, CustomStringConvertible {
        public var rule: String
        public var message: String
        public var description: String { "\(rule): \(message)" }
    }

    /// What the account has in the offer's subscription group.
    public struct History: Sendable, Hashable {
        /// The account's subscriptions in the group, as the engine left them.
        public var subscriptions: [SubscriptionState]
        /// Apple-signed transactions of the account that redeemed this promotional offer.
        public var redemptions: Int
        /// Signatures of this offer issued to the account that Apple would still accept
        /// (unexpired) and nobody has redeemed: each could become a redemption at Apple, where
        /// the signature is all that is checked.
        public var outstanding: Int

        public init(subscriptions: [SubscriptionState], redemptions: Int, outstanding: Int = 0) {
            self.subscriptions = subscriptions
            self.redemptions = redemptions
            self.outstanding = outstanding
        }
    }

    /// Whether `offer` may be signed for an account with `history` at `now`; nil when it may,
    /// else the first rule that refused.
    public static func refusal(_ offer: Offer, history: History, now: Date) -> Refusal? {
        let subscriptions = history.subscriptions
        // Apple's own floor: promotional offers are for current or past subscribers.
        guard !subscriptions.isEmpty else {
            return Refusal(
                rule: "eligible: \(offer.eligible.rawValue)",
                message: "the account has never subscribed in this group (promotional offers are for subscribers)")
        }
        let entitledNow = subscriptions.contains { $0.entitles(at: now) }
        let retrying = subscriptions.contains { $0.status == .billingRetry }
        switch offer.eligible {
        case .active:
            guard entitledNow else {
                return Refusal(rule: "eligible: active", message: "no active subscription in this group")
            }
        case .lapsed:
            guard !entitledNow, !retrying else {
                return Refusal(
                    rule: "eligible: lapsed",
                    message: retrying
                        ? "the subscription is in billing retry, not lapsed" : "the account is subscribed in this group"
                )
            }
            if let atLeast = offer.lapsedAtLeast {
                let lapsedAt = subscriptions.compactMap { $0.expiresAt }.max() ?? .distantPast
                guard atLeast.added(to: lapsedAt) <= now else {
                    return Refusal(
                        rule: "lapsedAtLeast",
                        message:
                            "lapsed less than \(atLeast) ago (expired \(ISO8601DateFormatter().string(from: lapsedAt)))"
                    )
                }
            }
        case .anySubscriber:
            break
        }
        // Counted at signing: a signature is a redemption Apple will honour, so the redeemed and
        // the signed-but-unredeemed together stay within the limit.
        if let max = offer.maxPerAccount, history.redemptions + history.outstanding >= max {
            return Refusal(
                rule: "maxPerAccount",
                message:
                    "redeemed \(history.redemptions) time\(history.redemptions == 1 ? "" : "s") and signed \(history.outstanding) more still redeemable (at most \(max))"
            )
        }
        return nil
    }

    /// Whether an order may ask for the win-back offer `offer` (StoreKeeper's policy on top of
    /// Apple's, which decides per Apple ID): the account subscribed in the group before, has no
    /// subscription active, in grace or in billing retry now, lapsed at least `churnedAtLeast`
    /// ago, and redeemed the offer fewer than `maxPerAccount` times under any Apple ID
    /// (`redemptions`: Apple-signed transactions with `offerType` 4 and this identifier).
    public static func winBackRefusal(
        _ offer: WinBackOffer, subscriptions: [SubscriptionState], redemptions: Int, now: Date
    ) -> Refusal? {
        guard !subscriptions.isEmpty else {
            return Refusal(
                rule: "eligible: lapsed",
                message: "the account has never subscribed in this group (win-back offers are for past subscribers)")
        }
        if subscriptions.contains(where: { $0.entitles(at: now) || $0.status == .billingRetry }) {
            return Refusal(rule: "eligible: lapsed", message: "the account is still subscribed in this group")
        }
        if let atLeast = offer.churnedAtLeast {
            let lapsedAt = subscriptions.compactMap { $0.expiresAt }.max() ?? .distantPast
            guard atLeast.added(to: lapsedAt) <= now else {
                return Refusal(rule: "churnedAtLeast", message: "lapsed less than \(atLeast) ago")
            }
        }
        if let max = offer.maxPerAccount, redemptions >= max {
            return Refusal(
                rule: "maxPerAccount",
                message:
                    "redeemed \(redemptions) time\(redemptions == 1 ? "" : "s") under this account's Apple IDs (at most \(max))"
            )
        }
        return nil
    }

    /// Whether a redemption Apple applied outside our signing (an offer code, a win-back
    /// offer) went past the catalog's per-account limit: `redemptions` counts it too.
    public static func overLimit(_ maxPerAccount: Int?, redemptions: Int) -> Bool {
        maxPerAccount.map { redemptions > $0 } ?? false
    }

    /// `offers.introductoryOffers: once_per_account`: whether the account may have the group's
    /// introductory offer. Apple counts per Apple ID; this counts per account, across every
    /// Apple ID it used: once it had one (`offerType` 1 in any Apple-signed transaction of the
    /// group), never again. A current subscriber in the group is never eligible (Apple's rule).
    /// `introductoryOutstanding`: an allowance signed `true` for another order of the account is
    /// still redeemable; a second one would let the account have the offer twice.
    public static func introductoryAllowed(
        hadIntroductoryOffer: Bool, subscriptions: [SubscriptionState], introductoryOutstanding: Bool = false,
        now: Date
    ) -> Bool {
        !hadIntroductoryOffer && !introductoryOutstanding && !subscriptions.contains { $0.entitles(at: now) }
    }
}

/// Apple's Get Retention Message: which answer, by the catalog's rules (first match wins).
public enum RetentionPolicy {
    /// What the request is about.
    public struct Request: Sendable, Hashable {
        public var productId: String
        /// Paid service in the subscription so far.
        public var paidTenure: TimeInterval
        /// A number in [0, 1) fixed per request (from its identifier): the holdout draw.
        public var draw: Double

        public init(productId: String, paidTenure: TimeInterval, draw: Double) {
            self.productId = productId
            self.paidTenure = paidTenure
            self.draw = draw
        }
    }

    public enum Decision: Sendable, Hashable {
        /// No rule matched: `{}` (Apple shows the default message).
        case none
        /// Rule `index` matched and this request is in its holdout: `{}`, counted for the rule.
        case holdout(rule: Int)
        /// Rule `index` answers.
        case answer(rule: Int)
    }

    /// The first rule whose `when` matches and whose offer (if any) `offerAllowed` accepts.
    public static func decide(
        _ request: Request, rules: [RetentionRule], now: Date, offerAllowed: (String) -> Bool
    ) -> Decision {
        for (index, rule) in rules.enumerated() {
            if let productId = rule.when?.productId, productId != request.productId { continue }
            if let tenure = rule.when?.tenureAtLeast {
                // Durations are calendar lengths: measured from the epoch in UTC, as a span.
                let base = Date(timeIntervalSince1970: 0)
                if request.paidTenure < tenure.added(to: base).timeIntervalSince(base) { continue }
            }
            if let offer = rule.promotionalOffer, !offerAllowed(offer.offerId) { continue }
            if let sample = rule.when?.sample, request.draw >= sample { return .holdout(rule: index) }
            return .answer(rule: index)
        }
        return .none
    }

    /// The holdout draw of a request: uniform in [0, 1), the same for every retry of it.
    public static func draw(_ requestIdentifier: String) -> Double {
        // FNV-1a over the lower-cased identifier: stable across processes and versions.
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in requestIdentifier.lowercased().utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return Double(hash >> 11) / Double(UInt64(1) << 53)
    }
}
