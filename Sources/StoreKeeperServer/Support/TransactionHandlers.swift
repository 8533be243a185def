import Foundation
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage

/// `GET /v1/transactions/{id}` (secret key): the transaction any id names — an App Store
/// transaction or original transaction id, a Google order id as Google prints it (`GPA.…`, with
/// or without `gp:`), a Google purchase token, a web payment id — with its account, its order,
/// its refunds and its anomalies.
struct TransactionRecordJSON: Encodable {
    struct Transaction: Encodable {
        var transactionId: String
        var originalTransactionId: String
        var store: String
        var appId: String?
        var productId: String
        var quantity: Int
        var environment: String
        var storefront: String?
        var purchasedAt: String?
        var deliveredAt: String?
        var expiresAt: String?
        var price: Double?
        var currency: String?
        /// `delivered`, `refunded` (wholly), `partially_refunded`, `refunded_before_delivery`.
        var status: String
    }

    struct Refund: Encodable {
        var refundedAt: String
        /// The share refunded, 0–1.
        var share: Double
        var type: String?
        var beforeDelivery: Bool
    }

    var transaction: Transaction
    var accountId: String?
    var orderId: String?
    var refunds: [Refund]
    var anomalies: [AnomalyJSON]

    init(_ record: PurchaseStore.TransactionRecord) {
        let refundedShare = record.refunds.map(\.share).max() ?? 0
        let status: String =
            if !record.delivered {
                "refunded_before_delivery"
            } else if refundedShare >= RefundPlanner.wholeShare {
                "refunded"
            } else if refundedShare > 0 {
                "partially_refunded"
            } else {
                "delivered"
            }
        transaction = Transaction(
            transactionId: record.transactionId, originalTransactionId: record.originalTransactionId,
            store: record.store.rawValue, appId: record.appId, productId: record.productId,
            quantity: record.quantity, environment: record.environment, storefront: record.storefront,
            purchasedAt: record.purchasedAt.map(StoreKeeperApp.iso),
            deliveredAt: record.deliveredAt.map(StoreKeeperApp.iso),
            expiresAt: record.expiresAt.map(StoreKeeperApp.iso),
            price: record.priceMilli.map { Double($0) / 1000 }, currency: record.currency, status: status)
        accountId = record.accountId
        orderId = record.orderId
        refunds = record.refunds.map {
            Refund(
                refundedAt: StoreKeeperApp.iso($0.refundedAt),
                share: Double($0.share) / Double(RefundPlanner.wholeShare),
                type: $0.type, beforeDelivery: $0.beforeDelivery)
        }
        anomalies = record.anomalies.map(AnomalyJSON.init)
    }
}

struct TransactionsController {
    let app: StoreKeeperApp

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("transactions/:transactionId") { _, context in
            let caller = try context.caller()
            try caller.requireScope(.read)
            let id = try StoreKeeperApp.parameter(context, "transactionId")
            guard !id.isEmpty, id.unicodeScalars.count <= 4096 else {
                throw APIError.badRequest("the id must be 1…4096 characters")
            }
            try StoreKeeperApp.validateText(id, field: "transactionId", requireNFC: false)
            guard let record = try await app.store.transaction(named: id), caller.covers(app: record.appId) else {
                throw APIError(
                    .notFound, "not_found",
                    "no transaction, original transaction, Google order or purchase token, or web payment '\(id.prefix(200))' is recorded here"
                )
            }
            return try StoreKeeperApp.json(TransactionRecordJSON(record))
        }
    }
}
