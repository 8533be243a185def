// Apple platforms; on Linux only in the type-check test target, against the StoreKit shim.
#if canImport(StoreKit) && (canImport(Darwin) || STOREKIT_SHIM)
    import Foundation
    import StoreKit
    import StoreKeeperKitCore

    public struct StoreKitAdapterError: Error, CustomStringConvertible, Sendable {
        public var description: String
    }

    /// StoreKit 2 as a `PaymentQueue`: mapping only; every decision is the coordinator's.
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, *)
    public final class StoreKit2PaymentQueue: PaymentQueue, @unchecked Sendable {
        /// Transactions seen and not yet finished, to finish them by id.
        private let held = Locked<[UInt64: Transaction]>([:])
        private let products = Locked<[String: Product]>([:])

        public init() {}

        /// The product for an id; a slow or failing product request is retried, never a reason
        /// to lose the tap (P8).
        func product(_ id: String) async throws -> Product {
            if let cached = products.withValue({ $0[id] }) { return cached }
            var lastError: Error?
            for attempt in 0..<3 {
                do {
                    if let product = try await Product.products(for: [id]).first {
                        products.withValue { $0[id] = product }
                        return product
                    }
                } catch {
                    lastError = error
                }
                try await Task.sleep(nanoseconds: UInt64(attempt + 1) * 500_000_000)
            }
            throw StoreKitAdapterError(description: "product \(id) unavailable: \(String(describing: lastError))")
        }

        public func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
            let product = try await product(productId)
            var options: Set<Product.PurchaseOption> = [.appAccountToken(appAccountToken)]
            if quantity > 1 { options.insert(.quantity(quantity)) }
            switch try await product.purchase(options: options) {
            case .success(let verification): return .purchased(map(verification))
            case .pending: return .deferred
            case .userCancelled: return .cancelled
            @unknown default: return .failed("unknown purchase result")
            }
        }

        /// The server verifies: an unverified transaction is submitted all the same (its JWS
        /// is the evidence), and the server's verdict decides.
        func map(_ verification: VerificationResult<Transaction>) -> StoreTransaction {
            let transaction = verification.unsafePayloadValue
            held.withValue { $0[transaction.id] = transaction }
            return StoreTransaction(
                id: String(transaction.id), originalId: String(transaction.originalID),
                productId: transaction.productID, quantity: transaction.purchasedQuantity,
                appAccountToken: transaction.appAccountToken, purchaseDate: transaction.purchaseDate,
                signedTransaction: verification.jwsRepresentation, revocationDate: transaction.revocationDate)
        }

        public func finish(transactionId: String) async {
            guard let id = UInt64(transactionId) else { return }
            if let transaction = held.withValue({ $0.removeValue(forKey: id) }) {
                await transaction.finish()
                return
            }
            for await verification in Transaction.unfinished where verification.unsafePayloadValue.id == id {
                await verification.unsafePayloadValue.finish()
                return
            }
        }

        public func unfinished() async -> [StoreTransaction] {
            var transactions: [StoreTransaction] = []
            for await verification in Transaction.unfinished { transactions.append(map(verification)) }
            return transactions
        }

        public func restore() async throws -> [StoreTransaction] {
            try await AppStore.sync()
            var transactions: [StoreTransaction] = []
            for await verification in Transaction.currentEntitlements { transactions.append(map(verification)) }
            return transactions
        }

        public func updates() -> AsyncStream<PaymentUpdate> {
            AsyncStream { continuation in
                let updates = Task {
                    for await verification in Transaction.updates {
                        continuation.yield(.transaction(self.map(verification)))
                    }
                }
                let intents: Task<Void, Never>? = {
                    guard #available(iOS 16.4, macOS 14.4, *) else { return nil }
                    return Task {
                        for await intent in PurchaseIntent.intents {
                            continuation.yield(.promoted(productId: intent.product.id, quantity: 1))
                        }
                    }
                }()
                continuation.onTermination = { _ in
                    updates.cancel()
                    intents?.cancel()
                }
            }
        }
    }

    /// Product metadata for display, from StoreKit 2. Purchases never wait on it (P8).
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, *)
    public struct StoreKit2Catalog: ProductCatalog {
        public init() {}
        public func products(_ ids: [String]) async throws -> [ProductInfo] {
            try await Product.products(for: ids).map {
                ProductInfo(id: $0.id, displayName: $0.displayName, displayPrice: $0.displayPrice)
            }
        }
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, *)
    extension PurchaseCoordinator {
        /// The coordinator an app makes at launch: StoreKit 2, the server over HTTP with the
        /// app's client tokens, the pending state in the Keychain where there is one.
        public static func storeKit2(
            server: URL, tokens: @escaping ClientTokenProvider, store: PendingStore? = nil
        ) throws -> PurchaseCoordinator {
            try PurchaseCoordinator(
                queue: StoreKit2PaymentQueue(), backend: HTTPBackend(baseURL: server, tokens: tokens),
                store: store ?? PurchaseCoordinator.defaultStore(), proofs: TransactionProofSource())
        }

        /// The same with StoreKit 1 (`SKPaymentQueue`), its app receipt as proof.
        public static func storeKit1(
            server: URL, tokens: @escaping ClientTokenProvider, store: PendingStore? = nil
        ) throws -> PurchaseCoordinator {
            try PurchaseCoordinator(
                queue: StoreKit1PaymentQueue(), backend: HTTPBackend(baseURL: server, tokens: tokens),
                store: store ?? PurchaseCoordinator.defaultStore(), proofs: AppReceiptProofSource())
        }

        static func defaultStore() -> PendingStore {
            #if canImport(Security) && canImport(Darwin)
                return KeychainPendingStore()
            #else
                let directory =
                    FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
                    ?? URL(fileURLWithPath: NSTemporaryDirectory())
                return FilePendingStore(url: directory.appendingPathComponent("StoreKeeperKit/pending.json"))
            #endif
        }
    }
#endif
