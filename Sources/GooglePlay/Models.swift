import Foundation

// Google Play Developer API and Real-time developer notification payloads
// (Google's Android Publisher API, v3). int64 values travel as JSON strings; enums of v2 resources
// are strings, of v1 resources integers. Every type decodes leniently: unknown fields are
// ignored, unknown enum values kept raw.

/// An int64 Google sends as a JSON string ("1795514400000") — or, sometimes, as a number.
public struct GoogleInt64: Codable, Hashable, Sendable, ExpressibleByIntegerLiteral {
    public var value: Int64

    public init(_ value: Int64) { self.value = value }
    public init(integerLiteral value: Int64) { self.value = value }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let text = try? container.decode(String.self) {
            guard let value = Int64(text) else {
                throw DecodingError.dataCorruptedError(
                    in: container, debugDescription: "not an int64: \(text.prefix(40))")
            }
            self.value = value
        } else {
            value = try container.decode(Int64.self)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(String(value))
    }
}

/// `Money`: `{"currencyCode": "EUR", "units": "9", "nanos": 990000000}`.
public struct GoogleMoney: Codable, Hashable, Sendable {
    public var currencyCode: String?
    public var units: GoogleInt64?
    public var nanos: Int32?

    public init(currencyCode: String?, units: Int64, nanos: Int32) {
        self.currencyCode = currencyCode
        self.units = GoogleInt64(units)
        self.nanos = nanos
    }

    /// Milliunits (9.99 → 9990), rounded down; nil when it overflows.
    public var milliunits: Int64? {
        let (whole, overflow) = (units?.value ?? 0).multipliedReportingOverflow(by: 1000)
        guard !overflow else { return nil }
        let (sum, overflow2) = whole.addingReportingOverflow(Int64(nanos ?? 0) / 1_000_000)
        return overflow2 ? nil : sum
    }

    /// From milliunits.
    public init(currencyCode: String, milliunits: Int64) {
        self.init(
            currencyCode: currencyCode, units: milliunits / 1000, nanos: Int32(milliunits % 1000) * 1_000_000)
    }
}

/// An RFC 3339 timestamp of a v2 resource ("2026-11-24T10:00:00.123Z", up to 9 fraction digits).
public enum GoogleTime {
    public static func parse(_ text: String?) -> Date? {
        guard var text, text.utf8.count <= 40, text.utf8.allSatisfy({ $0 < 0x80 }) else { return nil }
        // Foundation's ISO 8601 parser takes at most 3 fraction digits: trim the rest.
        if let dot = text.firstIndex(of: "."), let end = text[dot...].firstIndex(where: { !$0.isNumber && $0 != "." }) {
            let digits = text[text.index(after: dot)..<end]
            if digits.count > 3 {
                text = String(text[..<text.index(dot, offsetBy: 4)]) + String(text[end...])
            }
        }
        if let date = try? Date(text, strategy: .iso8601) { return date }
        return try? Date(
            text,
            strategy: .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(
                separator: .omitted))
    }

    /// `2026-11-24T10:00:00.123Z`.
    public static func format(_ date: Date) -> String {
        date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
    }
}

// MARK: One-time products

/// `purchases.productsv2.getproductpurchasev2`: `ProductPurchaseV2`.
public struct ProductPurchaseV2: Codable, Hashable, Sendable {
    public struct LineItem: Codable, Hashable, Sendable {
        public struct OfferDetails: Codable, Hashable, Sendable {
            public var purchaseOptionId: String?
            public var offerId: String?
            public var offerTags: [String]?
            public var quantity: Int?
            public var refundableQuantity: Int?
            /// `CONSUMPTION_STATE_YET_TO_BE_CONSUMED`, `CONSUMPTION_STATE_CONSUMED`.
            public var consumptionState: String?

            public init(
                purchaseOptionId: String? = nil, offerId: String? = nil, quantity: Int?, refundableQuantity: Int?,
                consumptionState: String?
            ) {
                self.purchaseOptionId = purchaseOptionId
                self.offerId = offerId
                self.quantity = quantity
                self.refundableQuantity = refundableQuantity
                self.consumptionState = consumptionState
            }
        }
        public var productId: String?
        public var productOfferDetails: OfferDetails?

