import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of docs/api.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct TransactionJSON: Encodable {
    var transactionId: String
    var originalTransactionId: String
    var productId: String
    var quantity: Int
    var environment: String
    var orderId: String?
    var outcome: String
    /// `app_store`, `google_play` or `web` (from the transaction id).
    var store: String
    /// The app the transaction was bought in (set by the handler when known).
    var appId: String? = nil
    /// In a `signedTransactions` batch: why an entry was `rejected` (verification) or
    /// `not_delivered` (`owned_by_other_account`, …).
    var code: String?
}

extension TransactionJSON {
    /// A batch entry that failed verification: its ids as the JWS claims them (unverified, so the
    /// device can tell which of its transactions it was), outcome `rejected`.
    static func rejected(_ jws: String, code: String) -> TransactionJSON {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        var claimed: [String: Any] = [:]
        if parts.count == 3, parts[1].utf8.count <= 65_536, let bytes = Base64.decodeURL(parts[1]),
            let object = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any]
        {
            claimed = object
        }
        // Only ids as Apple writes them (digits), never other text from an unverified payload.
        func id(_ key: String) -> String? {
            (claimed[key] as? String).flatMap { StoreKeeperApp.isAppleNumericId($0) ? $0 : nil }
        }
        let transactionId = id("transactionId") ?? ""
        return TransactionJSON(
            transactionId: transactionId, originalTransactionId: id("originalTransactionId") ?? transactionId,
            productId: "", quantity: 0, environment: "", orderId: nil, outcome: "rejected", store: "app_store",
            code: code)
    }
}

extension TransactionJSON {
    /// `submitter`: an order of another account is never shown to the submitter.
    init(
        _ transaction: StoreTransaction, result: PurchaseStore.DeliveryResult, submitter: String,
        apps: AppDirectory = AppDirectory()
    ) {
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
        store = transaction.store.rawValue
        appId = apps.appId(ofStoreIdentity: transaction.storeIdentity)
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
        if let appId { json.field("appId", appId) }
        if let code { json.field("code", code) }
        json.field("environment", environment)
        json.field("orderId", orderId)
        json.field("originalTransactionId", originalTransactionId)
        json.field("outcome", outcome)
        json.field("productId", productId)
        json.field("quantity", quantity)
        json.field("store", store)
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
