import Foundation

/// The device's payment queue: StoreKit 2, StoreKit 1, or a scripted queue in tests and the
/// simulator. Adapters map; every decision is the coordinator's.
public protocol PaymentQueue: Sendable {
    /// Adds a payment for a product id (no product request needed first, P8), carrying the
    /// order's token (StoreKit 2 `appAccountToken`, StoreKit 1 `applicationUsername`).
    func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult
    /// The same with offers (`PurchaseOptions`); a queue without offer support refuses them.
    func purchase(productId: String, quantity: Int, appAccountToken: UUID, options: PurchaseOptions) async throws
        -> PaymentResult
    /// Finishes a transaction: StoreKit stops re-delivering it.
    func finish(transactionId: String) async
    /// Transactions StoreKit still holds unfinished (the sweep at launch).
    func unfinished() async -> [StoreTransaction]
    /// Restores past purchases; the transactions come back (StoreKit 1 also through `updates`).
    func restore() async throws -> [StoreTransaction]
    /// Everything that arrives without being asked for. Called once, at `configure()`.
    func updates() -> AsyncStream<PaymentUpdate>
}

/// Product metadata for display. Purchases never wait on it (P8).
public protocol ProductCatalog: Sendable {
    func products(_ ids: [String]) async throws -> [ProductInfo]
}

public struct ProductInfo: Sendable, Equatable {
    public var id: String
    public var displayName: String
    public var displayPrice: String
    public init(id: String, displayName: String, displayPrice: String) {
        self.id = id
        self.displayName = displayName
        self.displayPrice = displayPrice
    }
}

/// Where the proof of a transaction comes from at submission time: StoreKit 2's JWS, or
/// StoreKit 1's app receipt read fresh from the bundle.
public protocol ProofSource: Sendable {
    /// The proof for one transaction; `refresh` asks for a new app receipt first (the server
    /// answered `transaction_not_in_proof`, or the last one did not list the transaction).
    func proof(for transaction: StoreTransaction, refresh: Bool) async throws -> Proof
    /// The app receipt (base64) for a restore, refreshed first when asked; nil where there is
    /// none (StoreKit 2 restores send their JWS instead).
    func receipt(refresh: Bool) async throws -> String?
    /// The same under the coordinator's refresh policy (`ReceiptRefresh`).
    func proof(for transaction: StoreTransaction, receiptRefresh: ReceiptRefresh) async throws -> Proof
    func receipt(receiptRefresh: ReceiptRefresh) async throws -> String?
}

/// When a proof source may refresh the app receipt (`SKReceiptRefreshRequest` may show an App
/// Store sign-in sheet): the coordinator allows it at most once per launch and transaction, and
/// only in the foreground or in a purchase or restore the user started.
public enum ReceiptRefresh: Sendable, Equatable {
    /// Read what is on disk; no receipt is no proof now (held until a refresh is allowed).
    case never
    /// Refresh only when there is no receipt at all.
    case ifMissing
    /// Refresh first (the last receipt did not hold the transaction).
    case now
}

extension ProofSource {
    public func proof(for transaction: StoreTransaction) async throws -> Proof {
        try await proof(for: transaction, refresh: false)
    }
    public func receipt(refresh: Bool) async throws -> String? { nil }

    /// The proof under a refresh policy. Sources that never refresh anything (StoreKit 2's JWS)
    /// need not implement it.
    public func proof(for transaction: StoreTransaction, receiptRefresh: ReceiptRefresh) async throws -> Proof {
        try await proof(for: transaction, refresh: receiptRefresh == .now)
    }
    public func receipt(receiptRefresh: ReceiptRefresh) async throws -> String? {
        try await receipt(refresh: receiptRefresh == .now)
    }
}

/// The proof a transaction carries: its JWS, else its id for the server to look up.
public struct TransactionProofSource: ProofSource {
    public init() {}
    public func proof(for transaction: StoreTransaction, refresh: Bool) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        return .transactionId(transaction.id)
    }
}

/// Durable storage of the coordinator's state as separate records (an intent, a held
/// transaction, a settled id, an account view), so one update rewrites one small record, never
/// the whole history: Keychain items on Apple platforms, an append-only journal elsewhere.
/// The store keeps bytes; what they mean (and their versions) is the coordinator's.
public protocol PendingStore: Sendable {
    /// Every record by key. Throws when the storage cannot be read now (a Keychain before the
    /// first unlock): the coordinator then writes nothing and asks again later.
    func load() throws -> [String: Data]
    /// Writes `records` and removes `removing`, durably, before returning. A crash part way
    /// leaves each record either old or new (never torn).
    func write(_ records: [String: Data], removing: [String]) throws
}

