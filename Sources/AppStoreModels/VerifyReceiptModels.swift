// The legacy verifyReceipt web service (Apple's receipt documentation §2–3). Key names keep
// Apple's hyphens and underscores.

/// The verifyReceipt request body (`requestBody`).
public struct VerifyReceiptRequest: Codable, Hashable, Sendable {
    public var receiptData: String
    public var password: String?
    public var excludeOldTransactions: Bool?

    public init(receiptData: String, password: String? = nil, excludeOldTransactions: Bool? = nil) {
        self.receiptData = receiptData
        self.password = password
        self.excludeOldTransactions = excludeOldTransactions
    }

    enum CodingKeys: String, CodingKey {
        case receiptData = "receipt-data"
        case password
        case excludeOldTransactions = "exclude-old-transactions"
    }
}

/// The verifyReceipt response body (`responseBody`).
public struct VerifyReceiptResponse: Codable, Hashable, Sendable {
    public var status: Int64?
    public var environment: AppStoreEnvironment?
    public var isRetryable: LegacyValue?
    public var latestReceipt: String?
    public var latestReceiptInfo: [ReceiptInApp]?
    public var pendingRenewalInfo: [PendingRenewalInfo]?
    public var receipt: ReceiptInfo?
    public var exception: String?

    public init(
        status: Int64? = nil, environment: AppStoreEnvironment? = nil, isRetryable: LegacyValue? = nil,
        latestReceipt: String? = nil, latestReceiptInfo: [ReceiptInApp]? = nil,
        pendingRenewalInfo: [PendingRenewalInfo]? = nil, receipt: ReceiptInfo? = nil, exception: String? = nil
    ) {
        self.status = status
        self.environment = environment
        self.isRetryable = isRetryable
        self.latestReceipt = latestReceipt
        self.latestReceiptInfo = latestReceiptInfo
        self.pendingRenewalInfo = pendingRenewalInfo
        self.receipt = receipt
        self.exception = exception
    }

    enum CodingKeys: String, CodingKey {
        case status, environment, receipt, exception
        case isRetryable = "is_retryable"
        case isRetryableHyphen = "is-retryable"
        case latestReceipt = "latest_receipt"
        case latestReceiptInfo = "latest_receipt_info"
        case pendingRenewalInfo = "pending_renewal_info"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        status = try container.decodeIfPresent(LegacyValue.self, forKey: .status)?.int64Value
        environment = try container.decodeIfPresent(AppStoreEnvironment.self, forKey: .environment)
        // Apple documents `is_retryable`; some observers saw `is-retryable`. Accept both.
        isRetryable =
            try container.decodeIfPresent(LegacyValue.self, forKey: .isRetryable)
            ?? container.decodeIfPresent(LegacyValue.self, forKey: .isRetryableHyphen)
        latestReceipt = try container.decodeIfPresent(String.self, forKey: .latestReceipt)
        latestReceiptInfo = try container.decodeIfPresent([ReceiptInApp].self, forKey: .latestReceiptInfo)
        pendingRenewalInfo = try container.decodeIfPresent([PendingRenewalInfo].self, forKey: .pendingRenewalInfo)
        receipt = try container.decodeIfPresent(ReceiptInfo.self, forKey: .receipt)
        exception = try container.decodeIfPresent(String.self, forKey: .exception)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(status, forKey: .status)
        try container.encodeIfPresent(environment, forKey: .environment)
        try container.encodeIfPresent(isRetryable, forKey: .isRetryable)
        try container.encodeIfPresent(latestReceipt, forKey: .latestReceipt)
        try container.encodeIfPresent(latestReceiptInfo, forKey: .latestReceiptInfo)
        try container.encodeIfPresent(pendingRenewalInfo, forKey: .pendingRenewalInfo)
        try container.encodeIfPresent(receipt, forKey: .receipt)
        try container.encodeIfPresent(exception, forKey: .exception)
    }
}

