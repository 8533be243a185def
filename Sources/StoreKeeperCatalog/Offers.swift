import Foundation

/// A promotional offer set up in App Store Connect for an auto-renewable product, with the
/// policy StoreKeeper signs it by (docs/api.md "Product catalog", docs/offers-and-retention.md §1–2, §7).
///
/// ```yaml
/// offers:
///   - id: comeback_50
///     eligible: lapsed          # lapsed | active | any_subscriber (state in this group)
///     lapsedAtLeast: P30D       # optional
///     maxPerAccount: 1          # optional; redemptions counted from Apple-signed transactions
///     discountType: pay_as_you_go   # local App Store only: free_trial | pay_as_you_go | pay_up_front
///     price: 2.49                   # local App Store only, in the product's currency
///     period: P1M                   # local App Store only
/// ```
public struct Offer: Codable, Hashable, Sendable {
    public enum Eligible: String, Codable, Hashable, Sendable, CaseIterable, CatalogChoice {
        public init(from decoder: any Decoder) throws { self = try Self.decodeChoice(from: decoder) }

        /// Had a subscription in the group; none is active, in grace or in billing retry now.
        case lapsed
        /// Subscribed in the group now (active or in the grace period).
        case active
        /// Any subscription in the group, now or in the past.
        case anySubscriber = "any_subscriber"
    }

    public enum DiscountType: String, Codable, Hashable, Sendable, CaseIterable, CatalogChoice {
        public init(from decoder: any Decoder) throws { self = try Self.decodeChoice(from: decoder) }

        case freeTrial = "free_trial"
        case payAsYouGo = "pay_as_you_go"
        case payUpFront = "pay_up_front"
        /// An offer code of a one-time product (consumable, non-consumable, non-renewing).
        case oneTime = "one_time"

        /// Apple's `offerDiscountType`.
        public var appleValue: String {
            switch self {
            case .freeTrial: "FREE_TRIAL"
            case .payAsYouGo: "PAY_AS_YOU_GO"
            case .payUpFront: "PAY_UP_FRONT"
            case .oneTime: "ONE_TIME"
            }
        }
    }

    public var id: String
    public var eligible: Eligible
    public var lapsedAtLeast: ISODuration?
    public var maxPerAccount: Int?
    public var discountType: DiscountType?
    public var price: Decimal?
    public var period: ISODuration?

    public init(
        id: String, eligible: Eligible, lapsedAtLeast: ISODuration? = nil, maxPerAccount: Int? = nil,
        discountType: DiscountType? = nil, price: Decimal? = nil, period: ISODuration? = nil
    ) {
        self.id = id
        self.eligible = eligible
        self.lapsedAtLeast = lapsedAtLeast
        self.maxPerAccount = maxPerAccount
        self.discountType = discountType
        self.price = price
        self.period = period
    }
}

/// An introductory offer (local App Store: Apple applies it once per Apple ID and group).
public struct IntroductoryOffer: Codable, Hashable, Sendable {
    public var discountType: Offer.DiscountType
    public var price: Decimal?
    public var period: ISODuration

    public init(discountType: Offer.DiscountType, price: Decimal? = nil, period: ISODuration) {
        self.discountType = discountType
        self.price = price
        self.period = period
    }
}

/// A win-back offer (local App Store): Apple lists it in renewal info's
/// `eligibleWinBackOfferIds` for a churned subscriber who paid at least `paidAtLeast` and
/// lapsed at least `churnedAtLeast` ago (offers.md §4).
public struct WinBackOffer: Codable, Hashable, Sendable {
    public var id: String
    public var discountType: Offer.DiscountType
    public var price: Decimal?
    public var period: ISODuration
    public var paidAtLeast: ISODuration?
    public var churnedAtLeast: ISODuration?
    /// StoreKeeper's policy on top of Apple's (which counts per Apple ID): redemptions per app
    /// account, across its Apple IDs. An order asking for the offer beyond it is refused; a
    /// redemption beyond it (bought without asking) is delivered and raises
    /// `offer_limit_exceeded`.
    public var maxPerAccount: Int?

