import Foundation
import StoreKeeperKitCore

let tracing = ProcessInfo.processInfo.environment["STOREKEEPER_SIMULATE_TRACE"] != nil
func trace(_ line: @autoclosure () -> String) {
    if tracing { FileHandle.standardError.write(Data("\(Date().timeIntervalSince1970) \(line())\n".utf8)) }
}

/// The process died here (a simulated crash): everything the app was doing stops.
struct SimulatedCrash: Error {}

/// What can go wrong on a device, each a probability per opportunity.
public struct DeviceFaults: Sendable, Equatable {
    public var crash: Double = 0
    public var network: Double = 0
    /// Submissions only fail (the order was created; the upload does not get through).
    public var submissionFailure: Double = 0
    /// StoreKit returns the transaction without its token (and the payment carried none).
    public var dropToken: Double = 0
    /// The same callback twice.
    public var duplicate: Double = 0
    /// The callback never comes in this run of the app; the next launch's sweep finds it.
    public var dropCallback: Double = 0
    /// The callback comes late, through `updates`.
    public var delay: Double = 0
    /// Two products paid in one payment (the second reported through `updates`, first or last).
    public var merge: Double = 0
    /// Ask to Buy: a parent approves later, after a restart.
    public var askToBuy: Double = 0
    /// StoreKit hands the oldest unfinished transaction to the new payment instead of paying
    /// (P11: an unfinished consumable resurfacing under a new order).
    public var staleCallback: Double = 0
    /// The user taps buy twice.
    public var doubleTap: Double = 0

    public init() {}

    public static let none = DeviceFaults()
}

/// A deterministic generator (SplitMix64), one per device (and one per chaos run), so a seed
/// replays the same choices.
public struct SeededRandom: Sendable {
    var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }
    mutating func chance(_ p: Double) -> Bool { p > 0 && unit() < p }
    public mutating func below(_ n: Int) -> Int { Int(next() % UInt64(max(n, 1))) }
}

