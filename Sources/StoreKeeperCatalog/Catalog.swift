import Foundation
import Yams

/// The product catalog (docs/configuration.md, the catalog): what each App Store product
/// id is and what it grants. One file serves the server and the local App Store.
///
/// ```yaml
/// products:
///   - id: coins_60
///     type: consumable            # consumable | non_consumable | auto_renewable | non_renewing
///     grants: { currency: coins, amount: 60 }
///     prices: { USA: { currency: USD, price: 0.99 } }   # local App Store only; default 0.99 USD
///   - id: pro_monthly
///     type: auto_renewable
///     group: pro
///     period: P1M                 # local App Store only; default P1M
///     grants: { entitlement: pro }
/// ```
public struct Catalog: Hashable, Sendable {
    public var products: [Product]
    /// Answers to Apple's Get Retention Message, first match wins.
    public var retention: [RetentionRule]
    /// Prorated refunds of indivisible products and the refund preference rules (RefundPolicy).
    public var refunds: RefundPolicy

    public init(products: [Product], retention: [RetentionRule] = [], refunds: RefundPolicy = RefundPolicy()) throws {
        self.products = products
        self.retention = retention
        self.refunds = refunds
        try validate()
        try refunds.validate()
        try validateOffers()
    }

    /// The product `id` names: its own id, else an App Store product id mapped in
    /// `storeProducts.app_store` (Apple's transactions carry the App Store's id).
    public func product(_ id: String) -> Product? {
        products.first { $0.id == id } ?? products.first { $0.storeProducts?["app_store"] == id }
    }

    /// The stores a catalog maps product ids for (`storeProducts` keys).
    public static let stores = ["app_store", "google_play", "stripe"]

    /// The product a store sells as `storeProductId`: the one whose `storeProducts[store]` is it,
    /// else the one with that id and no mapping for that store.
    public func product(store: String, storeProductId: String) -> Product? {
        products.first { $0.storeProducts?[store] == storeProductId }
            ?? products.first { $0.id == storeProductId && $0.storeProducts?[store] == nil }
    }

    /// The largest currency amount one product may grant.
    public static let maxGrantAmount: Int64 = 1_000_000_000_000

    /// Products of one subscription group, in catalog order (the order ranks them: first is the
    /// highest service level, as App Store Connect ranks a group).
    public func group(_ group: String) -> [Product] { products.filter { $0.group == group } }

    /// Loads a catalog file, YAML or JSON by extension (`.yaml`, `.yml`, `.json`).
    public static func load(path: String) throws -> Catalog {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CatalogError("cannot read catalog file \(path)")
        }
        let text = String(decoding: data, as: UTF8.self)
        switch URL(fileURLWithPath: path).pathExtension.lowercased() {
        case "json": return try parse(json: text)
        case "yaml", "yml": return try parse(yaml: text)
        default: throw CatalogError("catalog file \(path) must end in .yaml, .yml or .json")
        }
    }

    public static func parse(yaml: String) throws -> Catalog {
        do {
            try CatalogKeys.check(try Yams.compose(yaml: yaml).map { CatalogKeys.plain($0, depth: 0) })
            let file = try YAMLDecoder().decode(File.self, from: yaml)
            return try Catalog(products: file.products, retention: file.retention, refunds: file.refunds)
        } catch let error as CatalogError {
            throw error
        } catch {
            throw CatalogError("catalog is not valid: \(CatalogError.describe(error))")
        }
    }

    public static func parse(json: String) throws -> Catalog {
        do {
            try CatalogKeys.check(try? JSONSerialization.jsonObject(with: Data(json.utf8)))
            let file = try JSONDecoder().decode(File.self, from: Data(json.utf8))
            return try Catalog(products: file.products, retention: file.retention, refunds: file.refunds)
        } catch let error as CatalogError {
            throw error
        } catch {
            throw CatalogError("catalog is not valid: \(CatalogError.describe(error))")
        }
    }

    struct File: Decodable {
        var products: [Product]
        var retention: [RetentionRule]
        var refunds: RefundPolicy

        enum CodingKeys: String, CodingKey { case products, retention, refunds }

        /// A list item of `retention` with a product's `id` and `type` is a product: docs/api.md's
        /// example catalog lists `season_pass` after the retention rules, at their indentation.
        enum Entry: Decodable {
            case rule(RetentionRule)
            case product(Product)

            enum Keys: String, CodingKey { case type }

            init(from decoder: any Decoder) throws {
                if try decoder.container(keyedBy: Keys.self).contains(.type) {
                    self = .product(try Product(from: decoder))
                } else {
                    self = .rule(try RetentionRule(from: decoder))
                }
            }
        }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            products = try container.decode([Product].self, forKey: .products)
            retention = []
            refunds = try container.decodeIfPresent(RefundPolicy.self, forKey: .refunds) ?? RefundPolicy()
            for entry in try container.decodeIfPresent([Entry].self, forKey: .retention) ?? [] {
                switch entry {
                case .rule(let rule): retention.append(rule)
                case .product(let product): products.append(product)
                }
            }
        }
    }

    private func validate() throws {
        var seen = Set<String>()
        var seenStoreIds = Set<String>()
        for (index, product) in products.enumerated() {
            let name = "products[\(index)] (\(product.id))"
            guard !product.id.isEmpty, product.id.count <= 255 else {
                throw CatalogError("\(name): id must be 1…255 characters")
            }
            guard seen.insert(product.id).inserted else { throw CatalogError("\(name): duplicate product id") }
            switch product.type {
            case .autoRenewable:
                guard product.group?.isEmpty == false else {
                    throw CatalogError("\(name): an auto_renewable product needs a group")
                }
            case .nonRenewing:
                guard product.duration != nil else {
                    throw CatalogError("\(name): a non_renewing product needs a duration (e.g. P30D)")
                }
            case .consumable, .nonConsumable:
                break
            }
            guard product.grants.entitlement != nil || product.grants.currency != nil else {
                throw CatalogError("\(name): grants needs an entitlement or a currency")
            }
            if product.grants.currency != nil {
                guard let amount = product.grants.amount, amount > 0 else {
                    throw CatalogError("\(name): a currency grant needs a positive amount")
                }
                // Bounded so amount × quantity and years of balances stay far from Int64's limit.
                guard amount <= Catalog.maxGrantAmount else {
                    throw CatalogError("\(name): amount must be at most \(Catalog.maxGrantAmount)")
                }
            }
            for (store, id) in product.storeProducts ?? [:] {
                guard Catalog.stores.contains(store) else {
                    throw CatalogError(
                        "\(name): storeProducts.\(store): stores are \(Catalog.stores.joined(separator: ", "))")
                }
                guard !id.isEmpty, id.count <= 255 else {
                    throw CatalogError("\(name): storeProducts.\(store) must be 1…255 characters")
                }
                guard seenStoreIds.insert("\(store)\u{0}\(id)").inserted else {
                    throw CatalogError("\(name): storeProducts.\(store) '\(id)' names two products")
                }
            }
            for (storefront, price) in product.prices ?? [:] {
                guard storefront.count == 3, price.currency.count == 3, price.price >= 0 else {
                    throw CatalogError(
                        "\(name): prices.\(storefront) needs an alpha-3 storefront, ISO 4217 currency and a price ≥ 0")
                }
            }
        }
    }
}

