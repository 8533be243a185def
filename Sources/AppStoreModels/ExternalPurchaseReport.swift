/// External Purchase Server API (Apple's 2025–26 App Store documentation §8): `PUT /externalPurchase/v1/reports`.
public struct ExternalPurchaseReport: Codable, Hashable, Sendable {
    /// `LINE_ITEM`, `NO_LINE_ITEM`, `UNRECOGNIZED_TOKEN`, `DUPLICATE_TOKEN`.
    public var requestIdentifier: String?
    public var externalPurchaseId: String?
    public var status: String?
    public var lineItems: [ExternalPurchaseLineItem]?

    public init(
        requestIdentifier: String?, externalPurchaseId: String?, status: String?,
        lineItems: [ExternalPurchaseLineItem]? = nil
    ) {
        self.requestIdentifier = requestIdentifier
        self.externalPurchaseId = externalPurchaseId
        self.status = status
        self.lineItems = lineItems
    }

    public static let lineItem = "LINE_ITEM"
    public static let noLineItem = "NO_LINE_ITEM"
    public static let unrecognizedToken = "UNRECOGNIZED_TOKEN"
    public static let duplicateToken = "DUPLICATE_TOKEN"
}

/// One line item: `OneTimeBuyLineItem`, `SubscriptionBuyLineItem` or `RefundLineItem` (the
/// fields they share, the others optional). Amounts are milliunits of `reportingCurrency`.
public struct ExternalPurchaseLineItem: Codable, Hashable, Sendable {
    public var lineItemId: String?
    public var creationDate: Int64?
    /// `BUY` or `REFUND`.
    public var eventType: String?
    /// `ONE_TIME_BUY`, or a subscription's.
    public var productType: String?
    public var productIdentifier: String?
    public var quantity: Int64?
    public var pricingCurrency: String?
    public var reportingCurrency: String?
    public var exchangeRate: String?
    public var amountTaxInclusive: Int64?
    public var amountTaxExclusive: Int64?
    public var taxAmount: Int64?
    public var netAmountTaxExclusive: Int64?
    public var taxCountry: String?
    public var restatement: Bool?
    public var erroneouslySubmitted: Bool?
    /// Refunds and subscription events: the line item they refer to.
    public var referenceLineItemId: String?
    /// `SubscriptionBuyLineItem`: `SUBSCRIPTION_START`, `RENEWAL`, `SUBSCRIPTION_CHANGE`,
    /// `SUBSCRIPTION_PAYMENT`.
    public var subscriptionEvent: String?
    /// `SubscriptionBuyLineItem`: the paid period (ms) and its length in days.
    public var subscriptionStartDate: Int64?
    public var subscriptionEndDate: Int64?
    public var subscriptionDaysOfPaidService: Int64?

    public init(
        lineItemId: String?, creationDate: Int64?, eventType: String?, productType: String?,
        productIdentifier: String?, quantity: Int64?, pricingCurrency: String?, reportingCurrency: String?,
        amountTaxInclusive: Int64?, amountTaxExclusive: Int64?, taxAmount: Int64?, netAmountTaxExclusive: Int64?,
        taxCountry: String?, referenceLineItemId: String? = nil
    ) {
        self.lineItemId = lineItemId
        self.creationDate = creationDate
        self.eventType = eventType
        self.productType = productType
        self.productIdentifier = productIdentifier
        self.quantity = quantity
        self.pricingCurrency = pricingCurrency
        self.reportingCurrency = reportingCurrency
        self.amountTaxInclusive = amountTaxInclusive
        self.amountTaxExclusive = amountTaxExclusive
        self.taxAmount = taxAmount
        self.netAmountTaxExclusive = netAmountTaxExclusive
        self.taxCountry = taxCountry
        self.referenceLineItemId = referenceLineItemId
    }

    /// `productType` of one-time products.
    public static let oneTimeBuy = "ONE_TIME_BUY"
    /// `productType` of subscriptions (Apple's value is [unconfirmed] in the digest).
    public static let subscription = "SUBSCRIPTION"
    public static let subscriptionEvents: Set<String> = [
        "SUBSCRIPTION_START", "RENEWAL", "SUBSCRIPTION_CHANGE", "SUBSCRIPTION_PAYMENT",
    ]
}

/// `SendReportSuccessResponse`.
public struct SendExternalPurchaseReportResponse: Codable, Hashable, Sendable {
    public var requestIdentifier: String?

    public init(requestIdentifier: String?) { self.requestIdentifier = requestIdentifier }
}