/// The decoded `receipt` object of a verifyReceipt response.
public struct ReceiptInfo: Codable, Hashable, Sendable {
    public var adamId: LegacyValue?
    public var appItemId: LegacyValue?
    public var applicationVersion: String?
    public var bundleId: String?
    public var downloadId: LegacyValue?
    public var expirationDate: String?
    public var expirationDateMs: LegacyValue?
    public var expirationDatePst: String?
    public var inApp: [ReceiptInApp]?
    public var originalApplicationVersion: String?
    public var originalPurchaseDate: String?
    public var originalPurchaseDateMs: LegacyValue?
    public var originalPurchaseDatePst: String?
    public var preorderDate: String?
    public var preorderDateMs: LegacyValue?
    public var preorderDatePst: String?
    public var receiptCreationDate: String?
    public var receiptCreationDateMs: LegacyValue?
    public var receiptCreationDatePst: String?
    public var receiptType: String?
    public var requestDate: String?
    public var requestDateMs: LegacyValue?
    public var requestDatePst: String?
    public var versionExternalIdentifier: LegacyValue?

    public init(
        adamId: LegacyValue? = nil, appItemId: LegacyValue? = nil, applicationVersion: String? = nil,
        bundleId: String? = nil, downloadId: LegacyValue? = nil, expirationDate: String? = nil,
        expirationDateMs: LegacyValue? = nil, expirationDatePst: String? = nil, inApp: [ReceiptInApp]? = nil,
        originalApplicationVersion: String? = nil, originalPurchaseDate: String? = nil,
        originalPurchaseDateMs: LegacyValue? = nil, originalPurchaseDatePst: String? = nil,
        preorderDate: String? = nil, preorderDateMs: LegacyValue? = nil, preorderDatePst: String? = nil,
        receiptCreationDate: String? = nil, receiptCreationDateMs: LegacyValue? = nil,
        receiptCreationDatePst: String? = nil, receiptType: String? = nil, requestDate: String? = nil,
        requestDateMs: LegacyValue? = nil, requestDatePst: String? = nil,
        versionExternalIdentifier: LegacyValue? = nil
    ) {
        self.adamId = adamId
        self.appItemId = appItemId
        self.applicationVersion = applicationVersion
        self.bundleId = bundleId
        self.downloadId = downloadId
        self.expirationDate = expirationDate
        self.expirationDateMs = expirationDateMs
        self.expirationDatePst = expirationDatePst
        self.inApp = inApp
        self.originalApplicationVersion = originalApplicationVersion
        self.originalPurchaseDate = originalPurchaseDate
        self.originalPurchaseDateMs = originalPurchaseDateMs
        self.originalPurchaseDatePst = originalPurchaseDatePst
        self.preorderDate = preorderDate
        self.preorderDateMs = preorderDateMs
        self.preorderDatePst = preorderDatePst
        self.receiptCreationDate = receiptCreationDate
        self.receiptCreationDateMs = receiptCreationDateMs
        self.receiptCreationDatePst = receiptCreationDatePst
        self.receiptType = receiptType
        self.requestDate = requestDate
        self.requestDateMs = requestDateMs
        self.requestDatePst = requestDatePst
        self.versionExternalIdentifier = versionExternalIdentifier
    }

    enum CodingKeys: String, CodingKey {
        case adamId = "adam_id"
        case appItemId = "app_item_id"
        case applicationVersion = "application_version"
        case bundleId = "bundle_id"
        case downloadId = "download_id"
        case expirationDate = "expiration_date"
        case expirationDateMs = "expiration_date_ms"
        case expirationDatePst = "expiration_date_pst"
        case inApp = "in_app"
        case originalApplicationVersion = "original_application_version"
        case originalPurchaseDate = "original_purchase_date"
        case originalPurchaseDateMs = "original_purchase_date_ms"
        case originalPurchaseDatePst = "original_purchase_date_pst"
        case preorderDate = "preorder_date"
        case preorderDateMs = "preorder_date_ms"
        case preorderDatePst = "preorder_date_pst"
        case receiptCreationDate = "receipt_creation_date"
        case receiptCreationDateMs = "receipt_creation_date_ms"
        case receiptCreationDatePst = "receipt_creation_date_pst"
        case receiptType = "receipt_type"
        case requestDate = "request_date"
        case requestDateMs = "request_date_ms"
        case requestDatePst = "request_date_pst"
        case versionExternalIdentifier = "version_external_identifier"
    }
}

