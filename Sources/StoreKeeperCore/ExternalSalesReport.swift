import Foundation

/// Sales made outside a store that the store must be told of (Apple's External Purchase
/// reports for web payments linked out to): what storage builds from its records and keeps
/// until the store accepts it. The store's adapter writes it in the store's own request body.
/// Amounts are milliunits of `reportingCurrency`; dates milliseconds since 1970.
public struct ExternalSalesReport: Codable, Hashable, Sendable {
    public var requestIdentifier: String?
    public var externalPurchaseId: String?
    /// `LINE_ITEM`, `NO_LINE_ITEM`, `UNRECOGNIZED_TOKEN` or `DUPLICATE_TOKEN`.
    public var status: String?
    public var lineItems: [LineItem]?

    public init(requestIdentifier: String?, externalPurchaseId: String?, status: String?, lineItems: [LineItem]? = nil)
    {
        self.requestIdentifier = requestIdentifier
        self.externalPurchaseId = externalPurchaseId
        self.status = status
        self.lineItems = lineItems
    }

    public static let lineItem = "LINE_ITEM"
    public static let noLineItem = "NO_LINE_ITEM"
    public static let unrecognizedToken = "UNRECOGNIZED_TOKEN"
    public static let duplicateToken = "DUPLICATE_TOKEN"

    /// One sale or refund.
    public struct LineItem: Codable, Hashable, Sendable {
        public var lineItemId: String?
        public var creationDate: Int64?
        /// `BUY` or `REFUND`.
        public var eventType: String?
        /// `ONE_TIME_BUY` or `SUBSCRIPTION`.
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
        /// A refund's or a later subscription payment's: the line item it refers to.
        public var referenceLineItemId: String?
        /// A subscription's: `SUBSCRIPTION_START`, `RENEWAL`, `SUBSCRIPTION_CHANGE`.
        public var subscriptionEvent: String?
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

        public static let oneTimeBuy = "ONE_TIME_BUY"
        public static let subscription = "SUBSCRIPTION"
    }
}
