import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Crypto
import Foundation
import StoreKeeperCatalog
import Testing

@testable import LocalAppStore

/// The local App Store's behaviour on a frozen clock that only tests move.
@Suite struct LocalAppStoreEngineTests {
    static let pki = try! ApplePKI.generate(name: "Engine Test")
    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
              - { id: remove_ads, type: non_consumable, grants: { entitlement: no_ads } }
              - { id: pro_yearly, type: auto_renewable, group: pro, period: P1Y, grants: { entitlement: pro } }
              - { id: pro_monthly, type: auto_renewable, group: pro, period: P1M, grants: { entitlement: pro } }
              - { id: lite_monthly, type: auto_renewable, group: pro, period: P1M, grants: { entitlement: lite } }
              - { id: season_pass, type: non_renewing, duration: P30D, grants: { entitlement: season } }
            """)
    static let start = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01

    static func store(grace: TimeInterval? = 16 * 86_400) -> LocalAppStore {
        LocalAppStore(
            configuration: .init(catalog: catalog, gracePeriod: grace), pki: pki,
            clock: StoreClock(start: start, scale: 0))
    }

    static let verifier = try! SignedDataVerifier(
        .init(trustedRoots: pki.trustRootsDER, bundleId: "com.example.app", appAppleId: 1_234_567_890))

    func types(_ store: LocalAppStore) async -> [String] {
        await store.notifications.map {
            [$0.payload.notificationType?.rawValue, $0.payload.subtype?.rawValue].compactMap { $0 }.joined(
                separator: "/")
        }
    }

    @Test func consumablePurchaseIsSignedAndLeavesTheReceiptOnceFinished() async throws {
        let store = Self.store()
        let result = try await store.buy(
            "alice", items: [.init(productId: "coins_60", quantity: 3)], appAccountToken: UUID())
        #expect(result.signedTransactions.count == 1)
        let verified = try await Self.verifier.verifyTransaction(result.signedTransactions[0])
        #expect(verified.quantity == 3)
        #expect(verified.price == 2970)
        #expect(verified.environment == .production)
        let receiptVerifier = try AppReceiptVerifier(trustedRoots: Self.pki.trustRootsDER, bundleId: "com.example.app")
        #expect(try await receiptVerifier.verify(result.receipt).inAppPurchases.count == 1)
        try await store.finish(verified.transactionId!)
        #expect(try await receiptVerifier.verify(try await store.receipt(for: "alice")).inAppPurchases.isEmpty)
        // Still visible to the Server API (history v2 keeps finished consumables).
        #expect(await store.history(of: "alice").count == 1)
        #expect(await types(store) == ["ONE_TIME_CHARGE"])
        // The notification verifies, nested transaction included.
        let notification = try await Self.verifier.verifyNotification(await store.notifications[0].signedPayload)
        #expect(notification.transaction?.transactionId == verified.transactionId)
    }

    @Test func receiptCarriesTheDeviceHashAsADeviceChecksIt() async throws {
        let store = Self.store()
        let result = try await store.buy("hash", items: [.init(productId: "remove_ads")])
        let receipt = try await AppReceiptVerifier(trustedRoots: Self.pki.trustRootsDER).verify(result.receipt)
        let device = try #require(await store.customers["hash"]?.deviceId)
        let deviceBytes = withUnsafeBytes(of: device.uuid) { Array($0) }
        let expected = Array(
            Insecure.SHA1.hash(data: deviceBytes + (receipt.opaqueValue ?? []) + (receipt.bundleIdValueBytes ?? [])))
        #expect(receipt.sha1Hash == expected)
        #expect(receipt.bundleIdValueBytes?.first == 0x0C)
    }

    @Test func mergedPaymentHasOneReceiptWithBothEntries() async throws {
        let store = Self.store()
        let result = try await store.buy("bob", items: [.init(productId: "coins_60"), .init(productId: "remove_ads")])
        #expect(result.transactions.map(\.productId) == ["coins_60", "remove_ads"])
        let receipt = try await AppReceiptVerifier(trustedRoots: Self.pki.trustRootsDER).verify(result.receipt)
        #expect(Set(receipt.inAppPurchases.compactMap(\.productId)) == ["coins_60", "remove_ads"])
    }

    @Test func askToBuyChargesOnlyWhenApproved() async throws {
        let store = Self.store()
        let asked = try await store.buy("kid", items: [.init(productId: "remove_ads")], askToBuy: true)
        #expect(asked.transactions.isEmpty)
        let pendingId = try #require(asked.pendingId)
        #expect(await store.history(of: "kid").isEmpty)
        let approved = try await store.approve(pendingId)
        #expect(approved.transactions.first?.productId == "remove_ads")
        await #expect(throws: LocalAppStore.StoreError.self) { try await store.approve(pendingId) }
        let declined = try await store.buy("kid", items: [.init(productId: "coins_60")], askToBuy: true)
        try await store.decline(declined.pendingId!)
        #expect(await store.history(of: "kid").count == 1)
    }

    @Test func badPurchasesAreRefused() async {
        let store = Self.store()
        await #expect(throws: LocalAppStore.StoreError.unknownProduct("nope")) {
            try await store.buy("a", items: [.init(productId: "nope")])
        }
        await #expect(throws: LocalAppStore.StoreError.self) { try await store.buy("a", items: []) }
        await #expect(throws: LocalAppStore.StoreError.self) {
            try await store.buy("a", items: [.init(productId: "coins_60", quantity: 11)])
        }
        await #expect(throws: LocalAppStore.StoreError.self) {
            try await store.buy("a", items: [.init(productId: "remove_ads", quantity: 2)])
        }
    }

    @Test func subscriptionRenewsThreeTimes() async throws {
        let store = Self.store()
        let bought = try await store.buy("carol", items: [.init(productId: "pro_monthly")])
        let original = bought.transactions[0].originalTransactionId!
        await store.advance(by: 95 * 86_400)  // Jan 1 → Apr 6: renewals on Feb 1, Mar 1, Apr 1
        let history = await store.history(of: "carol")
        #expect(history.count == 4)
        #expect(Set(history.map(\.payload.originalTransactionId)) == [original])
        #expect(history.dropFirst().allSatisfy { $0.payload.transactionReason == .renewal })
        #expect(Set(history.compactMap(\.payload.webOrderLineItemId)).count == 4)
        let expiries = history.compactMap(\.payload.expiresDate).map(Date.init(milliseconds:))
        #expect(expiries.last == Date(timeIntervalSince1970: 1_777_593_600))  // 2026-05-01
        #expect(await store.subscription(original)?.status == .active)
        #expect(await types(store) == ["SUBSCRIBED/INITIAL_BUY", "DID_RENEW", "DID_RENEW", "DID_RENEW"])
    }

    @Test func billingFailureGraceRecovery() async throws {
        let store = Self.store()
        let original = try await store.buy("dave", items: [.init(productId: "pro_monthly")]).transactions[0]
            .originalTransactionId!
        await store.setBillingFails("dave", true)
        await store.advance(by: 32 * 86_400)  // renewal due Feb 1 fails: grace until Feb 17
        #expect(await store.subscription(original)?.status == .billingGracePeriod)
        let renewal = try await Self.verifier.verifyRenewalInfo(try await store.signRenewalInfo(original))
        #expect(renewal.gracePeriodExpiresDate != nil)
        #expect(renewal.isInBillingRetryPeriod == true)
        await store.advance(by: 20 * 86_400)  // grace over: billing retry
        #expect(await store.subscription(original)?.status == .billingRetry)
        await store.setBillingFails("dave", false)
        await store.advance(by: 86_400)
        #expect(await store.subscription(original)?.status == .active)
        #expect(
            await types(store) == [
                "SUBSCRIBED/INITIAL_BUY", "DID_FAIL_TO_RENEW/GRACE_PERIOD", "GRACE_PERIOD_EXPIRED",
                "DID_RENEW/BILLING_RECOVERY",
            ])
        // Statuses travel inside the notifications.
        #expect(
            await store.notifications.map(\.payload.data?.status) == [
                .active, .billingGracePeriod, .billingRetry, .active,
            ])
    }

    @Test func billingRetryRunsOutWithoutGrace() async throws {
        let store = Self.store(grace: nil)
        let original = try await store.buy("erin", items: [.init(productId: "pro_monthly")]).transactions[0]
            .originalTransactionId!
        await store.setBillingFails("erin", true)
        await store.advance(by: 100 * 86_400)
        #expect(await store.subscription(original)?.status == .expired)
        #expect(await types(store) == ["SUBSCRIBED/INITIAL_BUY", "DID_FAIL_TO_RENEW", "EXPIRED/BILLING_RETRY"])
    }

    @Test func cancelThenExpireThenResubscribe() async throws {
        let store = Self.store()
        let original = try await store.buy("fay", items: [.init(productId: "pro_monthly")]).transactions[0]
            .originalTransactionId!
        try await store.setAutoRenew(original, false)
        await store.advance(by: 40 * 86_400)
        #expect(await store.subscription(original)?.status == .expired)
        let again = try await store.buy("fay", items: [.init(productId: "pro_monthly")])
        #expect(again.transactions[0].originalTransactionId == original)
        #expect(
            await types(store) == [
                "SUBSCRIBED/INITIAL_BUY", "DID_CHANGE_RENEWAL_STATUS/AUTO_RENEW_DISABLED", "EXPIRED/VOLUNTARY",
                "SUBSCRIBED/RESUBSCRIBE",
            ])
        await #expect(throws: LocalAppStore.StoreError.self) {
            try await store.buy("fay", items: [.init(productId: "pro_yearly")])
        }
    }

    @Test func upgradeIsImmediateDowngradeAtRenewal() async throws {
        let store = Self.store()
        let first = try await store.buy("gus", items: [.init(productId: "pro_monthly")]).transactions[0]
        let original = first.originalTransactionId!
        try await store.changeProduct(original, to: "pro_yearly")  // higher level: upgrade now
        #expect(await store.subscription(original)?.productId == "pro_yearly")
        #expect(await store.transaction(first.transactionId!)?.payload.isUpgraded == true)
        try await store.changeProduct(original, to: "pro_monthly")  // lower level, other period: next renewal
        #expect(await store.subscription(original)?.productId == "pro_yearly")
        #expect(await store.subscription(original)?.autoRenewProductId == "pro_monthly")
        await store.advance(by: 370 * 86_400)
        #expect(await store.subscription(original)?.productId == "pro_monthly")
        #expect(
            Array(await types(store).prefix(4)) == [
                "SUBSCRIBED/INITIAL_BUY", "DID_CHANGE_RENEWAL_PREF/UPGRADE", "DID_CHANGE_RENEWAL_PREF/DOWNGRADE",
                "DID_RENEW",
            ])
        await #expect(throws: LocalAppStore.StoreError.self) { try await store.changeProduct(original, to: "coins_60") }
    }

    @Test func refundsDeclinesAndReversals() async throws {
        let store = Self.store()
        let coins = try await store.buy("hal", items: [.init(productId: "coins_60")]).transactions[0].transactionId!
        try await store.requestRefund(coins)
        try await store.refund(coins, percentage: 50_000)
        let refunded = try await Self.verifier.verifyTransaction(try await store.signTransaction(coins))
        #expect(refunded.revocationDate != nil)
        #expect(refunded.revocationType == .refundProrated)
        try await store.reverseRefund(coins)
        #expect(try await Self.verifier.verifyTransaction(try await store.signTransaction(coins)).revocationDate == nil)
        let sub = try await store.buy("hal", items: [.init(productId: "pro_monthly")]).transactions[0]
        try await store.refund(sub.transactionId!)
        #expect(await store.subscription(sub.originalTransactionId!)?.status == .revoked)
        try await store.declineRefund(coins)
        #expect(
            await types(store) == [
                "ONE_TIME_CHARGE", "CONSUMPTION_REQUEST", "REFUND", "REFUND_REVERSED", "SUBSCRIBED/INITIAL_BUY",
                "REFUND",
                "REFUND_DECLINED",
            ])
        #expect(await store.notifications[1].payload.data?.consumptionRequestReason == .unintendedPurchase)
    }

    @Test func familySharingRevocation() async throws {
        let store = Self.store()
        let unlock = try await store.buy("kim", items: [.init(productId: "remove_ads")]).transactions[0].transactionId!
        try await store.revokeFamilySharing(unlock)
        let revoked = try await Self.verifier.verifyTransaction(try await store.signTransaction(unlock))
        #expect(revoked.revocationType == .familyRevoke)
        #expect(revoked.inAppOwnershipType == .familyShared)
        #expect(await types(store) == ["ONE_TIME_CHARGE", "REVOKE"])
        let coins = try await store.buy("kim", items: [.init(productId: "coins_60")]).transactions[0].transactionId!
        await #expect(throws: LocalAppStore.StoreError.self) { try await store.revokeFamilySharing(coins) }
    }

    @Test func renewalDateExtensionFollowsApplesLimits() async throws {
        let store = Self.store()
        let original = try await store.buy("ivy", items: [.init(productId: "pro_monthly")]).transactions[0]
            .originalTransactionId!
        let before = await store.subscription(original)!.expires
        let response = try await store.extendRenewalDate(original, days: 10, requestIdentifier: "r1")
        #expect(response.effectiveDate == before.addingTimeInterval(10 * 86_400).milliseconds)
        _ = try await store.extendRenewalDate(original, days: 5, requestIdentifier: "r2")
        await #expect(throws: LocalAppStore.ExtensionRefusal.maximum) {
            try await store.extendRenewalDate(original, days: 5, requestIdentifier: "r3")
        }
        await #expect(throws: LocalAppStore.StoreError.self) {
            try await store.extendRenewalDate(original, days: 91, requestIdentifier: "r4")
        }
        #expect(await types(store).last == "RENEWAL_EXTENDED")
    }

    @Test func droppedAppAccountTokenFault() async throws {
        let store = Self.store()
        var faults = Faults()
        faults.dropAppAccountToken = true
        await store.setFaults(faults)
        let id = try await store.buy("jo", items: [.init(productId: "remove_ads")], appAccountToken: UUID())
            .transactions[0]
            .transactionId!
        #expect(try await Self.verifier.verifyTransaction(try await store.signTransaction(id)).appAccountToken == nil)
    }
}
