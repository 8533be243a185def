import Foundation

/// The catalog's `refunds:` section: what a prorated refund of an indivisible product does, and
/// the refund preference StoreKeeper states when Apple asks (CONSUMPTION_REQUEST → Send
/// Consumption Information V2's `refundPreference`). Rules are tried in order, the first whose
/// every condition holds decides; none matching means "no preference" (the field is omitted).
///
/// ```yaml
/// refunds:
///   revokeNonConsumableAt: 50          # percent: a prorated refund of at least this share removes a non-consumable
///   disputes: revoke_when_lost         # or revoke_when_opened (Stripe's chargebacks; inquiries never revoke)
///   preference:
///     - name: spent_coins
///       when: { productType: consumable, consumedAtLeast: 50 }
///       preference: decline            # decline | grant_full | grant_prorated
///     - name: new_customer_first_purchase
///       when: { purchase: first, accountAgeBelow: P7D }
///       preference: grant_full
/// ```
public struct RefundPolicy: Codable, Hashable, Sendable {
    /// A prorated refund of a non-consumable removes it when its share is at least this many
    /// percent (default 50; 100 keeps it unless refunded in full; 0 removes it on any refund).
    public var revokeNonConsumableAt: Double?
    public var preference: [PreferenceRule]?
    /// Send Consumption Information's `sampleContentProvided` for every product (a free sample,
    /// trial or feature tour before purchase); products with an introductory offer say true anyway.
    public var sampleContentProvided: Bool?
    /// Chargebacks (Stripe's disputes): revoked when lost (the default), or as soon as opened
    /// (given back if won). Inquiries never revoke.
    public var disputes: DisputePolicy?

    public init(
        revokeNonConsumableAt: Double? = nil, preference: [PreferenceRule]? = nil, sampleContentProvided: Bool? = nil,
        disputes: DisputePolicy? = nil
    ) {
        self.revokeNonConsumableAt = revokeNonConsumableAt
        self.preference = preference
        self.sampleContentProvided = sampleContentProvided
        self.disputes = disputes
    }

    public enum DisputePolicy: String, Codable, Hashable, Sendable, CaseIterable, CatalogChoice {
        public init(from decoder: any Decoder) throws { self = try Self.decodeChoice(from: decoder) }

        case revokeWhenLost = "revoke_when_lost"
        case revokeWhenOpened = "revoke_when_opened"
    }

    /// `revokeNonConsumableAt` in Apple's milliunits.
    public var revokeNonConsumableAtShare: Int32 {
        Int32(((revokeNonConsumableAt ?? 50) * 1000).rounded())
    }

    public enum Preference: String, Codable, Hashable, Sendable, CaseIterable, CatalogChoice {
        public init(from decoder: any Decoder) throws { self = try Self.decodeChoice(from: decoder) }

        case decline
        case grantFull = "grant_full"
        case grantProrated = "grant_prorated"

        /// Apple's `refundPreference` value.
        public var apple: String {
            switch self {
            case .decline: "DECLINE"
            case .grantFull: "GRANT_FULL"
            case .grantProrated: "GRANT_PRORATED"
            }
        }
    }

    public struct PreferenceRule: Codable, Hashable, Sendable {
        /// Named in the audit log and the consumption answer's record.
        public var name: String
        public var when: When?
        public var preference: Preference

        public init(name: String, when: When? = nil, preference: Preference) {
            self.name = name
            self.when = when
            self.preference = preference
        }
    }

    public struct When: Codable, Hashable, Sendable {
        /// Any of these product ids.
        public var productIds: [String]?
        public var productType: Product.Kind?
        /// Share of the purchase consumed, in percent (a consumable's spent credit; a delivered
        /// non-consumable or non-renewing purchase is 100; an auto-renewable's elapsed period).
        public var consumedAtLeast: Double?
        public var consumedBelow: Double?
        /// `first`: the account's first purchase; `repeat`: it had bought before.
        public var purchase: PurchaseOrdinal?
        /// Time since the account's first purchase or order.
        public var accountAgeAtLeast: ISODuration?
        public var accountAgeBelow: ISODuration?

        public init(
            productIds: [String]? = nil, productType: Product.Kind? = nil, consumedAtLeast: Double? = nil,
            consumedBelow: Double? = nil, purchase: PurchaseOrdinal? = nil, accountAgeAtLeast: ISODuration? = nil,
            accountAgeBelow: ISODuration? = nil
        ) {
            self.productIds = productIds
            self.productType = productType
            self.consumedAtLeast = consumedAtLeast
            self.consumedBelow = consumedBelow
            self.purchase = purchase
            self.accountAgeAtLeast = accountAgeAtLeast
            self.accountAgeBelow = accountAgeBelow
        }
    }

    public enum PurchaseOrdinal: String, Codable, Hashable, Sendable, CaseIterable, CatalogChoice {
        public init(from decoder: any Decoder) throws { self = try Self.decodeChoice(from: decoder) }

        case first
        case `repeat`
    }

    /// What a rule is matched against.
    public struct Facts: Hashable, Sendable {
        public var productId: String
        public var productType: Product.Kind?
        /// Milliunits (0…100 000).
        public var consumedShare: Int32
        public var firstPurchase: Bool
        /// Since the account's first purchase or order; nil when unknown.
        public var accountSince: Date?
        public var now: Date

        public init(
            productId: String, productType: Product.Kind?, consumedShare: Int32, firstPurchase: Bool,
            accountSince: Date?, now: Date
        ) {
            self.productId = productId
            self.productType = productType
            self.consumedShare = consumedShare
            self.firstPurchase = firstPurchase
            self.accountSince = accountSince
            self.now = now
        }
    }

    /// The first rule that matches, or nil (no preference).
    public func decide(_ facts: Facts) -> PreferenceRule? {
        (preference ?? []).first { $0.when.map { Self.matches($0, facts) } ?? true }
    }

    static func matches(_ when: When, _ facts: Facts) -> Bool {
        if let ids = when.productIds, !ids.contains(facts.productId) { return false }
        if let type = when.productType, type != facts.productType { return false }
        let consumed = Double(facts.consumedShare) / 1000
        if let least = when.consumedAtLeast, consumed < least { return false }
        if let below = when.consumedBelow, consumed >= below { return false }
        if let ordinal = when.purchase, (ordinal == .first) != facts.firstPurchase { return false }
        if when.accountAgeAtLeast != nil || when.accountAgeBelow != nil {
            guard let since = facts.accountSince else { return false }
            if let least = when.accountAgeAtLeast, least.added(to: since) > facts.now { return false }
            if let below = when.accountAgeBelow, below.added(to: since) <= facts.now { return false }
        }
        return true
    }

    func validate() throws {
        if let share = revokeNonConsumableAt, !(0...100).contains(share) {
            throw CatalogError("refunds.revokeNonConsumableAt must be a percent, 0…100")
        }
        var names = Set<String>()
        for (index, rule) in (preference ?? []).enumerated() {
            let name = "refunds.preference[\(index)]"
            guard !rule.name.isEmpty, rule.name.count <= 64 else {
                throw CatalogError("\(name): name must be 1…64 characters")
            }
            guard names.insert(rule.name).inserted else { throw CatalogError("\(name): duplicate name '\(rule.name)'") }
            for value in [rule.when?.consumedAtLeast, rule.when?.consumedBelow].compactMap({ $0 })
            where !(0...100).contains(value) {
                throw CatalogError("\(name): consumedAtLeast and consumedBelow are percents, 0…100")
            }
        }
    }
}