        public init(productId: String?, productOfferDetails: OfferDetails?) {
            self.productId = productId
            self.productOfferDetails = productOfferDetails
        }
    }
    public struct PurchaseStateContext: Codable, Hashable, Sendable {
        /// `PURCHASED`, `CANCELLED`, `PENDING`.
        public var purchaseState: String?
        public init(purchaseState: String?) { self.purchaseState = purchaseState }
    }
    public struct TestPurchaseContext: Codable, Hashable, Sendable {
        public var fopType: String?
        public init(fopType: String?) { self.fopType = fopType }
    }

    public var kind: String?
    public var productLineItem: [LineItem]?
    public var purchaseStateContext: PurchaseStateContext?
    public var testPurchaseContext: TestPurchaseContext?
    public var orderId: String?
    public var obfuscatedExternalAccountId: String?
    public var obfuscatedExternalProfileId: String?
    public var regionCode: String?
    public var purchaseCompletionTime: String?
    /// `ACKNOWLEDGEMENT_STATE_PENDING`, `ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED`.
    public var acknowledgementState: String?

    public init() {}

    public static let purchased = "PURCHASED"
    public static let pending = "PENDING"
    public static let cancelled = "CANCELLED"
}

public enum AcknowledgementState {
    public static let pending = "ACKNOWLEDGEMENT_STATE_PENDING"
    public static let acknowledged = "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED"
}

public enum ConsumptionState {
    public static let yetToBeConsumed = "CONSUMPTION_STATE_YET_TO_BE_CONSUMED"
    public static let consumed = "CONSUMPTION_STATE_CONSUMED"
}

// MARK: Subscriptions

/// `purchases.subscriptionsv2.get`: `SubscriptionPurchaseV2`.
public struct SubscriptionPurchaseV2: Codable, Hashable, Sendable {
    public struct LineItem: Codable, Hashable, Sendable {
        public struct AutoRenewingPlan: Codable, Hashable, Sendable {
            public var autoRenewEnabled: Bool?
            public var recurringPrice: GoogleMoney?
            public init(autoRenewEnabled: Bool?, recurringPrice: GoogleMoney?) {
                self.autoRenewEnabled = autoRenewEnabled
                self.recurringPrice = recurringPrice
            }
        }
        public struct PrepaidPlan: Codable, Hashable, Sendable {
            public var allowExtendAfterTime: String?
            public init(allowExtendAfterTime: String?) { self.allowExtendAfterTime = allowExtendAfterTime }
        }
        public struct OfferDetails: Codable, Hashable, Sendable {
            public var basePlanId: String?
            public var offerId: String?
            public var offerTags: [String]?
            public init(basePlanId: String?, offerId: String? = nil, offerTags: [String]? = nil) {
                self.basePlanId = basePlanId
                self.offerId = offerId
                self.offerTags = offerTags
            }
        }
        public var productId: String?
        public var expiryTime: String?
        public var latestSuccessfulOrderId: String?
        public var autoRenewingPlan: AutoRenewingPlan?
        public var prepaidPlan: PrepaidPlan?
        public var offerDetails: OfferDetails?

        public init(
            productId: String?, expiryTime: String?, latestSuccessfulOrderId: String?,
            autoRenewingPlan: AutoRenewingPlan?, offerDetails: OfferDetails? = nil
        ) {
            self.productId = productId
            self.expiryTime = expiryTime
            self.latestSuccessfulOrderId = latestSuccessfulOrderId
            self.autoRenewingPlan = autoRenewingPlan
            self.offerDetails = offerDetails
        }
    }
    public struct ExternalAccountIdentifiers: Codable, Hashable, Sendable {
        public var externalAccountId: String?
        public var obfuscatedExternalAccountId: String?
        public var obfuscatedExternalProfileId: String?
        public init(obfuscatedExternalAccountId: String?) {
            self.obfuscatedExternalAccountId = obfuscatedExternalAccountId
        }
    }
    public struct PausedStateContext: Codable, Hashable, Sendable {
        public var autoResumeTime: String?
        public init(autoResumeTime: String?) { self.autoResumeTime = autoResumeTime }
    }
    /// Only when CANCELED or EXPIRED: which kind of cancellation (each an object).
    public struct CanceledStateContext: Codable, Hashable, Sendable {
        public struct UserInitiated: Codable, Hashable, Sendable {
            public var cancelTime: String?
            public init(cancelTime: String?) { self.cancelTime = cancelTime }
        }
        public struct Empty: Codable, Hashable, Sendable { public init() {} }
        public var userInitiatedCancellation: UserInitiated?
        public var systemInitiatedCancellation: Empty?
        public var developerInitiatedCancellation: Empty?
        public var replacementCancellation: Empty?
        public init() {}
    }
    public struct Empty: Codable, Hashable, Sendable { public init() {} }
    /// A resubscription made in the Play Store's subscriptions center after the old one
    /// expired: the expired token and its account ids (gone once acknowledged).
    public struct OutOfAppPurchaseContext: Codable, Hashable, Sendable {
        public var expiredExternalAccountIdentifiers: ExternalAccountIdentifiers?
        public var expiredPurchaseToken: String?
        public init(expiredExternalAccountIdentifiers: ExternalAccountIdentifiers?, expiredPurchaseToken: String?) {
            self.expiredExternalAccountIdentifiers = expiredExternalAccountIdentifiers
            self.expiredPurchaseToken = expiredPurchaseToken
        }
    }