    public init(
        id: String, discountType: Offer.DiscountType, price: Decimal? = nil, period: ISODuration,
        paidAtLeast: ISODuration? = nil, churnedAtLeast: ISODuration? = nil, maxPerAccount: Int? = nil
    ) {
        self.maxPerAccount = maxPerAccount
        self.id = id
        self.discountType = discountType
        self.price = price
        self.period = period
        self.paidAtLeast = paidAtLeast
        self.churnedAtLeast = churnedAtLeast
    }
}

/// An offer code set up in App Store Connect (for any product type since 2025-10), with
/// StoreKeeper's policy: `maxPerAccount` redemptions per app account across its Apple IDs
/// (Apple counts per Apple ID). Codes are redeemed in the App Store, never asked for: one beyond
/// the limit is delivered (Apple was paid) and raises `offer_limit_exceeded`.
///
/// ```yaml
/// offerCodes:
///   - id: SPRING_COINS        # the transaction's offerIdentifier
///     maxPerAccount: 1
/// ```
public struct OfferCodeRule: Codable, Hashable, Sendable {
    public var id: String
    public var maxPerAccount: Int?

    public init(id: String, maxPerAccount: Int? = nil) {
        self.id = id
        self.maxPerAccount = maxPerAccount
    }
}

/// One answer to Apple's Get Retention Message, chosen when `when` matches (docs/api.md catalog
/// `retention`, docs/offers-and-retention.md §5.2). Exactly one of `message`, `alternateProduct`,
/// `promotionalOffer`.
public struct RetentionRule: Codable, Hashable, Sendable {
    public struct When: Codable, Hashable, Sendable {
        public var productId: String?
        /// Paid service in the subscription at least this long.
        public var tenureAtLeast: ISODuration?
        /// The share (0–1) of matching requests answered; the rest are the holdout, answered `{}`.
        public var sample: Double?

        public init(productId: String? = nil, tenureAtLeast: ISODuration? = nil, sample: Double? = nil) {
            self.productId = productId
            self.tenureAtLeast = tenureAtLeast
            self.sample = sample
        }
    }

    public struct Message: Codable, Hashable, Sendable {
        public var messageId: String
        public init(messageId: String) { self.messageId = messageId }
    }

    public struct AlternateProduct: Codable, Hashable, Sendable {
        public var messageId: String
        public var productId: String
        public init(messageId: String, productId: String) {
            self.messageId = messageId
            self.productId = productId
        }
    }

    public struct PromotionalOffer: Codable, Hashable, Sendable {
        public var messageId: String
        public var offerId: String
        public init(messageId: String, offerId: String) {
            self.messageId = messageId
            self.offerId = offerId
        }
    }

    /// The rule's name in `GET /v1/retention/report`; default `rule-<position from 1>`.
    public var id: String?
    public var when: When?
    public var message: Message?
    public var alternateProduct: AlternateProduct?
    public var promotionalOffer: PromotionalOffer?

    public init(
        id: String? = nil, when: When? = nil, message: Message? = nil, alternateProduct: AlternateProduct? = nil,
        promotionalOffer: PromotionalOffer? = nil
    ) {
        self.id = id
        self.when = when
        self.message = message
        self.alternateProduct = alternateProduct
        self.promotionalOffer = promotionalOffer
    }
}

extension Catalog {
    /// The promotional offer `offerId` of `productId`.
    public func offer(_ offerId: String, of productId: String) -> Offer? {
        product(productId)?.offers?.first { $0.id == offerId }
    }

    /// The win-back offer `offerId` of `productId`.
    public func winBackOffer(_ offerId: String, of productId: String) -> WinBackOffer? {
        product(productId)?.winBackOffers?.first { $0.id == offerId }
    }

    /// The per-account limit the catalog sets on an offer Apple applied outside our signing:
    /// `offerType` 3 (offer codes, `offerCodes`) or 4 (win-back, `winBackOffers`); nil when none.
    public func redemptionLimit(offerType: Int, offerIdentifier: String, productId: String) -> Int? {
        guard let product = product(productId) else { return nil }
        switch offerType {
        case 3: return product.offerCodes?.first { $0.id == offerIdentifier }?.maxPerAccount
        case 4: return product.winBackOffers?.first { $0.id == offerIdentifier }?.maxPerAccount
        default: return nil
        }
    }

    /// The rule's name: its `id`, else `rule-<n>` (1-based position).
    public func retentionRuleName(_ index: Int) -> String { retention[index].id ?? "rule-\(index + 1)" }