/// The StoreKeeper server, as the device uses it.
public protocol Backend: Sendable {
    func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder
    /// The same asking for a promotional offer's signature, telling the server the Apple
    /// Account (`AppTransaction.appTransactionID`).
    func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, appTransactionId: String?
    ) async throws -> ServerOrder
    /// The same naming the win-back offer the purchase will use, so the server's catalog policy
    /// (`maxPerAccount` across the account's Apple IDs) decides before the payment. A backend
    /// without that policy ignores it (the default implementation).
    func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, winBackOfferId: String?,
        appTransactionId: String?
    ) async throws -> ServerOrder
    /// Submits a proof. `transactionId` names the transaction the device reports (sent with a
    /// receipt, which must contain it); `.signedTransactions` is one batch (1…100).
    func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
        -> SubmissionVerdict
    /// Cancels an unpaid order (the user cancelled; nothing was charged).
    func cancelOrder(accountId: String, orderId: String) async throws
    func customerInfo(accountId: String) async throws -> CustomerInfo
    /// Records the customer's answer to "share consumption data with Apple?" (Send Consumption
    /// Information V2 is sent only with it; docs/consent.md).
    func setConsumptionDataConsent(accountId: String, granted: Bool) async throws
    /// Binds a purchase made before the account existed (a web checkout's redemption code) to
    /// the account, once (`POST /v1/redemptions/{code}`).
    func redeem(accountId: String, code: String) async throws
    /// Where refused (unverified) answers are counted, if this backend checks them.
    var signatureDiagnostics: SignatureDiagnostics? { get }
}

extension Backend {
    /// A backend without redemption codes refuses them.
    public func redeem(accountId: String, code: String) async throws {
        throw BackendError.server(
            status: 404, code: "not_found", message: "this backend has no redemption codes", retryable: false)
    }

    /// Where a backend that checks signed answers counts the ones it refused (nil: it checks none).
    public var signatureDiagnostics: SignatureDiagnostics? { nil }

    public func submitPurchase(accountId: String, orderId: String?, proof: Proof) async -> SubmissionVerdict {
        await submitPurchase(accountId: accountId, orderId: orderId, proof: proof, transactionId: nil)
    }
}

/// Wall-clock time for records, and a monotonic sleep for waits: a device clock set back a
/// day must not hold a paid order a day longer.
public protocol Clock: Sendable {
    func now() -> Date
    /// Seconds of elapsed (monotonic) time since some fixed point: waits are measured in it.
    func uptime() -> TimeInterval
    /// Sleeps for `seconds` of elapsed (monotonic) time, whatever the wall clock does meanwhile.
    func sleep(for seconds: TimeInterval) async throws
}

extension Clock {
    public func uptime() -> TimeInterval { ProcessInfo.processInfo.systemUptime }
}

public struct SystemClock: Clock {
    public init() {}
    public func now() -> Date { Date() }
    public func uptime() -> TimeInterval { ProcessInfo.processInfo.systemUptime }
    public func sleep(for seconds: TimeInterval) async throws {
        // Task.sleep counts monotonic time (uptime), not the wall clock.
        if seconds > 0 { try await Task.sleep(nanoseconds: UInt64(min(seconds, 86_400 * 30) * 1_000_000_000)) }
    }
}

/// Exponential backoff with jitter: attempt n waits base·2ⁿ⁻¹, capped, times a random factor
/// in [0.5, 1] so a fleet of devices that failed together does not retry together.
public struct RetryPolicy: Sendable, Equatable {
    public var base: TimeInterval
    public var cap: TimeInterval
    public init(base: TimeInterval = 2, cap: TimeInterval = 900) {
        self.base = base
        self.cap = cap
    }

    public func delay(afterAttempt attempt: Int, random: Double) -> TimeInterval {
        let exponent = Double(min(max(attempt - 1, 0), 30))
        let full = min(cap, base * pow(2, exponent))
        return full * (0.5 + 0.5 * min(max(random, 0), 1))
    }
}

/// A payment queue without offers: payments without options go through; with them, refused.
public struct OffersUnsupported: Error, Sendable, CustomStringConvertible {
    public init() {}
    public var description: String { "this payment queue cannot apply offers" }
}

extension PaymentQueue {
    public func purchase(productId: String, quantity: Int, appAccountToken: UUID, options: PurchaseOptions)
        async throws -> PaymentResult
    {
        guard options.isEmpty else { throw OffersUnsupported() }
        return try await purchase(productId: productId, quantity: quantity, appAccountToken: appAccountToken)
    }
}

extension Backend {
    public func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, winBackOfferId: String?,
        appTransactionId: String?
    ) async throws -> ServerOrder {
        try await createOrder(
            accountId: accountId, productId: productId, quantity: quantity, offerId: offerId,
            appTransactionId: appTransactionId)
    }

    public func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, appTransactionId: String?
    ) async throws -> ServerOrder {
        guard offerId == nil else { throw OffersUnsupported() }
        return try await createOrder(accountId: accountId, productId: productId, quantity: quantity)
    }
}

/// The Apple Account on this device, as StoreKit's `AppTransaction.appTransactionID` (iOS 16+).
public protocol AppTransactionSource: Sendable {
    func appTransactionId() async -> String?
}