    public var kind: String?
    public var regionCode: String?
    public var startTime: String?
    public var subscriptionState: String?
    public var lineItems: [LineItem]?
    public var linkedPurchaseToken: String?
    public var latestOrderId: String?
    public var acknowledgementState: String?
    public var externalAccountIdentifiers: ExternalAccountIdentifiers?
    public var pausedStateContext: PausedStateContext?
    public var canceledStateContext: CanceledStateContext?
    public var testPurchase: Empty?
    public var outOfAppPurchaseContext: OutOfAppPurchaseContext?
    public var etag: String?

    public init() {}
}

/// `subscriptionState` values (§3.2).
public enum SubscriptionState {
    public static let pending = "SUBSCRIPTION_STATE_PENDING"
    public static let active = "SUBSCRIPTION_STATE_ACTIVE"
    public static let paused = "SUBSCRIPTION_STATE_PAUSED"
    public static let inGracePeriod = "SUBSCRIPTION_STATE_IN_GRACE_PERIOD"
    public static let onHold = "SUBSCRIPTION_STATE_ON_HOLD"
    public static let canceled = "SUBSCRIPTION_STATE_CANCELED"
    public static let expired = "SUBSCRIPTION_STATE_EXPIRED"
    public static let pendingPurchaseCanceled = "SUBSCRIPTION_STATE_PENDING_PURCHASE_CANCELED"
}

// MARK: Voided purchases

public struct VoidedPurchase: Codable, Hashable, Sendable {
    public var kind: String?
    public var purchaseToken: String?
    public var purchaseTimeMillis: GoogleInt64?
    public var voidedTimeMillis: GoogleInt64?
    public var orderId: String?
    /// 0 User, 1 Developer, 2 Google.
    public var voidedSource: Int?
    /// 0 Other, 1 Remorse, 2 Not_received, 3 Defective, 4 Accidental_purchase, 5 Fraud,
    /// 6 Friendly_fraud, 7 Chargeback, 8 Unacknowledged_purchase.
    public var voidedReason: Int?
    /// Quantity-based partial refunds only.
    public var voidedQuantity: Int?

    public init(
        purchaseToken: String?, purchaseTimeMillis: Int64?, voidedTimeMillis: Int64?, orderId: String?,
        voidedSource: Int?, voidedReason: Int?, voidedQuantity: Int? = nil
    ) {
        self.kind = "androidpublisher#voidedPurchase"
        self.purchaseToken = purchaseToken
        self.purchaseTimeMillis = purchaseTimeMillis.map { GoogleInt64($0) }
        self.voidedTimeMillis = voidedTimeMillis.map { GoogleInt64($0) }
        self.orderId = orderId
        self.voidedSource = voidedSource
        self.voidedReason = voidedReason
        self.voidedQuantity = voidedQuantity
    }
}

public struct VoidedPurchasesListResponse: Codable, Hashable, Sendable {
    public struct PageInfo: Codable, Hashable, Sendable {
        public var totalResults: Int?
        public var resultPerPage: Int?
        public var startIndex: Int?
        public init(totalResults: Int?, resultPerPage: Int?, startIndex: Int?) {
            self.totalResults = totalResults
            self.resultPerPage = resultPerPage
            self.startIndex = startIndex
        }
    }
    public struct TokenPagination: Codable, Hashable, Sendable {
        public var nextPageToken: String?
        public var previousPageToken: String?
        public init(nextPageToken: String?) { self.nextPageToken = nextPageToken }
    }
    public var pageInfo: PageInfo?
    public var tokenPagination: TokenPagination?
    public var voidedPurchases: [VoidedPurchase]?

    public init(pageInfo: PageInfo?, tokenPagination: TokenPagination?, voidedPurchases: [VoidedPurchase]?) {
        self.pageInfo = pageInfo
        self.tokenPagination = tokenPagination
        self.voidedPurchases = voidedPurchases
    }
}

