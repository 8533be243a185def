import Foundation

// Stripe's objects as the API version this adapter pins (`2026-07-29.dahlia`) renders them,
// reduced to what an in-app-purchase server reads. Every field is optional and unknown keys and
// enum values are kept or ignored: Stripe adds fields and values monthly.

/// Stripe's amounts: integers in the currency's smallest unit.
public enum StripeMoney {
    /// Digits after the decimal point of `currency`'s smallest unit (0 for zero-decimal
    /// currencies such as JPY and KRW, 3 for Stripe's three-decimal ones such as BHD and KWD,
    /// 2 otherwise).
    public static func decimals(_ currency: String) -> Int {
        let code = currency.lowercased()
        if zeroDecimal.contains(code) { return 0 }
        return threeDecimal.contains(code) ? 3 : 2
    }

    /// Milliunits (thousandths of the major unit, the store-neutral price unit) per smallest
    /// unit of `currency`: 1000 for yen, 10 for cents, 1 for fils.
    public static func milliunitsPerUnit(_ currency: String) -> Int64 {
        switch decimals(currency) {
        case 0: 1000
        case 3: 1
        default: 10
        }
    }

    static let threeDecimal: Set<String> = ["bhd", "jod", "kwd", "omr", "tnd"]

    static let zeroDecimal: Set<String> = [
        "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv", "xaf", "xof", "xpf",
    ]
}

/// An expandable field: an id, or the object when expanded.
public enum StripeExpandable<Object: Decodable & Sendable & Hashable>: Decodable, Sendable, Hashable {
    case id(String)
    case object(Object)

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let id = try? container.decode(String.self) {
            self = .id(id)
        } else {
            self = .object(try container.decode(Object.self))
        }
    }

    public var object: Object? {
        if case .object(let object) = self { return object }
        return nil
    }
}

extension StripeExpandable where Object: StripeIdentified {
    public var id: String {
        switch self {
        case .id(let id): id
        case .object(let object): object.id
        }
    }
}

public protocol StripeIdentified {
    var id: String { get }
}

public struct StripeList<Item: Decodable & Sendable & Hashable>: Decodable, Sendable, Hashable {
    public var data: [Item]
    public var hasMore: Bool?

    enum CodingKeys: String, CodingKey {
        case data
        case hasMore = "has_more"
    }

    public init(data: [Item], hasMore: Bool? = nil) {
        self.data = data
        self.hasMore = hasMore
    }
}

public struct StripePrice: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var product: String?
    public var currency: String?
    public var unitAmount: Int64?
    public var type: String?
    public var recurring: Recurring?
    public var lookupKey: String?

    public struct Recurring: Decodable, Sendable, Hashable {
        public var interval: String?
        public var intervalCount: Int?
        enum CodingKeys: String, CodingKey {
            case interval
            case intervalCount = "interval_count"
        }
    }

    enum CodingKeys: String, CodingKey {
        case id, product, currency, type, recurring
        case unitAmount = "unit_amount"
        case lookupKey = "lookup_key"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(String.self, forKey: .id)
        // `product` is expandable: keep its id either way.
        product =
            (try? container.decodeIfPresent(String.self, forKey: .product))
            ?? (try? container.decodeIfPresent(StripeObjectId.self, forKey: .product))?.id
        currency = try container.decodeIfPresent(String.self, forKey: .currency)
        unitAmount = try container.decodeIfPresent(Int64.self, forKey: .unitAmount)
        type = try container.decodeIfPresent(String.self, forKey: .type)
        recurring = try container.decodeIfPresent(Recurring.self, forKey: .recurring)
        lookupKey = try container.decodeIfPresent(String.self, forKey: .lookupKey)
    }
}

/// Any object, by its id only.
public struct StripeObjectId: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
}

public struct StripeLineItem: Decodable, Sendable, Hashable {
    public var id: String?
    public var quantity: Int?
    public var price: StripePrice?
    public var amountTotal: Int64?
    public var currency: String?

    enum CodingKeys: String, CodingKey {
        case id, quantity, price, currency
        case amountTotal = "amount_total"
    }
}

