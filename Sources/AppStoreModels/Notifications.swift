/// The body Apple POSTs for App Store Server Notifications V2 (`responseBodyV2`).
public struct ResponseBodyV2: Codable, Hashable, Sendable {
    public var signedPayload: String?
    public init(signedPayload: String? = nil) { self.signedPayload = signedPayload }
}

/// The decoded `signedPayload` of a V2 notification (Apple's App Store Server Notifications V2 documentation §2).
/// Exactly one of `data`, `summary`, `externalPurchaseToken`, `appData` is present.
public struct ResponseBodyV2DecodedPayload: Codable, Hashable, Sendable {
    public var notificationType: NotificationType?
    public var subtype: NotificationSubtype?
    public var notificationUUID: String?
    public var version: String?
    public var signedDate: Int64?
    public var data: NotificationData?
    public var summary: NotificationSummary?
    public var externalPurchaseToken: ExternalPurchaseToken?
    public var appData: NotificationAppData?

    public init(
        notificationType: NotificationType? = nil, subtype: NotificationSubtype? = nil,
        notificationUUID: String? = nil, version: String? = nil, signedDate: Int64? = nil,
        data: NotificationData? = nil, summary: NotificationSummary? = nil,
        externalPurchaseToken: ExternalPurchaseToken? = nil, appData: NotificationAppData? = nil
    ) {
        self.notificationType = notificationType
        self.subtype = subtype
        self.notificationUUID = notificationUUID
        self.version = version
        self.signedDate = signedDate
        self.data = data
        self.summary = summary
        self.externalPurchaseToken = externalPurchaseToken
        self.appData = appData
    }
}

/// `data` of a notification: app metadata plus the nested signed transaction and renewal info.
public struct NotificationData: Codable, Hashable, Sendable {
    public var appAppleId: Int64?
    public var bundleId: String?
    public var bundleVersion: String?
    public var environment: AppStoreEnvironment?
    public var signedTransactionInfo: String?
    public var signedRenewalInfo: String?
    public var status: SubscriptionStatus?
    public var consumptionRequestReason: ConsumptionRequestReason?

    public init(
        appAppleId: Int64? = nil, bundleId: String? = nil, bundleVersion: String? = nil,
        environment: AppStoreEnvironment? = nil, signedTransactionInfo: String? = nil,
        signedRenewalInfo: String? = nil, status: SubscriptionStatus? = nil,
        consumptionRequestReason: ConsumptionRequestReason? = nil
    ) {
        self.appAppleId = appAppleId
        self.bundleId = bundleId
        self.bundleVersion = bundleVersion
        self.environment = environment
        self.signedTransactionInfo = signedTransactionInfo
        self.signedRenewalInfo = signedRenewalInfo
        self.status = status
        self.consumptionRequestReason = consumptionRequestReason
    }
}

/// `summary` of a RENEWAL_EXTENSION / SUMMARY notification.
public struct NotificationSummary: Codable, Hashable, Sendable {
    public var environment: AppStoreEnvironment?
    public var appAppleId: Int64?
    public var bundleId: String?
    public var productId: String?
    public var requestIdentifier: String?
    public var storefrontCountryCodes: [String]?
    public var succeededCount: Int64?
    public var failedCount: Int64?

    public init(
        environment: AppStoreEnvironment? = nil, appAppleId: Int64? = nil, bundleId: String? = nil,
        productId: String? = nil, requestIdentifier: String? = nil, storefrontCountryCodes: [String]? = nil,
        succeededCount: Int64? = nil, failedCount: Int64? = nil
    ) {
        self.environment = environment
        self.appAppleId = appAppleId
        self.bundleId = bundleId
        self.productId = productId
        self.requestIdentifier = requestIdentifier
        self.storefrontCountryCodes = storefrontCountryCodes
        self.succeededCount = succeededCount
        self.failedCount = failedCount
    }
}

/// `externalPurchaseToken` of an EXTERNAL_PURCHASE_TOKEN notification.
public struct ExternalPurchaseToken: Codable, Hashable, Sendable {
    public var externalPurchaseId: String?
    public var tokenCreationDate: Int64?
    public var appAppleId: Int64?
    public var bundleId: String?
    public var tokenType: String?
    public var tokenExpirationDate: Int64?

    public init(
        externalPurchaseId: String? = nil, tokenCreationDate: Int64? = nil, appAppleId: Int64? = nil,
        bundleId: String? = nil, tokenType: String? = nil, tokenExpirationDate: Int64? = nil
    ) {
        self.externalPurchaseId = externalPurchaseId
        self.tokenCreationDate = tokenCreationDate
        self.appAppleId = appAppleId
        self.bundleId = bundleId
        self.tokenType = tokenType
        self.tokenExpirationDate = tokenExpirationDate
    }

    /// There is no environment field: Apple marks sandbox tokens by the id's prefix.
    public var environment: AppStoreEnvironment {
        (externalPurchaseId ?? "").hasPrefix("SANDBOX") ? .sandbox : .production
    }
}

/// `appData` of a RESCIND_CONSENT notification.
public struct NotificationAppData: Codable, Hashable, Sendable {
    public var appAppleId: Int64?
    public var bundleId: String?
    public var environment: AppStoreEnvironment?
    public var signedAppTransactionInfo: String?

    public init(
        appAppleId: Int64? = nil, bundleId: String? = nil, environment: AppStoreEnvironment? = nil,
        signedAppTransactionInfo: String? = nil
    ) {
        self.appAppleId = appAppleId
        self.bundleId = bundleId
        self.environment = environment
        self.signedAppTransactionInfo = signedAppTransactionInfo
    }
}
