// Every enumeration in Apple's payloads (Apple's JWS documentation §4.1, §5, notifications.md,
// server-api.md). Raw values are exactly Apple's.

/// Product type of a transaction (`type`).
public struct ProductType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let autoRenewable = Self(rawValue: "Auto-Renewable Subscription")
    public static let nonConsumable = Self(rawValue: "Non-Consumable")
    public static let consumable = Self(rawValue: "Consumable")
    public static let nonRenewing = Self(rawValue: "Non-Renewing Subscription")
    public static let knownValues: [Self] = [.autoRenewable, .nonConsumable, .consumable, .nonRenewing]
}

/// `inAppOwnershipType`.
public struct InAppOwnershipType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let purchased = Self(rawValue: "PURCHASED")
    public static let familyShared = Self(rawValue: "FAMILY_SHARED")
    public static let assigned = Self(rawValue: "ASSIGNED")
    public static let knownValues: [Self] = [.purchased, .familyShared, .assigned]
}

/// `revocationReason`.
public struct RevocationReason: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let refundedForOtherReason = Self(rawValue: 0)
    public static let refundedDueToIssue = Self(rawValue: 1)
    public static let knownValues: [Self] = [.refundedForOtherReason, .refundedDueToIssue]
}

/// `revocationType`.
public struct RevocationType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let refundFull = Self(rawValue: "REFUND_FULL")
    public static let refundProrated = Self(rawValue: "REFUND_PRORATED")
    public static let familyRevoke = Self(rawValue: "FAMILY_REVOKE")
    public static let knownValues: [Self] = [.refundFull, .refundProrated, .familyRevoke]
}

/// `offerType`.
public struct OfferType: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let introductoryOffer = Self(rawValue: 1)
    public static let promotionalOffer = Self(rawValue: 2)
    public static let offerCode = Self(rawValue: 3)
    public static let winBackOffer = Self(rawValue: 4)
    public static let knownValues: [Self] = [.introductoryOffer, .promotionalOffer, .offerCode, .winBackOffer]
}

/// `offerDiscountType`.
public struct OfferDiscountType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let freeTrial = Self(rawValue: "FREE_TRIAL")
    public static let payAsYouGo = Self(rawValue: "PAY_AS_YOU_GO")
    public static let payUpFront = Self(rawValue: "PAY_UP_FRONT")
    public static let oneTime = Self(rawValue: "ONE_TIME")
    public static let knownValues: [Self] = [.freeTrial, .payAsYouGo, .payUpFront, .oneTime]
}

/// `environment` (and `receiptType` of app transactions).
public struct AppStoreEnvironment: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let production = Self(rawValue: "Production")
    public static let sandbox = Self(rawValue: "Sandbox")
    public static let xcode = Self(rawValue: "Xcode")
    public static let localTesting = Self(rawValue: "LocalTesting")
    public static let knownValues: [Self] = [.production, .sandbox, .xcode, .localTesting]
}

/// `transactionReason`.
public struct TransactionReason: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let purchase = Self(rawValue: "PURCHASE")
    public static let renewal = Self(rawValue: "RENEWAL")
    public static let knownValues: [Self] = [.purchase, .renewal]
}

/// `billingPlanType` / `renewalBillingPlanType`.
public struct BillingPlanType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let billedUpfront = Self(rawValue: "BILLED_UPFRONT")
    public static let monthly = Self(rawValue: "MONTHLY")
    public static let knownValues: [Self] = [.billedUpfront, .monthly]
}

/// `autoRenewStatus`.
public struct AutoRenewStatus: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let off = Self(rawValue: 0)
    public static let on = Self(rawValue: 1)
    public static let knownValues: [Self] = [.off, .on]
}

/// `expirationIntent`.
public struct ExpirationIntent: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let customerCancelled = Self(rawValue: 1)
    public static let billingError = Self(rawValue: 2)
    public static let customerDidNotConsentToPriceIncrease = Self(rawValue: 3)
    public static let productNotAvailable = Self(rawValue: 4)
    public static let other = Self(rawValue: 5)
    public static let knownValues: [Self] = [
        .customerCancelled, .billingError, .customerDidNotConsentToPriceIncrease, .productNotAvailable, .other,
    ]
}

/// `priceIncreaseStatus`.
public struct PriceIncreaseStatus: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let customerHasNotResponded = Self(rawValue: 0)
    public static let customerConsentedOrWasNotified = Self(rawValue: 1)
    public static let knownValues: [Self] = [.customerHasNotResponded, .customerConsentedOrWasNotified]
}

