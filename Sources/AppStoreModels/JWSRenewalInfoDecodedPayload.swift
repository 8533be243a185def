/// The decoded payload of a `JWSRenewalInfo` (Apple's JWS documentation §5). It has no `bundleId`.
public struct JWSRenewalInfoDecodedPayload: Codable, Hashable, Sendable {
    public var originalTransactionId: String?
    public var productId: String?
    public var autoRenewProductId: String?
    public var autoRenewStatus: AutoRenewStatus?
    public var expirationIntent: ExpirationIntent?
    public var isInBillingRetryPeriod: Bool?
    public var gracePeriodExpiresDate: Int64?
    public var priceIncreaseStatus: PriceIncreaseStatus?
    public var offerType: OfferType?
    public var offerIdentifier: String?
    public var offerDiscountType: OfferDiscountType?
    public var offerPeriod: String?
    public var signedDate: Int64?
    public var environment: AppStoreEnvironment?
    public var recentSubscriptionStartDate: Int64?
    public var renewalDate: Int64?
    public var renewalPrice: Int64?
    public var currency: String?
    public var eligibleWinBackOfferIds: [String]?
    public var appAccountToken: String?
    public var appTransactionId: String?
    public var renewalBillingPlanType: BillingPlanType?
    public var commitmentInfo: RenewalCommitmentInfo?
    public var advancedCommerceInfo: JSONValue?

    public init(
        originalTransactionId: String? = nil, productId: String? = nil, autoRenewProductId: String? = nil,
        autoRenewStatus: AutoRenewStatus? = nil, expirationIntent: ExpirationIntent? = nil,
        isInBillingRetryPeriod: Bool? = nil, gracePeriodExpiresDate: Int64? = nil,
        priceIncreaseStatus: PriceIncreaseStatus? = nil, offerType: OfferType? = nil, offerIdentifier: String? = nil,
        offerDiscountType: OfferDiscountType? = nil, offerPeriod: String? = nil, signedDate: Int64? = nil,
        environment: AppStoreEnvironment? = nil, recentSubscriptionStartDate: Int64? = nil,
        renewalDate: Int64? = nil, renewalPrice: Int64? = nil, currency: String? = nil,
        eligibleWinBackOfferIds: [String]? = nil, appAccountToken: String? = nil, appTransactionId: String? = nil,
        renewalBillingPlanType: BillingPlanType? = nil, commitmentInfo: RenewalCommitmentInfo? = nil,
        advancedCommerceInfo: JSONValue? = nil
    ) {
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.autoRenewProductId = autoRenewProductId
        self.autoRenewStatus = autoRenewStatus
        self.expirationIntent = expirationIntent
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.priceIncreaseStatus = priceIncreaseStatus
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.offerDiscountType = offerDiscountType
        self.offerPeriod = offerPeriod
        self.signedDate = signedDate
        self.environment = environment
        self.recentSubscriptionStartDate = recentSubscriptionStartDate
        self.renewalDate = renewalDate
        self.renewalPrice = renewalPrice
        self.currency = currency
        self.eligibleWinBackOfferIds = eligibleWinBackOfferIds
        self.appAccountToken = appAccountToken
        self.appTransactionId = appTransactionId
        self.renewalBillingPlanType = renewalBillingPlanType
        self.commitmentInfo = commitmentInfo
        self.advancedCommerceInfo = advancedCommerceInfo
    }
}

/// `commitmentInfo` of renewal info.
public struct RenewalCommitmentInfo: Codable, Hashable, Sendable {
    public var commitmentAutoRenewProductId: String?
    public var commitmentAutoRenewStatus: AutoRenewStatus?
    public var commitmentRenewalBillingPlanType: BillingPlanType?
    public var commitmentRenewalDate: Int64?
    public var commitmentRenewalPrice: Int64?

    public init(
        commitmentAutoRenewProductId: String? = nil, commitmentAutoRenewStatus: AutoRenewStatus? = nil,
        commitmentRenewalBillingPlanType: BillingPlanType? = nil, commitmentRenewalDate: Int64? = nil,
        commitmentRenewalPrice: Int64? = nil
    ) {
        self.commitmentAutoRenewProductId = commitmentAutoRenewProductId
        self.commitmentAutoRenewStatus = commitmentAutoRenewStatus
        self.commitmentRenewalBillingPlanType = commitmentRenewalBillingPlanType
        self.commitmentRenewalDate = commitmentRenewalDate
        self.commitmentRenewalPrice = commitmentRenewalPrice
    }
}
