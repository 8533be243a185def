import Foundation

/// StoreKit 1's proof: the app receipt as it is on disk when the submission is made (it grows
/// as purchases happen), base64, sent with the transaction's id so the server checks that the
/// receipt holds it. Asked to (the last receipt did not list the transaction), and before ever
/// falling back to the id alone (no receipt yet: a fresh install), it refreshes the receipt
/// first (`SKReceiptRefreshRequest` on a device).
public struct AppReceiptProofSource: ProofSource {
    let receiptURL: @Sendable () -> URL?
    let refreshReceipt: @Sendable () async throws -> Void

    public init(
        receiptURL: @escaping @Sendable () -> URL? = { Bundle.main.appStoreReceiptURL },
        refreshReceipt: @escaping @Sendable () async throws -> Void = {}
    ) {
        self.receiptURL = receiptURL
        self.refreshReceipt = refreshReceipt
    }

    func read() -> String? {
        guard let url = receiptURL(), let data = try? Data(contentsOf: url), !data.isEmpty else { return nil }
        return data.base64EncodedString()
    }

    public func receipt(refresh: Bool) async throws -> String? {
        if refresh { try await refreshReceipt() }
        if let receipt = read() { return receipt }
        if !refresh {
            try await refreshReceipt()
            return read()
        }
        return nil
    }

    public func proof(for transaction: StoreTransaction, refresh: Bool) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        if let receipt = try await receipt(refresh: refresh) { return .receipt(receipt) }
        return .transactionId(transaction.id)
    }

    public func receipt(receiptRefresh: ReceiptRefresh) async throws -> String? {
        switch receiptRefresh {
        case .now: return try await receipt(refresh: true)
        case .ifMissing: return try await receipt(refresh: false)
        case .never: return read()
        }
    }

    /// Under the coordinator's policy: with no receipt on disk and no refresh allowed now, no
    /// proof yet (held until the app is in the foreground or the user buys or restores) —
    /// rather than the bare id, which proves nothing about who paid.
    public func proof(for transaction: StoreTransaction, receiptRefresh: ReceiptRefresh) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        if let receipt = try await receipt(receiptRefresh: receiptRefresh) { return .receipt(receipt) }
        guard receiptRefresh != .never else { throw NoReceiptYet() }
        return .transactionId(transaction.id)
    }

    public struct NoReceiptYet: Error, CustomStringConvertible {
        public var description: String { "no app receipt on disk, and no refresh allowed now" }
    }
}
