import AppStoreModels
import Foundation
import StoreKeeperCatalog
import Testing

@testable import StoreKeeperCore

/// Who may have which offer, and which retention answer: exhaustively over the states a
/// subscription group can be in, both ways for every rule.
@Suite struct OfferEligibilityTests {
    static let now = Date(timeIntervalSince1970: 1_767_225_600)

    static func subscription(_ status: StoreKeeperCore.SubscriptionStatus, expires: TimeInterval) -> SubscriptionState {
        var state = SubscriptionState(
            originalTransactionId: "1", productId: "pro_monthly", status: status,
            expiresAt: now.addingTimeInterval(expires), autoRenew: status == .active, signedDate: now)
        // In the grace period, access runs to the grace period's end.
        if status == .gracePeriod { state.gracePeriodEndsAt = now.addingTimeInterval(10 * 86_400) }
        return state
    }

    static func refusal(_ offer: Offer, _ subscriptions: [SubscriptionState], redemptions: Int = 0) -> String? {
        OfferEligibility.refusal(
            offer, history: .init(subscriptions: subscriptions, redemptions: redemptions), now: now)?.rule
    }

    /// Every (rule, state) pair: which rule refuses, or nil.
    @Test func everyEligibleRuleAgainstEveryState() {
        let day: TimeInterval = 86_400
        let states: [(String, [SubscriptionState])] = [
            ("never", []),
            ("active", [Self.subscription(.active, expires: 10 * day)]),
            ("grace", [Self.subscription(.gracePeriod, expires: -day)]),
            ("retry", [Self.subscription(.billingRetry, expires: -5 * day)]),
            ("expired", [Self.subscription(.expired, expires: -40 * day)]),
            ("revoked", [Self.subscription(.revoked, expires: 5 * day)]),
            // Expired by its date, status not yet moved: not entitled, so lapsed.
            ("stale-active", [Self.subscription(.active, expires: -2 * day)]),
            (
                "one-of-two-active",
                [Self.subscription(.expired, expires: -90 * day), Self.subscription(.active, expires: day)]
            ),
        ]
        let expected: [Offer.Eligible: [String: String?]] = [
            .lapsed: [
                "never": "eligible: lapsed", "active": "eligible: lapsed", "grace": "eligible: lapsed",
                "retry": "eligible: lapsed", "expired": nil, "revoked": nil, "stale-active": nil,
                "one-of-two-active": "eligible: lapsed",
            ],
            .active: [
                "never": "eligible: active", "active": nil, "grace": nil, "retry": "eligible: active",
                "expired": "eligible: active", "revoked": "eligible: active", "stale-active": "eligible: active",
                "one-of-two-active": nil,
            ],
            .anySubscriber: [
                "never": "eligible: any_subscriber", "active": nil, "grace": nil, "retry": nil, "expired": nil,
                "revoked": nil, "stale-active": nil, "one-of-two-active": nil,
            ],
        ]
        for eligible in Offer.Eligible.allCases {
            for (name, subscriptions) in states {
                let offer = Offer(id: "o", eligible: eligible)
                #expect(
                    Self.refusal(offer, subscriptions) == expected[eligible]![name]!,
                    "\(eligible) × \(name)")
            }
        }
    }

    @Test func lapsedAtLeastCountsFromTheLatestExpiry() {
        let offer = Offer(id: "o", eligible: .lapsed, lapsedAtLeast: ISODuration(days: 30))
        #expect(Self.refusal(offer, [Self.subscription(.expired, expires: -31 * 86_400)]) == nil)
        #expect(Self.refusal(offer, [Self.subscription(.expired, expires: -29 * 86_400)]) == "lapsedAtLeast")
        // Two subscriptions in the group: the newer expiry decides.
        #expect(
            Self.refusal(
                offer,
                [
                    Self.subscription(.expired, expires: -300 * 86_400),
                    Self.subscription(.revoked, expires: -2 * 86_400),
                ])
                == "lapsedAtLeast")
    }

    @Test func maxPerAccountCountsSignedRedemptions() {
        let offer = Offer(id: "o", eligible: .anySubscriber, maxPerAccount: 2)
        let history = [Self.subscription(.active, expires: 86_400)]
        #expect(Self.refusal(offer, history, redemptions: 0) == nil)
        #expect(Self.refusal(offer, history, redemptions: 1) == nil)
        #expect(Self.refusal(offer, history, redemptions: 2) == "maxPerAccount")
        #expect(Self.refusal(Offer(id: "o", eligible: .anySubscriber), history, redemptions: 99) == nil)
    }

    /// Win-back offers by the catalog's policy: every subscription state × churn age × the
    /// account's redemptions under any Apple ID; and the redemption-time limit for codes.
    @Test func winBackPolicyOverEveryStateChurnAndRedemptions() {
        let day: TimeInterval = 86_400
        let offer = WinBackOffer(
            id: "wb", discountType: .payUpFront, period: ISODuration(months: 1),
            churnedAtLeast: ISODuration(days: 30), maxPerAccount: 1)
        func rule(_ subscriptions: [SubscriptionState], redemptions: Int = 0) -> String? {
            OfferEligibility.winBackRefusal(
                offer, subscriptions: subscriptions, redemptions: redemptions, now: Self.now)?
                .rule
        }
        #expect(rule([]) == "eligible: lapsed")
        #expect(rule([Self.subscription(.active, expires: day)]) == "eligible: lapsed")
        #expect(rule([Self.subscription(.gracePeriod, expires: -day)]) == "eligible: lapsed")
        #expect(rule([Self.subscription(.billingRetry, expires: -40 * day)]) == "eligible: lapsed")
        #expect(rule([Self.subscription(.expired, expires: -29 * day)]) == "churnedAtLeast")
        #expect(rule([Self.subscription(.expired, expires: -31 * day)]) == nil)
        #expect(rule([Self.subscription(.revoked, expires: -31 * day)]) == nil)
        #expect(rule([Self.subscription(.expired, expires: -31 * day)], redemptions: 1) == "maxPerAccount")
        // One churned and one active subscription in the group: still subscribed.
        #expect(
            rule([Self.subscription(.expired, expires: -90 * day), Self.subscription(.active, expires: day)])
                == "eligible: lapsed")
        var unlimited = offer
        unlimited.maxPerAccount = nil
        #expect(
            OfferEligibility.winBackRefusal(
                unlimited, subscriptions: [Self.subscription(.expired, expires: -31 * day)], redemptions: 50,
                now: Self.now) == nil)
        // Codes: counted after the redemption, so the limit's own redemption is within it.
        #expect(!OfferEligibility.overLimit(1, redemptions: 1))
        #expect(OfferEligibility.overLimit(1, redemptions: 2))
        #expect(!OfferEligibility.overLimit(nil, redemptions: 1000))
    }

    @Test func introductoryOfferOncePerAccountNeverWhileSubscribed() {
        let active = [Self.subscription(.active, expires: 86_400)]
        let expired = [Self.subscription(.expired, expires: -86_400)]
        #expect(OfferEligibility.introductoryAllowed(hadIntroductoryOffer: false, subscriptions: [], now: Self.now))
        #expect(
            OfferEligibility.introductoryAllowed(hadIntroductoryOffer: false, subscriptions: expired, now: Self.now))
        #expect(!OfferEligibility.introductoryAllowed(hadIntroductoryOffer: true, subscriptions: [], now: Self.now))
        #expect(
            !OfferEligibility.introductoryAllowed(hadIntroductoryOffer: false, subscriptions: active, now: Self.now))
        #expect(
            !OfferEligibility.introductoryAllowed(hadIntroductoryOffer: true, subscriptions: expired, now: Self.now))
    }

    // MARK: Retention

    static let rules: [RetentionRule] = [
        RetentionRule(
            id: "loyal", when: .init(productId: "pro_yearly", tenureAtLeast: ISODuration(years: 1)),
            message: .init(messageId: "a")),
        RetentionRule(
            id: "offer", when: .init(productId: "pro_monthly", sample: 0.25),
            promotionalOffer: .init(messageId: "b", offerId: "stay")),
        RetentionRule(
            id: "switch", when: .init(productId: "pro_yearly"),
            alternateProduct: .init(messageId: "c", productId: "pro_monthly")),
    ]

    static func decide(_ product: String, tenure: TimeInterval = 0, draw: Double = 0, allowed: Bool = true)
        -> RetentionPolicy.Decision
    {
        RetentionPolicy.decide(
            .init(productId: product, paidTenure: tenure, draw: draw), rules: rules, now: now,
            offerAllowed: { _ in allowed })
    }

    @Test func firstMatchingRuleWinsWithTenureSampleAndEligibility() {
        let year: TimeInterval = 365 * 86_400
        #expect(Self.decide("pro_yearly", tenure: year) == .answer(rule: 0))
        #expect(Self.decide("pro_yearly", tenure: year - 1) == .answer(rule: 2))
        #expect(Self.decide("pro_monthly", draw: 0.1) == .answer(rule: 1))
        // Outside the sample: the holdout of that rule, answered {} (not the next rule).
        #expect(Self.decide("pro_monthly", draw: 0.25) == .holdout(rule: 1))
        #expect(Self.decide("pro_monthly", draw: 0.9) == .holdout(rule: 1))
        // An offer the account may not have: the rule does not match at all.
        #expect(Self.decide("pro_monthly", draw: 0.1, allowed: false) == .none)
        #expect(Self.decide("other") == .none)
    }

    @Test func theHoldoutDrawIsStableAndUniform() {
        let id = "6F1A6C3E-1F7B-4C9A-9D54-1E8E3B0C2A11"
        #expect(RetentionPolicy.draw(id) == RetentionPolicy.draw(id.lowercased()))
        let draws = (0..<10_000).map { _ in RetentionPolicy.draw(UUID().uuidString) }
        #expect(draws.allSatisfy { (0..<1).contains($0) })
        let below = draws.filter { $0 < 0.3 }.count
        #expect((2_700...3_300).contains(below), "\(below) of 10,000 below 0.3")
    }
}
