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
            try await purchase(
                productId: productId, quantity: quantity, appAccountToken: appAccountToken, options: PurchaseOptions())
        }

        public func purchase(
            productId: String, quantity: Int, appAccountToken: UUID, options offers: PurchaseOptions
        ) async throws -> PaymentResult {
            let product = try await product(productId)
            var options: Set<Product.PurchaseOption> = [.appAccountToken(appAccountToken)]
            if quantity > 1 { options.insert(.quantity(quantity)) }
            if let offer = offers.promotionalOffer { options.formUnion(try Self.promotionalOffer(offer)) }
            if let jws = offers.introductoryOfferEligibilityJWS {
                // The server's once-per-account decision: Apple applies or removes the intro offer.
                options.insert(.introductoryOfferEligibility(compactJWS: jws))
            }
            if let winBack = offers.winBackOfferId {
                guard #available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, *) else {
                    throw StoreKitAdapterError(description: "win-back offers need iOS 18")
                }
                guard let offer = product.subscription?.winBackOffers.first(where: { $0.id == winBack }) else {
                    throw StoreKitAdapterError(description: "\(productId) has no win-back offer \(winBack)")
                }
                options.insert(.winBackOffer(offer))
            }
            switch try await product.purchase(options: options) {
            case .success(let verification): return .purchased(map(verification))
            case .pending: return .deferred
            case .userCancelled: return .cancelled
            @unknown default: return .failed("unknown purchase result")
            }
        }

        /// A signed promotional offer: the V2 JWS (`promotionalOffer(_:compactJWS:)`, back-deployed
        /// to iOS 15 from the iOS 26 SDK) where the SDK has it, else V1's fields with the decoded
        /// signature bytes.
        static func promotionalOffer(_ offer: SignedOffer) throws -> [Product.PurchaseOption] {
            #if compiler(>=6.2)
                if !offer.jws.isEmpty {
                    return Product.PurchaseOption.promotionalOffer(offer.id, compactJWS: offer.jws)
                }
            #endif
            return [try promotionalOfferV1(offer)]
        }

        static func promotionalOfferV1(_ offer: SignedOffer) throws -> Product.PurchaseOption {
            guard let nonce = UUID(uuidString: offer.nonce), let signature = offer.signatureBytes else {
                throw StoreKitAdapterError(description: "offer \(offer.id): malformed nonce or signature")
            }
            return .promotionalOffer(
                offerID: offer.id, keyID: offer.keyId, nonce: nonce, signature: signature,
                timestamp: Int(offer.timestamp))
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

    /// The Apple Account of this device for this app (`AppTransaction.appTransactionID`): the
    /// server counts introductory offers and shared Apple Accounts by it.
    @available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, *)
    public struct StoreKitAppTransactionSource: AppTransactionSource {
        public init() {}
        public func appTransactionId() async -> String? {
            guard let shared = try? await AppTransaction.shared else { return nil }
            return shared.unsafePayloadValue.appTransactionID
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
            var appTransactions: AppTransactionSource?
            if #available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, *) {
                appTransactions = StoreKitAppTransactionSource()
            }
            return try PurchaseCoordinator(
                queue: StoreKit2PaymentQueue(), backend: HTTPBackend(baseURL: server, tokens: tokens),
                store: store ?? PurchaseCoordinator.defaultStore(), proofs: TransactionProofSource(),
                appTransactions: appTransactions)
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