public struct CatalogError: Error, Hashable, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }

    static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let context):
            return "missing '\(key.stringValue)' at \(path(context))"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context),
            DecodingError.dataCorrupted(let context):
            return "\(context.debugDescription) at \(path(context))"
        default:
            return "\(error)"
        }
    }

    private static func path(_ context: DecodingError.Context) -> String {
        let path = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined()
        return path.isEmpty ? "the top level" : String(path.drop(while: { $0 == "." }))
    }
}

/// One product of the catalog.
public struct Product: Codable, Hashable, Sendable {
    public enum Kind: String, Codable, Hashable, Sendable, CaseIterable, CatalogChoice {
        public init(from decoder: any Decoder) throws { self = try Self.decodeChoice(from: decoder) }

        case consumable
        case nonConsumable = "non_consumable"
        case autoRenewable = "auto_renewable"
        case nonRenewing = "non_renewing"
    }

    public struct Grants: Codable, Hashable, Sendable {
        public var currency: String?
        public var amount: Int64?
        public var entitlement: String?

        public init(currency: String? = nil, amount: Int64? = nil, entitlement: String? = nil) {
            self.currency = currency
            self.amount = amount
            self.entitlement = entitlement
        }
    }

    public struct Price: Codable, Hashable, Sendable {
        public var currency: String
        /// In the currency's units (0.99), as App Store Connect shows it.
        public var price: Decimal

        public init(currency: String, price: Decimal) {
            self.currency = currency
            self.price = price
        }

        /// Apple's milliunits (0.99 → 990).
        public var milliunits: Int64 {
            var scaled = price * 1000
            var rounded = Decimal()
            NSDecimalRound(&rounded, &scaled, 0, .plain)
            return NSDecimalNumber(decimal: rounded).int64Value
        }
    }

    public var id: String
    public var type: Kind
    public var group: String?
    /// Length of access of a non-renewing subscription.
    public var duration: ISODuration?
    /// Billing period of an auto-renewable subscription (local App Store); default one month.
    public var period: ISODuration?
    public var grants: Grants
    /// Price per storefront (local App Store); default 0.99 USD.
    public var prices: [String: Price]?
    /// Promotional offers (auto-renewable only), with the policy they are signed by.
    public var offers: [Offer]?
    /// The introductory offer (local App Store: applied once per Apple ID and group).
    public var introductoryOffer: IntroductoryOffer?
    /// Win-back offers (local App Store: listed for churned subscribers; StoreKeeper: the
    /// per-account policy).
    public var winBackOffers: [WinBackOffer]?
    /// Offer codes with StoreKeeper's per-account policy (any product type).
    public var offerCodes: [OfferCodeRule]?
    /// Each store's id for this product when it differs from `id`:
    /// `{app_store: com.x.pro_monthly, google_play: pro_monthly}`.
    public var storeProducts: [String: String]?