/// One in-app transaction of `receipt.in_app` or `latest_receipt_info` (the latter adds
/// the last five fields).
public struct ReceiptInApp: Codable, Hashable, Sendable {
    public var cancellationDate: String?
    public var cancellationDateMs: LegacyValue?
    public var cancellationDatePst: String?
    public var cancellationReason: LegacyValue?
    public var expiresDate: String?
    public var expiresDateMs: LegacyValue?
    public var expiresDatePst: String?
    public var isInIntroOfferPeriod: LegacyValue?
    public var isTrialPeriod: LegacyValue?
    public var originalPurchaseDate: String?
    public var originalPurchaseDateMs: LegacyValue?
    public var originalPurchaseDatePst: String?
    public var originalTransactionId: String?
    public var productId: String?
    public var promotionalOfferId: String?
    public var purchaseDate: String?
    public var purchaseDateMs: LegacyValue?
    public var purchaseDatePst: String?
    public var quantity: LegacyValue?
    public var transactionId: String?
    public var webOrderLineItemId: String?
    public var appAccountToken: String?
    public var inAppOwnershipType: InAppOwnershipType?
    public var isUpgraded: LegacyValue?
    public var offerCodeRefName: String?
    public var subscriptionGroupIdentifier: String?

    public init(
        cancellationDate: String? = nil, cancellationDateMs: LegacyValue? = nil, cancellationDatePst: String? = nil,
        cancellationReason: LegacyValue? = nil, expiresDate: String? = nil, expiresDateMs: LegacyValue? = nil,
        expiresDatePst: String? = nil, isInIntroOfferPeriod: LegacyValue? = nil, isTrialPeriod: LegacyValue? = nil,
        originalPurchaseDate: String? = nil, originalPurchaseDateMs: LegacyValue? = nil,
        originalPurchaseDatePst: String? = nil, originalTransactionId: String? = nil, productId: String? = nil,
        promotionalOfferId: String? = nil, purchaseDate: String? = nil, purchaseDateMs: LegacyValue? = nil,
        purchaseDatePst: String? = nil, quantity: LegacyValue? = nil, transactionId: String? = nil,
        webOrderLineItemId: String? = nil, appAccountToken: String? = nil,
        inAppOwnershipType: InAppOwnershipType? = nil, isUpgraded: LegacyValue? = nil,
        offerCodeRefName: String? = nil, subscriptionGroupIdentifier: String? = nil
    ) {
        self.cancellationDate = cancellationDate
        self.cancellationDateMs = cancellationDateMs
        self.cancellationDatePst = cancellationDatePst
        self.cancellationReason = cancellationReason
        self.expiresDate = expiresDate
        self.expiresDateMs = expiresDateMs
        self.expiresDatePst = expiresDatePst
        self.isInIntroOfferPeriod = isInIntroOfferPeriod
        self.isTrialPeriod = isTrialPeriod
        self.originalPurchaseDate = originalPurchaseDate
        self.originalPurchaseDateMs = originalPurchaseDateMs
        self.originalPurchaseDatePst = originalPurchaseDatePst
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.promotionalOfferId = promotionalOfferId
        self.purchaseDate = purchaseDate
        self.purchaseDateMs = purchaseDateMs
        self.purchaseDatePst = purchaseDatePst
        self.quantity = quantity
        self.transactionId = transactionId
        self.webOrderLineItemId = webOrderLineItemId
        self.appAccountToken = appAccountToken
        self.inAppOwnershipType = inAppOwnershipType
        self.isUpgraded = isUpgraded
        self.offerCodeRefName = offerCodeRefName
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
    }

