import Foundation

/// The account as the server sees it (docs/api.md `GET /v1/accounts/{accountId}`), dates typed.
public struct CustomerInfo: Codable, Sendable, Equatable {
    public struct Entitlement: Codable, Sendable, Equatable {
        public var id: String
        /// Active when the server answered; `CustomerInfo.isActive` also checks `expiresAt`.
        public var active: Bool
        public var productId: String?
        public var expiresAt: Date?
        public var originalTransactionId: String?

        public init(
            id: String, active: Bool, productId: String? = nil, expiresAt: Date? = nil,
            originalTransactionId: String? = nil
        ) {
            self.id = id
            self.active = active
            self.productId = productId
            self.expiresAt = expiresAt
            self.originalTransactionId = originalTransactionId
        }

        enum CodingKeys: String, CodingKey { case id, active, productId, expiresAt, originalTransactionId }
        public init(from decoder: Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            id = try container.decode(String.self, forKey: .id)
            active = try container.decodeIfPresent(Bool.self, forKey: .active) ?? false
            productId = try container.decodeIfPresent(String.self, forKey: .productId)
            expiresAt = try container.decodeIfPresent(String.self, forKey: .expiresAt).flatMap(ISODate.parse)
            originalTransactionId = try container.decodeIfPresent(String.self, forKey: .originalTransactionId)
        }
        public func encode(to encoder: Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(id, forKey: .id)
            try container.encode(active, forKey: .active)
            try container.encodeIfPresent(productId, forKey: .productId)
            try container.encodeIfPresent(expiresAt.map(ISODate.format), forKey: .expiresAt)
            try container.encodeIfPresent(originalTransactionId, forKey: .originalTransactionId)
        }

        /// Active at `date`: the server said so and it has not expired since.
        public func isActive(at date: Date) -> Bool { active && (expiresAt.map { $0 > date } ?? true) }
    }
    public struct Subscription: Codable, Sendable, Equatable {
        public var originalTransactionId: String
        public var productId: String
        public var status: String
        public var expiresAt: Date?
        public var autoRenew: Bool?
        /// Billed monthly with a 12-month commitment: show "month 4 of 12, renews until …".
        public var commitment: Commitment?

        public struct Commitment: Codable, Sendable, Equatable {
            public var billingPeriod: Int
            public var totalBillingPeriods: Int
            public var expiresAt: Date?
            /// Whether a new commitment follows this one (nil: not known).
            public var renews: Bool?

            public init(billingPeriod: Int, totalBillingPeriods: Int, expiresAt: Date? = nil, renews: Bool? = nil) {
                self.billingPeriod = billingPeriod
                self.totalBillingPeriods = totalBillingPeriods
                self.expiresAt = expiresAt
                self.renews = renews
            }

            enum CodingKeys: String, CodingKey { case billingPeriod, totalBillingPeriods, expiresAt, renews }
            public init(from decoder: Decoder) throws {
                let container = try decoder.container(keyedBy: CodingKeys.self)
                billingPeriod = try container.decode(Int.self, forKey: .billingPeriod)
                totalBillingPeriods = try container.decodeIfPresent(Int.self, forKey: .totalBillingPeriods) ?? 12
                expiresAt = try container.decodeIfPresent(String.self, forKey: .expiresAt).flatMap(ISODate.parse)
                renews = try container.decodeIfPresent(Bool.self, forKey: .renews)
            }
            public func encode(to encoder: Encoder) throws {
                var container = encoder.container(keyedBy: CodingKeys.self)
                try container.encode(billingPeriod, forKey: .billingPeriod)
                try container.encode(totalBillingPeriods, forKey: .totalBillingPeriods)
                try container.encodeIfPresent(expiresAt.map(ISODate.format), forKey: .expiresAt)
                try container.encodeIfPresent(renews, forKey: .renews)
            }
        }

        public init(
            originalTransactionId: String, productId: String, status: String, expiresAt: Date? = nil,
            autoRenew: Bool? = nil, commitment: Commitment? = nil
        ) {
            self.originalTransactionId = originalTransactionId
            self.productId = productId
            self.status = status
            self.expiresAt = expiresAt
            self.autoRenew = autoRenew
            self.commitment = commitment
        }

