import Foundation
import StoreKeeperKitCore

/// A payment queue whose answers a test scripts, recording every payment and finish.
final class FakeQueue: PaymentQueue, @unchecked Sendable {
    struct State {
        var payments: [(productId: String, quantity: Int, token: UUID)] = []
        var finished: [String] = []
        var unfinished: [StoreTransaction] = []
        var next: [PaymentResult] = []
        var restorable: [StoreTransaction] = []
        var continuation: AsyncStream<PaymentUpdate>.Continuation?
        var onPurchase: (@Sendable () -> Void)?
        var purchaseDelay: UInt64 = 0
        var counter = 1000
        var options: [PurchaseOptions] = []
        /// Refuse offers, as a queue without offer support does.
        var offersUnsupported = false
    }
    let state = Locked(State())

    var payments: [(productId: String, quantity: Int, token: UUID)] { state.withValue { $0.payments } }
    var finished: [String] { state.withValue { $0.finished } }

    /// Scripts the next payment's answer; `.purchased` with an empty id makes a transaction
    /// from the payment (with its token unless `dropToken`).
    func answer(_ result: PaymentResult) { state.withValue { $0.next.append(result) } }

    func transaction(productId: String, token: UUID?, id: String? = nil, date: Date = Date()) -> StoreTransaction {
        let id =
            id
            ?? state.withValue {
                $0.counter += 1
                return String($0.counter)
            }
        return StoreTransaction(
            id: id, originalId: id, productId: productId, quantity: 1, appAccountToken: token, purchaseDate: date,
            signedTransaction: "jws-\(id)")
    }

    func purchase(productId: String, quantity: Int, appAccountToken: UUID, options: PurchaseOptions) async throws
        -> PaymentResult
    {
        let unsupported = state.withValue { state -> Bool in
            state.options.append(options)
            return state.offersUnsupported
        }
        if unsupported && !options.isEmpty { throw OffersUnsupported() }
        return try await purchase(productId: productId, quantity: quantity, appAccountToken: appAccountToken)
    }

    func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
        let (hook, delay) = state.withValue { state -> ((@Sendable () -> Void)?, UInt64) in
            state.payments.append((productId, quantity, appAccountToken))
            return (state.onPurchase, state.purchaseDelay)
        }
        hook?()
        if delay > 0 { try await Task.sleep(nanoseconds: delay) }
        let scripted = state.withValue { $0.next.isEmpty ? nil : $0.next.removeFirst() }
        switch scripted {
        case nil:
            let transaction = transaction(productId: productId, token: appAccountToken)
            state.withValue { $0.unfinished.append(transaction) }
            return .purchased(transaction)
        case .purchased(let transaction)?:
            state.withValue { $0.unfinished.append(transaction) }
            return .purchased(transaction)
        case let other?:
            return other
        }
    }

    func finish(transactionId: String) async {
        state.withValue { state in
            state.finished.append(transactionId)
            state.unfinished.removeAll { $0.id == transactionId }
        }
    }

    func unfinished() async -> [StoreTransaction] { state.withValue { $0.unfinished } }

    func restore() async throws -> [StoreTransaction] { state.withValue { $0.restorable } }

    func updates() -> AsyncStream<PaymentUpdate> {
        AsyncStream { continuation in state.withValue { $0.continuation = continuation } }
    }

    /// StoreKit reports something on its own.
    func send(_ update: PaymentUpdate) {
        if case .transaction(let transaction) = update {
            state.withValue { state in
                if !state.unfinished.contains(where: { $0.id == transaction.id }) {
                    state.unfinished.append(transaction)
                }
            }
        }
        _ = state.withValue { $0.continuation }?.yield(update)
    }
}

/// A server whose verdicts a test scripts; records every order and submission.
final class FakeBackend: Backend, @unchecked Sendable {
    struct Submission: Equatable {
        var accountId: String
        var orderId: String?
        var proof: Proof
    }
    struct State {
        var orders: [ServerOrder] = []
        var submissions: [Submission] = []
        var verdicts: [SubmissionVerdict] = []
        var orderFailure: BackendError?
        var accounts: [String: CustomerInfo] = [:]
        var offline = false
        var orderRequests: [(offerId: String?, appTransactionId: String?)] = []
        var introductory: IntroductoryOfferEligibility?
    }
    let state = Locked(State())

