import AppStoreAdapter
import AppStoreModels
import Foundation
import Testing

@testable import StoreKeeperCore

/// Every notification type and subtype of Apple's library v6.0.0 is applied or recorded with
/// a reason — none silently dropped, none taken for "a type this server does not know".
@Suite struct NotificationPlannerTests {
    static let transaction = StoreTransaction.appStore(
        transactionId: "2000000000000002", originalTransactionId: "2000000000000001", productId: "pro_monthly")

    static func record(_ type: NotificationType, _ subtype: NotificationSubtype?, withData: Bool) -> NotificationRecord
    {
        var record = NotificationRecord(
            notificationUUID: UUID().uuidString, type: type.rawValue, subtype: subtype?.rawValue,
            notice: StoreNotice(apple: type, subtype), signedDate: 1, environment: "Production")
        if withData {
            record.transaction = transaction
            record.appTransactionId = "705000000000000001"
            record.externalToken = ExternalToken(externalPurchaseId: "abc")
        }
        return record
    }

    @Test func everyTypeAndSubtypeIsAppliedOrIgnoredForAReason() {
        let subtypes: [NotificationSubtype?] = [nil] + NotificationSubtype.knownValues
        #expect(NotificationType.knownValues.count == 23)
        for type in NotificationType.knownValues {
            for subtype in subtypes {
                for withData in [true, false] {
                    let record = Self.record(type, subtype, withData: withData)
                    switch NotificationPlanner.action(for: record) {
                    case .ignored(let reason):
                        #expect(!reason.isEmpty)
                        #expect(!reason.contains("does not know"), "\(type.rawValue) \(subtype?.rawValue ?? "-")")
                        // A type that carries data is applied when it has it.
                        if withData {
                            #expect(
                                [.refundDeclined, .renewalExtension, .test, .metadataUpdate, .migration, .priceChange]
                                    .contains(type), "\(type.rawValue) with its data is ignored: \(reason)")
                        }
                    default:
                        #expect(withData, "\(type.rawValue) applied without its data")
                        // Anything applied has a subject to order it by.
                        #expect(record.subject != nil)
                    }
                }
            }
        }
        // An unknown type is recorded, not dropped.
        if case .ignored(let reason) = NotificationPlanner.action(
            for: Self.record(.init(rawValue: "NEW_2027"), nil, withData: true))
        {
            #expect(reason.contains("NEW_2027"))
        } else {
            Issue.record("an unknown type must be ignored with a reason")
        }
    }

    @Test func rescindConsentAndExternalTokensHaveTheirOwnSubjects() {
        #expect(Self.record(.rescindConsent, nil, withData: false).subject == nil)
        var rescind = Self.record(.rescindConsent, nil, withData: false)
        rescind.appTransactionId = "705"
        #expect(rescind.subject == "consent:705")
        var token = Self.record(.externalPurchaseToken, .unreported, withData: false)
        token.externalToken = ExternalToken(externalPurchaseId: "SANDBOX1")
        #expect(token.subject == "external:SANDBOX1")
    }
}
