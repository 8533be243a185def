// Request and response bodies of the App Store Server API (Apple's App Store Server API documentation §5).

/// `TransactionInfoResponse` (Get Transaction Info).
public struct TransactionInfoResponse: Codable, Hashable, Sendable {
    public var signedTransactionInfo: String?
    public init(signedTransactionInfo: String? = nil) { self.signedTransactionInfo = signedTransactionInfo }
}

/// `HistoryResponse` (Get Transaction History v1/v2).
public struct HistoryResponse: Codable, Hashable, Sendable {
    public var revision: String?
    public var hasMore: Bool?
    public var bundleId: String?
    public var appAppleId: Int64?
    public var environment: AppStoreEnvironment?
    public var signedTransactions: [String]?

    public init(
        revision: String? = nil, hasMore: Bool? = nil, bundleId: String? = nil, appAppleId: Int64? = nil,
        environment: AppStoreEnvironment? = nil, signedTransactions: [String]? = nil
    ) {
        self.revision = revision
        self.hasMore = hasMore
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.environment = environment
        self.signedTransactions = signedTransactions
    }
}

/// `StatusResponse` (Get All Subscription Statuses).
public struct StatusResponse: Codable, Hashable, Sendable {
    public var environment: AppStoreEnvironment?
    public var bundleId: String?
    public var appAppleId: Int64?
    public var data: [SubscriptionGroupIdentifierItem]?

    public init(
        environment: AppStoreEnvironment? = nil, bundleId: String? = nil, appAppleId: Int64? = nil,
        data: [SubscriptionGroupIdentifierItem]? = nil
    ) {
        self.environment = environment
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.data = data
    }
}

/// One subscription group in a `StatusResponse`.
public struct SubscriptionGroupIdentifierItem: Codable, Hashable, Sendable {
    public var subscriptionGroupIdentifier: String?
    public var lastTransactions: [LastTransactionsItem]?

    public init(subscriptionGroupIdentifier: String? = nil, lastTransactions: [LastTransactionsItem]? = nil) {
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.lastTransactions = lastTransactions
    }
}

/// The latest transaction and renewal info of one subscription.
public struct LastTransactionsItem: Codable, Hashable, Sendable {
    public var status: SubscriptionStatus?
    public var originalTransactionId: String?
    public var signedTransactionInfo: String?
    public var signedRenewalInfo: String?

    public init(
        status: SubscriptionStatus? = nil, originalTransactionId: String? = nil,
        signedTransactionInfo: String? = nil, signedRenewalInfo: String? = nil
    ) {
        self.status = status
        self.originalTransactionId = originalTransactionId
        self.signedTransactionInfo = signedTransactionInfo
        self.signedRenewalInfo = signedRenewalInfo
    }
}

/// `RefundHistoryResponse` (Get Refund History v2).
public struct RefundHistoryResponse: Codable, Hashable, Sendable {
    public var signedTransactions: [String]?
    public var revision: String?
    public var hasMore: Bool?

    public init(signedTransactions: [String]? = nil, revision: String? = nil, hasMore: Bool? = nil) {
        self.signedTransactions = signedTransactions
        self.revision = revision
        self.hasMore = hasMore
    }
}

/// `OrderLookupResponse` (Look Up Order ID).
public struct OrderLookupResponse: Codable, Hashable, Sendable {
    public var status: OrderLookupStatus?
    public var signedTransactions: [String]?

    public init(status: OrderLookupStatus? = nil, signedTransactions: [String]? = nil) {
        self.status = status
        self.signedTransactions = signedTransactions
    }
}

/// `AppTransactionInfoResponse` (Get App Transaction Info).
public struct AppTransactionInfoResponse: Codable, Hashable, Sendable {
    public var signedAppTransactionInfo: String?
    public init(signedAppTransactionInfo: String? = nil) { self.signedAppTransactionInfo = signedAppTransactionInfo }
}

/// `ConsumptionRequest` (Send Consumption Information v2).
public struct ConsumptionRequest: Codable, Hashable, Sendable {
    public var customerConsented: Bool?
    public var sampleContentProvided: Bool?
    public var deliveryStatus: DeliveryStatus?
    public var consumptionPercentage: Int32?
    public var refundPreference: RefundPreference?