/// One simulated phone: an Apple ID, one app account, StoreKit's queue (which outlives the
/// app), and the app itself — a `PurchaseCoordinator` rebuilt from its store file after every
/// crash. Every component the coordinator talks to is wrapped for one run of the app (a
/// generation): when the generation crashes, its writes, payments, finishes and requests stop.
public actor SimulatedDevice {
    nonisolated public let appleId: String
    nonisolated public let accountId: String
    let control: LocalStoreControl
    let server: URL
    let key: String
    let storeURL: URL
    let retry: RetryPolicy
    var faults: DeviceFaults
    var random: SeededRandom

    // StoreKit's side (survives crashes).
    var unfinished: [StoreTransaction] = []
    var receiptProofs: Set<String> = []
    var askToBuy: [String] = []
    var tokenOfOrder: [UUID: String] = [:]
    var continuation: AsyncStream<PaymentUpdate>.Continuation?

    // What the server answered, as the device saw it (the ground truth for "finished before ack").
    var acknowledged: Set<String> = []
    var deliveredTo: [String: Set<String>] = [:]
    var deliveredAnswers: [String: Int] = [:]

    // Counters for the report.
    public private(set) var payments = 0
    public private(set) var purchasesStarted = 0
    public private(set) var finishedBeforeAck = 0
    public private(set) var crashes = 0
    public private(set) var doubleCharges = 0
    public private(set) var networkFailures = 0

    var generation: Generation
    public private(set) var coordinator: PurchaseCoordinator?
    let tokens: ClientTokenProvider
    let transport: HTTPTransport
    let fsync: Bool

    /// `tokens` mints the client tokens the SDK sends (default: the secret key, which the
    /// server accepts for every call); `transport` carries them (default AsyncHTTPClient).
    public init(
        appleId: String, accountId: String, server: URL, key: String, directory: URL, seed: UInt64,
        faults: DeviceFaults, retry: RetryPolicy = RetryPolicy(base: 0.05, cap: 1),
        tokens: ClientTokenProvider? = nil, transport: HTTPTransport = AsyncHTTPTransport(), fsync: Bool = true
    ) {
        self.fsync = fsync
        self.appleId = appleId
        self.accountId = accountId
        self.server = server
        self.key = key
        self.tokens = tokens ?? { [key] _, _ in key }
        self.transport = transport
        self.control = LocalStoreControl(server: server, key: key)
        self.storeURL = directory.appendingPathComponent("\(appleId).json")
        self.faults = faults
        self.retry = retry
        self.random = SeededRandom(seed: seed)
        self.generation = Generation(number: 0)
    }

    // MARK: The app's lifecycle

    /// Launches the app: a coordinator from the store file, configured, the user logged in.
    public func launch() async throws {
        trace("\(appleId) launch")
        if generation.crashed { crashes += 1 }
        // `crash` is per purchase; a purchase passes about ten crash points.
        generation = Generation(number: generation.number + 1, seed: random.next(), crashRate: faults.crash / 10)
        continuation?.finish()
        continuation = nil
        let gate = generation
        let coordinator = try PurchaseCoordinator(
            queue: GatedQueue(device: self, gate: gate),
            backend: GatedBackend(
                device: self, gate: gate,
                inner: HTTPBackend(baseURL: server, transport: transport, tokens: tokens)),
            store: GatedStore(inner: FilePendingStore(url: storeURL, synchronous: fsync), device: self, gate: gate),
            proofs: DeviceProofs(device: self),
            configuration: .init(retry: retry, random: { Double.random(in: 0...1) }))
        self.coordinator = coordinator
        await coordinator.configure()
        guard !gate.dead else { return try await relaunch() }
        await coordinator.login(accountId)
        if gate.dead { try await relaunch() }
    }

    func relaunch() async throws {
        await coordinator?.shutdown()
        coordinator = nil
        try await launch()
    }

    /// A crash decided at one of the crash points.
    nonisolated func maybeCrash(_ gate: Generation) throws { try gate.maybeCrash() }

    /// One tap on "buy" (sometimes two). Returns once the app has an answer or crashed (then
    /// relaunched).
    public func buy(productId: String, quantity: Int) async throws {
        guard let coordinator else { return try await launch() }
        purchasesStarted += 1
        trace("\(appleId) buy \(purchasesStarted) \(productId) gen \(generation.number)")
        defer { trace("\(appleId) buy \(purchasesStarted) done") }
        let paymentsBefore = payments
        let gate = generation
        let watchdog = Task {
            try await Task.sleep(nanoseconds: 3_000_000_000)
            // The purchase hangs (its callback was dropped): the user kills the app.
            gate.dead = true
            await coordinator.shutdown()
        }
        if random.chance(faults.doubleTap) {
            async let first = try? coordinator.purchase(productId: productId, quantity: quantity)
            try? await Task.sleep(nanoseconds: 1_000_000)
            let second = try? await coordinator.purchase(productId: productId, quantity: quantity)
            _ = await first
            // Two taps, one payment: a second one would be a double charge.
            if second != nil && payments - paymentsBefore > 1 { doubleCharges += 1 }
        } else {
            _ = try? await coordinator.purchase(productId: productId, quantity: quantity)
        }
        watchdog.cancel()
        if gate.dead { try await relaunch() }
        await maybeApprove()
    }

    /// A parent approves one waiting Ask to Buy request, sometimes.
    func maybeApprove(all: Bool = false) async {
        while !askToBuy.isEmpty, all || random.chance(0.3) {
            let pendingId = askToBuy.removeFirst()
            guard let payment = try? await control.approve(pendingId) else { continue }
            payments += 1
            let transactions = map(payment)
            for transaction in transactions { report(transaction) }
            if !all { break }
        }
    }

    /// Settles: no more faults, every Ask to Buy approved, the app relaunched and re-driven
    /// until StoreKit holds nothing unfinished and the app holds nothing pending.
    public func settle(deadline: Date) async throws -> Bool {
        faults = .none
        await maybeApprove(all: true)
        try await relaunch()
        while Date() < deadline {
            let pending = await coordinator?.pendingSubmissions.count ?? 0
            if pending == 0 && unfinished.isEmpty && askToBuy.isEmpty { return true }
            await coordinator?.redrive(.networkChange)
            try await Task.sleep(nanoseconds: 100_000_000)
            if !unfinished.isEmpty, await coordinator?.pendingSubmissions.count == 0 {
                // StoreKit holds something the app never heard of in this run: the next
                // launch's sweep finds it.
                try await relaunch()
            }
        }
        return false
    }

    public func setFaults(_ faults: DeviceFaults) { self.faults = faults }

    /// Orders the app created, in order.
    public private(set) var orderIds: [String] = []
    func created(_ order: ServerOrder) { orderIds.append(order.orderId) }

    /// Puts a transaction in StoreKit's queue, unfinished, without telling the app (one paid
    /// and delivered elsewhere, its finish lost).
    public func adoptUnfinished(_ payment: LocalStoreControl.Payment) { _ = map(payment) }

    /// One purchase straight through the coordinator (scenario tests): its outcome, or the
    /// error it threw; nil when the app crashed on the way (it is then relaunched).
    public func purchase(productId: String, quantity: Int = 1) async throws -> Result<PurchaseOutcome, Error>? {
        guard let coordinator else {
            try await launch()
            return nil
        }
        let gate = generation
        let result: Result<PurchaseOutcome, Error>
        do {
            result = .success(try await coordinator.purchase(productId: productId, quantity: quantity))
        } catch {
            result = .failure(error)
        }
        if gate.dead {
            try await relaunch()
            return nil
        }
        return result
    }

    /// Kills the app and starts it again.
    public func restart() async throws {
        generation.dead = true
        try await relaunch()
    }

    /// Approves every waiting Ask to Buy request.
    public func approveAll() async { await maybeApprove(all: true) }

    public var unfinishedIds: [String] { unfinished.map(\.id) }
    public var pendingCount: Int {
        get async { await coordinator?.pendingSubmissions.count ?? 0 }
    }
    public var acknowledgedIds: Set<String> { acknowledged }

    public func stop() async {
        generation.dead = true
        await coordinator?.shutdown()
        coordinator = nil
        continuation?.finish()
    }

    // MARK: StoreKit's side

    func map(_ payment: LocalStoreControl.Payment) -> [StoreTransaction] {
        let merged = payment.transactions.count > 1
        var result: [StoreTransaction] = []
        for (index, transaction) in payment.transactions.enumerated() {
            let signed = merged ? nil : payment.signedTransactions[index]
            if merged { receiptProofs.insert(transaction.transactionId) }
            let mapped = StoreTransaction(
                id: transaction.transactionId, originalId: transaction.originalTransactionId,
                productId: transaction.productId, quantity: transaction.quantity ?? 1,
                appAccountToken: transaction.appAccountToken.flatMap(UUID.init(uuidString:)),
                purchaseDate: Date(timeIntervalSince1970: Double(transaction.purchaseDate ?? 0) / 1000),
                signedTransaction: signed)
            unfinished.append(mapped)
            result.append(mapped)
        }
        return result
    }

    /// StoreKit tells the app (when the app is running).
    func report(_ transaction: StoreTransaction) {
        continuation?.yield(.transaction(transaction))
    }

    func purchase(productId: String, quantity: Int, token: UUID, gate: Generation) async throws -> PaymentResult {
        trace("\(appleId) pay")
        defer { trace("\(appleId) pay done") }
        try maybeCrash(gate)
        let items: [(productId: String, quantity: Int)]
        var mergedWith: String?
        if random.chance(faults.merge), let other = otherConsumable(than: productId) {
            mergedWith = other
            items = [(productId, quantity), (other, 1)]
        } else {
            items = [(productId, quantity)]
        }
        if random.chance(faults.staleCallback), let stale = unfinished.first {
            return .purchased(stale)
        }
        let dropToken = random.chance(faults.dropToken)
        if random.chance(faults.askToBuy) {
            let payment = try await control.pay(
                appleId: appleId, items: items, appAccountToken: dropToken ? nil : token, askToBuy: true)
            if let id = payment.pendingId { askToBuy.append(id) }
            return .deferred
        }
        let payment = try await control.pay(
            appleId: appleId, items: items, appAccountToken: dropToken ? nil : token, askToBuy: false)
        payments += 1
        var transactions = map(payment)
        // The app may die right after paying, before hearing of it.
        try maybeCrash(gate)
        if random.chance(faults.dropCallback) { return .enqueued }
        if mergedWith != nil, transactions.count == 2 {
            let second = transactions.removeLast()
            let reorder = random.chance(0.5)
            if reorder { report(second) }
            defer { if !reorder { report(second) } }
        }
        let first = transactions[0]
        if random.chance(faults.duplicate) { report(first) }
        if random.chance(faults.delay) {
            let delay = UInt64(random.below(200)) * 1_000_000
            Task {
                try? await Task.sleep(nanoseconds: delay)
                await self.reportIfRunning(first, gate: gate)
            }
            return .enqueued
        }
        return .purchased(first)
    }

    func reportIfRunning(_ transaction: StoreTransaction, gate: Generation) {
        guard !gate.dead, gate === generation else { return }
        report(transaction)
    }

    var consumables: [String] = []
    public func setConsumables(_ ids: [String]) { consumables = ids }
    func otherConsumable(than productId: String) -> String? {
        let others = consumables.filter { $0 != productId }
        return others.isEmpty ? nil : others[random.below(others.count)]
    }

    func finish(_ transactionId: String, gate: Generation) async {
        guard !gate.dead else { return }
        guard unfinished.contains(where: { $0.id == transactionId }) else { return }
        if !acknowledged.contains(transactionId) { finishedBeforeAck += 1 }
        unfinished.removeAll { $0.id == transactionId }
        try? await control.finish(transactionId)
    }

    func updates(gate: Generation) -> AsyncStream<PaymentUpdate> {
        let (stream, continuation) = AsyncStream<PaymentUpdate>.makeStream()
        if gate === generation && !gate.dead {
            self.continuation = continuation
        } else {
            continuation.finish()
        }
        return stream
    }

    func unfinishedTransactions() -> [StoreTransaction] { unfinished }

    func proof(for transaction: StoreTransaction) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        if receiptProofs.contains(transaction.id) { return .receipt(try await control.receipt(appleId: appleId)) }
        return .transactionId(transaction.id)
    }

    // MARK: The network

    func submissionFails() -> Bool {
        guard random.chance(faults.submissionFailure) else { return false }
        networkFailures += 1
        return true
    }

    func networkFails() -> (before: Bool, after: Bool) {
        guard random.chance(faults.network) else { return (false, false) }
        networkFailures += 1
        return random.chance(0.5) ? (true, false) : (false, true)
    }

    /// Records what the server answered: a final verdict acknowledges the transaction(s).
    func record(_ verdict: SubmissionVerdict, proof: Proof) {
        switch verdict {
        case .accepted(let response):
            let account = response.account?.accountId ?? accountId
            for transaction in response.transactions {
                acknowledged.insert(transaction.transactionId)
                if transaction.outcome == "delivered" || transaction.outcome == "already_delivered" {
                    deliveredTo[transaction.transactionId, default: []].insert(account)
                }
                if transaction.outcome == "delivered" { deliveredAnswers[transaction.transactionId, default: 0] += 1 }
            }
        case .rejected:
            if let id = Self.transactionId(in: proof) { acknowledged.insert(id) }
        case .pending, .retryable:
            break
        }
    }

    static func transactionId(in proof: Proof) -> String? {
        switch proof {
        case .transactionId(let id): return id
        case .receipt: return nil
        case .signedTransaction(let jws):
            let parts = jws.split(separator: ".")
            guard parts.count == 3 else { return nil }
            var base64 = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while base64.count % 4 != 0 { base64 += "=" }
            guard let data = Data(base64Encoded: base64),
                let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
            else { return nil }
            return object["transactionId"] as? String
        }
    }

    /// The device's view for the report.
    func observations() -> (acknowledged: Set<String>, deliveredTo: [String: Set<String>], answers: [String: Int]) {
        (acknowledged, deliveredTo, deliveredAnswers)
    }
}