// MARK: Refund review

/// `orders.reviewrefund` body.
public struct ReviewRefundRequest: Codable, Hashable, Sendable {
    public var pendingRefundToken: String?
    public var sampleContentProvided: Bool?
    /// `DECLINE`, `APPROVE`, `NEUTRAL`.
    public var refundPreference: String?
    /// 0…100000.
    public var consumptionPercentageMilliunits: Int?

    public init(
        pendingRefundToken: String?, sampleContentProvided: Bool?, refundPreference: String?,
        consumptionPercentageMilliunits: Int?
    ) {
        self.pendingRefundToken = pendingRefundToken
        self.sampleContentProvided = sampleContentProvided
        self.refundPreference = refundPreference
        self.consumptionPercentageMilliunits = consumptionPercentageMilliunits
    }
}

// MARK: Real-time developer notifications

/// The decoded `data` of a Pub/Sub push: exactly one of the notification objects is present.
public struct DeveloperNotification: Codable, Hashable, Sendable {
    public struct Subscription: Codable, Hashable, Sendable {
        public var version: String?
        public var notificationType: Int?
        public var purchaseToken: String?
        public var subscriptionId: String?
        public init(notificationType: Int?, purchaseToken: String?) {
            self.version = "1.0"
            self.notificationType = notificationType
            self.purchaseToken = purchaseToken
        }
    }
    public struct OneTimeProduct: Codable, Hashable, Sendable {
        public var version: String?
        /// 1 ONE_TIME_PRODUCT_PURCHASED, 2 ONE_TIME_PRODUCT_CANCELED.
        public var notificationType: Int?
        public var purchaseToken: String?
        public var sku: String?
        public init(notificationType: Int?, purchaseToken: String?, sku: String?) {
            self.version = "1.0"
            self.notificationType = notificationType
            self.purchaseToken = purchaseToken
            self.sku = sku
        }
    }
    public struct Voided: Codable, Hashable, Sendable {
        public var purchaseToken: String?
        public var orderId: String?
        /// 1 subscription, 2 one-time.
        public var productType: Int?
        /// 1 full, 2 quantity-based partial.
        public var refundType: Int?
        public init(purchaseToken: String?, orderId: String?, productType: Int?, refundType: Int?) {
            self.purchaseToken = purchaseToken
            self.orderId = orderId
            self.productType = productType
            self.refundType = refundType
        }
    }
    public struct PendingRefundReview: Codable, Hashable, Sendable {
        public var version: String?
        public var pendingRefundToken: String?
        public var orderId: String?
        public var refundReason: Int?
        public var obfuscatedAccountId: String?
        public init(pendingRefundToken: String?, orderId: String?, refundReason: Int?, obfuscatedAccountId: String?) {
            self.version = "1.0"
            self.pendingRefundToken = pendingRefundToken
            self.orderId = orderId
            self.refundReason = refundReason
            self.obfuscatedAccountId = obfuscatedAccountId
        }
    }
    public struct Test: Codable, Hashable, Sendable {
        public var version: String?
        public init() { version = "1.0" }
    }

    public var version: String?
    public var packageName: String?
    public var eventTimeMillis: GoogleInt64?
    public var subscriptionNotification: Subscription?
    public var oneTimeProductNotification: OneTimeProduct?
    public var voidedPurchaseNotification: Voided?
    public var pendingRefundReviewNotification: PendingRefundReview?
    public var testNotification: Test?

    public init(packageName: String, eventTimeMillis: Int64) {
        self.version = "1.0"
        self.packageName = packageName
        self.eventTimeMillis = GoogleInt64(eventTimeMillis)
    }

    /// The purchase the notification is about (nil for a test or a refund review).
    public var purchaseToken: String? {
        subscriptionNotification?.purchaseToken ?? oneTimeProductNotification?.purchaseToken
            ?? voidedPurchaseNotification?.purchaseToken
    }

    /// A short name for logs and the dashboard: `SUBSCRIPTION_RENEWED`, `ONE_TIME_PRODUCT_PURCHASED`…
    public var typeName: String {
        if let type = subscriptionNotification?.notificationType {
            return Self.subscriptionTypes[type] ?? "SUBSCRIPTION_\(type)"
        }
        if let type = oneTimeProductNotification?.notificationType {
            return type == 1
                ? "ONE_TIME_PRODUCT_PURCHASED" : type == 2 ? "ONE_TIME_PRODUCT_CANCELED" : "ONE_TIME_\(type)"
        }
        if voidedPurchaseNotification != nil { return "VOIDED_PURCHASE" }
        if pendingRefundReviewNotification != nil { return "PENDING_REFUND_REVIEW" }
        if testNotification != nil { return "TEST" }
        return "UNKNOWN"
    }