    public init(
        customerConsented: Bool? = nil, sampleContentProvided: Bool? = nil, deliveryStatus: DeliveryStatus? = nil,
        consumptionPercentage: Int32? = nil, refundPreference: RefundPreference? = nil
    ) {
        self.customerConsented = customerConsented
        self.sampleContentProvided = sampleContentProvided
        self.deliveryStatus = deliveryStatus
        self.consumptionPercentage = consumptionPercentage
        self.refundPreference = refundPreference
    }
}

/// `ConsumptionRequestV1` (Send Consumption Information V1); the integer codes are Apple's.
public struct ConsumptionRequestV1: Codable, Hashable, Sendable {
    public var customerConsented: Bool?
    public var consumptionStatus: Int32?
    public var platform: Int32?
    public var sampleContentProvided: Bool?
    public var deliveryStatus: Int32?
    public var appAccountToken: String?
    public var accountTenure: Int32?
    public var playTime: Int32?
    public var lifetimeDollarsRefunded: Int32?
    public var lifetimeDollarsPurchased: Int32?
    public var userStatus: Int32?
    public var refundPreference: Int32?

    public init(
        customerConsented: Bool? = nil, consumptionStatus: Int32? = nil, platform: Int32? = nil,
        sampleContentProvided: Bool? = nil, deliveryStatus: Int32? = nil, appAccountToken: String? = nil,
        accountTenure: Int32? = nil, playTime: Int32? = nil, lifetimeDollarsRefunded: Int32? = nil,
        lifetimeDollarsPurchased: Int32? = nil, userStatus: Int32? = nil, refundPreference: Int32? = nil
    ) {
        self.customerConsented = customerConsented
        self.consumptionStatus = consumptionStatus
        self.platform = platform
        self.sampleContentProvided = sampleContentProvided
        self.deliveryStatus = deliveryStatus
        self.appAccountToken = appAccountToken
        self.accountTenure = accountTenure
        self.playTime = playTime
        self.lifetimeDollarsRefunded = lifetimeDollarsRefunded
        self.lifetimeDollarsPurchased = lifetimeDollarsPurchased
        self.userStatus = userStatus
        self.refundPreference = refundPreference
    }
}

/// `ExtendRenewalDateRequest`.
public struct ExtendRenewalDateRequest: Codable, Hashable, Sendable {
    public var extendByDays: Int32?
    public var extendReasonCode: ExtendReasonCode?
    public var requestIdentifier: String?

    public init(extendByDays: Int32? = nil, extendReasonCode: ExtendReasonCode? = nil, requestIdentifier: String? = nil)
    {
        self.extendByDays = extendByDays
        self.extendReasonCode = extendReasonCode
        self.requestIdentifier = requestIdentifier
    }
}

/// `ExtendRenewalDateResponse`.
public struct ExtendRenewalDateResponse: Codable, Hashable, Sendable {
    public var originalTransactionId: String?
    public var webOrderLineItemId: String?
    public var success: Bool?
    public var effectiveDate: Int64?

    public init(
        originalTransactionId: String? = nil, webOrderLineItemId: String? = nil, success: Bool? = nil,
        effectiveDate: Int64? = nil
    ) {
        self.originalTransactionId = originalTransactionId
        self.webOrderLineItemId = webOrderLineItemId
        self.success = success
        self.effectiveDate = effectiveDate
    }
}

/// `MassExtendRenewalDateRequest`.
public struct MassExtendRenewalDateRequest: Codable, Hashable, Sendable {
    public var extendByDays: Int32?
    public var extendReasonCode: ExtendReasonCode?
    public var requestIdentifier: String?
    public var productId: String?
    public var storefrontCountryCodes: [String]?

    public init(
        extendByDays: Int32? = nil, extendReasonCode: ExtendReasonCode? = nil, requestIdentifier: String? = nil,
        productId: String? = nil, storefrontCountryCodes: [String]? = nil
    ) {
        self.extendByDays = extendByDays
        self.extendReasonCode = extendReasonCode
        self.requestIdentifier = requestIdentifier
        self.productId = productId
        self.storefrontCountryCodes = storefrontCountryCodes
    }
}

/// `MassExtendRenewalDateResponse`.
public struct MassExtendRenewalDateResponse: Codable, Hashable, Sendable {
    public var requestIdentifier: String?
    public init(requestIdentifier: String? = nil) { self.requestIdentifier = requestIdentifier }
}

/// `MassExtendRenewalDateStatusResponse`.
public struct MassExtendRenewalDateStatusResponse: Codable, Hashable, Sendable {
    public var requestIdentifier: String?
    public var complete: Bool?
    public var completeDate: Int64?
    public var succeededCount: Int64?
    public var failedCount: Int64?