/// One run of the app; dead once it crashed (or the user killed it).
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

    /// A crash point: the process may die here.
    func maybeCrash() throws {
        try lock.withLock {
            guard !isDead else { throw SimulatedCrash() }
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
        guard (try? gate.maybeCrash()) != nil else { return }
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
        return order
    }

    func submitPurchase(accountId: String, orderId: String?, proof: Proof) async -> SubmissionVerdict {
        guard !gate.dead else { return .retryable(status: nil, code: "crashed", retryAfter: nil) }
        trace("\(accountId) submit")
        defer { trace("\(accountId) submit done") }
        if await device.submissionFails() { return .retryable(status: nil, code: "network", retryAfter: nil) }
        let (before, after) = await device.networkFails()
        if before { return .retryable(status: nil, code: "network", retryAfter: nil) }
        let verdict = await inner.submitPurchase(accountId: accountId, orderId: orderId, proof: proof)
        // The server answered: whatever happens on the device now, it has the verdict.
        await device.record(verdict, proof: proof)
        if after { return .retryable(status: nil, code: "network", retryAfter: nil) }
        if (try? gate.maybeCrash()) == nil {
            return .retryable(status: nil, code: "crashed", retryAfter: nil)
        }
        return verdict
    }

    func customerInfo(accountId: String) async throws -> CustomerInfo {
        guard !gate.dead else { throw SimulatedCrash() }
        return try await inner.customerInfo(accountId: accountId)
    }
}

/// The store file, with crashes before and after a write (never a torn file: that is the
/// file store's own guarantee, tested in the SDK).
struct GatedStore: PendingStore {
    let inner: FilePendingStore
    let device: SimulatedDevice
    let gate: Generation

    func load() throws -> PendingState { try inner.load() }

    func save(_ state: PendingState) throws {
        try gate.maybeCrash()
        try inner.save(state)
        try gate.maybeCrash()
    }
}

struct DeviceProofs: ProofSource {
    let device: SimulatedDevice
    func proof(for transaction: StoreTransaction) async throws -> Proof {
        try await device.proof(for: transaction)
    }
}
