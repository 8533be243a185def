import Foundation
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// What stands between the SDK and the world on a simulated device: the gates a simulated
/// crash closes, the proxy, the clock, the store and the proofs.
final class Generation: @unchecked Sendable {
    let number: Int
    private let lock = NSLock()
    private var isDead = false
    private var random: SeededRandom
    private let crashRate: Double
    /// Died of a simulated crash (not a user's kill).
    private(set) var crashed = false

    init(number: Int, seed: UInt64 = 0, crashRate: Double = 0) {
        self.number = number
        self.random = SeededRandom(seed: seed &+ UInt64(number) &* 0x2545_F491_4F6C_DD1D)
        self.crashRate = crashRate
    }

    var dead: Bool {
        get { lock.withLock { isDead } }
        set { lock.withLock { isDead = newValue } }
    }

    /// Between a tap and StoreKit's charge: the only death there is the one planned with the tap
    /// (nil: outside that window, crash points draw as usual).
    private var deathBeforePaying: Bool?

    /// Opens the window (`dies`: whether the app is killed at the payment sheet); false when the
    /// app is already dead.
    func openPaymentWindow(dies: Bool) -> Bool {
        lock.withLock {
            guard !isDead else { return false }
            deathBeforePaying = dies
            return true
        }
    }

    /// Closes it (the purchase ended without reaching the payment sheet).
    func closePaymentWindow() {
        lock.withLock { deathBeforePaying = nil }
    }

    /// At the payment sheet: the planned death, if any; the window closes either way.
    func dieIfPlannedBeforePaying() throws {
        try lock.withLock {
            guard !isDead else { throw SimulatedCrash() }
            defer { deathBeforePaying = nil }
            if deathBeforePaying == true {
                isDead = true
                crashed = true
                throw SimulatedCrash()
            }
        }
    }

    /// A crash point: the process may die here (never between a tap and the charge, but for the
    /// planned death at the payment sheet).
    func maybeCrash() throws {
        try lock.withLock {
            guard !isDead else { throw SimulatedCrash() }
            if deathBeforePaying != nil { return }
            if crashRate > 0 && random.unit() < crashRate {
                isDead = true
                crashed = true
                throw SimulatedCrash()
            }
        }
    }
}

struct GatedQueue: PaymentQueue {
    let device: SimulatedDevice
    let gate: Generation

    func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
        try await device.purchase(productId: productId, quantity: quantity, token: appAccountToken, gate: gate)
    }
    func finish(transactionId: String) async {
        await device.finish(transactionId, gate: gate)
    }
    func unfinished() async -> [StoreTransaction] {
        gate.dead ? [] : await device.unfinishedTransactions()
    }
    func restore() async throws -> [StoreTransaction] { [] }
    func updates() -> AsyncStream<PaymentUpdate> {
        let (stream, continuation) = AsyncStream<PaymentUpdate>.makeStream()
        let device = device
        let gate = gate
        let task = Task {
            for await update in await device.updates(gate: gate) { continuation.yield(update) }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
        return stream
    }
}

struct GatedBackend: Backend {
    let device: SimulatedDevice
    let gate: Generation
    let inner: HTTPBackend

    var signatureDiagnostics: SignatureDiagnostics? { inner.signatureDiagnostics }

    func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder {
        guard !gate.dead else { throw SimulatedCrash() }
        trace("\(accountId) order")
        defer { trace("\(accountId) order done") }
        let (before, after) = await device.networkFails()
        if before { throw BackendError.network("simulated: no connection") }
        let order = try await inner.createOrder(accountId: accountId, productId: productId, quantity: quantity)
        await device.created(order)
        if after { throw BackendError.network("simulated: connection lost before the answer") }
        try gate.maybeCrash()
        await device.handedToApp(order)
        return order
    }

    func cancelOrder(accountId: String, orderId: String) async throws {
        guard !gate.dead else { throw SimulatedCrash() }
        try await inner.cancelOrder(accountId: accountId, orderId: orderId)
    }

