import Foundation
import StoreKeeperSupport

/// A Stripe object with a hand-written reader over `FastJSON`, for the webhook's hot path: a
/// paid Checkout Session re-read with its payment intent, charge and balance transaction
/// expanded, and the event itself. `JSONDecoder` spent a seventh of a webhook's CPU on the
/// session alone (Codable across modules: unspecialized generics, a thrown error per expanded
/// field). The contract is `FastDecodable`'s: whenever `init(fast:)` succeeds it equals what
/// `JSONDecoder` gives; anything it does not model (an expanded subscription, a value of an
/// unexpected type) makes it throw, and `JSONDecoder` decodes instead (and gives the error).
protocol StripeFastDecodable: Decodable {
    init(fast f: FastJSON.Fields) throws
}

extension StripeFastDecodable {
    static func decode(json bytes: [UInt8]) throws -> Self {
        if case .object(let fields)? = try? FastJSON.parse(bytes), let value = try? Self(fast: FastJSON.Fields(fields))
        {
            return value
        }
        return try JSONDecoder().decode(Self.self, from: Data(bytes))
    }
}

extension FastJSON.Fields {
    func required(_ key: String) throws -> String {
        guard let value = try string(key) else { throw Unsupported() }
        return value
    }

    func int(_ key: String) throws -> Int? {
        guard let value = try int64(key) else { return nil }
        guard let narrow = Int(exactly: value) else { throw Unsupported() }
        return narrow
    }

    func double(_ key: String) throws -> Double? {
        switch values[key] {
        case nil, .null?: return nil
        case .number(let text)?:
            guard let value = Double(text) else { throw Unsupported() }
            return value
        default: throw Unsupported()
        }
    }

    /// Stripe's metadata: strings only.
    func metadata(_ key: String) throws -> [String: String]? {
        guard let object = try object(key) else { return nil }
        var result: [String: String] = [:]
        for (name, value) in object.values {
            guard case .string(let text) = value else { throw Unsupported() }
            result[name] = text
        }
        return result
    }

    func nested<T: StripeFastDecodable>(_ key: String, as type: T.Type = T.self) throws -> T? {
        try object(key).map { try T(fast: $0) }
    }

    /// An id, or the object when expanded.
    func expandable<T: StripeFastDecodable>(_ key: String, as type: T.Type = T.self) throws -> StripeExpandable<T>? {
        switch values[key] {
        case nil, .null?: return nil
        case .string(let id)?: return .id(id)
        case .object(let fields)?: return .object(try T(fast: FastJSON.Fields(fields)))
        default: throw Unsupported()
        }
    }

    func list<T: StripeFastDecodable>(_ key: String, of type: T.Type = T.self) throws -> StripeList<T>? {
        guard let list = try object(key) else { return nil }
        guard case .array(let items)? = list.values["data"] else { throw Unsupported() }
        return StripeList(
            data: try items.map {
                guard case .object(let fields) = $0 else { throw Unsupported() }
                return try T(fast: FastJSON.Fields(fields))
            }, hasMore: try list.bool("has_more"))
    }
}

extension StripeObjectId: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws { self.init(id: try f.required("id")) }
}

extension StripePrice: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        id = try f.required("id")
        // Expandable: its id either way; anything else is no product (as `try?` reads it).
        switch f.values["product"] {
        case .string(let text)?: product = text
        case .object(let fields)?:
            if case .string(let text)? = fields["id"] { product = text } else { product = nil }
        default: product = nil
        }
        currency = try f.string("currency")
        unitAmount = try f.int64("unit_amount")
        type = try f.string("type")
        recurring = try f.object("recurring").map {
            Recurring(interval: try $0.string("interval"), intervalCount: try $0.int("interval_count"))
        }
        lookupKey = try f.string("lookup_key")
    }
}

extension StripeLineItem: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        self.init(
            id: try f.string("id"), quantity: try f.int("quantity"), price: try f.nested("price"),
            amountTotal: try f.int64("amount_total"), currency: try f.string("currency"))
    }
}

