import AppStoreAdapter
import AppStoreModels
import Foundation
import Testing

@testable import StoreKeeperCore

/// The subscription state machine, event by event (docs/scenarios.md S1–S7): statuses, access,
/// product changes, refunds, and `signedDate` order.
@Suite struct SubscriptionMachineTests {
    static let start = Date(timeIntervalSince1970: 1_767_225_600)
    static let day: TimeInterval = 86_400

    static func at(_ days: Double) -> Date { start.addingTimeInterval(days * day) }
    static func ms(_ date: Date) -> Int64 { Int64(date.timeIntervalSince1970 * 1000) }

    static func transaction(
        _ id: String, product: String = "pro_monthly", expires days: Double, revoked: Bool = false
    ) -> StoreTransaction {
        var payload = StoreTransaction.appStore()
        payload.transactionId = id
        payload.originalTransactionId = "1000"
        payload.productId = product
        payload.kind = .autoRenewable
        payload.expiresDate = ms(at(days))
        if revoked { payload.revocationDate = ms(at(days - 1)) }
        return payload
    }

    static func renewal(
        autoRenew: Bool = true, next: String? = nil, graceUntil days: Double? = nil
    ) -> JWSRenewalInfoDecodedPayload {
        var info = JWSRenewalInfoDecodedPayload()
        info.originalTransactionId = "1000"
        info.autoRenewStatus = autoRenew ? .on : .off
        info.autoRenewProductId = next
        info.gracePeriodExpiresDate = days.map { ms(at($0)) }
        return info
    }

    static func notification(
        _ type: NotificationType, _ subtype: NotificationSubtype? = nil, signed days: Double,
        transaction: StoreTransaction? = nil, renewal: JWSRenewalInfoDecodedPayload? = nil
    ) -> SubscriptionEvent {
        SubscriptionEvent(
            .apple(type, subtype), signedDate: at(days), transaction: transaction,
            renewalInfo: renewal.map(StoreRenewal.init(apple:)))
    }

    /// A subscription bought on day 0, renewing monthly.
    static func subscribed() -> SubscriptionState {
        let (state, effects) = SubscriptionMachine.apply(
            nil,
            notification(
                .subscribed, .initialBuy, signed: 0, transaction: transaction("1000", expires: 30),
                renewal: renewal()))
        #expect(effects.contains(.statusChanged(from: nil, to: .active)))
        #expect(effects.contains(.entitlementGranted(productId: "pro_monthly", expiresAt: at(30))))
        return state!
    }

