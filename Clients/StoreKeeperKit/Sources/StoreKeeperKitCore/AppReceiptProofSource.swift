import Foundation

/// StoreKit 1's proof: the app receipt as it is on disk when the submission is made (it grows
/// as purchases happen), base64; without a receipt (not yet fetched, a fresh install), the
/// transaction id for the server to look up — which delivers only what the account's own
/// order token or ownership proves (API.md).
public struct AppReceiptProofSource: ProofSource {
    let receiptURL: @Sendable () -> URL?

    public init(receiptURL: @escaping @Sendable () -> URL? = { Bundle.main.appStoreReceiptURL }) {
        self.receiptURL = receiptURL
    }

    public func proof(for transaction: StoreTransaction) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        if let url = receiptURL(), let data = try? Data(contentsOf: url), !data.isEmpty {
            return .receipt(data.base64EncodedString())
        }
        return .transactionId(transaction.id)
    }
}