    func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
        -> SubmissionVerdict
    {
        guard !gate.dead else { return .retryable(status: nil, code: "crashed", retryAfter: nil) }
        trace("\(accountId) submit")
        defer { trace("\(accountId) submit done") }
        if await device.submissionFails() { return .retryable(status: nil, code: "network", retryAfter: nil) }
        let (before, after) = await device.networkFails()
        if before { return .retryable(status: nil, code: "network", retryAfter: nil) }
        let verdict = await inner.submitPurchase(
            accountId: accountId, orderId: orderId, proof: proof, transactionId: transactionId)
        // The server answered: whatever happens on the device now, it has the verdict.
        await device.record(verdict, proof: proof)
        if after { return .retryable(status: nil, code: "network", retryAfter: nil) }
        if (try? gate.maybeCrash()) == nil {
            return .retryable(status: nil, code: "crashed", retryAfter: nil)
        }
        return verdict
    }

    func setConsumptionDataConsent(accountId: String, granted: Bool) async throws {
        try await inner.setConsumptionDataConsent(accountId: accountId, granted: granted)
    }

    func customerInfo(accountId: String) async throws -> CustomerInfo {
        guard !gate.dead else { throw SimulatedCrash() }
        return try await inner.customerInfo(accountId: accountId)
    }
}

/// What stands between the device and the server: at the fault's rate a proxy, WAF or CDN
/// answers an HTML error page instead (or after) the server. Cancellation goes through to the
/// transport, which honours it as URLSession does.
struct Middlebox: HTTPTransport {
    let device: SimulatedDevice
    let inner: HTTPTransport

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let (before, after) = await device.middlebox()
        if let before { return Self.page(before, request) }
        let answer = try await inner.send(request)
        if let after {
            // The server did answer: what it delivered is the truth the report compares with.
            if answer.1.statusCode == 200, request.url?.path.hasSuffix("/v1/purchases") == true,
                let response = try? JSONDecoder().decode(PurchaseResponse.self, from: answer.0)
            {
                await device.record(.accepted(response), proof: .receipt(""))
            }
            return Self.page(after, request)
        }
        return answer
    }

    static func page(_ status: Int, _ request: URLRequest) -> (Data, HTTPURLResponse) {
        let body = Data("<html><head><title>\(status)</title></head><body><h1>\(status)</h1>nginx</body></html>".utf8)
        let response = HTTPURLResponse(
            url: request.url ?? URL(string: "http://proxy")!, statusCode: status, httpVersion: "HTTP/1.1",
            headerFields: ["Content-Type": "text/html"])!
        return (body, response)
    }
}

/// The device's wall clock, which the user may set a day off; sleeps count real elapsed time.
struct DeviceClock: Clock {
    let offset: Locked<TimeInterval>
    func now() -> Date { Date().addingTimeInterval(offset.withValue { $0 }) }
    func sleep(for seconds: TimeInterval) async throws {
        if seconds > 0 { try await Task.sleep(nanoseconds: UInt64(min(seconds, 86_400) * 1_000_000_000)) }
    }
}

/// The store file, with crashes before and after a write (never a torn file: that is the
/// file store's own guarantee, tested in the SDK).
struct GatedStore: PendingStore {
    let inner: FilePendingStore
    let device: SimulatedDevice
    let gate: Generation

    func load() throws -> [String: Data] { try inner.load() }

    func write(_ records: [String: Data], removing: [String]) throws {
        try gate.maybeCrash()
        try inner.write(records, removing: removing)
        try gate.maybeCrash()
    }
}

struct DeviceProofs: ProofSource {
    let device: SimulatedDevice
    func proof(for transaction: StoreTransaction, refresh: Bool) async throws -> Proof {
        try await device.proof(for: transaction, refresh: refresh)
    }
    func receipt(refresh: Bool) async throws -> String? {
        try await device.receipt(refresh: refresh)
    }
}