    public static let subscriptionTypes: [Int: String] = [
        1: "SUBSCRIPTION_RECOVERED", 2: "SUBSCRIPTION_RENEWED", 3: "SUBSCRIPTION_CANCELED",
        4: "SUBSCRIPTION_PURCHASED", 5: "SUBSCRIPTION_ON_HOLD", 6: "SUBSCRIPTION_IN_GRACE_PERIOD",
        7: "SUBSCRIPTION_RESTARTED", 8: "SUBSCRIPTION_PRICE_CHANGE_CONFIRMED", 9: "SUBSCRIPTION_DEFERRED",
        10: "SUBSCRIPTION_PAUSED", 11: "SUBSCRIPTION_PAUSE_SCHEDULE_CHANGED", 12: "SUBSCRIPTION_REVOKED",
        13: "SUBSCRIPTION_EXPIRED", 17: "SUBSCRIPTION_ITEMS_CHANGED", 18: "SUBSCRIPTION_CANCELLATION_SCHEDULED",
        19: "SUBSCRIPTION_PRICE_CHANGE_UPDATED", 20: "SUBSCRIPTION_PENDING_PURCHASE_CANCELED",
        22: "SUBSCRIPTION_PRICE_STEP_UP_CONSENT_UPDATED",
    ]
}

/// A Pub/Sub push body ("wrapped" format).
public struct PubSubPush: Codable, Hashable, Sendable {
    public struct Message: Codable, Hashable, Sendable {
        public var attributes: [String: String]?
        /// Base64 of the UTF-8 JSON `DeveloperNotification`.
        public var data: String?
        public var messageId: String?
        public var publishTime: String?

        public init(data: String?, messageId: String?, publishTime: String?) {
            self.data = data
            self.messageId = messageId
            self.publishTime = publishTime
        }
    }
    public var message: Message?
    public var subscription: String?

    public init(message: Message?, subscription: String?) {
        self.message = message
        self.subscription = subscription
    }
}

/// Google's JSON error body: `{"error": {"code", "message", "errors": [{"reason", …}]}}`.
public struct GoogleErrorBody: Codable, Hashable, Sendable {
    public struct Detail: Codable, Hashable, Sendable {
        public struct Item: Codable, Hashable, Sendable {
            public var message: String?
            public var domain: String?
            public var reason: String?
            public init(message: String?, domain: String? = "global", reason: String?) {
                self.message = message
                self.domain = domain
                self.reason = reason
            }
        }
        public var code: Int?
        public var message: String?
        public var errors: [Item]?
        public var status: String?
    }
    public var error: Detail?

    public init(code: Int, message: String, reason: String, status: String? = nil) {
        self.error = Detail(
            code: code, message: message, errors: [.init(message: message, reason: reason)], status: status)
    }
}

// MARK: Orders

/// `orders.batchGet`'s answer.
public struct GoogleOrders: Codable, Hashable, Sendable {
    public var orders: [GoogleOrder]?

    public init(orders: [GoogleOrder]?) {
        self.orders = orders
    }
}

/// `orders.get` (google-play.md §6.2): what one order charged, for accounting — never for
/// entitlement (the purchase resources say what is owned).
public struct GoogleOrder: Codable, Hashable, Sendable {
    public enum State {
        public static let processed = "PROCESSED"
        public static let refunded = "REFUNDED"
        public static let partiallyRefunded = "PARTIALLY_REFUNDED"
        public static let pending = "PENDING"
        public static let canceled = "CANCELED"
    }

    public struct LineItem: Codable, Hashable, Sendable {
        public struct OneTimePurchaseDetails: Codable, Hashable, Sendable {
            public var quantity: Int?
            public init(quantity: Int?) { self.quantity = quantity }
        }
        public struct SubscriptionDetails: Codable, Hashable, Sendable {
            public var basePlanId: String?
            public var offerId: String?
            public var servicePeriodStartTime: String?
            public var servicePeriodEndTime: String?
            public init(
                basePlanId: String?, offerId: String? = nil, servicePeriodStartTime: String?,
                servicePeriodEndTime: String?
            ) {
                self.basePlanId = basePlanId
                self.offerId = offerId
                self.servicePeriodStartTime = servicePeriodStartTime
                self.servicePeriodEndTime = servicePeriodEndTime
            }
        }
        public var productId: String?
        public var listingPrice: GoogleMoney?
        public var total: GoogleMoney?
        public var tax: GoogleMoney?
        public var oneTimePurchaseDetails: OneTimePurchaseDetails?
        public var subscriptionDetails: SubscriptionDetails?
        public init() {}
    }