        enum CodingKeys: String, CodingKey {
            case originalTransactionId, productId, status, expiresAt, autoRenew, commitment
        }
        public init(from decoder: Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            originalTransactionId = try container.decode(String.self, forKey: .originalTransactionId)
            productId = try container.decode(String.self, forKey: .productId)
            status = try container.decode(String.self, forKey: .status)
            expiresAt = try container.decodeIfPresent(String.self, forKey: .expiresAt).flatMap(ISODate.parse)
            autoRenew = try container.decodeIfPresent(Bool.self, forKey: .autoRenew)
            // Tolerant: a commitment this version cannot read is left out, never a failed decode.
            commitment = try? container.decodeIfPresent(Commitment.self, forKey: .commitment)
        }
        public func encode(to encoder: Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(originalTransactionId, forKey: .originalTransactionId)
            try container.encode(productId, forKey: .productId)
            try container.encode(status, forKey: .status)
            try container.encodeIfPresent(expiresAt.map(ISODate.format), forKey: .expiresAt)
            try container.encodeIfPresent(autoRenew, forKey: .autoRenew)
            try container.encodeIfPresent(commitment, forKey: .commitment)
        }
    }
    public var accountId: String
    public var entitlements: [Entitlement]
    public var balances: [String: Int64]
    public var subscriptions: [Subscription]
    /// The server's time when it answered (its `Date` header), when this view came fresh from
    /// it: the device's own clock may be set days off (players move it to skip game timers).
    /// Not part of the view's identity, never stored.
    public var serverTime: Date?

    public init(
        accountId: String, entitlements: [Entitlement] = [], balances: [String: Int64] = [:],
        subscriptions: [Subscription] = [], serverTime: Date? = nil
    ) {
        self.accountId = accountId
        self.entitlements = entitlements
        self.balances = balances
        self.subscriptions = subscriptions
        self.serverTime = serverTime
    }

    public static func == (lhs: CustomerInfo, rhs: CustomerInfo) -> Bool {
        lhs.accountId == rhs.accountId && lhs.entitlements == rhs.entitlements && lhs.balances == rhs.balances
            && lhs.subscriptions == rhs.subscriptions
    }

    enum CodingKeys: String, CodingKey { case accountId, entitlements, balances, subscriptions }
    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        accountId = try container.decode(String.self, forKey: .accountId)
        entitlements = try container.decodeIfPresent([Entitlement].self, forKey: .entitlements) ?? []
        balances = try container.decodeIfPresent([String: Int64].self, forKey: .balances) ?? [:]
        subscriptions = try container.decodeIfPresent([Subscription].self, forKey: .subscriptions) ?? []
    }

    /// Whether the entitlement is active at `date` (now by default): an answer cached offline
    /// stops granting what has expired since.
    public func isActive(_ entitlement: String, at date: Date = Date()) -> Bool {
        entitlements.contains { $0.id == entitlement && $0.isActive(at: date) }
    }
}

/// The logged-in account and what the device knows of it: what a screen shows.
public struct AccountView: Sendable, Equatable {
    /// Nil when nobody is logged in.
    public var accountId: String?
    /// The account's last view from the server (offline too); nil until one arrived.
    public var customerInfo: CustomerInfo?
    /// The account's purchases the device holds until the server's verdict (paid, delivering).
    public var pendingPurchases: Int
    /// The entitlements active when the view was published (sorted): a view republished when
    /// one expires differs from the last, so every observer re-renders at that moment.
    public var activeEntitlementIds: [String]

    /// `activeEntitlementIds` nil: those of `customerInfo` active by this device's clock.
    public init(
        accountId: String?, customerInfo: CustomerInfo?, pendingPurchases: Int = 0,
        activeEntitlementIds: [String]? = nil
    ) {
        self.accountId = accountId
        self.customerInfo = customerInfo
        self.pendingPurchases = pendingPurchases
        self.activeEntitlementIds =
            activeEntitlementIds
            ?? Set((customerInfo?.entitlements ?? []).filter { $0.isActive(at: Date()) }.map(\.id)).sorted()
    }
}
