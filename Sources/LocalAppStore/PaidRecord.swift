import AppStoreModels
import Foundation
import StoreKeeperCatalog

/// What a customer paid for, from the store's own record: the truth a simulator (or a third
/// party) compares the purchase server's accounts with.
extension LocalAppStore {
    public struct PaidTransaction: Codable, Sendable, Equatable {
        public var transactionId: String
        public var originalTransactionId: String
        public var productId: String
        public var quantity: Int32
        public var appAccountToken: String?
        public var purchaseDate: Int64
        public var revoked: Bool
        public var finished: Bool
    }

    public struct PaidRecord: Codable, Sendable, Equatable {
        public var appleId: String
        public var transactions: [PaidTransaction]
        /// Currencies credited (`"coins": 360`) and entitlements held now (`"entitlements": ["no_ads"]`),
        /// revoked transactions excluded.
        public var paid: [String: JSONValue]
    }

    /// Every transaction of a customer, in purchase order, and what they add up to.
    public func paidRecord(for appleId: String) -> PaidRecord {
        let now = clock.now().milliseconds
        let customer = customers[appleId]
        var list: [PaidTransaction] = []
        var currencies: [String: Int64] = [:]
        var entitlements: Set<String> = []
        for id in customer?.transactionIds ?? [] {
            guard let stored = self.transactions[id] else { continue }
            let payload = stored.payload
            let revoked = payload.revocationDate != nil
            list.append(
                PaidTransaction(
                    transactionId: payload.transactionId ?? id,
                    originalTransactionId: payload.originalTransactionId ?? id,
                    productId: payload.productId ?? "", quantity: payload.quantity ?? 1,
                    appAccountToken: payload.appAccountToken, purchaseDate: payload.purchaseDate ?? 0,
                    revoked: revoked, finished: customer?.finished.contains(id) ?? false))
            guard !revoked, let product = configuration.catalog.product(payload.productId ?? "") else { continue }
            if let currency = product.grants.currency, let amount = product.grants.amount {
                currencies[currency, default: 0] += amount * Int64(max(1, payload.quantity ?? 1))
            }
            if let entitlement = product.grants.entitlement {
                let lasts = payload.expiresDate.map { $0 > now } ?? true
                if lasts { entitlements.insert(entitlement) }
            }
        }
        var paid: [String: JSONValue] = currencies.mapValues { .int($0) }
        paid["entitlements"] = .array(entitlements.sorted().map { .string($0) })
        return PaidRecord(appleId: appleId, transactions: list, paid: paid)
    }
}