public struct StripeCheckoutSession: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var mode: String?
    public var status: String?
    public var paymentStatus: String?
    public var url: String?
    public var expiresAt: Int64?
    public var clientReferenceId: String?
    public var metadata: [String: String]?
    public var customer: StripeExpandable<StripeObjectId>?
    public var customerDetails: CustomerDetails?
    public var paymentIntent: StripeExpandable<StripePaymentIntent>?
    public var subscription: StripeExpandable<StripeSubscription>?
    public var invoice: StripeExpandable<StripeObjectId>?
    public var amountTotal: Int64?
    public var currency: String?
    public var livemode: Bool?
    public var lineItems: StripeList<StripeLineItem>?
    public var created: Int64?
    public var totalDetails: TotalDetails?

    public struct TotalDetails: Decodable, Sendable, Hashable {
        public var amountTax: Int64?
        enum CodingKeys: String, CodingKey { case amountTax = "amount_tax" }
    }

    public struct CustomerDetails: Decodable, Sendable, Hashable {
        public var email: String?
        public var address: Address?
        public struct Address: Decodable, Sendable, Hashable {
            /// ISO 3166-1 alpha-2.
            public var country: String?
            /// State, county, province or region.
            public var state: String?
        }
    }

    enum CodingKeys: String, CodingKey {
        case id, mode, status, url, metadata, customer, subscription, invoice, currency, livemode, created
        case paymentStatus = "payment_status"
        case expiresAt = "expires_at"
        case clientReferenceId = "client_reference_id"
        case customerDetails = "customer_details"
        case paymentIntent = "payment_intent"
        case amountTotal = "amount_total"
        case lineItems = "line_items"
        case totalDetails = "total_details"
    }

    /// Paid, or nothing to pay (a free trial, a full discount): fulfil. `unpaid`: wait for
    /// `checkout.session.async_payment_succeeded`.
    public var isPaid: Bool {
        status == "complete" && (paymentStatus == "paid" || paymentStatus == "no_payment_required")
    }
}

public struct StripePaymentIntent: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var amount: Int64?
    public var amountReceived: Int64?
    public var currency: String?
    public var status: String?
    public var metadata: [String: String]?
    public var latestCharge: StripeExpandable<StripeCharge>?
    public var customer: StripeExpandable<StripeObjectId>?
    public var created: Int64?
    public var livemode: Bool?

    enum CodingKeys: String, CodingKey {
        case id, amount, currency, status, metadata, customer, created, livemode
        case amountReceived = "amount_received"
        case latestCharge = "latest_charge"
    }
}

public struct StripeCharge: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var amount: Int64?
    public var amountRefunded: Int64?
    public var refunded: Bool?
    public var currency: String?
    public var status: String?
    public var paid: Bool?
    public var disputed: Bool?
    public var paymentIntent: StripeExpandable<StripeObjectId>?
    public var balanceTransaction: StripeExpandable<StripeBalanceTransaction>?
    public var refunds: StripeList<StripeRefund>?
    public var metadata: [String: String]?
    public var created: Int64?
    public var livemode: Bool?
    public var billingDetails: BillingDetails?

    public struct BillingDetails: Decodable, Sendable, Hashable {
        public var address: StripeCheckoutSession.CustomerDetails.Address?
    }

    enum CodingKeys: String, CodingKey {
        case id, amount, refunded, currency, status, paid, disputed, refunds, metadata, created, livemode
        case amountRefunded = "amount_refunded"
        case paymentIntent = "payment_intent"
        case balanceTransaction = "balance_transaction"
        case billingDetails = "billing_details"
    }
}

public struct StripeRefund: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var amount: Int64?
    public var charge: StripeExpandable<StripeObjectId>?
    public var paymentIntent: StripeExpandable<StripeObjectId>?
    public var currency: String?
    public var status: String?
    public var reason: String?
    public var created: Int64?
    public var balanceTransaction: StripeExpandable<StripeBalanceTransaction>?

    enum CodingKeys: String, CodingKey {
        case id, amount, charge, currency, status, reason, created
        case paymentIntent = "payment_intent"
        case balanceTransaction = "balance_transaction"
    }
}

public struct StripeDispute: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var amount: Int64?
    public var charge: StripeExpandable<StripeObjectId>?
    public var paymentIntent: StripeExpandable<StripeObjectId>?
    public var currency: String?
    public var status: String?
    public var reason: String?
    public var created: Int64?

    enum CodingKeys: String, CodingKey {
        case id, amount, charge, currency, status, reason, created
        case paymentIntent = "payment_intent"
    }

    /// An inquiry (`warning_…`): no money moved; never a reason to revoke.
    public var isInquiry: Bool { status?.hasPrefix("warning_") == true }
}

public struct StripeBalanceTransaction: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var amount: Int64?
    public var fee: Int64?
    public var net: Int64?
    public var currency: String?
    public var exchangeRate: Double?
    public var status: String?

    enum CodingKeys: String, CodingKey {
        case id, amount, fee, net, currency, status
        case exchangeRate = "exchange_rate"
    }
}

