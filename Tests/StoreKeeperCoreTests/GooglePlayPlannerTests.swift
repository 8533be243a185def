import AppStoreAdapter
import AppStoreModels
import Foundation
import StoreKeeperCatalog
import Testing

@testable import StoreKeeperCore

/// Google Play's decisions (google-play.md §4, §7): every state, both ways.
@Suite struct GooglePlayPlannerTests {
    static let states: [(String, StoreKeeperCore.SubscriptionStatus?)] = [
        ("SUBSCRIPTION_STATE_ACTIVE", .active),
        ("SUBSCRIPTION_STATE_CANCELED", .active),
        ("SUBSCRIPTION_STATE_IN_GRACE_PERIOD", .gracePeriod),
        ("SUBSCRIPTION_STATE_ON_HOLD", .billingRetry),
        ("SUBSCRIPTION_STATE_PAUSED", .paused),
        ("SUBSCRIPTION_STATE_EXPIRED", .expired),
        ("SUBSCRIPTION_STATE_PENDING", nil),
        ("SUBSCRIPTION_STATE_PENDING_PURCHASE_CANCELED", nil),
        ("SUBSCRIPTION_STATE_SOMETHING_NEW", nil),
    ]

    @Test(arguments: states)
    func eachSubscriptionStateGivesItsStatus(state: String, status: StoreKeeperCore.SubscriptionStatus?) {
        #expect(GooglePlayPlanner.status(subscriptionState: state) == status)
        // A voided purchase is revoked whatever Google's state still says.
        #expect(GooglePlayPlanner.status(subscriptionState: state, voided: true) == .revoked)
        // Access follows: grace and (canceled-but-unexpired) active give it; hold and pause do not.
        if let status {
            #expect(
                status.entitles
                    == [
                        "SUBSCRIPTION_STATE_ACTIVE", "SUBSCRIPTION_STATE_CANCELED",
                        "SUBSCRIPTION_STATE_IN_GRACE_PERIOD",
                    ].contains(state))
        }
    }

    @Test func onlyPaidPurchasesAreDeliveredAndAcknowledged() {
        #expect(GooglePlayPlanner.readiness(purchaseState: "PURCHASED") == .paid)
        #expect(GooglePlayPlanner.readiness(purchaseState: "PENDING") == .pending)
        #expect(GooglePlayPlanner.readiness(purchaseState: "CANCELLED") == .notPaid("purchaseState CANCELLED"))
        #expect(GooglePlayPlanner.readiness(purchaseState: nil) == .notPaid("purchaseState absent"))
        #expect(GooglePlayPlanner.readiness(subscriptionState: "SUBSCRIPTION_STATE_PENDING") == .pending)
        #expect(GooglePlayPlanner.readiness(subscriptionState: "SUBSCRIPTION_STATE_ON_HOLD") == .paid)
        #expect(
            GooglePlayPlanner.readiness(subscriptionState: "SUBSCRIPTION_STATE_PENDING_PURCHASE_CANCELED")
                != .paid)
        #expect(GooglePlayPlanner.needsAcknowledgement(paid: true, acknowledgementState: nil))
        #expect(
            GooglePlayPlanner.needsAcknowledgement(
                paid: true, acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING"))
        #expect(
            !GooglePlayPlanner.needsAcknowledgement(
                paid: true, acknowledgementState: "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED"))
        #expect(!GooglePlayPlanner.needsAcknowledgement(paid: false, acknowledgementState: nil))
    }

    /// Quantity refunds take back exactly their units of the credit, summed over Google's
    /// records of one order; a record without a quantity is everything; nothing overflows.
    @Test func quantityRefundsAreExact() {
        let third = GooglePlayPlanner.revocation(voidedQuantities: [1], quantity: 3)
        #expect(third.portion(of: 180) == 60)
        #expect(third.share == 33_333)
        #expect(third.isPartial)
        let twoThirds = GooglePlayPlanner.revocation(voidedQuantities: [1, 1], quantity: 3)
        #expect(twoThirds.portion(of: 180) == 120)
        let all = GooglePlayPlanner.revocation(voidedQuantities: [1, 1, 1], quantity: 3)
        #expect(all.portion(of: 180) == 180 && !all.isPartial)
        #expect(GooglePlayPlanner.revocation(voidedQuantities: [1, nil], quantity: 3).portion(of: 180) == 180)
        #expect(
            GooglePlayPlanner.revocation(voidedQuantities: [Int.max, Int.max], quantity: 3).portion(of: 180) == 180)
        #expect(GooglePlayPlanner.revocation(voidedQuantities: [-5], quantity: 3).portion(of: 180) == 0)
        #expect(GooglePlayPlanner.revocation(voidedQuantities: [1], quantity: 3).portion(of: Int64.max) > 0)
    }

    @Test func aRefundReviewMapsThePolicysPreferenceToGooglesWords() {
        let facts = ConsumptionPlanner.Facts(
            delivered: true, productType: .consumable, credited: 100, balance: 25, productId: "coins")
        let none = GooglePlayPlanner.reviewAnswer(
            facts, policy: RefundPolicy(), sampleContentProvided: true, now: Date())
        #expect(none.refundPreference == "NEUTRAL" && none.rule == nil)
        #expect(none.consumptionPercentageMilliunits == 75_000)
        #expect(none.sampleContentProvided)
        for (preference, google) in [
            (RefundPolicy.Preference.decline, "DECLINE"), (.grantFull, "APPROVE"), (.grantProrated, "NEUTRAL"),
        ] {
            let policy = RefundPolicy(preference: [.init(name: "r", preference: preference)])
            let answer = GooglePlayPlanner.reviewAnswer(
                facts, policy: policy, sampleContentProvided: false, now: Date())
            #expect(answer.refundPreference == google, "\(preference)")
            #expect(answer.rule == "r")
        }
    }
}

@Suite struct GooglePlayProceedsTests {
    /// Google's service fee: subscriptions 15 % from the first period, one-time products 30 %
    /// (15 % with the reduced tier), test purchases none.
    @Test func googlesServiceFeeIsNotApples() {
        var subscription = StoreTransaction(store: .googlePlay)
        subscription.transactionId = "gp:GPA.1"
        subscription.kind = .autoRenewable
        subscription.environment = .production
        subscription.purchaseDate = 1_767_225_600_000
        subscription.price = 9990
        #expect(Proceeds.percent(of: subscription) == 85)
        var coins = subscription
        coins.kind = .consumable
        #expect(Proceeds.percent(of: coins) == 70)
        #expect(Proceeds.percent(of: coins, smallBusinessProgram: true) == 85)
        var test = coins
        test.environment = .sandbox
        #expect(Proceeds.percent(of: test) == nil)
        // Apple's first-year subscription is 70 %.
        var apple = subscription
        apple.transactionId = "2000000000000001"
        apple.store = .appStore
        #expect(Proceeds.percent(of: apple) == 70)
    }
}