    enum CodingKeys: String, CodingKey {
        case cancellationDate = "cancellation_date"
        case cancellationDateMs = "cancellation_date_ms"
        case cancellationDatePst = "cancellation_date_pst"
        case cancellationReason = "cancellation_reason"
        case expiresDate = "expires_date"
        case expiresDateMs = "expires_date_ms"
        case expiresDatePst = "expires_date_pst"
        case isInIntroOfferPeriod = "is_in_intro_offer_period"
        case isTrialPeriod = "is_trial_period"
        case originalPurchaseDate = "original_purchase_date"
        case originalPurchaseDateMs = "original_purchase_date_ms"
        case originalPurchaseDatePst = "original_purchase_date_pst"
        case originalTransactionId = "original_transaction_id"
        case productId = "product_id"
        case promotionalOfferId = "promotional_offer_id"
        case purchaseDate = "purchase_date"
        case purchaseDateMs = "purchase_date_ms"
        case purchaseDatePst = "purchase_date_pst"
        case quantity
        case transactionId = "transaction_id"
        case webOrderLineItemId = "web_order_line_item_id"
        case appAccountToken = "app_account_token"
        case inAppOwnershipType = "in_app_ownership_type"
        case isUpgraded = "is_upgraded"
        case offerCodeRefName = "offer_code_ref_name"
        case subscriptionGroupIdentifier = "subscription_group_identifier"
    }
}

/// One element of `pending_renewal_info`.
public struct PendingRenewalInfo: Codable, Hashable, Sendable {
    public var autoRenewProductId: String?
    public var autoRenewStatus: LegacyValue?
    public var expirationIntent: LegacyValue?
    public var gracePeriodExpiresDate: String?
    public var gracePeriodExpiresDateMs: LegacyValue?
    public var gracePeriodExpiresDatePst: String?
    public var isInBillingRetryPeriod: LegacyValue?
    public var offerCodeRefName: String?
    public var originalTransactionId: String?
    public var priceConsentStatus: LegacyValue?
    public var priceIncreaseStatus: LegacyValue?
    public var productId: String?
    public var promotionalOfferId: String?

    public init(
        autoRenewProductId: String? = nil, autoRenewStatus: LegacyValue? = nil,
        expirationIntent: LegacyValue? = nil, gracePeriodExpiresDate: String? = nil,
        gracePeriodExpiresDateMs: LegacyValue? = nil, gracePeriodExpiresDatePst: String? = nil,
        isInBillingRetryPeriod: LegacyValue? = nil, offerCodeRefName: String? = nil,
        originalTransactionId: String? = nil, priceConsentStatus: LegacyValue? = nil,
        priceIncreaseStatus: LegacyValue? = nil, productId: String? = nil, promotionalOfferId: String? = nil
    ) {
        self.autoRenewProductId = autoRenewProductId
        self.autoRenewStatus = autoRenewStatus
        self.expirationIntent = expirationIntent
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.gracePeriodExpiresDateMs = gracePeriodExpiresDateMs
        self.gracePeriodExpiresDatePst = gracePeriodExpiresDatePst
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.offerCodeRefName = offerCodeRefName
        self.originalTransactionId = originalTransactionId
        self.priceConsentStatus = priceConsentStatus
        self.priceIncreaseStatus = priceIncreaseStatus
        self.productId = productId
        self.promotionalOfferId = promotionalOfferId
    }

    enum CodingKeys: String, CodingKey {
        case autoRenewProductId = "auto_renew_product_id"
        case autoRenewStatus = "auto_renew_status"
        case expirationIntent = "expiration_intent"
        case gracePeriodExpiresDate = "grace_period_expires_date"
        case gracePeriodExpiresDateMs = "grace_period_expires_date_ms"
        case gracePeriodExpiresDatePst = "grace_period_expires_date_pst"
        case isInBillingRetryPeriod = "is_in_billing_retry_period"
        case offerCodeRefName = "offer_code_ref_name"
        case originalTransactionId = "original_transaction_id"
        case priceConsentStatus = "price_consent_status"
        case priceIncreaseStatus = "price_increase_status"
        case productId = "product_id"
        case promotionalOfferId = "promotional_offer_id"
    }
}
