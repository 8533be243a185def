// Apple platforms; on Linux only in the type-check test target, against the StoreKit shim.
#if canImport(StoreKit) && (canImport(Darwin) || STOREKIT_SHIM)
    import Foundation
    import StoreKit
    import StoreKeeperKitCore

    /// StoreKit 1 (`SKPaymentQueue`) as a `PaymentQueue`: mapping only. The observer is added
    /// when it is made — at launch — so StoreKit re-delivers unfinished transactions at once;
    /// what arrives before `configure()` asks for `updates()` is buffered.
    public final class StoreKit1PaymentQueue: NSObject, PaymentQueue, SKPaymentTransactionObserver, @unchecked Sendable
    {
        struct State {
            var continuation: AsyncStream<PaymentUpdate>.Continuation?
            var buffered: [PaymentUpdate] = []
            var held: [String: SKPaymentTransaction] = [:]
            /// Every caller of a restore in progress: a second one joins the first.
            var restoring: [CheckedContinuation<[StoreTransaction], Error>] = []
            var restored: [StoreTransaction] = []
            /// Payments started on the App Store, waiting for the app's consent, by handle.
            var promoted: [String: (payment: SKPayment, product: SKProduct)] = [:]
        }
        private let queue: SKPaymentQueue
        private let state = Locked(State())

        public init(queue: SKPaymentQueue = SKPaymentQueue.default()) {
            self.queue = queue
            super.init()
            queue.add(self)
        }

        /// Stops observing the payment queue (StoreKit holds its observers strongly: without
        /// this an adapter replaced by another keeps receiving, and finishing, transactions).
        public func stop() {
            queue.remove(self)
            let continuation = state.withValue { state -> AsyncStream<PaymentUpdate>.Continuation? in
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.finish()
        }

        deinit { queue.remove(self) }

        /// A payment from the product id alone (no product request first: P8), carrying the
        /// order's token as `applicationUsername`. The outcome comes through the observer.
        public func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
            try await purchase(
                productId: productId, quantity: quantity, appAccountToken: appAccountToken, options: PurchaseOptions())
        }

        /// StoreKit 1 takes the V1 signature (`SKPaymentDiscount`, field 5 = `applicationUsername`).
        /// It has no way to pass an intro-eligibility JWS (Apple's own rule applies) nor a win-back offer.
        public func purchase(
            productId: String, quantity: Int, appAccountToken: UUID, options: PurchaseOptions
        ) async throws -> PaymentResult {
            guard options.winBackOfferId == nil else {
                throw StoreKitAdapterError(description: "win-back offers need StoreKit 2")
            }
            let payment: SKMutablePayment
            if let handle = options.promotedPurchaseId {
                // The payment the App Store offered, with its discount and quantity, now under
                // the order's token.
                guard let offered = state.withValue({ $0.promoted.removeValue(forKey: handle) }) else {
                    throw StoreKitAdapterError(description: "no promoted purchase \(handle) is waiting")
                }
                payment = SKMutablePayment(product: offered.product)
                payment.quantity = offered.payment.quantity
                payment.paymentDiscount = offered.payment.paymentDiscount
            } else {
                payment = SKMutablePayment()
                payment.productIdentifier = productId
                payment.quantity = quantity
            }
            payment.applicationUsername = appAccountToken.uuidString.lowercased()
            if let offer = options.promotionalOffer {
                guard let nonce = UUID(uuidString: offer.nonce) else {
                    throw StoreKitAdapterError(description: "offer \(offer.id): malformed nonce")
                }
                payment.paymentDiscount = SKPaymentDiscount(
                    identifier: offer.id, keyIdentifier: offer.keyId, nonce: nonce, signature: offer.signature,
                    timestamp: NSNumber(value: offer.timestamp))
            }
            queue.add(payment)
            return .enqueued
        }

        public func finish(transactionId: String) async {
            let transaction =
                state.withValue { $0.held.removeValue(forKey: transactionId) }
                ?? queue.transactions.first { $0.transactionIdentifier == transactionId }
            if let transaction { queue.finishTransaction(transaction) }
        }

        /// Unfinished purchases, and restores' copies marked as such (a restored transaction is
        /// never taken for a new purchase).
        public func unfinished() async -> [StoreTransaction] {
            queue.transactions.filter { $0.transactionState == .purchased || $0.transactionState == .restored }
                .map(map)
        }

        /// One restore at a time: a call while one runs waits for the same answer.
        public func restore() async throws -> [StoreTransaction] {
            try await withCheckedThrowingContinuation { continuation in
                let first = state.withValue { state -> Bool in
                    state.restoring.append(continuation)
                    guard state.restoring.count == 1 else { return false }
                    state.restored = []
                    return true
                }
                if first { queue.restoreCompletedTransactions() }
            }
        }

        public func updates() -> AsyncStream<PaymentUpdate> {
            AsyncStream { continuation in
                let buffered = state.withValue { state -> [PaymentUpdate] in
                    state.continuation = continuation
                    defer { state.buffered = [] }
                    return state.buffered
                }
                for update in buffered { continuation.yield(update) }
            }
        }

        func map(_ transaction: SKPaymentTransaction) -> StoreTransaction {
            let id = transaction.transactionIdentifier ?? "failed-\(ObjectIdentifier(transaction).hashValue)"
            state.withValue { $0.held[id] = transaction }
            return StoreTransaction(
                id: id, originalId: transaction.original?.transactionIdentifier,
                productId: transaction.payment.productIdentifier, quantity: transaction.payment.quantity,
                appAccountToken: transaction.payment.applicationUsername.flatMap(UUID.init(uuidString:)),
                purchaseDate: transaction.transactionDate ?? Date(),
                isRestored: transaction.transactionState == .restored ? true : nil,
                offerId: transaction.payment.paymentDiscount?.identifier,
                offerType: transaction.payment.paymentDiscount == nil ? nil : .promotional)
        }

        func emit(_ update: PaymentUpdate) {
            let continuation = state.withValue { state -> AsyncStream<PaymentUpdate>.Continuation? in
                if state.continuation == nil { state.buffered.append(update) }
                return state.continuation
            }
            continuation?.yield(update)
        }

        public func paymentQueue(_ queue: SKPaymentQueue, updatedTransactions transactions: [SKPaymentTransaction]) {
            for transaction in transactions {
                switch transaction.transactionState {
                case .purchased:
                    emit(.transaction(map(transaction)))
                case .restored:
                    let mapped = map(transaction)
                    state.withValue { $0.restored.append(mapped) }
                    emit(.restored(mapped))
                case .failed:
                    let mapped = map(transaction)
                    let cancelled = (transaction.error as? SKError)?.code == .paymentCancelled
                    emit(
                        .failed(
                            productId: mapped.productId, transactionId: mapped.id, cancelled: cancelled,
                            appAccountToken: mapped.appAccountToken,
                            failure: transaction.error.map(StoreKitFailure.init)))
                case .deferred:
                    emit(
                        .deferred(
                            productId: transaction.payment.productIdentifier,
                            appAccountToken: transaction.payment.applicationUsername.flatMap(UUID.init(uuidString:))))
                case .purchasing:
                    break
                @unknown default:
                    break
                }
            }
        }

        /// A purchase started on the App Store: not added now; the coordinator buys it with an
        /// order of the logged-in account (after login if nobody is).
        public func paymentQueue(
            _ queue: SKPaymentQueue, shouldAddStorePayment payment: SKPayment, for product: SKProduct
        )
            -> Bool
        {
            let handle = UUID().uuidString
            state.withValue { $0.promoted[handle] = (payment, product) }
            emit(
                .promoted(
                    PromotedPurchase(
                        id: handle, productId: product.productIdentifier, quantity: payment.quantity,
                        offerId: payment.paymentDiscount?.identifier)))
            return false
        }

        public func paymentQueueRestoreCompletedTransactionsFinished(_ queue: SKPaymentQueue) {
            let (waiters, restored) = state.withValue { state in
                defer { state.restoring = [] }
                return (state.restoring, state.restored)
            }
            for waiter in waiters { waiter.resume(returning: restored) }
        }

        public func paymentQueue(_ queue: SKPaymentQueue, restoreCompletedTransactionsFailedWithError error: Error) {
            let waiters = state.withValue { state in
                defer { state.restoring = [] }
                return state.restoring
            }
            for waiter in waiters { waiter.resume(throwing: error) }
        }
    }

    /// `SKReceiptRefreshRequest` as an async call: the app receipt on disk is fetched anew (it
    /// may ask the user to sign in to the App Store). One refresh at a time; callers join it.
    public final class ReceiptRefresher: NSObject, SKRequestDelegate, @unchecked Sendable {
        private let state = Locked<(request: SKReceiptRefreshRequest?, waiters: [CheckedContinuation<Void, Error>])>(
            (nil, []))

        public override init() { super.init() }

        public func refresh() async throws {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
                let request = state.withValue { state -> SKReceiptRefreshRequest? in
                    state.waiters.append(continuation)
                    guard state.request == nil else { return nil }
                    let request = SKReceiptRefreshRequest(receiptProperties: nil)
                    state.request = request
                    return request
                }
                if let request {
                    request.delegate = self
                    request.start()
                }
            }
        }

        private func finish(_ error: Error?) {
            let waiters = state.withValue { state in
                defer { state = (nil, []) }
                return state.waiters
            }
            for waiter in waiters {
                if let error { waiter.resume(throwing: error) } else { waiter.resume() }
            }
        }

        public func requestDidFinish(_ request: SKRequest) { finish(nil) }
        public func request(_ request: SKRequest, didFailWithError error: Error) { finish(error) }
    }

    /// StoreKit 1's errors, mapped by code (never parsed from their description).
    @available(iOS, introduced: 3.0, deprecated: 18.0)
    extension SKError: StoreKitFailureConvertible {
        public var storeKitFailure: StoreKitFailure {
            let (kind, name): (StoreKitFailure.Kind, String) =
                switch code {
                case .paymentCancelled, .overlayCancelled: (.userCancelled, "paymentCancelled")
                case .paymentNotAllowed: (.paymentNotAllowed, "paymentNotAllowed")
                case .storeProductNotAvailable: (.productUnavailable, "storeProductNotAvailable")
                case .cloudServiceNetworkConnectionFailed: (.network, "cloudServiceNetworkConnectionFailed")
                case .invalidOfferIdentifier: (.invalidOffer, "invalidOfferIdentifier")
                case .invalidSignature: (.invalidOffer, "invalidSignature")
                case .missingOfferParams: (.invalidOffer, "missingOfferParams")
                case .invalidOfferPrice: (.invalidOffer, "invalidOfferPrice")
                case .ineligibleForOffer: (.ineligibleForOffer, "ineligibleForOffer")
                case .clientInvalid: (.paymentNotAllowed, "clientInvalid")
                case .paymentInvalid: (.unknown, "paymentInvalid")
                default: (.unknown, "code\(code.rawValue)")
                }
            return StoreKitFailure(
                kind: kind, code: "SKError.\(name)", message: String(describing: self),
                underlying: (self as Error) as? any Error & Sendable)
        }
    }
#endif
