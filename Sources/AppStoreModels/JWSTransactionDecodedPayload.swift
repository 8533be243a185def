/// The decoded payload of a `JWSTransaction` (Apple's JWS documentation §4).
///
/// Every field is optional because Apple adds and omits fields over time; ids are strings,
/// dates are epoch milliseconds, prices are milliunits of `currency`.
public struct JWSTransactionDecodedPayload: Codable, Hashable, Sendable {
    public var transactionId: String?
    public var originalTransactionId: String?
    public var webOrderLineItemId: String?
    public var previousOriginalTransactionId: String?
    public var bundleId: String?
    public var productId: String?
    public var subscriptionGroupIdentifier: String?
    public var purchaseDate: Int64?
    public var originalPurchaseDate: Int64?
    public var expiresDate: Int64?
    public var quantity: Int32?
    public var type: ProductType?
    public var appAccountToken: String?
    public var inAppOwnershipType: InAppOwnershipType?
    public var signedDate: Int64?
    public var revocationReason: RevocationReason?
    public var revocationDate: Int64?
    public var revocationType: RevocationType?
    public var revocationPercentage: Int32?
    public var isUpgraded: Bool?
    public var offerType: OfferType?
    public var offerIdentifier: String?
    public var offerDiscountType: OfferDiscountType?
    public var offerPeriod: String?
    public var environment: AppStoreEnvironment?
    public var storefront: String?
    public var storefrontId: String?
    public var transactionReason: TransactionReason?
    public var currency: String?
    public var price: Int64?
    public var appTransactionId: String?
    public var billingPlanType: BillingPlanType?
    public var commitmentInfo: TransactionCommitmentInfo?
    public var advancedCommerceInfo: JSONValue?

    public init(
        transactionId: String? = nil, originalTransactionId: String? = nil, webOrderLineItemId: String? = nil,
        previousOriginalTransactionId: String? = nil, bundleId: String? = nil, productId: String? = nil,
        subscriptionGroupIdentifier: String? = nil, purchaseDate: Int64? = nil, originalPurchaseDate: Int64? = nil,
        expiresDate: Int64? = nil, quantity: Int32? = nil, type: ProductType? = nil, appAccountToken: String? = nil,
        inAppOwnershipType: InAppOwnershipType? = nil, signedDate: Int64? = nil,
        revocationReason: RevocationReason? = nil, revocationDate: Int64? = nil,
        revocationType: RevocationType? = nil, revocationPercentage: Int32? = nil, isUpgraded: Bool? = nil,
        offerType: OfferType? = nil, offerIdentifier: String? = nil, offerDiscountType: OfferDiscountType? = nil,
        offerPeriod: String? = nil, environment: AppStoreEnvironment? = nil, storefront: String? = nil,
        storefrontId: String? = nil, transactionReason: TransactionReason? = nil, currency: String? = nil,
        price: Int64? = nil, appTransactionId: String? = nil, billingPlanType: BillingPlanType? = nil,
        commitmentInfo: TransactionCommitmentInfo? = nil, advancedCommerceInfo: JSONValue? = nil
    ) {
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.webOrderLineItemId = webOrderLineItemId
        self.previousOriginalTransactionId = previousOriginalTransactionId
        self.bundleId = bundleId
        self.productId = productId
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.purchaseDate = purchaseDate
        self.originalPurchaseDate = originalPurchaseDate
        self.expiresDate = expiresDate
        self.quantity = quantity
        self.type = type
        self.appAccountToken = appAccountToken
        self.inAppOwnershipType = inAppOwnershipType
        self.signedDate = signedDate
        self.revocationReason = revocationReason
        self.revocationDate = revocationDate
        self.revocationType = revocationType
        self.revocationPercentage = revocationPercentage
        self.isUpgraded = isUpgraded
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.offerDiscountType = offerDiscountType
        self.offerPeriod = offerPeriod
        self.environment = environment
        self.storefront = storefront
        self.storefrontId = storefrontId
        self.transactionReason = transactionReason
        self.currency = currency
        self.price = price
        self.appTransactionId = appTransactionId
        self.billingPlanType = billingPlanType
        self.commitmentInfo = commitmentInfo
        self.advancedCommerceInfo = advancedCommerceInfo
    }

    /// Apple: the presence of `revocationDate` means refunded or revoked.
    public var isRevoked: Bool { revocationDate != nil }
}

/// `commitmentInfo` of a transaction (monthly-billed commitment plans).
public struct TransactionCommitmentInfo: Codable, Hashable, Sendable {
    public var billingPeriodNumber: Int32?
    public var totalBillingPeriods: Int32?
    public var commitmentExpiresDate: Int64?
    public var commitmentPrice: Int64?

    public init(
        billingPeriodNumber: Int32? = nil, totalBillingPeriods: Int32? = nil, commitmentExpiresDate: Int64? = nil,
        commitmentPrice: Int64? = nil
    ) {
        self.billingPeriodNumber = billingPeriodNumber
        self.totalBillingPeriods = totalBillingPeriods
        self.commitmentExpiresDate = commitmentExpiresDate
        self.commitmentPrice = commitmentPrice
    }
}
