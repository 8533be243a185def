import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of API.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct OrderJSON: Encodable {
    var orderId: String
    var appAccountToken: String
    var accountId: String
    var productId: String
    var quantity: Int
    var status: String
    var createdAt: String
    var transactionId: String?
    var deliveredAt: String?

    init(_ order: Order) {
        orderId = order.orderId
        appAccountToken = order.appAccountToken.uuidString.lowercased()
        accountId = order.accountId
        productId = order.productId
        quantity = order.quantity
        status = order.status.rawValue
        createdAt = StoreKeeperApp.iso(order.createdAt)
        transactionId = order.transactionId
        deliveredAt = order.deliveredAt.map(StoreKeeperApp.iso)
    }
}

struct TransactionJSON: Encodable {
    var transactionId: String
    var originalTransactionId: String
    var productId: String
    var quantity: Int
    var environment: String
    var orderId: String?
    var outcome: String

    /// `submitter`: an order of another account is never shown to the submitter.
    init(_ transaction: JWSTransactionDecodedPayload, result: PurchaseStore.DeliveryResult, submitter: String) {
        transactionId = transaction.transactionId ?? ""
        originalTransactionId = transaction.originalTransactionId ?? transactionId
        productId = transaction.productId ?? ""
        quantity = Int(transaction.quantity ?? 1)
        environment = transaction.environment?.rawValue ?? "Production"
        let recipient = result.plan.delivery?.accountId ?? result.existing?.accountId ?? result.plan.accountId
        orderId =
            recipient == submitter
            ? result.plan.delivery?.orderId ?? result.existing?.orderId ?? result.plan.order?.orderId : nil
        outcome = result.plan.outcome.rawValue
    }
}

struct AccountJSON: Encodable {
    struct Entitlement: Encodable {
        var id: String
        var active: Bool
        var productId: String
        var expiresAt: String?
        var originalTransactionId: String
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

struct PurchaseJSON: Encodable {
    var status: String
    var transactions: [TransactionJSON]
    var account: AccountJSON
}

struct AnomalyJSON: Encodable {
    var id: String
    var kind: String
    var status: String
    var transactionId: String?
    var orderId: String?
    var accountId: String?
    var detail: String
    var createdAt: String
    var resolvedAt: String?
    var resolution: String?

    init(_ anomaly: PurchaseStore.StoredAnomaly) {
        id = anomaly.id
        kind = anomaly.kind
        status = anomaly.status
        transactionId = anomaly.transactionId
        orderId = anomaly.orderId
        accountId = anomaly.accountId
        detail = anomaly.detail
        createdAt = StoreKeeperApp.iso(anomaly.createdAt)
        resolvedAt = anomaly.resolvedAt.map(StoreKeeperApp.iso)
        resolution = anomaly.resolution
    }
}

struct AuditJSON: Encodable {
    var id: String
    var actor: String
    var action: String
    var subject: String?
    var detail: String
    var createdAt: String

    init(_ entry: PurchaseStore.AuditEntry) {
        id = entry.id
        actor = entry.actor
        action = entry.action
        subject = entry.subject
        detail = entry.detail
        createdAt = StoreKeeperApp.iso(entry.createdAt)
    }
}
