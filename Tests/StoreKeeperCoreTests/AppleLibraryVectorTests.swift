import AppStoreAdapter
import AppStoreModels
import Foundation
import Testing

@testable import StoreKeeperCore

/// Apple's own 2025–2026 payloads, as the test resources of Apple's Swift library v6.0.0 hold
/// them (`Tests/AppStoreServerLibraryTests/resources/models/…`, copied as data): decoded by our
/// decoders and taken through our decisions.
@Suite struct AppleLibraryVectorTests {
    /// `signedTransactionWithRevocation.json`.
    static let revoked = #"""
        {"originalTransactionId":"12345","transactionId":"23456","webOrderLineItemId":"34343","bundleId":"com.example",
         "productId":"com.example.product","subscriptionGroupIdentifier":"55555","purchaseDate":1698148900000,
         "originalPurchaseDate":1698148800000,"expiresDate":1698149000000,"quantity":1,"type":"Auto-Renewable Subscription",
         "appAccountToken":"7e3fb20b-4cdb-47cc-936d-99d65f608138","inAppOwnershipType":"PURCHASED","signedDate":1698148900000,
         "revocationReason":1,"revocationDate":1698148950000,"isUpgraded":true,"offerType":1,"offerIdentifier":"abc.123",
         "environment":"LocalTesting","storefront":"USA","storefrontId":"143441","transactionReason":"PURCHASE","price":10990,
         "currency":"USD","offerDiscountType":"PAY_AS_YOU_GO","appTransactionId":"71134","offerPeriod":"P1Y",
         "revocationType":"REFUND_PRORATED","revocationPercentage":50000}
        """#

    /// `signedTransaction.json` (its commitment part; Advanced Commerce omitted).
    static let committed = #"""
        {"transactionId":"23456","originalTransactionId":"12345","productId":"com.example.product",
         "purchaseDate":1698148900000,"expiresDate":1698149000000,"type":"Auto-Renewable Subscription","price":10990,
         "currency":"USD","appTransactionId":"71134","billingPlanType":"MONTHLY",
         "commitmentInfo":{"billingPeriodNumber":3,"commitmentExpiresDate":1698150000000,"commitmentPrice":119880,"totalBillingPeriods":12}}
        """#

    /// `signedRescindConsentNotification.json`.
    static let rescind = #"""
        {"notificationType":"RESCIND_CONSENT","notificationUUID":"002e14d5-51f5-4503-b5a8-c3a1af68eb20",
         "appData":{"appAppleId":41234,"bundleId":"com.example","environment":"LocalTesting",
                    "signedAppTransactionInfo":"signed_app_transaction_info_value"},
         "version":"2.0","signedDate":1698148900000}
        """#

    /// `signedExternalPurchaseTokenNotificationWithTokenType.json`.
    static let externalToken = #"""
        {"notificationType":"EXTERNAL_PURCHASE_TOKEN","subtype":"UNREPORTED","notificationUUID":"002e14d5-51f5-4503-b5a8-c3a1af68eb20",
         "version":"2.0","signedDate":1698148900000,
         "externalPurchaseToken":{"externalPurchaseId":"b2158121-7af9-49d4-9561-1f588205523e","tokenCreationDate":1698148950000,
                                  "appAppleId":55555,"bundleId":"com.example","tokenType":"ACQUISITION"}}
        """#

    @Test func aProratedRevocationIsItsShare() throws {
        let transaction = StoreTransaction(
            apple: try JWSTransactionDecodedPayload.decode(json: Array(Self.revoked.utf8)))
        #expect(transaction.revocationType == .refundProrated)
        #expect(transaction.revocationPercentage == 50_000)
        let revocation = RefundPlanner.Revocation(transaction)
        #expect(revocation.share == 50_000 && revocation.isPartial)
        #expect(RefundPlanner.portion(of: 60, share: revocation.share) == 30)
        #expect(transaction.appTransactionId == "71134")
    }

    @Test func aCommitmentTransactionMovesTheMachine() throws {
        let transaction = StoreTransaction(
            apple: try JWSTransactionDecodedPayload.decode(json: Array(Self.committed.utf8)))
        let (state, _) = SubscriptionMachine.apply(
            nil,
            SubscriptionEvent(
                .apple(.didRenew), signedDate: Date(timeIntervalSince1970: 1_698_148_900),
                transaction: transaction))
        #expect(state?.commitment?.period == 3)
        #expect(state?.commitment?.periods == 12)
        #expect(state?.commitment?.expiresAt == Date(timeIntervalSince1970: 1_698_150_000))
        #expect(state?.commitment?.isBinding == true)
        #expect(state?.willRenew == true)
    }

    @Test func rescindConsentAndExternalTokenNotificationsAreRecordedWithTheirSubjects() throws {
        let rescind = try ResponseBodyV2DecodedPayload.decode(json: Array(Self.rescind.utf8))
        #expect(rescind.appData?.signedAppTransactionInfo == "signed_app_transaction_info_value")
        #expect(rescind.subtype == nil)
        let app = AppTransaction(appTransactionId: "71134", bundleId: "com.example")
        let record = try #require(
            NotificationRecord(payload: rescind, transaction: nil, renewalInfo: nil, appTransaction: app))
        #expect(record.subject == "consent:71134")
        #expect(record.environment == "LocalTesting")
        #expect(NotificationPlanner.action(for: record) == .rescindConsent)

        let token = try ResponseBodyV2DecodedPayload.decode(json: Array(Self.externalToken.utf8))
        let tokenRecord = try #require(NotificationRecord(payload: token, transaction: nil, renewalInfo: nil))
        #expect(tokenRecord.externalToken?.tokenType == "ACQUISITION")
        #expect(tokenRecord.subject == "external:b2158121-7af9-49d4-9561-1f588205523e")
        #expect(tokenRecord.environment == "Production")
        #expect(NotificationPlanner.action(for: tokenRecord) == .externalPurchaseToken)
    }
}