public struct StripeSubscriptionItem: Decodable, Sendable, Hashable {
    public var id: String?
    public var price: StripePrice?
    public var quantity: Int?
    public var currentPeriodStart: Int64?
    public var currentPeriodEnd: Int64?

    enum CodingKeys: String, CodingKey {
        case id, price, quantity
        case currentPeriodStart = "current_period_start"
        case currentPeriodEnd = "current_period_end"
    }
}

public struct StripeSubscription: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var status: String?
    public var customer: StripeExpandable<StripeObjectId>?
    public var items: StripeList<StripeSubscriptionItem>?
    public var cancelAtPeriodEnd: Bool?
    public var cancelAt: Int64?
    public var canceledAt: Int64?
    public var endedAt: Int64?
    public var trialEnd: Int64?
    public var startDate: Int64?
    public var metadata: [String: String]?
    public var latestInvoice: StripeExpandable<StripeInvoice>?
    public var pauseCollection: PauseCollection?
    public var livemode: Bool?
    public var created: Int64?
    /// Pre-`basil` payloads (old stored events) carry the period here; read items first.
    public var legacyCurrentPeriodEnd: Int64?
    public var legacyCurrentPeriodStart: Int64?

    public struct PauseCollection: Decodable, Sendable, Hashable {
        public var behavior: String?
        public var resumesAt: Int64?
        enum CodingKeys: String, CodingKey {
            case behavior
            case resumesAt = "resumes_at"
        }
    }

    enum CodingKeys: String, CodingKey {
        case id, status, customer, items, metadata, livemode, created
        case cancelAtPeriodEnd = "cancel_at_period_end"
        case cancelAt = "cancel_at"
        case canceledAt = "canceled_at"
        case endedAt = "ended_at"
        case trialEnd = "trial_end"
        case startDate = "start_date"
        case latestInvoice = "latest_invoice"
        case pauseCollection = "pause_collection"
        case legacyCurrentPeriodEnd = "current_period_end"
        case legacyCurrentPeriodStart = "current_period_start"
    }

    /// The paid period's end: the latest item's (since `basil`), else the top level's.
    public var currentPeriodEnd: Int64? {
        items?.data.compactMap(\.currentPeriodEnd).max() ?? legacyCurrentPeriodEnd
    }

    public var currentPeriodStart: Int64? {
        items?.data.compactMap(\.currentPeriodStart).max() ?? legacyCurrentPeriodStart
    }

    public var price: StripePrice? { items?.data.first?.price }
}

