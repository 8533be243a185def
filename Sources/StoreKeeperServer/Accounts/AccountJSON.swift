import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of docs/api.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct AccountJSON: Encodable {
    struct Entitlement: Encodable {
        var id: String
        var active: Bool
        var productId: String?
        var expiresAt: String?
        var originalTransactionId: String?
        /// `purchase`, `subscription` or `grant` (docs/api.md).
        var source: String
        var grantId: String?
    }

    struct Subscription: Encodable {
        var originalTransactionId: String
        /// `app_store`, `google_play` or `web`, and the app (when known).
        var store: String
        var appId: String? = nil
        var productId: String
        var status: String
        var expiresAt: String?
        var autoRenew: Bool
        /// Billed monthly with a 12-month commitment (absent for a plan billed up front).
        var commitment: Commitment? = nil
    }

    /// `billingPeriod` of `totalBillingPeriods`, the commitment's end, and whether a new
    /// commitment follows (absent: not known). A cancel inside a commitment stops only that.
    struct Commitment: Encodable {
        var billingPeriod: Int
        var totalBillingPeriods: Int
        var expiresAt: String?
        var renews: Bool?
    }

    var accountId: String
    var entitlements: [Entitlement]
    var balances: [String: Int64]
    var subscriptions: [Subscription]
}

/// A body the server writes without `JSONEncoder` (`JSONOutput`): the same bytes, keys in
/// sorted order by hand; `JSONOutputTests` holds each type to `JSONEncoder`'s output.
protocol JSONWritable: Encodable {
    func write(to json: inout JSONOutput)
}

extension JSONOutput {
    /// `"name":[…]`, each element written by itself.
    mutating func field<Element: JSONWritable>(_ name: String, _ elements: [Element]) {
        key(name)
        beginArray()
        for element in elements { element.write(to: &self) }
        endArray()
    }
}

extension AccountJSON: JSONWritable {
    func write(to json: inout JSONOutput) {
        json.beginObject()
        json.field("accountId", accountId)
        json.key("balances")
        json.object(balances)
        json.field("entitlements", entitlements)
        json.field("subscriptions", subscriptions)
        json.endObject()
    }
}

extension AccountJSON.Entitlement: JSONWritable {
    func write(to json: inout JSONOutput) {
        json.beginObject()
        json.field("active", active)
        json.field("expiresAt", expiresAt)
        json.field("grantId", grantId)
        json.field("id", id)
        json.field("originalTransactionId", originalTransactionId)
        json.field("productId", productId)
        json.field("source", source)
        json.endObject()
    }
}

extension AccountJSON.Subscription: JSONWritable {
    func write(to json: inout JSONOutput) {
        json.beginObject()
        json.field("appId", appId)
        json.field("autoRenew", autoRenew)
        if let commitment {
            json.key("commitment")
            json.beginObject()
            json.field("billingPeriod", commitment.billingPeriod)
            json.field("expiresAt", commitment.expiresAt)
            if let renews = commitment.renews { json.field("renews", renews) }
            json.field("totalBillingPeriods", commitment.totalBillingPeriods)
            json.endObject()
        }
        json.field("expiresAt", expiresAt)
        json.field("originalTransactionId", originalTransactionId)
        json.field("productId", productId)
        json.field("status", status)
        json.field("store", store)
        json.endObject()
    }
}

extension Dictionary: JSONWritable where Key == String, Value == Int64 {
    func write(to json: inout JSONOutput) {
        json.object(self)
    }
}
