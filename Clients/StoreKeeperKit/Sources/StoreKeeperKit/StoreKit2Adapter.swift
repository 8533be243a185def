// Apple platforms; on Linux only in the type-check test target, against the StoreKit shim.
#if canImport(StoreKit) && (canImport(Darwin) || STOREKIT_SHIM)
    import Foundation
    import StoreKit
    import StoreKeeperKitCore

    public struct StoreKitAdapterError: Error, CustomStringConvertible, Sendable {
        public var description: String
    }

    /// StoreKit 2 as a `PaymentQueue`: mapping only; every decision is the coordinator's.
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, *)
    public final class StoreKit2PaymentQueue: PaymentQueue, @unchecked Sendable {
        /// Transactions seen and not yet finished, to finish them by id.
        private let held = Locked<[UInt64: Transaction]>([:])
        private let products = Locked<[String: Product]>([:])
        /// Purchases started on the App Store (`PurchaseIntent`), waiting for the app, by handle.
        private let intents = Locked<[String: Any]>([:])

        public init() {}

        /// Loads products ahead of the tap (the app's store screen), so a purchase waits on nothing.
        public func prefetch(_ ids: [String]) async {
            guard let loaded = try? await Product.products(for: ids) else { return }
            products.withValue { cache in for product in loaded { cache[product.id] = product } }
        }

        /// The product for an id: the cached one, else one request (a second only after a quick
        /// failure). An unknown product is an error at once.
        func product(_ id: String) async throws -> Product {
            if let cached = products.withValue({ $0[id] }) { return cached }
            var lastError: Error?
            for attempt in 0..<2 {
                do {
                    if let product = try await Product.products(for: [id]).first {
                        products.withValue { $0[id] = product }
                        return product
                    }
                    throw StoreKitAdapterError(description: "the App Store does not know product \(id)")
                } catch let error as StoreKitAdapterError {
                    throw error
                } catch {
                    lastError = error
                }
                if attempt == 0 { try await Task.sleep(nanoseconds: 250_000_000) }
            }
            throw lastError ?? StoreKitAdapterError(description: "product \(id) unavailable")
        }

        public func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
            try await purchase(
                productId: productId, quantity: quantity, appAccountToken: appAccountToken, options: PurchaseOptions())
        }

        public func purchase(
            productId: String, quantity: Int, appAccountToken: UUID, options offers: PurchaseOptions
        ) async throws -> PaymentResult {
            var product: Product
            var options: Set<Product.PurchaseOption> = [.appAccountToken(appAccountToken)]
            if let handle = offers.promotedPurchaseId {
                guard #available(iOS 16.4, macOS 14.4, *),
                    let intent = intents.withValue({ $0.removeValue(forKey: handle) }) as? StoreKit.PurchaseIntent
                else {
                    throw StoreKitAdapterError(description: "no promoted purchase \(handle) is waiting")
                }
                product = intent.product
                if #available(iOS 18.0, macOS 15.0, *), let offer = intent.offer, offer.type == .winBack {
                    options.insert(.winBackOffer(offer))
                }
            } else {
                product = try await self.product(productId)
            }
            if quantity > 1 { options.insert(.quantity(quantity)) }
            if let offer = offers.promotionalOffer { options.formUnion(try Self.promotionalOffer(offer)) }
            if let jws = offers.introductoryOfferEligibilityJWS {
                // The server's once-per-account decision: Apple applies or removes the intro offer.
                options.insert(.introductoryOfferEligibility(compactJWS: jws))
            }
            if let winBack = offers.winBackOfferId, offers.promotedPurchaseId == nil {
                guard #available(iOS 18.0, macOS 15.0, tvOS 18.0, *) else {
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
            @unknown default:
                return .failed(
                    StoreKitFailure(code: "Product.PurchaseResult.unknown", message: "unknown purchase result"))
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
            var mapped = StoreTransaction(
                id: String(transaction.id), originalId: String(transaction.originalID),
                productId: transaction.productID, quantity: transaction.purchasedQuantity,
                appAccountToken: transaction.appAccountToken, purchaseDate: transaction.purchaseDate,
                signedTransaction: verification.jwsRepresentation, revocationDate: transaction.revocationDate,
                ownership: transaction.ownershipType == .familyShared ? .familyShared : .purchased,
                isUpgraded: transaction.isUpgraded)
            if #available(iOS 17.2, macOS 14.2, tvOS 17.2, *) {
                if let offer = transaction.offer {
                    mapped.offerId = offer.id
                    mapped.offerType = Self.offerType(offer.type)
                }
            } else {
                mapped.offerId = transaction.offerID
                mapped.offerType = transaction.offerType.flatMap(Self.offerType)
            }
            if #available(iOS 17.0, macOS 14.0, tvOS 17.0, *) {
                mapped.reason = transaction.reason == .renewal ? .renewal : .purchase
            }
            if #available(iOS 16.0, macOS 13.0, tvOS 16.0, *) {
                switch transaction.environment {
                case .production: mapped.environment = .production
                case .sandbox: mapped.environment = .sandbox
                case .xcode: mapped.environment = .xcode
                default: mapped.environment = nil
                }
            }
            return mapped
        }

        static func offerType(_ type: Transaction.OfferType) -> StoreTransaction.OfferType? {
            switch type {
            case .introductory: return .introductory
            case .promotional: return .promotional
            case .code: return .code
            default:
                if #available(iOS 18.0, macOS 15.0, tvOS 18.0, *), type == .winBack { return .winBack }
                return nil
            }
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
                        for await intent in StoreKit.PurchaseIntent.intents {
                            let handle = UUID().uuidString
                            self.intents.withValue { $0[handle] = intent }
                            var offerId: String?
                            var kind: PromotedPurchase.OfferKind?
                            if #available(iOS 18.0, macOS 15.0, *), let offer = intent.offer {
                                offerId = offer.id
                                kind = offer.type == .winBack ? .winBack : .promotional
                            }
                            continuation.yield(
                                .promoted(
                                    PromotedPurchase(
                                        id: handle, productId: intent.product.id, offerId: offerId, offerKind: kind)))
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
    @available(iOS 16.0, macOS 13.0, tvOS 16.0, *)
    public final class StoreKitAppTransactionSource: AppTransactionSource, @unchecked Sendable {
        private let cached = Locked<String?>(nil)
        public init() {}
        /// Asked once per process (the coordinator asks at `configure`, not at each tap).
        public func appTransactionId() async -> String? {
            if let known = cached.withValue({ $0 }) { return known }
            guard let shared = try? await AppTransaction.shared else { return nil }
            let id = shared.unsafePayloadValue.appTransactionID
            cached.withValue { $0 = id }
            return id
        }
    }

    /// Product metadata for display, from StoreKit 2. Purchases never wait on it (P8).
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, *)
    public struct StoreKit2Catalog: ProductCatalog {
        public init() {}
        public func products(_ ids: [String]) async throws -> [ProductInfo] {
            try await Product.products(for: ids).map {
                ProductInfo(id: $0.id, displayName: $0.displayName, displayPrice: $0.displayPrice)
            }
        }
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, *)
    extension PurchaseCoordinator {
        /// The coordinator an app makes at launch: StoreKit 2, the server over HTTP (`appId`: this
        /// app's id on a server that serves several apps, `apps[].id`) with the app's client tokens (and, given it, the server's answer-signing key), the pending
        /// state in the Keychain. It cannot fail: the Keychain is read at `configure()`, and
        /// again later if the device is still locked.
        public static func storeKit2(
            server: URL, appId: String? = nil, tokens: @escaping ClientTokenProvider,
            responseSigningKey: ResponseSigningKey? = nil,
            store: PendingStore? = nil, configuration: Configuration = PurchaseCoordinator.defaultConfiguration()
        ) -> PurchaseCoordinator {
            storeKit2(
                server: server, appId: appId, tokens: tokens,
                responseSigningKeys: responseSigningKey.map { [$0] } ?? [],
                store: store, configuration: configuration)
        }

        /// With every key the server may sign answers with while this build is installed (the
        /// current one and, during a rotation, the next: `GET /v1/status` lists both).
        public static func storeKit2(
            server: URL, appId: String? = nil, tokens: @escaping ClientTokenProvider,
            responseSigningKeys: [ResponseSigningKey], store: PendingStore? = nil,
            configuration: Configuration = PurchaseCoordinator.defaultConfiguration()
        ) -> PurchaseCoordinator {
            var appTransactions: AppTransactionSource?
            if #available(iOS 16.0, macOS 13.0, tvOS 16.0, *) {
                appTransactions = StoreKitAppTransactionSource()
            }
            return PurchaseCoordinator(
                queue: StoreKit2PaymentQueue(),
                backend: HTTPBackend(
                    baseURL: server, appId: appId, responseSigningKeys: responseSigningKeys, tokens: tokens),
                store: store ?? PurchaseCoordinator.defaultStore(), proofs: TransactionProofSource(),
                configuration: configuration, appTransactions: appTransactions)
        }

        /// The same with StoreKit 1 (`SKPaymentQueue`), its app receipt as proof (refreshed with
        /// `SKReceiptRefreshRequest` when it lacks a transaction).
        public static func storeKit1(
            server: URL, appId: String? = nil, tokens: @escaping ClientTokenProvider,
            responseSigningKey: ResponseSigningKey? = nil,
            store: PendingStore? = nil, configuration: Configuration = PurchaseCoordinator.defaultConfiguration()
        ) -> PurchaseCoordinator {
            storeKit1(
                server: server, appId: appId, tokens: tokens,
                responseSigningKeys: responseSigningKey.map { [$0] } ?? [],
                store: store, configuration: configuration)
        }

        public static func storeKit1(
            server: URL, appId: String? = nil, tokens: @escaping ClientTokenProvider,
            responseSigningKeys: [ResponseSigningKey], store: PendingStore? = nil,
            configuration: Configuration = PurchaseCoordinator.defaultConfiguration()
        ) -> PurchaseCoordinator {
            let refresher = ReceiptRefresher()
            return PurchaseCoordinator(
                queue: StoreKit1PaymentQueue(),
                backend: HTTPBackend(
                    baseURL: server, appId: appId, responseSigningKeys: responseSigningKeys, tokens: tokens),
                store: store ?? PurchaseCoordinator.defaultStore(),
                proofs: AppReceiptProofSource(refreshReceipt: { try await refresher.refresh() }),
                configuration: configuration)
        }

        /// The defaults, with the reinstall marker in Application Support (removed by an
        /// uninstall, while the Keychain is not).
        public static func defaultConfiguration() -> Configuration {
            let directory =
                FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
                ?? URL(fileURLWithPath: NSTemporaryDirectory())
            return Configuration(
                installation: FileInstallationMarker(url: directory.appendingPathComponent("StoreKeeperKit/installed")))
        }

        static func defaultStore() -> PendingStore {
            #if canImport(Security) && (canImport(Darwin) || SECURITY_SHIM)
                return KeychainPendingStore()
            #else
                let directory =
                    FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
                    ?? URL(fileURLWithPath: NSTemporaryDirectory())
                return FilePendingStore(url: directory.appendingPathComponent("StoreKeeperKit/pending.journal"))
            #endif
        }
    }

    /// StoreKit 2's errors, mapped case by case (never parsed from their description).
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, *)
    extension StoreKitError: StoreKitFailureConvertible {
        public var storeKitFailure: StoreKitFailure {
            let (kind, name): (StoreKitFailure.Kind, String) =
                switch self {
                case .userCancelled: (.userCancelled, "userCancelled")
                case .networkError: (.network, "networkError")
                case .systemError: (.systemError, "systemError")
                case .notAvailableInStorefront: (.notAvailableInStorefront, "notAvailableInStorefront")
                case .notEntitled: (.notEntitled, "notEntitled")
                case .unknown: (.unknown, "unknown")
                @unknown default: (.unknown, "unknown")
                }
            return StoreKitFailure(
                kind: kind, code: "StoreKitError.\(name)", message: String(describing: self),
                underlying: (self as Error) as? any Error & Sendable)
        }
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, *)
    extension Product.PurchaseError: StoreKitFailureConvertible {
        public var storeKitFailure: StoreKitFailure {
            let (kind, name): (StoreKitFailure.Kind, String) =
                switch self {
                case .invalidQuantity: (.unknown, "invalidQuantity")
                case .productUnavailable: (.productUnavailable, "productUnavailable")
                case .purchaseNotAllowed: (.paymentNotAllowed, "purchaseNotAllowed")
                case .ineligibleForOffer: (.ineligibleForOffer, "ineligibleForOffer")
                case .invalidOfferIdentifier: (.invalidOffer, "invalidOfferIdentifier")
                case .invalidOfferPrice: (.invalidOffer, "invalidOfferPrice")
                case .invalidOfferSignature: (.invalidOffer, "invalidOfferSignature")
                case .missingOfferParameters: (.invalidOffer, "missingOfferParameters")
                @unknown default: (.unknown, "unknown")
                }
            return StoreKitFailure(
                kind: kind, code: "Product.PurchaseError.\(name)", message: String(describing: self),
                underlying: (self as Error) as? any Error & Sendable)
        }
    }
#endif