/// Subscription `status` (notification `data.status`, Get All Subscription Statuses).
public struct SubscriptionStatus: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let active = Self(rawValue: 1)
    public static let expired = Self(rawValue: 2)
    public static let billingRetry = Self(rawValue: 3)
    public static let billingGracePeriod = Self(rawValue: 4)
    public static let revoked = Self(rawValue: 5)
    public static let knownValues: [Self] = [.active, .expired, .billingRetry, .billingGracePeriod, .revoked]
    /// Apple: entitled while active or in the billing grace period.
    public var isEntitled: Bool { self == .active || self == .billingGracePeriod }
}

/// `originalPlatform` of an app transaction.
public struct PurchasePlatform: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let iOS = Self(rawValue: "iOS")
    public static let macOS = Self(rawValue: "macOS")
    public static let tvOS = Self(rawValue: "tvOS")
    public static let visionOS = Self(rawValue: "visionOS")
    public static let knownValues: [Self] = [.iOS, .macOS, .tvOS, .visionOS]
}

/// `notificationType` of Notifications V2.
public struct NotificationType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let subscribed = Self(rawValue: "SUBSCRIBED")
    public static let didRenew = Self(rawValue: "DID_RENEW")
    public static let didFailToRenew = Self(rawValue: "DID_FAIL_TO_RENEW")
    public static let gracePeriodExpired = Self(rawValue: "GRACE_PERIOD_EXPIRED")
    public static let expired = Self(rawValue: "EXPIRED")
    public static let didChangeRenewalStatus = Self(rawValue: "DID_CHANGE_RENEWAL_STATUS")
    public static let didChangeRenewalPref = Self(rawValue: "DID_CHANGE_RENEWAL_PREF")
    public static let offerRedeemed = Self(rawValue: "OFFER_REDEEMED")
    public static let priceIncrease = Self(rawValue: "PRICE_INCREASE")
    public static let refund = Self(rawValue: "REFUND")
    public static let refundDeclined = Self(rawValue: "REFUND_DECLINED")
    public static let refundReversed = Self(rawValue: "REFUND_REVERSED")
    public static let consumptionRequest = Self(rawValue: "CONSUMPTION_REQUEST")
    public static let revoke = Self(rawValue: "REVOKE")
    public static let renewalExtended = Self(rawValue: "RENEWAL_EXTENDED")
    public static let renewalExtension = Self(rawValue: "RENEWAL_EXTENSION")
    public static let oneTimeCharge = Self(rawValue: "ONE_TIME_CHARGE")
    public static let test = Self(rawValue: "TEST")
    public static let externalPurchaseToken = Self(rawValue: "EXTERNAL_PURCHASE_TOKEN")
    public static let rescindConsent = Self(rawValue: "RESCIND_CONSENT")
    public static let metadataUpdate = Self(rawValue: "METADATA_UPDATE")
    public static let migration = Self(rawValue: "MIGRATION")
    public static let priceChange = Self(rawValue: "PRICE_CHANGE")
    public static let knownValues: [Self] = [
        .subscribed, .didRenew, .didFailToRenew, .gracePeriodExpired, .expired, .didChangeRenewalStatus,
        .didChangeRenewalPref, .offerRedeemed, .priceIncrease, .refund, .refundDeclined, .refundReversed,
        .consumptionRequest, .revoke, .renewalExtended, .renewalExtension, .oneTimeCharge, .test,
        .externalPurchaseToken, .rescindConsent, .metadataUpdate, .migration, .priceChange,
    ]
}

/// `subtype` of Notifications V2.
public struct NotificationSubtype: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let initialBuy = Self(rawValue: "INITIAL_BUY")
    public static let resubscribe = Self(rawValue: "RESUBSCRIBE")
    public static let upgrade = Self(rawValue: "UPGRADE")
    public static let downgrade = Self(rawValue: "DOWNGRADE")
    public static let autoRenewEnabled = Self(rawValue: "AUTO_RENEW_ENABLED")
    public static let autoRenewDisabled = Self(rawValue: "AUTO_RENEW_DISABLED")
    public static let voluntary = Self(rawValue: "VOLUNTARY")
    public static let billingRetry = Self(rawValue: "BILLING_RETRY")
    public static let priceIncrease = Self(rawValue: "PRICE_INCREASE")
    public static let productNotForSale = Self(rawValue: "PRODUCT_NOT_FOR_SALE")
    public static let gracePeriod = Self(rawValue: "GRACE_PERIOD")
    public static let billingRecovery = Self(rawValue: "BILLING_RECOVERY")
    public static let pending = Self(rawValue: "PENDING")
    public static let accepted = Self(rawValue: "ACCEPTED")
    public static let summary = Self(rawValue: "SUMMARY")
    public static let failure = Self(rawValue: "FAILURE")
    public static let unreported = Self(rawValue: "UNREPORTED")
    public static let created = Self(rawValue: "CREATED")
    public static let activeTokenReminder = Self(rawValue: "ACTIVE_TOKEN_REMINDER")
    public static let knownValues: [Self] = [
        .initialBuy, .resubscribe, .upgrade, .downgrade, .autoRenewEnabled, .autoRenewDisabled, .voluntary,
        .billingRetry, .priceIncrease, .productNotForSale, .gracePeriod, .billingRecovery, .pending, .accepted,
        .summary, .failure, .unreported, .created, .activeTokenReminder,
    ]
}

