import Foundation
import StoreKeeperKitCore
import XCTest

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

    func transaction(productId: String, token: UUID?, id: String? = nil, date: Date = Date(), quantity: Int = 1)
        -> StoreTransaction
    {
        let id =
            id
            ?? state.withValue {
                $0.counter += 1
                return String($0.counter)
            }
        return StoreTransaction(
            id: id, originalId: id, productId: productId, quantity: quantity, appAccountToken: token,
            purchaseDate: date,
            signedTransaction: "jws-\(id)")
    }

    /// A StoreKit 1 transaction (no JWS: its proof is the receipt), as the observer maps it.
    func storeKit1(productId: String, token: UUID?, id: String, date: Date = Date(), quantity: Int = 1)
        -> StoreTransaction
    {
        StoreTransaction(
            id: id, originalId: id, productId: productId, quantity: quantity, appAccountToken: token, purchaseDate: date
        )
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
            let transaction = transaction(productId: productId, token: appAccountToken, quantity: quantity)
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
        var transactionId: String? = nil
    }
    struct State {
        var orders: [ServerOrder] = []
        var submissions: [Submission] = []
        var verdicts: [SubmissionVerdict] = []
        var orderFailure: BackendError?
        var accounts: [String: CustomerInfo] = [:]
        var offline = false
        /// Account views asked for.
        var customerInfoCalls = 0
        var orderRequests: [(offerId: String?, appTransactionId: String?)] = []
        var winBackRequests: [String?] = []
        var introductory: IntroductoryOfferEligibility?
        var cancelled: [String] = []
        var expiresIn: TimeInterval? = nil
        var consents: [String: Bool] = [:]
        /// Redemption codes → what the account gets; a used code is removed.
        var codes: [String: CustomerInfo] = [:]
        var redeemed: [(account: String, code: String)] = []
    }
    let state = Locked(State())

    var submissions: [Submission] { state.withValue { $0.submissions } }
    var orders: [ServerOrder] { state.withValue { $0.orders } }

    func script(_ verdicts: SubmissionVerdict...) { state.withValue { $0.verdicts.append(contentsOf: verdicts) } }

    func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, winBackOfferId: String?,
        appTransactionId: String?
    ) async throws -> ServerOrder {
        state.withValue { $0.winBackRequests.append(winBackOfferId) }
        return try await createOrder(
            accountId: accountId, productId: productId, quantity: quantity, offerId: offerId,
            appTransactionId: appTransactionId)
    }

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
                productId: productId, quantity: quantity,
                expiresAt: state.expiresIn.map { Date(timeIntervalSince1970: 1_800_000_000).addingTimeInterval($0) })
            state.orders.append(order)
            return order
        }
    }

    /// How long a submission takes, in real time; a cancelled one ends at once, as a URLSession
    /// request does, and never reaches the "server".
    let latencyNanoseconds = Locked<UInt64>(0)
    let cancelledSubmissions = Locked(0)

    func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
        -> SubmissionVerdict
    {
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
            state.submissions.append(
                Submission(accountId: accountId, orderId: orderId, proof: proof, transactionId: transactionId))
            if !state.verdicts.isEmpty { return state.verdicts.removeFirst() }
            return .accepted(
                PurchaseResponse(
                    status: "delivered", transactions: FakeBackend.entries(proof, orderId: orderId),
                    account: CustomerInfo(accountId: accountId, balances: ["coins": Int64(state.submissions.count)])))
        }
    }

    /// The server's entries for a proof: one per transaction it names ("jws-<id>" here).
    static func entries(_ proof: Proof, orderId: String? = nil, outcome: String = "delivered")
        -> [PurchaseResponse.Transaction]
    {
        func id(_ jws: String) -> String { jws.hasPrefix("jws-") ? String(jws.dropFirst(4)) : jws }
        switch proof {
        case .signedTransaction(let jws): return [.init(transactionId: id(jws), orderId: orderId, outcome: outcome)]
        case .signedTransactions(let list): return list.map { .init(transactionId: id($0), outcome: outcome) }
        case .transactionId(let value): return [.init(transactionId: value, orderId: orderId, outcome: outcome)]
        case .receipt: return []
        }
    }

    /// A 200 naming these transactions.
    static func delivered(_ ids: String..., outcome: String = "delivered", account: String = "u1") -> SubmissionVerdict
    {
        .accepted(
            PurchaseResponse(
                status: "delivered", transactions: ids.map { .init(transactionId: $0, outcome: outcome) },
                account: CustomerInfo(accountId: account)))
    }

    /// The consent answers recorded, per account (the last one counts).
    var consents: [String: Bool] { state.withValue { $0.consents } }

    func setConsumptionDataConsent(accountId: String, granted: Bool) async throws {
        if state.withValue({ $0.offline }) { throw BackendError.network("offline") }
        state.withValue { $0.consents[accountId] = granted }
    }

    func cancelOrder(accountId: String, orderId: String) async throws {
        state.withValue { $0.cancelled.append(orderId) }
    }

    func redeem(accountId: String, code: String) async throws {
        try state.withValue { state in
            if state.offline { throw BackendError.network("offline") }
            guard let granted = state.codes.removeValue(forKey: code) else {
                throw BackendError.server(status: 409, code: "already_redeemed", message: "used", retryable: false)
            }
            var info = granted
            info.accountId = accountId
            state.accounts[accountId] = info
            state.redeemed.append((accountId, code))
        }
    }

    func customerInfo(accountId: String) async throws -> CustomerInfo {
        try state.withValue { state in
            state.customerInfoCalls += 1
            if state.offline { throw BackendError.network("offline") }
            return state.accounts[accountId] ?? CustomerInfo(accountId: accountId)
        }
    }
}

