import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of API.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct TransactionJSON: Encodable {
    var transactionId: String
    var originalTransactionId: String
    var productId: String
    var quantity: Int
    var environment: String
    var orderId: String?
    var outcome: String
}

extension TransactionJSON {
    /// `submitter`: an order of another account is never shown to the submitter.
    init(_ transaction: JWSTransactionDecodedPayload, result: PurchaseStore.DeliveryResult, submitter: String) {
        transactionId = transaction.transactionId ?? ""
        originalTransactionId = transaction.originalTransactionId ?? transactionId
        productId = transaction.productId ?? ""
        quantity = Int(transaction.quantity ?? 1)
        environment = transaction.environment?.rawValue ?? "Production"
        let recipient = result.plan.delivery?.accountId ?? result.existing?.accountId ?? result.plan.accountId
        orderId =
            Identifiers.same(recipient, submitter)
            ? result.plan.delivery?.orderId ?? result.existing?.orderId ?? result.plan.order?.orderId : nil
        outcome = result.plan.outcome.rawValue
    }
}

struct PurchaseJSON: Encodable {
    var status: String
    var transactions: [TransactionJSON]
    var account: AccountJSON
}

extension TransactionJSON: JSONWritable {
    func write(to json: inout JSONOutput) {
        json.beginObject()
        json.field("environment", environment)
        json.field("orderId", orderId)
        json.field("originalTransactionId", originalTransactionId)
        json.field("outcome", outcome)
        json.field("productId", productId)
        json.field("quantity", quantity)
        json.field("transactionId", transactionId)
        json.endObject()
    }
}

extension PurchaseJSON: JSONWritable {
    func write(to json: inout JSONOutput) {
        json.beginObject()
        json.key("account")
        account.write(to: &json)
        json.field("status", status)
        json.field("transactions", transactions)
        json.endObject()
    }
}