    /// A web subscription's period ending without a payment (`.lapsed`): expired only once the
    /// period (or its grace) is over, and only from active or grace; never before, never a
    /// revoked or expired one, never an older event than the state's.
    @Test func aLapseExpiresOnlyAnEndedActivePeriod() {
        let active = Self.subscribed()
        let early = SubscriptionMachine.apply(active, SubscriptionEvent(.lapsed, signedDate: Self.at(29)))
        #expect(early.0 == active)
        #expect(early.1.count == 1 && { if case .ignored = early.1[0] { true } else { false } }())
        let (lapsed, effects) = SubscriptionMachine.apply(active, SubscriptionEvent(.lapsed, signedDate: Self.at(30)))
        #expect(lapsed?.status == .expired)
        #expect(effects.contains(.statusChanged(from: .active, to: .expired)))
        #expect(effects.contains(.entitlementRemoved(productId: "pro_monthly")))
        // Grace counts: not before its end.
        var grace = active
        grace.status = .gracePeriod
        grace.gracePeriodEndsAt = Self.at(36)
        #expect(SubscriptionMachine.apply(grace, SubscriptionEvent(.lapsed, signedDate: Self.at(31))).0 == grace)
        #expect(
            SubscriptionMachine.apply(grace, SubscriptionEvent(.lapsed, signedDate: Self.at(36))).0?.status == .expired)
        for status: StoreKeeperCore.SubscriptionStatus in [.revoked, .expired, .billingRetry] {
            var other = active
            other.status = status
            #expect(SubscriptionMachine.apply(other, SubscriptionEvent(.lapsed, signedDate: Self.at(40))).0 == other)
        }
        // Nothing to lapse, and no older event than the state's.
        #expect(SubscriptionMachine.apply(nil, SubscriptionEvent(.lapsed, signedDate: Self.at(40))).0 == nil)
        #expect(
            SubscriptionMachine.apply(active, SubscriptionEvent(.lapsed, signedDate: Self.at(-1))).1 == [.stale])
    }

    /// The store's silence (`.silent`, the minute duty past expiry + the retry window) expires
    /// the subscription but is no word from the store: a renewal Apple signed before it and that
    /// is applied only now (queued behind a backlog, retried for days) still renews.
    @Test func silenceNeverMakesALateGenuineRenewalStale() {
        let active = Self.subscribed()
        let silent = SubscriptionEvent(.silent, signedDate: Self.at(30) + SubscriptionMachine.silenceWindow)
        let (expired, effects) = SubscriptionMachine.apply(active, silent)
        #expect(expired?.status == .expired)
        #expect(effects.contains(.entitlementRemoved(productId: "pro_monthly")))
        #expect(expired?.signedDate == active.signedDate, "the watermark stays")
        let (renewed, _) = SubscriptionMachine.apply(
            expired, Self.notification(.didRenew, signed: 30, transaction: Self.transaction("1001", expires: 60)))
        #expect(renewed?.status == .active)
        #expect(renewed?.expiresAt == Self.at(60))
        #expect(renewed?.latestTransactionId == "1001")
    }

    @Test func subscribeThenRenewMovesTheExpiryOnly() {
        var state = Self.subscribed()
        #expect(state.status == .active && state.autoRenew && state.entitles(at: Self.at(29)))
        for month in 1...3 {
            let (next, effects) = SubscriptionMachine.apply(
                state,
                Self.notification(
                    .didRenew, signed: Double(30 * month),
                    transaction: Self.transaction("\(1000 + month)", expires: Double(30 * (month + 1)))))
            state = next!
            #expect(
                effects == [.entitlementGranted(productId: "pro_monthly", expiresAt: Self.at(Double(30 * (month + 1))))]
            )
        }
        #expect(state.expiresAt == Self.at(120))
        #expect(state.latestTransactionId == "1003")
    }

    /// Found by `storekeeper chaos` (Apple down: DID_RENEW dropped, EXPIRED delivered first):
    /// the EXPIRED notification's transaction is the renewal's, so the subscription ends at the
    /// renewed period's end, not the first one's; the late DID_RENEW is then stale.
    @Test func anEventCarryingALaterPeriodTakesItWhateverItsType() {
        let state = Self.subscribed()
        let renewed = Self.transaction("1001", expires: 60)
        let (expired, _) = SubscriptionMachine.apply(
            state, Self.notification(.expired, .voluntary, signed: 60, transaction: renewed))
        #expect(expired?.status == .expired)
        #expect(expired?.expiresAt == Self.at(60))
        #expect(expired?.latestTransactionId == "1001")
        let (late, lateEffects) = SubscriptionMachine.apply(
            expired, Self.notification(.didRenew, signed: 30, transaction: renewed))
        _ = lateEffects
        #expect(late?.status == .expired && late?.expiresAt == Self.at(60))

        // A failed renewal after a missed one: billing retry, from the later period's end.
        let (failing, _) = SubscriptionMachine.apply(
            state,
            Self.notification(
                .didFailToRenew, signed: 60, transaction: Self.transaction("1001", expires: 60),
                renewal: Self.renewal()))
        #expect(failing?.status == .billingRetry && failing?.expiresAt == Self.at(60))
        // An older period in a notification never moves the expiry back.
        let (kept, _) = SubscriptionMachine.apply(
            failing,
            Self.notification(
                .didChangeRenewalStatus, .autoRenewDisabled, signed: 61,
                transaction: Self.transaction("1000", expires: 30)
            ))
        #expect(kept?.expiresAt == Self.at(60) && kept?.autoRenew == false)
    }

    @Test func billingFailureGraceThenRetryThenRecovery() {
        var state = Self.subscribed()
        var effects: [SubscriptionMachine.Effect]
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(.didFailToRenew, .gracePeriod, signed: 30, renewal: Self.renewal(graceUntil: 46))))
        #expect(state.status == .gracePeriod)
        #expect(state.entitles(at: Self.at(40)) && !state.entitles(at: Self.at(47)))
        #expect(effects.contains(.entitlementGranted(productId: "pro_monthly", expiresAt: Self.at(46))))
        (state, effects) = unwrap(
            SubscriptionMachine.apply(state, Self.notification(.gracePeriodExpired, signed: 46)))
        #expect(state.status == .billingRetry)
        #expect(
            effects == [
                .statusChanged(from: .gracePeriod, to: .billingRetry), .entitlementRemoved(productId: "pro_monthly"),
            ])
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(
                    .didRenew, .billingRecovery, signed: 50, transaction: Self.transaction("1001", expires: 80))))
        #expect(state.status == .active && state.gracePeriodEndsAt == nil)
        #expect(effects.contains(.entitlementGranted(productId: "pro_monthly", expiresAt: Self.at(80))))
    }

    @Test func billingRetryThenExpiryAndVoluntaryCancelThenResubscribe() {
        var state = Self.subscribed()
        (state, _) = unwrap(SubscriptionMachine.apply(state, Self.notification(.didFailToRenew, signed: 30)))
        #expect(state.status == .billingRetry && !state.entitles(at: Self.at(31)))
        (state, _) = unwrap(SubscriptionMachine.apply(state, Self.notification(.expired, .billingRetry, signed: 90)))
        #expect(state.status == .expired && !state.autoRenew)

        var other = Self.subscribed()
        (other, _) = unwrap(
            SubscriptionMachine.apply(
                other,
                Self.notification(
                    .didChangeRenewalStatus, .autoRenewDisabled, signed: 10, renewal: Self.renewal(autoRenew: false))))
        #expect(!other.autoRenew && other.status == .active)
        (other, _) = unwrap(SubscriptionMachine.apply(other, Self.notification(.expired, .voluntary, signed: 30)))
        #expect(other.status == .expired)
        let effects: [SubscriptionMachine.Effect]
        (other, effects) = unwrap(
            SubscriptionMachine.apply(
                other,
                Self.notification(
                    .subscribed, .resubscribe, signed: 40, transaction: Self.transaction("1005", expires: 70),
                    renewal: Self.renewal())))
        #expect(other.status == .active && other.autoRenew)
        #expect(effects.contains(.statusChanged(from: .expired, to: .active)))
    }

    /// A late DID_RENEW cannot undo a REFUND; REFUND_REVERSED reinstates exactly what was
    /// reversed.
    @Test func refundRevokesAndALateRenewalCannotUndoIt() {
        var state = Self.subscribed()
        var effects: [SubscriptionMachine.Effect]
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(
                    .refund, signed: 10, transaction: Self.transaction("1000", expires: 30, revoked: true))))
        #expect(state.status == .revoked && state.revokedTransactionId == "1000")
        #expect(
            effects == [.statusChanged(from: .active, to: .revoked), .entitlementRemoved(productId: "pro_monthly")])
        let late = SubscriptionMachine.apply(
            state, Self.notification(.didRenew, signed: 9, transaction: Self.transaction("1001", expires: 60)))
        #expect(late.1 == [.stale])
        #expect(late.0 == state)
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(.refundReversed, signed: 12, transaction: Self.transaction("1000", expires: 30))))
        #expect(state.status == .active && state.revokedTransactionId == nil)
        #expect(effects.contains(.entitlementGranted(productId: "pro_monthly", expiresAt: Self.at(30))))
    }

    /// A late EXPIRED cannot undo a renewal signed after it.
    @Test func aLateExpiryIsStale() {
        var state = Self.subscribed()
        (state, _) = unwrap(
            SubscriptionMachine.apply(
                state, Self.notification(.didRenew, signed: 30, transaction: Self.transaction("1001", expires: 60))))
        let (after, effects) = SubscriptionMachine.apply(state, Self.notification(.expired, .voluntary, signed: 29))
        #expect(effects == [.stale])
        #expect(after?.status == .active)
    }

    /// One entitlement per subscription: an upgrade switches at once, a downgrade at renewal.
    @Test func upgradeIsImmediateAndDowngradeWaitsForTheRenewal() {
        var state = Self.subscribed()
        var effects: [SubscriptionMachine.Effect]
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(
                    .didChangeRenewalPref, .upgrade, signed: 5,
                    transaction: Self.transaction("1001", product: "pro_yearly", expires: 370),
                    renewal: Self.renewal(next: "pro_yearly"))))
        #expect(state.productId == "pro_yearly" && state.expiresAt == Self.at(370))
        #expect(
            effects == [
                .entitlementRemoved(productId: "pro_monthly"),
                .entitlementGranted(productId: "pro_yearly", expiresAt: Self.at(370)),
            ])
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(
                    .didChangeRenewalPref, .downgrade, signed: 20, renewal: Self.renewal(next: "basic_yearly"))))
        #expect(state.productId == "pro_yearly" && state.nextProductId == "basic_yearly")
        #expect(effects.isEmpty)
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(
                    .didRenew, signed: 370, transaction: Self.transaction("1002", product: "basic_yearly", expires: 735)
                )))
        #expect(state.productId == "basic_yearly")
        #expect(
            effects == [
                .entitlementRemoved(productId: "pro_yearly"),
                .entitlementGranted(productId: "basic_yearly", expiresAt: Self.at(735)),
            ])
    }

    @Test func familySharingRevokeRemovesAccess() {
        let (state, effects) = SubscriptionMachine.apply(
            Self.subscribed(), Self.notification(.revoke, signed: 3, transaction: Self.transaction("1000", expires: 30))
        )
        #expect(state?.status == .revoked)
        #expect(effects.contains(.entitlementRemoved(productId: "pro_monthly")))
    }

    /// A1 (issue 33): a refund or revoke of an older period never ends the current one; one of
    /// the current period does. The refund of the older period arrives before or after the
    /// current period's renewal; its REFUND_REVERSED changes nothing.
    @Test(arguments: [NotificationType.refund, .revoke], [true, false])
    func aRefundOfAnOlderPeriodKeepsTheCurrentOne(type: NotificationType, renewalFirst: Bool) {
        var state = Self.subscribed()
        let renewal = Self.notification(.didRenew, signed: 30, transaction: Self.transaction("1001", expires: 60))
        let refundOfTheFirst = Self.notification(
            type, signed: renewalFirst ? 40 : 35, transaction: Self.transaction("1000", expires: 30, revoked: true))
        (state, _) = unwrap(SubscriptionMachine.apply(state, renewal))
        var effects: [SubscriptionMachine.Effect]
        (state, effects) = unwrap(SubscriptionMachine.apply(state, refundOfTheFirst))
        #expect(state.status == .active, "the current period stays")
        #expect(state.expiresAt == Self.at(60))
        #expect(state.revokedTransactionId == nil)
        #expect(effects.count == 1)
        if case .ignored(let reason)? = effects.first { #expect(reason.contains("older period")) }
        let reversed = SubscriptionMachine.apply(
            state, Self.notification(.refundReversed, signed: 45, transaction: Self.transaction("1000", expires: 30)))
        #expect(reversed.0?.status == .active)
        // The current period's own refund revokes it.
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                Self.notification(type, signed: 50, transaction: Self.transaction("1001", expires: 60, revoked: true))))
        #expect(state.status == .revoked && state.revokedTransactionId == "1001")
        #expect(effects.contains(.entitlementRemoved(productId: "pro_monthly")))
    }

    /// Issue 33: the first transaction, submitted by the device or notified, is the latest.
    @Test func theFirstTransactionIsTheLatest() {
        let submitted = SubscriptionMachine.apply(
            nil,
            SubscriptionEvent(
                .submittedTransaction, signedDate: Self.at(0), transaction: Self.transaction("1000", expires: 30)))
        #expect(submitted.0?.latestTransactionId == "1000")
        #expect(Self.subscribed().latestTransactionId == "1000")
        // A refund without a transaction then revokes that one.
        let refunded = SubscriptionMachine.apply(submitted.0, Self.notification(.refund, signed: 5))
        #expect(refunded.0?.status == .revoked && refunded.0?.revokedTransactionId == "1000")
    }

    @Test func recordedButIgnoredTypesChangeNothing() {
        let state = Self.subscribed()
        for type in [
            NotificationType.test, .consumptionRequest, .refundDeclined, .renewalExtension, .externalPurchaseToken,
            .metadataUpdate, .migration, .priceChange, .rescindConsent, .oneTimeCharge,
            NotificationType(rawValue: "SOMETHING_APPLE_ADDS_LATER"),
        ] {
            let (after, effects) = SubscriptionMachine.apply(state, Self.notification(type, signed: 5))
            #expect(effects.count == 1)
            if case .ignored = effects.first {} else { Issue.record("\(type.rawValue) was not ignored: \(effects)") }
            #expect(after?.status == state.status && after?.expiresAt == state.expiresAt)
            #expect(after?.signedDate == Self.at(5))
        }
    }

    /// Every type and subtype Apple documents, on every status: applied or ignored, never a
    /// crash, and never a stale answer for a newer event.
    @Test func everyTypeAndSubtypeIsHandledOnEveryStatus() {
        for status in SubscriptionStatus.allCases {
            var base = Self.subscribed()
            base.status = status
            for type in NotificationType.knownValues {
                for subtype in [nil] + NotificationSubtype.knownValues {
                    let (after, effects) = SubscriptionMachine.apply(
                        base,
                        Self.notification(
                            type, subtype, signed: 1, transaction: Self.transaction("1009", expires: 60),
                            renewal: Self.renewal()))
                    #expect(after != nil)
                    #expect(!effects.contains(.stale))
                    #expect(after.map { $0.signedDate == Self.at(1) } == true)
                }
            }
        }
    }

    @Test func submittedTransactionsMoveForwardNeverBack() {
        var state = Self.subscribed()
        var effects: [SubscriptionMachine.Effect]
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                SubscriptionEvent(
                    .submittedTransaction, signedDate: Self.at(31), transaction: Self.transaction("1001", expires: 60)))
        )
        #expect(state.expiresAt == Self.at(60))
        #expect(effects == [.entitlementGranted(productId: "pro_monthly", expiresAt: Self.at(60))])
        // An older period submitted again changes nothing.
        (state, effects) = unwrap(
            SubscriptionMachine.apply(
                state,
                SubscriptionEvent(
                    .submittedTransaction, signedDate: Self.at(32), transaction: Self.transaction("1000", expires: 30)))
        )
        #expect(state.expiresAt == Self.at(60) && effects.isEmpty)
        // A revoked one revokes.
        (state, _) = unwrap(
            SubscriptionMachine.apply(
                state,
                SubscriptionEvent(
                    .submittedTransaction, signedDate: Self.at(33),
                    transaction: Self.transaction("1001", expires: 60, revoked: true))))
        #expect(state.status == .revoked)
    }

    /// After expiry an older period, even a refunded one, moves nothing back.
    @Test func olderPeriodsNeverMoveAnExpiredOrCurrentSubscriptionBack() {
        var state = Self.subscribed()
        (state, _) = unwrap(
            SubscriptionMachine.apply(
                state, Self.notification(.didRenew, signed: 30, transaction: Self.transaction("1001", expires: 60))))
        (state, _) = unwrap(SubscriptionMachine.apply(state, Self.notification(.expired, .voluntary, signed: 60)))
        let (afterOld, oldEffects) = SubscriptionMachine.apply(
            state,
            SubscriptionEvent(
                .submittedTransaction, signedDate: Self.at(61), transaction: Self.transaction("1000", expires: 30)))
        #expect(afterOld?.expiresAt == Self.at(60) && afterOld?.status == .expired && oldEffects.isEmpty)
        let (afterRefunded, _) = SubscriptionMachine.apply(
            state,
            SubscriptionEvent(
                .submittedTransaction, signedDate: Self.at(62),
                transaction: Self.transaction("1000", expires: 30, revoked: true)))
        #expect(afterRefunded?.status == .expired)
    }

    @Test func applesStatusesMapAndUnknownOnesAreIgnored() {
        let state = Self.subscribed()
        for (code, status) in [
            (1, SubscriptionStatus.active), (2, .expired), (3, .billingRetry), (4, .gracePeriod), (5, .revoked),
        ] {
            let (after, _) = SubscriptionMachine.apply(
                state,
                SubscriptionEvent(
                    .appleStatus(code), signedDate: Self.at(2), renewalInfo: StoreRenewal(apple: Self.renewal())))
            #expect(after?.status == status)
        }
        let (after, effects) = SubscriptionMachine.apply(
            state, SubscriptionEvent(.appleStatus(9), signedDate: Self.at(2)))
        #expect(after == state)
        #expect(effects == [.ignored("unknown Apple status 9")])
    }

    @Test func nothingStartsWithoutATransaction() {
        let (state, effects) = SubscriptionMachine.apply(nil, Self.notification(.didFailToRenew, signed: 1))
        #expect(state == nil)
        #expect(effects.count == 1)
    }

    @Test func accessByStatus() {
        var state = Self.subscribed()
        for status in SubscriptionStatus.allCases {
            state.status = status
            #expect(state.entitles(at: Self.at(1)) == status.entitles)
        }
        state.status = .active
        #expect(!state.entitles(at: Self.at(31)))
    }

    func unwrap(_ result: (SubscriptionState?, [SubscriptionMachine.Effect])) -> (
        SubscriptionState, [SubscriptionMachine.Effect]
    ) {
        (result.0!, result.1)
    }
}