    public init(
        id: String, type: Kind, group: String? = nil, duration: ISODuration? = nil, period: ISODuration? = nil,
        grants: Grants, prices: [String: Price]? = nil, offers: [Offer]? = nil,
        introductoryOffer: IntroductoryOffer? = nil, winBackOffers: [WinBackOffer]? = nil
    ) {
        self.offers = offers
        self.introductoryOffer = introductoryOffer
        self.winBackOffers = winBackOffers
        self.id = id
        self.type = type
        self.group = group
        self.duration = duration
        self.period = period
        self.grants = grants
        self.prices = prices
    }

    /// The price in a storefront: its own, else the USA's, else 0.99 USD.
    public func price(in storefront: String) -> Price {
        prices?[storefront] ?? prices?["USA"] ?? Price(currency: "USD", price: Decimal(string: "0.99")!)
    }
}

/// An ISO 8601 duration as App Store Connect writes periods: `P1M`, `P30D`, `P1Y`, `P1W`,
/// `PT12H` (the local App Store's accelerated tests use hours and minutes).
public struct ISODuration: Codable, Hashable, Sendable, CustomStringConvertible {
    public var years = 0
    public var months = 0
    public var days = 0
    public var hours = 0
    public var minutes = 0
    public var seconds = 0

    public init(years: Int = 0, months: Int = 0, days: Int = 0, hours: Int = 0, minutes: Int = 0, seconds: Int = 0) {
        self.years = years
        self.months = months
        self.days = days
        self.hours = hours
        self.minutes = minutes
        self.seconds = seconds
    }

    public init?(_ text: String) {
        var rest = Substring(text)
        guard rest.first == "P", rest.count > 1 else { return nil }
        rest = rest.dropFirst()
        var inTime = false
        var any = false
        var anyTime = false
        while let first = rest.first {
            if first == "T" {
                guard !inTime else { return nil }
                inTime = true
                rest = rest.dropFirst()
                continue
            }
            let digits = rest.prefix(while: \.isNumber)
            guard !digits.isEmpty, digits.count <= 6, let value = Int(digits) else { return nil }
            rest = rest.dropFirst(digits.count)
            guard let unit = rest.first else { return nil }
            rest = rest.dropFirst()
            switch (unit, inTime) {
            case ("Y", false): years = value
            case ("M", false): months = value
            case ("W", false): days += value * 7
            case ("D", false): days += value
            case ("H", true): (hours, anyTime) = (value, true)
            case ("M", true): (minutes, anyTime) = (value, true)
            case ("S", true): (seconds, anyTime) = (value, true)
            default: return nil
            }
            any = true
        }
        guard any, !inTime || anyTime else { return nil }
        guard years + months + days + hours + minutes + seconds > 0 else { return nil }
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let duration = ISODuration(text) else {
            throw DecodingError.dataCorrupted(
                .init(
                    codingPath: decoder.codingPath,
                    debugDescription: "'\(text)' is not an ISO 8601 duration like P1M or P30D"))
        }
        self = duration
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }

    public var description: String {
        var text = "P"
        if years > 0 { text += "\(years)Y" }
        if months > 0 { text += "\(months)M" }
        if days > 0 { text += "\(days)D" }
        if hours + minutes + seconds > 0 {
            text += "T"
            if hours > 0 { text += "\(hours)H" }
            if minutes > 0 { text += "\(minutes)M" }
            if seconds > 0 { text += "\(seconds)S" }
        }
        return text
    }

    /// `date` plus this duration on the Gregorian calendar in UTC (a month from Jan 31 is Feb 28/29).
    public func added(to date: Date) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let components = DateComponents(
            year: years, month: months, day: days, hour: hours, minute: minutes, second: seconds)
        return calendar.date(byAdding: components, to: date) ?? date
    }
}

/// A catalog word read from the file: a value outside the list is an error naming the valid
/// ones (`'consumables' is not one of consumable, non_consumable, …`), not a decoding message.
protocol CatalogChoice: RawRepresentable, CaseIterable where RawValue == String {}

extension CatalogChoice {
    static func decodeChoice(from decoder: any Decoder) throws -> Self {
        let container = try decoder.singleValueContainer()
        let raw = try container.decode(String.self)
        guard let value = Self(rawValue: raw) else {
            throw DecodingError.dataCorruptedError(
                in: container,
                debugDescription:
                    "'\(raw.prefix(64))' is not one of \(Self.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return value
    }
}
