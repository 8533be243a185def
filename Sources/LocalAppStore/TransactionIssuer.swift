import AppStoreModels
import AppStoreSigning
import Foundation
import Synchronization

/// Issues App Store transactions the way Apple shapes them: numeric string ids, epoch-ms
/// dates, milliunit prices, subscription fields only for subscriptions.
public struct TransactionIssuer: Sendable {
    public struct Purchase: Sendable {
        public var bundleId: String
        public var productId: String
        public var type: ProductType
        public var quantity: Int32
        public var appAccountToken: UUID?
        public var environment: AppStoreEnvironment
        public var storefront: String
        public var currency: String
        /// Price of one unit, in milliunits.
        public var unitPrice: Int64
        public var subscriptionGroupIdentifier: String?
        /// Length of a subscription period (auto-renewable) in seconds.
        public var subscriptionPeriod: TimeInterval

        public init(
            bundleId: String, productId: String, type: ProductType = .consumable, quantity: Int32 = 1,
            appAccountToken: UUID? = nil, environment: AppStoreEnvironment = .production, storefront: String = "USA",
            currency: String = "USD", unitPrice: Int64 = 990, subscriptionGroupIdentifier: String? = nil,
            subscriptionPeriod: TimeInterval = 30 * 86_400
        ) {
            self.bundleId = bundleId
            self.productId = productId
            self.type = type
            self.quantity = quantity
            self.appAccountToken = appAccountToken
            self.environment = environment
            self.storefront = storefront
            self.currency = currency
            self.unitPrice = unitPrice
            self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
            self.subscriptionPeriod = subscriptionPeriod
        }
    }

    public init() {}

    /// The decoded payload of a new purchase at `now`.
    public func transaction(for purchase: Purchase, at now: Date, id: String) -> JWSTransactionDecodedPayload {
        let milliseconds = Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
        var payload = JWSTransactionDecodedPayload(
            transactionId: id, originalTransactionId: id, bundleId: purchase.bundleId, productId: purchase.productId,
            purchaseDate: milliseconds, originalPurchaseDate: milliseconds,
            quantity: purchase.type == .consumable ? purchase.quantity : 1, type: purchase.type,
            appAccountToken: purchase.appAccountToken?.uuidString.lowercased(), inAppOwnershipType: .purchased,
            signedDate: milliseconds, environment: purchase.environment, storefront: purchase.storefront,
            storefrontId: Self.storefrontIds[purchase.storefront] ?? "143441", transactionReason: .purchase,
            currency: purchase.currency,
            price: purchase.unitPrice * Int64(purchase.type == .consumable ? purchase.quantity : 1))
        if purchase.type == .autoRenewable {
            payload.webOrderLineItemId = TransactionIds.next()
            payload.subscriptionGroupIdentifier = purchase.subscriptionGroupIdentifier ?? "21000000"
            payload.expiresDate = milliseconds + Int64(purchase.subscriptionPeriod * 1000)
        }
        return payload
    }

    /// Apple's storefront ids for the common storefronts (others default to the USA's).
    static let storefrontIds: [String: String] = [
        "USA": "143441", "GBR": "143444", "DEU": "143443", "FRA": "143442", "JPN": "143462", "CHN": "143465",
        "CAN": "143455", "AUS": "143460", "KOR": "143466", "BRA": "143503", "IND": "143467",
    ]
}

/// Transaction ids as Apple writes them: 16 decimal digits, unique within this process and
/// practically unique across processes (time-based, with a random low part).
public enum TransactionIds {
    private static let last = Mutex<UInt64>(0)

    public static func next() -> String {
        let micros = UInt64(Date().timeIntervalSince1970 * 1_000_000)
        // 2 + 12 digits of time-derived value + 3 random digits, strictly increasing here.
        let candidate = 2_000_000_000_000_000 + (micros % 1_000_000_000_000) * 1000 + UInt64.random(in: 0..<1000)
        let value = last.withLock { last in
            last = max(last + 1, candidate)
            return last
        }
        return String(value)
    }
}