    var submissions: [Submission] { state.withValue { $0.submissions } }
    var orders: [ServerOrder] { state.withValue { $0.orders } }

    func script(_ verdicts: SubmissionVerdict...) { state.withValue { $0.verdicts.append(contentsOf: verdicts) } }

    func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, appTransactionId: String?
    ) async throws -> ServerOrder {
        var order = try await createOrder(accountId: accountId, productId: productId, quantity: quantity)
        state.withValue { state in
            state.orderRequests.append((offerId, appTransactionId))
            order.introductoryOfferEligibility = state.introductory
        }
        if let offerId {
            order.offer = SignedOffer(
                id: offerId, keyId: "KEY", nonce: UUID().uuidString.lowercased(), timestamp: 1_767_225_600_000,
                signature: "MEUCIQ==", jws: "header.payload.signature")
        }
        return order
    }

    func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder {
        try state.withValue { state in
            if let failure = state.orderFailure { throw failure }
            let order = ServerOrder(
                orderId: "order-\(state.orders.count + 1)", appAccountToken: UUID(), accountId: accountId,
                productId: productId, quantity: quantity)
            state.orders.append(order)
            return order
        }
    }

    /// How long a submission takes, in real time; a cancelled one ends at once, as a URLSession
    /// request does, and never reaches the "server".
    let latencyNanoseconds = Locked<UInt64>(0)
    let cancelledSubmissions = Locked(0)

    func submitPurchase(accountId: String, orderId: String?, proof: Proof) async -> SubmissionVerdict {
        let latency = latencyNanoseconds.withValue { $0 }
        if latency > 0 {
            do {
                try await Task.sleep(nanoseconds: latency)
            } catch {
                cancelledSubmissions.withValue { $0 += 1 }
                return .cancelled
            }
        }
        return state.withValue { state in
            state.submissions.append(Submission(accountId: accountId, orderId: orderId, proof: proof))
            if !state.verdicts.isEmpty { return state.verdicts.removeFirst() }
            return .accepted(
                PurchaseResponse(
                    status: "delivered", transactions: [],
                    account: CustomerInfo(accountId: accountId, balances: ["coins": Int64(state.submissions.count)])))
        }
    }

    func customerInfo(accountId: String) async throws -> CustomerInfo {
        try state.withValue { state in
            if state.offline { throw BackendError.network("offline") }
            return state.accounts[accountId] ?? CustomerInfo(accountId: accountId)
        }
    }
}

/// Time a test moves by hand; sleeps wait until it has moved far enough.
final class ManualClock: Clock, @unchecked Sendable {
    let current = Locked(Date(timeIntervalSince1970: 1_800_000_000))
    func now() -> Date { current.withValue { $0 } }
    func advance(_ seconds: TimeInterval) { current.withValue { $0 = $0.addingTimeInterval(seconds) } }
    func sleep(until: Date) async throws {
        while now() < until {
            try await Task.sleep(nanoseconds: 2_000_000)
        }
    }
}

/// A pending store in memory that counts writes and can fail them.
final class MemoryStore: PendingStore, @unchecked Sendable {
    let saved = Locked<PendingState?>(nil)
    let failing = Locked(false)
    func load() throws -> PendingState { saved.withValue { $0 } ?? PendingState() }
    func save(_ state: PendingState) throws {
        if failing.withValue({ $0 }) { throw PendingStoreError("disk full") }
        saved.withValue { $0 = state }
    }
    var state: PendingState { saved.withValue { $0 } ?? PendingState() }
}

func eventually(
    timeout: TimeInterval = 5, _ condition: @Sendable () async -> Bool
) async -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if await condition() { return true }
        try? await Task.sleep(nanoseconds: 5_000_000)
    }
    return await condition()
}