    func validateOffers() throws {
        var offerIds = Set<String>()
        for (index, product) in products.enumerated() {
            let name = "products[\(index)] (\(product.id))"
            let offers = product.offers ?? []
            if !offers.isEmpty || product.introductoryOffer != nil || product.winBackOffers?.isEmpty == false {
                guard product.type == .autoRenewable else {
                    throw CatalogError("\(name): offers are for auto_renewable products only")
                }
            }
            for offer in offers {
                guard !offer.id.isEmpty, offer.id.count <= 64 else {
                    throw CatalogError("\(name): offer id must be 1…64 characters")
                }
                guard offerIds.insert(offer.id).inserted else {
                    throw CatalogError(
                        "\(name): offer id '\(offer.id)' is used twice (App Store Connect ids are unique)")
                }
                if let max = offer.maxPerAccount, max < 1 {
                    throw CatalogError("\(name): offer '\(offer.id)': maxPerAccount must be at least 1")
                }
                if offer.lapsedAtLeast != nil, offer.eligible != .lapsed {
                    throw CatalogError("\(name): offer '\(offer.id)': lapsedAtLeast needs eligible: lapsed")
                }
                if let price = offer.price, price < 0 {
                    throw CatalogError("\(name): offer '\(offer.id)': price must be ≥ 0")
                }
            }
            for offer in product.winBackOffers ?? [] {
                guard !offer.id.isEmpty, offerIds.insert(offer.id).inserted else {
                    throw CatalogError("\(name): win-back offer id '\(offer.id)' is empty or used twice")
                }
                if let max = offer.maxPerAccount, max < 1 {
                    throw CatalogError("\(name): win-back offer '\(offer.id)': maxPerAccount must be at least 1")
                }
            }
            var codes = Set<String>()
            for code in product.offerCodes ?? [] {
                guard !code.id.isEmpty, code.id.count <= 64, codes.insert(code.id).inserted else {
                    throw CatalogError("\(name): offer code id '\(code.id)' is empty, over 64 characters or used twice")
                }
                if let max = code.maxPerAccount, max < 1 {
                    throw CatalogError("\(name): offer code '\(code.id)': maxPerAccount must be at least 1")
                }
            }
        }
        for (index, rule) in retention.enumerated() {
            let name = "retention[\(index)]"
            let answers = [rule.message != nil, rule.alternateProduct != nil, rule.promotionalOffer != nil]
            guard answers.filter({ $0 }).count == 1 else {
                throw CatalogError("\(name): give exactly one of message, alternateProduct, promotionalOffer")
            }
            if let sample = rule.when?.sample, !(0...1).contains(sample) {
                throw CatalogError("\(name): sample must be between 0 and 1")
            }
            if let productId = rule.when?.productId, product(productId)?.type != .autoRenewable {
                throw CatalogError("\(name): '\(productId)' is not an auto_renewable product of the catalog")
            }
            let messageId =
                rule.message?.messageId ?? rule.alternateProduct?.messageId ?? rule.promotionalOffer?.messageId ?? ""
            guard UUID(uuidString: messageId) != nil else {
                throw CatalogError("\(name): messageId must be a UUID (the message's id at Apple)")
            }
            if let alternate = rule.alternateProduct {
                guard let target = product(alternate.productId), target.type == .autoRenewable else {
                    throw CatalogError("\(name): '\(alternate.productId)' is not an auto_renewable product")
                }
                if let productId = rule.when?.productId, product(productId)?.group != target.group {
                    throw CatalogError("\(name): '\(alternate.productId)' is not in the group of '\(productId)'")
                }
            }
            if let offer = rule.promotionalOffer {
                let holders = products.filter { $0.offers?.contains { $0.id == offer.offerId } == true }
                guard !holders.isEmpty else {
                    throw CatalogError("\(name): no product has the offer '\(offer.offerId)'")
                }
                if let productId = rule.when?.productId, !holders.contains(where: { $0.id == productId }) {
                    throw CatalogError("\(name): '\(productId)' has no offer '\(offer.offerId)'")
                }
            }
            if let id = rule.id, retention[..<index].contains(where: { $0.id == id }) {
                throw CatalogError("\(name): rule id '\(id)' is used twice")
            }
        }
    }
}