/// `consumptionRequestReason` of a CONSUMPTION_REQUEST notification.
public struct ConsumptionRequestReason: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let unintendedPurchase = Self(rawValue: "UNINTENDED_PURCHASE")
    public static let fulfillmentIssue = Self(rawValue: "FULFILLMENT_ISSUE")
    public static let unsatisfiedWithPurchase = Self(rawValue: "UNSATISFIED_WITH_PURCHASE")
    public static let legal = Self(rawValue: "LEGAL")
    public static let other = Self(rawValue: "OTHER")
    public static let knownValues: [Self] = [
        .unintendedPurchase, .fulfillmentIssue, .unsatisfiedWithPurchase, .legal, .other,
    ]
}

/// `sendAttemptResult` in notification history.
public struct SendAttemptResult: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let success = Self(rawValue: "SUCCESS")
    public static let timedOut = Self(rawValue: "TIMED_OUT")
    public static let tlsIssue = Self(rawValue: "TLS_ISSUE")
    public static let circularRedirect = Self(rawValue: "CIRCULAR_REDIRECT")
    public static let noResponse = Self(rawValue: "NO_RESPONSE")
    public static let socketIssue = Self(rawValue: "SOCKET_ISSUE")
    public static let unsupportedCharset = Self(rawValue: "UNSUPPORTED_CHARSET")
    public static let invalidResponse = Self(rawValue: "INVALID_RESPONSE")
    public static let prematureClose = Self(rawValue: "PREMATURE_CLOSE")
    public static let unsuccessfulHTTPResponseCode = Self(rawValue: "UNSUCCESSFUL_HTTP_RESPONSE_CODE")
    public static let other = Self(rawValue: "OTHER")
    public static let sslIssue = Self(rawValue: "SSL_ISSUE")
    public static let knownValues: [Self] = [
        .success, .timedOut, .tlsIssue, .circularRedirect, .noResponse, .socketIssue, .unsupportedCharset,
        .invalidResponse, .prematureClose, .unsuccessfulHTTPResponseCode, .other, .sslIssue,
    ]
}

/// `deliveryStatus` of Send Consumption Information (v2).
public struct DeliveryStatus: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let delivered = Self(rawValue: "DELIVERED")
    public static let undeliveredQualityIssue = Self(rawValue: "UNDELIVERED_QUALITY_ISSUE")
    public static let undeliveredWrongItem = Self(rawValue: "UNDELIVERED_WRONG_ITEM")
    public static let undeliveredServerOutage = Self(rawValue: "UNDELIVERED_SERVER_OUTAGE")
    public static let undeliveredOther = Self(rawValue: "UNDELIVERED_OTHER")
    public static let knownValues: [Self] = [
        .delivered, .undeliveredQualityIssue, .undeliveredWrongItem, .undeliveredServerOutage, .undeliveredOther,
    ]
}

/// `refundPreference` of Send Consumption Information (v2).
public struct RefundPreference: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let decline = Self(rawValue: "DECLINE")
    public static let grantFull = Self(rawValue: "GRANT_FULL")
    public static let grantProrated = Self(rawValue: "GRANT_PRORATED")
    public static let knownValues: [Self] = [.decline, .grantFull, .grantProrated]
}

/// `extendReasonCode` of the renewal-date extension endpoints.
public struct ExtendReasonCode: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let undeclared = Self(rawValue: 0)
    public static let customerSatisfaction = Self(rawValue: 1)
    public static let other = Self(rawValue: 2)
    public static let serviceIssueOrOutage = Self(rawValue: 3)
    public static let knownValues: [Self] = [.undeclared, .customerSatisfaction, .other, .serviceIssueOrOutage]
}

/// `productType` filter of Get Transaction History.
public struct HistoryProductType: AppleEnum {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let autoRenewable = Self(rawValue: "AUTO_RENEWABLE")
    public static let nonRenewable = Self(rawValue: "NON_RENEWABLE")
    public static let consumable = Self(rawValue: "CONSUMABLE")
    public static let nonConsumable = Self(rawValue: "NON_CONSUMABLE")
    public static let knownValues: [Self] = [.autoRenewable, .nonRenewable, .consumable, .nonConsumable]
}

/// Order Look Up `status`.
public struct OrderLookupStatus: AppleEnum {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let valid = Self(rawValue: 0)
    public static let invalid = Self(rawValue: 1)
    public static let knownValues: [Self] = [.valid, .invalid]
}