/// Time a test moves by hand: `advance` moves the wall clock and elapsed time together, `jump`
/// only the wall clock (a user setting the date), as on a device; sleeps count elapsed time.
final class ManualClock: Clock, @unchecked Sendable {
    let current = Locked(Date(timeIntervalSince1970: 1_800_000_000))
    let elapsed = Locked<TimeInterval>(0)
    func now() -> Date { current.withValue { $0 } }
    func advance(_ seconds: TimeInterval) {
        current.withValue { $0 = $0.addingTimeInterval(seconds) }
        elapsed.withValue { $0 += seconds }
    }
    func jump(_ seconds: TimeInterval) { current.withValue { $0 = $0.addingTimeInterval(seconds) } }
    func uptime() -> TimeInterval { elapsed.withValue { $0 } }
    func sleep(for seconds: TimeInterval) async throws {
        let until = elapsed.withValue { $0 } + seconds
        while elapsed.withValue({ $0 }) < until {
            try await Task.sleep(nanoseconds: 2_000_000)
        }
    }
}

/// A pending store in memory that counts writes and can fail them (or its reads: a locked
/// Keychain).
final class MemoryStore: PendingStore, @unchecked Sendable {
    let records = Locked<[String: Data]>([:])
    let failing = Locked(false)
    let unreadable = Locked(false)
    let writes = Locked(0)
    let bytesWritten = Locked(0)
    func load() throws -> [String: Data] {
        if unreadable.withValue({ $0 }) { throw PendingStoreError("errSecInteractionNotAllowed") }
        return records.withValue { $0 }
    }
    func write(_ changes: [String: Data], removing: [String]) throws {
        if failing.withValue({ $0 }) { throw PendingStoreError("disk full") }
        writes.withValue { $0 += 1 }
        bytesWritten.withValue { $0 += changes.values.reduce(0) { $0 + $1.count } }
        records.withValue { records in
            for (key, value) in changes { records[key] = value }
            for key in removing { records[key] = nil }
        }
    }
    var state: PendingState { PendingRecords.decode(records.withValue { $0 }).state }
}

extension PurchaseCoordinator {
    /// Waits until nothing runs in the background (configure, login and redrive return at once).
    /// The bound is generous: a loaded 2-core machine (a benchmark or CI beside the tests) once
    /// kept a 300-transaction replay busy past 5 s, and the assertions after it ran too early.
    func idle(timeout: TimeInterval = 60) async {
        _ = await eventually(timeout: timeout) { await self.isIdle }
    }
}

func eventually(
    timeout: TimeInterval = 60, _ condition: @Sendable () async -> Bool
) async -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if await condition() { return true }
        try? await Task.sleep(nanoseconds: 5_000_000)
    }
    return await condition()
}

func assertEventually(
    timeout: TimeInterval = 60, _ message: @autoclosure () -> String = "", file: StaticString = #filePath,
    line: UInt = #line, _ condition: @Sendable () async -> Bool
) async {
    let ok = await eventually(timeout: timeout, condition)
    XCTAssertTrue(ok, message(), file: file, line: line)
}
