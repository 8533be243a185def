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
    func proof(for transaction: StoreTransaction) async throws -> Proof
}

/// The proof a transaction carries: its JWS, else its id for the server to look up.
public struct TransactionProofSource: ProofSource {
    public init() {}
    public func proof(for transaction: StoreTransaction) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        return .transactionId(transaction.id)
    }
}

/// Durable storage of the coordinator's state: Keychain on Apple platforms, an atomically
/// replaced file elsewhere. `save` returns only once the state is durable.
public protocol PendingStore: Sendable {
    func load() throws -> PendingState
    func save(_ state: PendingState) throws
}

/// The StoreKeeper server, as the device uses it.
public protocol Backend: Sendable {
    func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder
    /// The same asking for a promotional offer's signature, telling the server the Apple
    /// Account (`AppTransaction.appTransactionID`).
    func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, appTransactionId: String?
    ) async throws -> ServerOrder
    func submitPurchase(accountId: String, orderId: String?, proof: Proof) async -> SubmissionVerdict
    func customerInfo(accountId: String) async throws -> CustomerInfo
}

public protocol Clock: Sendable {
    func now() -> Date
    /// Sleeps until the clock reads `deadline` (an absolute time: a clock moved while the
    /// sleeper was waiting to start still wakes it on time).
    func sleep(until deadline: Date) async throws
}

public struct SystemClock: Clock {
    public init() {}
    public func now() -> Date { Date() }
    public func sleep(until deadline: Date) async throws {
        let seconds = deadline.timeIntervalSinceNow
        if seconds > 0 { try await Task.sleep(nanoseconds: UInt64(seconds * 1_000_000_000)) }
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