    public var orderId: String?
    public var purchaseToken: String?
    /// `PENDING`, `PROCESSED`, `CANCELED`, `PENDING_REFUND`, `PARTIALLY_REFUNDED`, `REFUNDED`.
    public var state: String?
    public var createTime: String?
    public var lastEventTime: String?
    /// What the buyer paid, discounts and tax included.
    public var total: GoogleMoney?
    public var tax: GoogleMoney?
    public var developerRevenueInBuyerCurrency: GoogleMoney?
    public var lineItems: [LineItem]?

    public init() {}
}

/// `ExternalTransaction` of the Android Publisher API (v3 `externaltransactions`): a payment
/// taken outside Google Play under one of its programs, as reported and as Google keeps it.
public struct ExternalTransaction: Codable, Sendable, Hashable {
    public struct Price: Codable, Sendable, Hashable {
        /// Micros of `currency`, as a decimal string.
        public var priceMicros: String
        public var currency: String

        public init(priceMicros: String, currency: String) {
            self.priceMicros = priceMicros
            self.currency = currency
        }
    }

    public struct TaxAddress: Codable, Sendable, Hashable {
        /// ISO 3166-1 alpha-2.
        public var regionCode: String
        public var administrativeArea: String?

        public init(regionCode: String, administrativeArea: String? = nil) {
            self.regionCode = regionCode
            self.administrativeArea = administrativeArea
        }
    }

    public struct OneTime: Codable, Sendable, Hashable {
        public var externalTransactionToken: String?

        public init(externalTransactionToken: String?) { self.externalTransactionToken = externalTransactionToken }
    }

    public struct Recurring: Codable, Sendable, Hashable {
        /// The first payment only.
        public var externalTransactionToken: String?
        /// Renewals: the first payment's id.
        public var initialExternalTransactionId: String?
        public var externalSubscription: ExternalSubscription?

        public init(
            externalTransactionToken: String?, initialExternalTransactionId: String?,
            externalSubscription: ExternalSubscription?
        ) {
            self.externalTransactionToken = externalTransactionToken
            self.initialExternalTransactionId = initialExternalTransactionId
            self.externalSubscription = externalSubscription
        }
    }

    public struct ExternalSubscription: Codable, Sendable, Hashable {
        /// `RECURRING` or `PREPAID`.
        public var subscriptionType: String

        public init(subscriptionType: String) { self.subscriptionType = subscriptionType }
    }

    public var externalTransactionId: String?
    public var originalPreTaxAmount: Price?
    public var originalTaxAmount: Price?
    public var currentPreTaxAmount: Price?
    public var currentTaxAmount: Price?
    /// RFC 3339.
    public var transactionTime: String?
    public var createTime: String?
    public var packageName: String?
    /// `TRANSACTION_REPORTED` or `TRANSACTION_CANCELED`.
    public var transactionState: String?
    public var userTaxAddress: TaxAddress?
    public var oneTimeTransaction: OneTime?
    public var recurringTransaction: Recurring?

    public init() {}
}

/// The body of `externaltransactions.refundexternaltransaction`: `fullRefund` or `partialRefund`.
public struct ExternalTransactionRefund: Codable, Sendable, Hashable {
    public struct FullRefund: Codable, Sendable, Hashable {
        public init() {}
    }

    public struct PartialRefund: Codable, Sendable, Hashable {
        /// Unique per refund of the transaction (`[a-zA-Z0-9_-]`).
        public var refundId: String
        public var refundPreTaxAmount: ExternalTransaction.Price

        public init(refundId: String, refundPreTaxAmount: ExternalTransaction.Price) {
            self.refundId = refundId
            self.refundPreTaxAmount = refundPreTaxAmount
        }
    }

    /// RFC 3339.
    public var refundTime: String
    public var fullRefund: FullRefund?
    public var partialRefund: PartialRefund?

    public init(refundTime: String, fullRefund: FullRefund? = nil, partialRefund: PartialRefund? = nil) {
        self.refundTime = refundTime
        self.fullRefund = fullRefund
        self.partialRefund = partialRefund
    }
}
