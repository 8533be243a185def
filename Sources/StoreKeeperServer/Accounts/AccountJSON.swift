import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of API.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct AccountJSON: Encodable {
    struct Entitlement: Encodable {
        var id: String
        var active: Bool
        var productId: String?
        var expiresAt: String?
        var originalTransactionId: String?
        /// `purchase`, `subscription` or `grant` (API.md).
        var source: String
        var grantId: String?
    }

    struct Subscription: Encodable {
        var originalTransactionId: String
        var productId: String
        var status: String
        var expiresAt: String?
        var autoRenew: Bool
    }

    var accountId: String
    var entitlements: [Entitlement]
    var balances: [String: Int64]
    var subscriptions: [Subscription]
}