extension StripeBalanceTransaction: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        self.init(
            id: try f.required("id"), amount: try f.int64("amount"), fee: try f.int64("fee"), net: try f.int64("net"),
            currency: try f.string("currency"), exchangeRate: try f.double("exchange_rate"),
            status: try f.string("status"))
    }
}

extension StripeCheckoutSession.CustomerDetails.Address {
    init(fast f: FastJSON.Fields) throws {
        self.init(country: try f.string("country"), state: try f.string("state"))
    }
}

extension StripeRefund: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        self.init(
            id: try f.required("id"), amount: try f.int64("amount"), charge: try f.expandable("charge"),
            paymentIntent: try f.expandable("payment_intent"), currency: try f.string("currency"),
            status: try f.string("status"), reason: try f.string("reason"), created: try f.int64("created"),
            balanceTransaction: try f.expandable("balance_transaction"))
    }
}

extension StripeCharge: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        self.init(
            id: try f.required("id"), amount: try f.int64("amount"), amountRefunded: try f.int64("amount_refunded"),
            refunded: try f.bool("refunded"), currency: try f.string("currency"), status: try f.string("status"),
            paid: try f.bool("paid"), disputed: try f.bool("disputed"),
            paymentIntent: try f.expandable("payment_intent"),
            balanceTransaction: try f.expandable("balance_transaction"), refunds: try f.list("refunds"),
            metadata: try f.metadata("metadata"), created: try f.int64("created"), livemode: try f.bool("livemode"),
            billingDetails: try f.object("billing_details").map {
                BillingDetails(address: try $0.object("address").map { try .init(fast: $0) })
            })
    }
}

extension StripePaymentIntent: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        self.init(
            id: try f.required("id"), amount: try f.int64("amount"), amountReceived: try f.int64("amount_received"),
            currency: try f.string("currency"), status: try f.string("status"), metadata: try f.metadata("metadata"),
            latestCharge: try f.expandable("latest_charge"), customer: try f.expandable("customer"),
            created: try f.int64("created"), livemode: try f.bool("livemode"))
    }
}

extension StripeCheckoutSession: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        // An expanded subscription is `JSONDecoder`'s (a subscription-mode session, rarer).
        if case .object? = f.values["subscription"] { throw FastJSON.Fields.Unsupported() }
        var subscription: StripeExpandable<StripeSubscription>?
        if let id = try f.string("subscription") { subscription = .id(id) }
        self.init(
            id: try f.required("id"), mode: try f.string("mode"), status: try f.string("status"),
            paymentStatus: try f.string("payment_status"), url: try f.string("url"),
            expiresAt: try f.int64("expires_at"), clientReferenceId: try f.string("client_reference_id"),
            metadata: try f.metadata("metadata"), customer: try f.expandable("customer"),
            customerDetails: try f.object("customer_details").map {
                CustomerDetails(
                    email: try $0.string("email"), address: try $0.object("address").map { try .init(fast: $0) })
            },
            paymentIntent: try f.expandable("payment_intent"), subscription: subscription,
            invoice: try f.expandable("invoice"), amountTotal: try f.int64("amount_total"),
            currency: try f.string("currency"), livemode: try f.bool("livemode"), lineItems: try f.list("line_items"),
            created: try f.int64("created"),
            totalDetails: try f.object("total_details").map { TotalDetails(amountTax: try $0.int64("amount_tax")) })
    }
}

extension StripeEvent: StripeFastDecodable {
    init(fast f: FastJSON.Fields) throws {
        var event = StripeEvent(
            id: try f.required("id"), type: try f.required("type"), objectId: nil, objectType: nil,
            created: try f.int64("created"))
        event.object = try f.string("object")
        event.livemode = try f.bool("livemode")
        event.apiVersion = try f.string("api_version")
        let inner = try f.object("data")?.object("object")
        event.objectId = try inner?.string("id")
        event.objectType = try inner?.string("object")
        self = event
    }

    /// A webhook's body (the hand-written reader, else `JSONDecoder`).
    public static func decode(webhook bytes: [UInt8]) throws -> StripeEvent {
        try decode(json: bytes)
    }
}