extension SubscriptionMachineTests {
    /// A store's snapshot carrying a period that had already ended when it was applied (Stripe's
    /// `invoice.paid` of last month arriving after this month's) never moves the subscription
    /// back; an immediate change to a shorter period that has not ended is taken.
    @Test func anEndedOlderPeriodNeverShortensANewerOne() {
        let renewed = SubscriptionMachine.apply(
            Self.subscribed(),
            SubscriptionEvent(
                .storeState(.active, autoRenew: true), signedDate: Self.at(31),
                transaction: Self.transaction("1001", expires: 60))
        ).0
        #expect(renewed?.expiresAt == Self.at(60))
        // The first period's invoice again, later: its period ended at day 30.
        let (late, _) = SubscriptionMachine.apply(
            renewed,
            SubscriptionEvent(
                .storeState(.active, autoRenew: true), signedDate: Self.at(32),
                transaction: Self.transaction("1000", expires: 30)))
        #expect(late?.expiresAt == Self.at(60))
        #expect(late?.latestTransactionId == "1001")
        #expect(late?.status == .active)
        // The same through Apple's status: the same rule.
        let (status, _) = SubscriptionMachine.apply(
            renewed,
            SubscriptionEvent(
                .appleStatus(1), signedDate: Self.at(33), transaction: Self.transaction("1000", expires: 30)))
        #expect(status?.expiresAt == Self.at(60))
        // An immediate change to a product whose period ends sooner but has not ended: taken.
        let (changed, _) = SubscriptionMachine.apply(
            renewed,
            SubscriptionEvent(
                .storeState(.active, autoRenew: true), signedDate: Self.at(34),
                transaction: Self.transaction("1002", product: "pro_weekly", expires: 41)))
        #expect(changed?.expiresAt == Self.at(41))
        #expect(changed?.productId == "pro_weekly")
    }
}