    public init(
        requestIdentifier: String? = nil, complete: Bool? = nil, completeDate: Int64? = nil,
        succeededCount: Int64? = nil, failedCount: Int64? = nil
    ) {
        self.requestIdentifier = requestIdentifier
        self.complete = complete
        self.completeDate = completeDate
        self.succeededCount = succeededCount
        self.failedCount = failedCount
    }
}

/// `NotificationHistoryRequest`. Send the same body on every page.
public struct NotificationHistoryRequest: Codable, Hashable, Sendable {
    public var startDate: Int64?
    public var endDate: Int64?
    public var notificationType: NotificationType?
    public var notificationSubtype: NotificationSubtype?
    public var transactionId: String?
    public var onlyFailures: Bool?

    public init(
        startDate: Int64? = nil, endDate: Int64? = nil, notificationType: NotificationType? = nil,
        notificationSubtype: NotificationSubtype? = nil, transactionId: String? = nil, onlyFailures: Bool? = nil
    ) {
        self.startDate = startDate
        self.endDate = endDate
        self.notificationType = notificationType
        self.notificationSubtype = notificationSubtype
        self.transactionId = transactionId
        self.onlyFailures = onlyFailures
    }
}

/// `NotificationHistoryResponse`.
public struct NotificationHistoryResponse: Codable, Hashable, Sendable {
    public var paginationToken: String?
    public var hasMore: Bool?
    public var notificationHistory: [NotificationHistoryResponseItem]?

    public init(
        paginationToken: String? = nil, hasMore: Bool? = nil,
        notificationHistory: [NotificationHistoryResponseItem]? = nil
    ) {
        self.paginationToken = paginationToken
        self.hasMore = hasMore
        self.notificationHistory = notificationHistory
    }
}

/// One notification in the history, with up to six send attempts.
public struct NotificationHistoryResponseItem: Codable, Hashable, Sendable {
    public var signedPayload: String?
    public var sendAttempts: [SendAttemptItem]?
    public var firstSendAttemptResult: SendAttemptResult?

    public init(
        signedPayload: String? = nil, sendAttempts: [SendAttemptItem]? = nil,
        firstSendAttemptResult: SendAttemptResult? = nil
    ) {
        self.signedPayload = signedPayload
        self.sendAttempts = sendAttempts
        self.firstSendAttemptResult = firstSendAttemptResult
    }
}

/// One attempt to send a notification.
public struct SendAttemptItem: Codable, Hashable, Sendable {
    public var attemptDate: Int64?
    public var sendAttemptResult: SendAttemptResult?

    public init(attemptDate: Int64? = nil, sendAttemptResult: SendAttemptResult? = nil) {
        self.attemptDate = attemptDate
        self.sendAttemptResult = sendAttemptResult
    }
}

/// `SendTestNotificationResponse`.
public struct SendTestNotificationResponse: Codable, Hashable, Sendable {
    public var testNotificationToken: String?
    public init(testNotificationToken: String? = nil) { self.testNotificationToken = testNotificationToken }
}

/// `CheckTestNotificationResponse`.
public struct CheckTestNotificationResponse: Codable, Hashable, Sendable {
    public var signedPayload: String?
    public var sendAttempts: [SendAttemptItem]?
    public var firstSendAttemptResult: SendAttemptResult?

    public init(
        signedPayload: String? = nil, sendAttempts: [SendAttemptItem]? = nil,
        firstSendAttemptResult: SendAttemptResult? = nil
    ) {
        self.signedPayload = signedPayload
        self.sendAttempts = sendAttempts
        self.firstSendAttemptResult = firstSendAttemptResult
    }
}

/// `UpdateAppAccountTokenRequest` (Set App Account Token).
public struct UpdateAppAccountTokenRequest: Codable, Hashable, Sendable {
    public var appAccountToken: String?
    public init(appAccountToken: String? = nil) { self.appAccountToken = appAccountToken }
}

/// The error body of a non-2xx Server API answer (except 401, which has none).
public struct ServerAPIErrorPayload: Codable, Hashable, Sendable {
    public var errorCode: Int64?
    public var errorMessage: String?
    public init(errorCode: Int64? = nil, errorMessage: String? = nil) {
        self.errorCode = errorCode
        self.errorMessage = errorMessage
    }
}