public struct StripeInvoice: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var status: String?
    public var billingReason: String?
    public var customer: StripeExpandable<StripeObjectId>?
    public var currency: String?
    public var amountPaid: Int64?
    public var amountDue: Int64?
    public var total: Int64?
    public var attemptCount: Int?
    public var nextPaymentAttempt: Int64?
    public var parent: Parent?
    public var lines: StripeList<Line>?
    public var payments: StripeList<Payment>?
    public var livemode: Bool?
    public var created: Int64?
    public var statusTransitions: StatusTransitions?
    /// Pre-`basil` payloads (old stored events, an older account version): the invoice's
    /// subscription and payment at the top level. Read after `parent` and `payments`.
    public var legacySubscription: StripeExpandable<StripeObjectId>?
    public var legacyPaymentIntent: StripeExpandable<StripeObjectId>?
    /// The customer's address when the invoice was finalized.
    public var customerAddress: StripeCheckoutSession.CustomerDetails.Address?
    /// The taxes it charged (`total_taxes` since `basil`; `tax` before).
    public var totalTaxes: [Tax]?
    public var legacyTax: Int64?

    public struct Tax: Decodable, Sendable, Hashable {
        public var amount: Int64?
    }

    /// Tax included in what it charged.
    public var taxAmount: Int64? {
        totalTaxes.map { $0.reduce(0) { $0 + ($1.amount ?? 0) } } ?? legacyTax
    }

    public struct Parent: Decodable, Sendable, Hashable {
        public var type: String?
        public var subscriptionDetails: SubscriptionDetails?
        enum CodingKeys: String, CodingKey {
            case type
            case subscriptionDetails = "subscription_details"
        }
    }

    public struct SubscriptionDetails: Decodable, Sendable, Hashable {
        public var subscription: StripeExpandable<StripeObjectId>?
        public var metadata: [String: String]?
    }

    public struct Line: Decodable, Sendable, Hashable {
        public var id: String?
        public var amount: Int64?
        public var period: Period?
        public var pricing: Pricing?
        public var quantity: Int?
        public struct Period: Decodable, Sendable, Hashable {
            public var start: Int64?
            public var end: Int64?
        }
        public struct Pricing: Decodable, Sendable, Hashable {
            public var priceDetails: PriceDetails?
            enum CodingKeys: String, CodingKey { case priceDetails = "price_details" }
        }
        public struct PriceDetails: Decodable, Sendable, Hashable {
            public var price: String?
            public var product: String?
        }
    }

    public struct Payment: Decodable, Sendable, Hashable {
        public var id: String?
        public var status: String?
        public var payment: Reference?
        public struct Reference: Decodable, Sendable, Hashable {
            public var type: String?
            public var paymentIntent: StripeExpandable<StripeObjectId>?
            public var charge: StripeExpandable<StripeObjectId>?
            enum CodingKeys: String, CodingKey {
                case type, charge
                case paymentIntent = "payment_intent"
            }
        }
    }

    public struct StatusTransitions: Decodable, Sendable, Hashable {
        public var paidAt: Int64?
        enum CodingKeys: String, CodingKey { case paidAt = "paid_at" }
    }

    enum CodingKeys: String, CodingKey {
        case id, status, customer, currency, total, parent, lines, payments, livemode, created
        case billingReason = "billing_reason"
        case amountPaid = "amount_paid"
        case amountDue = "amount_due"
        case attemptCount = "attempt_count"
        case nextPaymentAttempt = "next_payment_attempt"
        case statusTransitions = "status_transitions"
        case legacySubscription = "subscription"
        case legacyPaymentIntent = "payment_intent"
        case customerAddress = "customer_address"
        case totalTaxes = "total_taxes"
        case legacyTax = "tax"
    }

    /// The subscription it bills (`parent.subscription_details.subscription` since `basil`).
    public var subscriptionId: String? { parent?.subscriptionDetails?.subscription?.id ?? legacySubscription?.id }
    /// The subscription's metadata when the invoice was finalized.
    public var subscriptionMetadata: [String: String]? { parent?.subscriptionDetails?.metadata }
    /// The payment intent that paid it (through its InvoicePayments).
    public var paymentIntentId: String? {
        payments?.data.first { $0.status == "paid" }?.payment?.paymentIntent?.id
            ?? payments?.data.first?.payment?.paymentIntent?.id ?? legacyPaymentIntent?.id
    }
    /// The period the invoice bills: the subscription line's.
    public var periodEnd: Int64? { lines?.data.compactMap { $0.period?.end }.max() }
    public var periodStart: Int64? { lines?.data.compactMap { $0.period?.start }.max() }
}

public struct StripeCustomer: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var metadata: [String: String]?
}

public struct StripePortalSession: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var url: String
}

/// An event: `data.object` is kept raw (its type depends on `type`), with its id.
public struct StripeEvent: Decodable, Sendable, Hashable, StripeIdentified {
    public var id: String
    public var object: String?
    public var type: String
    public var created: Int64?
    public var livemode: Bool?
    public var apiVersion: String?
    public var objectId: String?
    public var objectType: String?

    enum CodingKeys: String, CodingKey {
        case id, object, type, created, livemode, data
        case apiVersion = "api_version"
    }

    struct DataField: Decodable {
        var object: Inner?
        struct Inner: Decodable {
            var id: String?
            var object: String?
        }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(String.self, forKey: .id)
        object = try container.decodeIfPresent(String.self, forKey: .object)
        type = try container.decode(String.self, forKey: .type)
        created = try container.decodeIfPresent(Int64.self, forKey: .created)
        livemode = try container.decodeIfPresent(Bool.self, forKey: .livemode)
        apiVersion = try container.decodeIfPresent(String.self, forKey: .apiVersion)
        let data = try container.decodeIfPresent(DataField.self, forKey: .data)
        objectId = data?.object?.id
        objectType = data?.object?.object
    }

    public init(id: String, type: String, objectId: String?, objectType: String?, created: Int64? = nil) {
        self.id = id
        self.type = type
        self.objectId = objectId
        self.objectType = objectType
        self.created = created
    }
}

/// Stripe's error envelope.
public struct StripeErrorBody: Decodable, Sendable {
    public struct Inner: Decodable, Sendable {
        public var type: String?
        public var code: String?
        public var message: String?
        public var param: String?
    }
    public var error: Inner
}
