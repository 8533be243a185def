import AppStoreModels
import Foundation
import Testing

/// Every Apple payload decodes from Apple's JSON, ignores unknown fields, keeps unknown enum
/// values, and re-encodes to the same JSON.
@Suite struct ModelRoundTripTests {
    /// Decodes `json`, re-encodes, and checks the result equals `json` minus `unknownKeys`.
    func roundTrip<T: Codable & Equatable>(
        _ type: T.Type, _ json: String, unknownKeys: [String] = ["someFutureField"],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> T {
        let decoded = try JSONDecoder().decode(T.self, from: Data(json.utf8))
        let encoded = try JSONEncoder().encode(decoded)
        let again = try JSONDecoder().decode(T.self, from: encoded)
        #expect(again == decoded, sourceLocation: sourceLocation)
        var expected = try JSONSerialization.jsonObject(with: Data(json.utf8)) as! [String: Any]
        for key in unknownKeys { expected[key] = nil }
        let actual = try JSONSerialization.jsonObject(with: encoded) as! [String: Any]
        // Compare canonical serializations: Foundation's dictionary equality on Linux treats
        // JSON booleans and numbers inconsistently.
        func canonical(_ object: [String: Any]) throws -> String {
            String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
        }
        #expect(try canonical(actual) == canonical(expected), sourceLocation: sourceLocation)
        return decoded
    }

    @Test func transactionPayload() throws {
        let payload = try roundTrip(
            JWSTransactionDecodedPayload.self,
            """
            {"transactionId":"2000000511223344","originalTransactionId":"2000000500000001",
             "webOrderLineItemId":"2000000077665544","previousOriginalTransactionId":"1999","bundleId":"com.example.app",
             "productId":"com.example.pro.monthly","subscriptionGroupIdentifier":"21345678",
             "purchaseDate":1767225600000,"originalPurchaseDate":1764547200000,"expiresDate":1769904000000,
             "quantity":1,"type":"Auto-Renewable Subscription","appAccountToken":"7e3fb20b-4cdb-47cc-936d-99d65f608138",
             "inAppOwnershipType":"PURCHASED","signedDate":1767225605000,"revocationReason":1,"revocationDate":1767225609000,
             "revocationType":"REFUND_PRORATED","revocationPercentage":50000,"isUpgraded":false,"offerType":4,
             "offerIdentifier":"winback","offerDiscountType":"PAY_AS_YOU_GO","offerPeriod":"P1M","environment":"Production",
             "storefront":"DEU","storefrontId":"143443","transactionReason":"RENEWAL","currency":"EUR","price":4990,
             "appTransactionId":"705000000123456789","billingPlanType":"MONTHLY",
             "commitmentInfo":{"billingPeriodNumber":2,"totalBillingPeriods":12,"commitmentExpiresDate":1798761600000,
             "commitmentPrice":59880},"advancedCommerceInfo":{"nested":[1,"two",null,true,2.5]},
             "someFutureField":{"x":1}}
            """)
        #expect(payload.type == .autoRenewable)
        #expect(payload.price == 4990)
        #expect(payload.isRevoked)
        #expect(payload.revocationReason == .refundedDueToIssue)
        #expect(payload.offerType == .winBackOffer)
        #expect(payload.commitmentInfo?.totalBillingPeriods == 12)
    }

    @Test func unknownEnumValuesSurvive() throws {
        let payload = try roundTrip(
            JWSTransactionDecodedPayload.self,
            """
            {"type":"Quantum Subscription","inAppOwnershipType":"TELEPATHIC","offerType":99,"environment":"Moon",
             "revocationReason":7,"transactionReason":"GIFT","revocationType":"ASSIGNMENT_REVOKE",
             "offerDiscountType":"NEW","billingPlanType":"WEEKLY","someFutureField":1}
            """)
        #expect(payload.type?.rawValue == "Quantum Subscription")
        #expect(payload.type?.isKnown == false)
        #expect(payload.offerType?.rawValue == 99)
        #expect(payload.environment?.rawValue == "Moon")
        #expect(ProductType.consumable.isKnown)
    }

    @Test func idsStayStrings() throws {
        // A number where Apple sends a string id is a malformed payload, not silently coerced.
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(
                JWSTransactionDecodedPayload.self, from: Data(#"{"transactionId":2000000511223344}"#.utf8))
        }
        let big = try JSONDecoder().decode(
            JWSTransactionDecodedPayload.self, from: Data(#"{"transactionId":"99999999999999999999999"}"#.utf8))
        #expect(big.transactionId == "99999999999999999999999")
    }

    @Test func renewalInfoPayload() throws {
        let info = try roundTrip(
            JWSRenewalInfoDecodedPayload.self,
            """
            {"originalTransactionId":"1","productId":"pro","autoRenewProductId":"pro_yearly","autoRenewStatus":1,
             "expirationIntent":2,"isInBillingRetryPeriod":true,"gracePeriodExpiresDate":1,"priceIncreaseStatus":0,
             "offerType":1,"offerIdentifier":"o","offerDiscountType":"FREE_TRIAL","offerPeriod":"P3D","signedDate":2,
             "environment":"Sandbox","recentSubscriptionStartDate":3,"renewalDate":4,"renewalPrice":9990,"currency":"USD",
             "eligibleWinBackOfferIds":["a","b"],"appAccountToken":"u","appTransactionId":"7","renewalBillingPlanType":"BILLED_UPFRONT",
             "commitmentInfo":{"commitmentAutoRenewProductId":"p","commitmentAutoRenewStatus":0,
             "commitmentRenewalBillingPlanType":"MONTHLY","commitmentRenewalDate":5,"commitmentRenewalPrice":6},
             "advancedCommerceInfo":{"advancedCommercePriceIncreaseInfo":{"x":"y"}},"someFutureField":[]}
            """)
        #expect(info.autoRenewStatus == .on)
        #expect(info.expirationIntent == .billingError)
    }

    @Test func appTransactionPayload() throws {
        let app = try roundTrip(
            AppTransaction.self,
            """
            {"appAppleId":1234,"appTransactionId":"705","bundleId":"b","applicationVersion":"2","versionExternalIdentifier":9,
             "originalApplicationVersion":"1.0","originalPlatform":"visionOS","originalPurchaseDate":1,"preorderDate":2,
             "receiptCreationDate":3,"receiptType":"Xcode","deviceVerification":"AAA=","deviceVerificationNonce":"n",
             "someFutureField":null}
            """)
        #expect(app.originalPlatform == .visionOS)
        #expect(app.receiptType == .xcode)
    }

    @Test func notificationPayloads() throws {
        let data = try roundTrip(
            ResponseBodyV2DecodedPayload.self,
            """
            {"notificationType":"DID_FAIL_TO_RENEW","subtype":"GRACE_PERIOD","notificationUUID":"u-1","version":"2.0",
             "signedDate":1,"data":{"appAppleId":1,"bundleId":"b","bundleVersion":"7","environment":"Production",
             "signedTransactionInfo":"x.y.z","signedRenewalInfo":"a.b.c","status":4,
             "consumptionRequestReason":"FULFILLMENT_ISSUE"},"someFutureField":"f"}
            """)
        #expect(data.notificationType == .didFailToRenew)
        #expect(data.subtype == .gracePeriod)
        #expect(data.data?.status?.isEntitled == true)
        _ = try roundTrip(
            ResponseBodyV2DecodedPayload.self,
            """
            {"notificationType":"RENEWAL_EXTENSION","subtype":"SUMMARY","notificationUUID":"u","signedDate":1,
             "summary":{"environment":"Sandbox","appAppleId":1,"bundleId":"b","productId":"p","requestIdentifier":"r",
             "storefrontCountryCodes":["USA","DEU"],"succeededCount":5,"failedCount":2}}
            """, unknownKeys: [])
        let token = try roundTrip(
            ResponseBodyV2DecodedPayload.self,
            """
            {"notificationType":"EXTERNAL_PURCHASE_TOKEN","subtype":"ACTIVE_TOKEN_REMINDER","notificationUUID":"u",
             "externalPurchaseToken":{"externalPurchaseId":"SANDBOX_9","tokenCreationDate":1,"appAppleId":2,"bundleId":"b",
             "tokenType":"CUSTOM_LINK","tokenExpirationDate":3}}
            """, unknownKeys: [])
        #expect(token.externalPurchaseToken?.environment == .sandbox)
        _ = try roundTrip(
            ResponseBodyV2DecodedPayload.self,
            """
            {"notificationType":"RESCIND_CONSENT","notificationUUID":"u","appData":{"appAppleId":1,"bundleId":"b",
             "environment":"Production","signedAppTransactionInfo":"a.b.c"}}
            """, unknownKeys: [])
        _ = try roundTrip(ResponseBodyV2.self, #"{"signedPayload":"a.b.c","someFutureField":1}"#)
        for type in NotificationType.knownValues { #expect(type.isKnown) }
        #expect(NotificationType.knownValues.count == 23)
        #expect(NotificationSubtype.knownValues.count == 19)
    }

    @Test func serverAPIResponses() throws {
        _ = try roundTrip(TransactionInfoResponse.self, #"{"signedTransactionInfo":"a.b.c"}"#, unknownKeys: [])
        let history = try roundTrip(
            HistoryResponse.self,
            #"{"revision":"r1","hasMore":true,"bundleId":"b","appAppleId":1,"environment":"Sandbox","signedTransactions":["a","b"],"someFutureField":0}"#
        )
        #expect(history.signedTransactions?.count == 2)
        let status = try roundTrip(
            StatusResponse.self,
            """
            {"environment":"Production","bundleId":"b","appAppleId":1,"data":[{"subscriptionGroupIdentifier":"g",
             "lastTransactions":[{"status":3,"originalTransactionId":"1","signedTransactionInfo":"t","signedRenewalInfo":"r"}]}]}
            """, unknownKeys: [])
        #expect(status.data?.first?.lastTransactions?.first?.status == .billingRetry)
        _ = try roundTrip(
            RefundHistoryResponse.self, #"{"signedTransactions":[],"revision":"r","hasMore":false}"#, unknownKeys: [])
        _ = try roundTrip(OrderLookupResponse.self, #"{"status":1}"#, unknownKeys: [])
        _ = try roundTrip(AppTransactionInfoResponse.self, #"{"signedAppTransactionInfo":"a"}"#, unknownKeys: [])
        _ = try roundTrip(
            ExtendRenewalDateResponse.self,
            #"{"originalTransactionId":"1","webOrderLineItemId":"2","success":true,"effectiveDate":3}"#, unknownKeys: []
        )
        _ = try roundTrip(MassExtendRenewalDateResponse.self, #"{"requestIdentifier":"r"}"#, unknownKeys: [])
        _ = try roundTrip(
            MassExtendRenewalDateStatusResponse.self,
            #"{"requestIdentifier":"r","complete":true,"completeDate":1,"succeededCount":2,"failedCount":3}"#,
            unknownKeys: [])
        let notifications = try roundTrip(
            NotificationHistoryResponse.self,
            """
            {"paginationToken":"p","hasMore":false,"notificationHistory":[{"signedPayload":"s","sendAttempts":[
             {"attemptDate":1,"sendAttemptResult":"SUCCESS"},{"attemptDate":2,"sendAttemptResult":"CIRCUS"}],
             "firstSendAttemptResult":"TIMED_OUT"}]}
            """, unknownKeys: [])
        #expect(notifications.notificationHistory?.first?.sendAttempts?.last?.sendAttemptResult?.isKnown == false)
        _ = try roundTrip(SendTestNotificationResponse.self, #"{"testNotificationToken":"t"}"#, unknownKeys: [])
        _ = try roundTrip(
            CheckTestNotificationResponse.self,
            #"{"signedPayload":"s","sendAttempts":[{"attemptDate":1,"sendAttemptResult":"NO_RESPONSE"}]}"#,
            unknownKeys: [])
        _ = try roundTrip(ServerAPIErrorPayload.self, #"{"errorCode":4040010,"errorMessage":"nope"}"#, unknownKeys: [])
    }

    @Test func serverAPIRequests() throws {
        _ = try roundTrip(
            ConsumptionRequest.self,
            #"{"customerConsented":true,"sampleContentProvided":false,"deliveryStatus":"DELIVERED","consumptionPercentage":25000,"refundPreference":"GRANT_PRORATED"}"#,
            unknownKeys: [])
        _ = try roundTrip(
            ConsumptionRequestV1.self,
            """
            {"customerConsented":true,"consumptionStatus":2,"platform":1,"sampleContentProvided":false,"deliveryStatus":0,
             "appAccountToken":"","accountTenure":3,"playTime":4,"lifetimeDollarsRefunded":1,"lifetimeDollarsPurchased":5,
             "userStatus":1,"refundPreference":3}
            """, unknownKeys: [])
        _ = try roundTrip(
            ExtendRenewalDateRequest.self, #"{"extendByDays":30,"extendReasonCode":3,"requestIdentifier":"r"}"#,
            unknownKeys: [])
        _ = try roundTrip(
            MassExtendRenewalDateRequest.self,
            #"{"extendByDays":1,"extendReasonCode":1,"requestIdentifier":"r","productId":"p","storefrontCountryCodes":["USA"]}"#,
            unknownKeys: [])
        _ = try roundTrip(
            NotificationHistoryRequest.self,
            #"{"startDate":1,"endDate":2,"notificationType":"REFUND","notificationSubtype":"SUMMARY","transactionId":"t","onlyFailures":true}"#,
            unknownKeys: [])
        _ = try roundTrip(UpdateAppAccountTokenRequest.self, #"{"appAccountToken":"u"}"#, unknownKeys: [])
    }

    @Test func verifyReceiptResponse() throws {
        let response = try roundTrip(
            VerifyReceiptResponse.self,
            """
            {"status":0,"environment":"Sandbox","is_retryable":false,"latest_receipt":"MIIT",
             "latest_receipt_info":[{"cancellation_date":"2018-09-05 05:03:52 Etc/GMT","cancellation_date_ms":"1536123832000",
               "cancellation_date_pst":"2018-09-04 22:03:52 America/Los_Angeles","cancellation_reason":"1",
               "expires_date":"e","expires_date_ms":"1616411598724","expires_date_pst":"p","is_in_intro_offer_period":"false",
               "is_trial_period":"true","original_purchase_date":"o","original_purchase_date_ms":"1","original_purchase_date_pst":"p",
               "original_transaction_id":"1000000","product_id":"pro","promotional_offer_id":"promo","purchase_date":"d",
               "purchase_date_ms":"2","purchase_date_pst":"p","quantity":"1","transaction_id":"1000001",
               "web_order_line_item_id":"1000000050000000","app_account_token":"uuid","in_app_ownership_type":"FAMILY_SHARED",
               "is_upgraded":"true","offer_code_ref_name":"code","subscription_group_identifier":"g"}],
             "pending_renewal_info":[{"auto_renew_product_id":"pro","auto_renew_status":"1","expiration_intent":"2",
               "grace_period_expires_date":"g","grace_period_expires_date_ms":"3","grace_period_expires_date_pst":"p",
               "is_in_billing_retry_period":"1","offer_code_ref_name":"c","original_transaction_id":"1000000",
               "price_consent_status":"0","price_increase_status":"1","product_id":"pro","promotional_offer_id":"x"}],
             "receipt":{"adam_id":0,"app_item_id":123456789012,"application_version":"1","bundle_id":"b","download_id":42,
               "expiration_date":"x","expiration_date_ms":"4","expiration_date_pst":"y","in_app":[],
               "original_application_version":"1.0","original_purchase_date":"o","original_purchase_date_ms":"5",
               "original_purchase_date_pst":"p","preorder_date":"a","preorder_date_ms":"6","preorder_date_pst":"b",
               "receipt_creation_date":"c","receipt_creation_date_ms":"7","receipt_creation_date_pst":"d",
               "receipt_type":"ProductionSandbox","request_date":"r","request_date_ms":"8","request_date_pst":"s",
               "version_external_identifier":0},
             "exception":"none","some_future_field":1}
            """, unknownKeys: ["some_future_field"])
        let item = try #require(response.latestReceiptInfo?.first)
        #expect(item.expiresDateMs?.int64Value == 1_616_411_598_724)
        #expect(item.isTrialPeriod?.boolValue == true)
        #expect(item.quantity?.int64Value == 1)
        #expect(item.inAppOwnershipType == .familyShared)
        #expect(response.receipt?.appItemId == .integer(123_456_789_012))
        #expect(response.pendingRenewalInfo?.first?.isInBillingRetryPeriod?.boolValue == true)
        #expect(response.isRetryable?.boolValue == false)
    }

    @Test func verifyReceiptQuirks() throws {
        // Status as a string, hyphenated is-retryable, numbers where strings are usual.
        let response = try JSONDecoder().decode(
            VerifyReceiptResponse.self,
            from: Data(
                #"{"status":"21100","is-retryable":1,"latest_receipt_info":[{"quantity":2,"is_trial_period":false}]}"#
                    .utf8))
        #expect(response.status == 21100)
        #expect(response.isRetryable?.boolValue == true)
        #expect(response.latestReceiptInfo?.first?.quantity?.int64Value == 2)
        #expect(response.latestReceiptInfo?.first?.isTrialPeriod?.boolValue == false)
        let request = try JSONEncoder().encode(
            VerifyReceiptRequest(receiptData: "MII", password: "s", excludeOldTransactions: true))
        let object = try JSONSerialization.jsonObject(with: request) as! [String: Any]
        #expect(Set(object.keys) == ["receipt-data", "password", "exclude-old-transactions"])
    }

    @Test func legacyValues() {
        #expect(LegacyValue.string("12").int64Value == 12)
        #expect(LegacyValue.string("x").int64Value == nil)
        #expect(LegacyValue.string("0").boolValue == false)
        #expect(LegacyValue.string("maybe").boolValue == nil)
        #expect(LegacyValue.double(2.0).int64Value == 2)
        #expect(LegacyValue.bool(true).stringValue == "true")
    }
}
