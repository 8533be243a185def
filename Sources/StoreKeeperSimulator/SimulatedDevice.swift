import Foundation
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

let tracing = ProcessInfo.processInfo.environment["STOREKEEPER_SIMULATE_TRACE"] != nil
func trace(_ line: @autoclosure () -> String) {
    if tracing { FileHandle.standardError.write(Data("\(Date().timeIntervalSince1970) \(line())\n".utf8)) }
}

public actor SimulatedDevice {
    public enum StoreKitVersion: String, Sendable, Codable {
        case one = "1"
        case two = "2"
    }

    nonisolated public let appleId: String
    /// The device's first account (the one it launches with).
    nonisolated public let accountId: String
    /// Every app account used on this device (`--accounts-per-device`).
    nonisolated public let accounts: [String]
    nonisolated public let storeKit: StoreKitVersion
    let control: LocalStoreControl
    let server: URL
    let key: String
    /// The app's id on the server (`apps[].id`), sent with orders and purchases.
    let appId: String?
    /// The answer-signing keys the app was built with (none: answers are not checked).
    let responseSigningKeys: [ResponseSigningKey]
    /// Each launch's backend's count of refused answers.
    var signatureDiagnostics: [SignatureDiagnostics] = []
    /// Answers refused because their signature did not verify, over every launch.
    public var unverifiedAnswers: Int { signatureDiagnostics.reduce(0) { $0 + $1.unverifiedAnswers } }
    let storeURL: URL
    let retry: RetryPolicy
    var faults: DeviceFaults
    /// What the player does and what StoreKit does with each payment (taps, merges, Ask to Buy,
    /// callbacks): drawn only on each purchase's own path, in order, so a seed makes the same
    /// purchases and the same payments however the run is timed.
    var random: SeededRandom
    /// What the network and the process do (failures, proxies, stale receipts, callback delays):
    /// drawn as requests happen, so its sequence follows the run's timing; none of it decides
    /// whether a purchase is paid.
    var noise: SeededRandom
    /// From a tap until StoreKit charged (or refused): no unplanned fault strikes here, so what is
    /// paid depends on the seed alone (the planned death before paying is drawn with the tap).
    var beforePayment = false
    /// A double tap's second tap, due when the first one's payment sheet is up.
    var secondTap: (productId: String, quantity: Int)?

    // StoreKit's side (survives crashes).
    var unfinished: [StoreTransaction] = []
    /// Transactions finished on this device, oldest first (StoreKit 1 re-delivers one of them
    /// "restored for free"; StoreKit 2's replay floods them).
    var finishedHistory: [StoreTransaction] = []
    /// A year of history: transactions delivered before this run, replayed at each launch.
    var history: [StoreTransaction] = []
    /// The receipt the device last read (StoreKit 1 may hand it back stale).
    var cachedReceipt: String?
    /// Who paid each transaction: the account whose purchase call (or whose session, for one
    /// made outside the app) paid it — the ground truth for misattribution.
    var paidBy: [String: String] = [:]
    var askToBuyOwner: [String: String] = [:]
    public private(set) var currentAccount: String
    var callbacksOnTheWay = 0
    let clockOffset = Locked<TimeInterval>(0)
    var receiptProofs: Set<String> = []
    var askToBuy: [String] = []
    /// The catalog's consumables (a merged payment rides along with another one).
    var consumables: [String] = []
    var tokenOfOrder: [UUID: String] = [:]
    var continuation: AsyncStream<PaymentUpdate>.Continuation?

    // What the server answered, as the device saw it (the ground truth for "finished before ack").
    var acknowledged: Set<String> = []
    var deliveredTo: [String: Set<String>] = [:]
    var deliveredAnswers: [String: Int] = [:]

    // Counters for the report.
    public internal(set) var payments = 0
    public private(set) var purchasesStarted = 0
    public internal(set) var finishedBeforeAck = 0
    public private(set) var crashes = 0
    public internal(set) var doubleCharges = 0
    public private(set) var networkFailures = 0
    public private(set) var stuckPurchases = 0
    /// When the purchase call in progress began (the stuck watchdog counts from it).
    var purchaseCallStarted = ContinuousClock.now
    public internal(set) var middleboxErrors = 0
    public internal(set) var requests = 0

    var generation: Generation
    public private(set) var coordinator: PurchaseCoordinator?
    let tokens: ClientTokenProvider
    let transport: HTTPTransport
    let fsync: Bool

    /// `tokens` mints the client tokens the SDK sends (default: the secret key, which the
    /// server accepts for every call); `transport` carries them (default AsyncHTTPClient).
    /// How long a purchase call waits for StoreKit before answering `.pending`, and the bound
    /// past which a call that has not returned counts as stuck.
    let purchaseTimeout: TimeInterval
    /// A purchase call waits at most for the order (the HTTP timeout) and then for StoreKit
    /// (`purchaseTimeout`); past both, and a margin for a loaded machine, it is stuck.
    var stuckBound: TimeInterval { Self.requestTimeout + purchaseTimeout + 4 }
    static let requestTimeout: TimeInterval = 5

    public init(
        appleId: String, accountId: String, server: URL, key: String, directory: URL, seed: UInt64,
        faults: DeviceFaults, retry: RetryPolicy = RetryPolicy(base: 0.05, cap: 1),
        tokens: ClientTokenProvider? = nil, transport: HTTPTransport = AsyncHTTPTransport(), fsync: Bool = true,
        storeKit: StoreKitVersion = .two, otherAccounts: [String] = [], purchaseTimeout: TimeInterval = 30,
        appId: String? = nil, responseSigningKeys: [ResponseSigningKey] = []
    ) {
        self.appId = appId
        self.responseSigningKeys = responseSigningKeys
        self.fsync = fsync
        self.appleId = appleId
        self.accountId = accountId
        self.accounts = [accountId] + otherAccounts
        self.currentAccount = accountId
        self.storeKit = storeKit
        self.purchaseTimeout = purchaseTimeout
        self.server = server
        self.key = key
        self.tokens = tokens ?? { [key] _, _ in key }
        self.transport = transport
        self.control = LocalStoreControl(server: server, key: key)
        self.storeURL = directory.appendingPathComponent("\(appleId).journal")
        self.faults = faults
        self.retry = retry
        self.random = SeededRandom(seed: seed)
        self.noise = SeededRandom(seed: seed ^ 0x6E6F_6973_65)
        self.generation = Generation(number: 0)
    }

    // MARK: The app's lifecycle

    /// Launches the app: a coordinator from the store file, configured, the user logged in.
    public func launch() async throws {
        trace("\(appleId) launch")
        if generation.crashed { crashes += 1 }
        // `crash` is per purchase; a purchase passes about ten crash points.
        // How often the app relaunches follows the run's timing (crashes strike as requests
        // happen): its draws come from `noise`, never from the purchases' own stream.
        generation = Generation(number: generation.number + 1, seed: noise.next(), crashRate: faults.crash / 10)
        continuation?.finish()
        continuation = nil
        let gate = generation
        let offset = clockOffset
        let http = HTTPBackend(
            baseURL: server, appId: appId, timeout: Self.requestTimeout,
            transport: Middlebox(device: self, inner: transport), responseSigningKeys: responseSigningKeys,
            tokens: tokens)
        if let diagnostics = http.signatureDiagnostics { signatureDiagnostics.append(diagnostics) }
        let coordinator = PurchaseCoordinator(
            queue: GatedQueue(device: self, gate: gate),
            backend: GatedBackend(device: self, gate: gate, inner: http),
            store: GatedStore(inner: FilePendingStore(url: storeURL, synchronous: fsync), device: self, gate: gate),
            proofs: DeviceProofs(device: self), clock: DeviceClock(offset: offset),
            configuration: .init(
                retry: retry, purchaseTimeout: purchaseTimeout, maxRetryAfter: 5,
                logger: tracing ? TraceLogger(device: appleId) as StoreKeeperLogger : SilentLogger(),
                random: { Double.random(in: 0...1) }))
        self.coordinator = coordinator
        await coordinator.configure()
        guard !gate.dead else { return try await relaunch() }
        await coordinator.login(currentAccount)
        // A person takes longer than the launch sweep before switching accounts.
        let ready = Task { await coordinator.ready() }
        let watchdog = Task {
            try await Task.sleep(nanoseconds: 2_000_000_000)
            ready.cancel()
        }
        await ready.value
        watchdog.cancel()
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
        // The app died between purchases (a crash while it worked in the background): the user
        // opens it again before tapping.
        // Every choice of this purchase, drawn now and always the same number of draws.
        let jumps = random.chance(faults.clockJump)
        let jump = (random.unit() * 2 - 1) * 86_400
        let switches = random.chance(faults.switchAccount)
        let switchPick = random.below(max(1, accounts.count - 1))
        let tokenless = random.chance(faults.tokenless)
        let doubleTap = random.chance(faults.doubleTap)
        let diesBeforePaying = random.chance(faults.crash / 10)
        // From here to the charge no unplanned fault strikes; the window opens on a live app
        // (atomically: a crash on another task may have just killed it).
        while coordinator == nil || !generation.openPaymentWindow(dies: diesBeforePaying) { try await relaunch() }
        beforePayment = true
        let windowGate = generation
        defer {
            beforePayment = false
            windowGate.closePaymentWindow()
        }
        guard let coordinator else { return }
        if jumps { clockOffset.withValue { $0 += jump } }
        if accounts.count > 1, switches, await mayHandOver(coordinator) {
            // Another user of the device: log out, log in as them (purchases may be pending).
            let others = accounts.filter { $0 != currentAccount }
            currentAccount = others[switchPick % others.count]
            await coordinator.logout()
            await coordinator.login(currentAccount)
        }
        if tokenless { try await buyOutsideTheApp() }
        purchasesStarted += 1
        trace("\(appleId) buy \(purchasesStarted) \(productId) gen \(generation.number)")
        defer { trace("\(appleId) buy \(purchasesStarted) done") }
        let gate = generation
        let bound = Duration.milliseconds(Int64(stuckBound * 1000))
        purchaseCallStarted = .now
        let watchdog = Task {
            // The bound is a purchase call's (its order's request, then StoreKit's wait), counted
            // from the current call: each tap the player makes again after a refused order starts a
            // new one (on a loaded machine two slow orders in a row outlasted one call's bound).
            while true {
                let deadline = await self.purchaseCallStarted + bound
                guard ContinuousClock.now < deadline else { break }
                try await Task.sleep(until: deadline, clock: .continuous)
            }
            // The purchase call did not return within its bound: stuck. The user kills the app.
            await self.stuck()
            gate.dead = true
            await coordinator.shutdown()
        }
        // A double tap: the second tap lands while StoreKit shows the first one's payment sheet
        // (`purchase(productId:quantity:token:gate:)`), so the SDK must refuse it — never after
        // the first purchase ended, where it would be a new purchase the seed did not plan.
        secondTap = doubleTap ? (productId, quantity) : nil
        defer { secondTap = nil }
        let handedBefore = ordersHanded.count
        // The server could not make the order (busy, a timeout on a loaded machine): nothing was
        // charged, and the player taps again — so what is paid stays the seed's.
        for attempt in 1...8 {
            do {
                _ = try await coordinator.purchase(productId: productId, quantity: quantity)
            } catch PurchaseError.order(_) where attempt < 8 && !gate.dead {
                try? await Task.sleep(nanoseconds: UInt64(attempt) * 200_000_000)
                purchaseCallStarted = .now
                continue
            } catch {}
            break
        }
        watchdog.cancel()
        // The purchase call may give up waiting (`purchaseTimeout`) before its payment sheet
        // came up on a loaded machine; a person does not hand the device over or tap again while
        // the sheet is still to come. Bounded: the app may have died before showing it.
        let sheets = ordersHanded[handedBefore...]
        let sheetDeadline = Date().addingTimeInterval(Self.requestTimeout + purchaseTimeout)
        while !gate.dead, Date() < sheetDeadline, !sheets.allSatisfy(sheetsClosed.contains) {
            try await Task.sleep(nanoseconds: 5_000_000)
        }
        if gate.dead { try await relaunch() }
        await maybeApprove()
    }

    func stuck() {
        stuckPurchases += 1
        trace("\(appleId) STUCK purchase \(purchasesStarted) (no answer within \(stuckBound) s)")
    }

    /// Whether the user may hand the device over now: StoreKit owes the app no answer — every
    /// transaction it holds unfinished is one the app has taken in, and no callback is on its
    /// way. (A StoreKit 1 callback that comes after another user logged in, without its
    /// `applicationUsername`, is indistinguishable from that user's offer-code purchase: the
    /// SDK credits the logged-in user, as docs/ios-integration.md says. People do not switch
    /// accounts with a payment sheet unanswered.)
    func mayHandOver(_ coordinator: PurchaseCoordinator) async -> Bool {
        guard callbacksOnTheWay == 0 else { return false }
        let held = Set(await coordinator.pendingSubmissions.map(\.transaction.id))
        return unfinished.allSatisfy { held.contains($0.id) }
    }

    /// A purchase made outside the app (an offer code redeemed on the App Store): paid with no
    /// token, reported through the queue; the app's logged-in account is its owner. The device
    /// waits until the app has taken it in before anything else happens (a switch of accounts).
    func buyOutsideTheApp() async throws {
        guard let product = consumables.first else { return }
        let payment = try await control.pay(
            appleId: appleId, items: [(product, 1)], appAccountToken: nil, askToBuy: false)
        payments += 1
        trace("\(appleId) OUTSIDE \(product)")
        let transactions = map(payment, owner: currentAccount)
        for transaction in transactions { report(transaction) }
        guard let coordinator else { return }
        let ids = Set(transactions.map(\.id))
        let deadline = Date().addingTimeInterval(2)
        while Date() < deadline {
            let taken = await coordinator.pendingSubmissions.contains { ids.contains($0.transaction.id) }
            if taken || !unfinished.contains(where: { ids.contains($0.id) }) { break }
            try await Task.sleep(nanoseconds: 5_000_000)
        }
    }

    /// A parent approves one waiting Ask to Buy request, sometimes.
    func maybeApprove(all: Bool = false) async {
        while !askToBuy.isEmpty, all || random.chance(0.3) {
            let pendingId = askToBuy.removeFirst()
            guard let payment = try? await control.approve(pendingId) else { continue }
            payments += 1
            trace("\(appleId) APPROVED \(pendingId)")
            let transactions = map(payment, owner: askToBuyOwner[pendingId] ?? currentAccount)
            for transaction in transactions { report(transaction) }
            if !all { break }
        }
    }

    /// Settles: no more faults, every Ask to Buy approved, the app relaunched and re-driven
    /// until StoreKit holds nothing unfinished and the app holds nothing pending.
    public func settle(deadline: Date) async throws -> Bool {
        faults = .none
        clockOffset.withValue { $0 = 0 }
        await maybeApprove(all: true)
        try await adoptPaidButUnheard()
        try await relaunch()
        var quiet = 0
        while Date() < deadline {
            let held = await coordinator?.pendingSubmissions ?? []
            let idle = await coordinator?.isIdle ?? true
            // Settled once nothing is held, StoreKit holds nothing, and it stays so for a while:
            // updates the launch replays are still being taken in right after it.
            if held.isEmpty && unfinished.isEmpty && askToBuy.isEmpty && idle {
                quiet += 1
                if quiet >= 3 { return true }
                try await Task.sleep(nanoseconds: 100_000_000)
                continue
            }
            quiet = 0
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

    /// StoreKit's queue is the store's record: a payment the store took whose answer never
    /// reached this simulated StoreKit (the control call failed after the store recorded it: a
    /// deadline on a loaded machine) is still the device's unfinished transaction, as on a
    /// phone. Owned by the account its token names, else the one logged in.
    func adoptPaidButUnheard() async throws {
        let record = try await control.paid(appleId: appleId)
        for paid in record.transactions where !paid.revoked && paid.finished != true {
            guard paidBy[paid.transactionId] == nil else { continue }
            let token = paid.appAccountToken.flatMap(UUID.init(uuidString:))
            let transaction = StoreTransaction(
                id: paid.transactionId, originalId: paid.transactionId, productId: paid.productId,
                quantity: paid.quantity,
                appAccountToken: token,
                purchaseDate: Date(timeIntervalSince1970: Double(paid.purchaseDate ?? 0) / 1000),
                signedTransaction: nil)
            receiptProofs.insert(transaction.id)
            paidBy[transaction.id] = token.map(account(ofToken:)) ?? currentAccount
            if let token { tokenOfTransaction[transaction.id] = token }
            unfinished.append(transaction)
            trace("\(appleId) ADOPTED \(transaction.id) \(transaction.productId) (paid, never heard)")
        }
    }

    /// What the app still holds (reported as `held` when the run could not settle it).
    public var heldCount: Int {
        get async { await coordinator?.pendingSubmissions.count ?? 0 }
    }

    /// A year of history before the run: `count` purchases paid and delivered to the device's
    /// first account, then finished — what a `Transaction.updates` replay floods at launch.
    public func seedHistory(_ count: Int, productId: String) async throws {
        guard count > 0, storeKit == .two else { return }
        let items = [(productId: productId, quantity: 1)]
        for _ in 0..<count {
            let payment = try await control.pay(appleId: appleId, items: items, appAccountToken: nil, askToBuy: false)
            payments += 1
            let transactions = map(payment, owner: accountId)
            for transaction in transactions {
                guard let jws = transaction.signedTransaction else { continue }
                let verdict = await HTTPBackend(
                    baseURL: server, appId: appId, transport: transport, responseSigningKeys: responseSigningKeys,
                    tokens: tokens
                ).submitPurchase(
                    accountId: accountId, orderId: nil, proof: .signedTransaction(jws), transactionId: nil)
                record(verdict, proof: .signedTransaction(jws))
                guard case .accepted(let response) = verdict,
                    response.entry(for: transaction)?.outcome == "delivered"
                else {
                    throw LocalStoreControl.Failure(description: "history \(transaction.id): \(verdict)")
                }
                acknowledged.insert(transaction.id)
                unfinished.removeAll { $0.id == transaction.id }
                try await control.finish(transaction.id)
                history.append(transaction)
            }
        }
    }

    public func setFaults(_ faults: DeviceFaults) { self.faults = faults }

    /// Orders the app created, in order.
    public private(set) var orderIds: [String] = []
    func created(_ order: ServerOrder) {
        orderIds.append(order.orderId)
        orderAccounts[order.orderId] = order.accountId
        orderOfToken[order.appAccountToken] = order.orderId
    }
    var orderOfToken: [UUID: String] = [:]
    /// The account whose order carries `token` (the device's own orders), else the one logged in.
    func account(ofToken token: UUID) -> String {
        orderOfToken[token].flatMap { orderAccounts[$0] } ?? currentAccount
    }
    /// Orders the app received (their tokens, in order): each one's payment sheet comes up next.
    var ordersHanded: [UUID] = []
    func handedToApp(_ order: ServerOrder) { ordersHanded.append(order.appAccountToken) }
    /// Tokens whose StoreKit step (the payment sheet) has ended: paid, deferred or refused.
    var sheetsClosed: Set<UUID> = []
    /// The token each payment carried (StoreKit's record, whatever the callback said).
    var tokenOfTransaction: [String: UUID] = [:]

    /// The order a transaction's token names, if this device created it.
    public func order(paidBy transactionId: String) -> (orderId: String, accountId: String)? {
        guard let token = tokenOfTransaction[transactionId], let orderId = orderOfToken[token],
            let account = orderAccounts[orderId]
        else { return nil }
        return (orderId, account)
    }
    /// Whose each order is: a delivery that paid an order went to the order's account.
    var orderAccounts: [String: String] = [:]

    /// Puts a transaction in StoreKit's queue, unfinished, without telling the app (one paid
    /// and delivered elsewhere, its finish lost).
    public func adoptUnfinished(_ payment: LocalStoreControl.Payment) { _ = map(payment, owner: accountId) }

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

    // MARK: The network

    func submissionFails() -> Bool {
        guard !beforePayment, noise.chance(faults.submissionFailure) else { return false }
        networkFailures += 1
        return true
    }

    func networkFails() -> (before: Bool, after: Bool) {
        guard !beforePayment, noise.chance(faults.network) else { return (false, false) }
        networkFailures += 1
        return noise.chance(0.5) ? (true, false) : (false, true)
    }

    /// Records what the server answered: a final verdict acknowledges the transaction(s).
    func record(_ verdict: SubmissionVerdict, proof: Proof) {
        switch verdict {
        case .accepted(let response):
            let submitter = response.account?.accountId ?? accountId
            for transaction in response.transactions {
                acknowledged.insert(transaction.transactionId)
                if transaction.outcome == "delivered" || transaction.outcome == "already_delivered" {
                    // The recipient: the account of the order it paid (its token's), else the submitter.
                    let account = transaction.orderId.flatMap { orderAccounts[$0] } ?? submitter
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
        case .receipt, .signedTransactions: return nil
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
    func observations() -> (
        acknowledged: Set<String>, deliveredTo: [String: Set<String>], answers: [String: Int],
        paidBy: [String: String]
    ) {
        (acknowledged, deliveredTo, deliveredAnswers, paidBy)
    }
}

/// One run of the app; dead once it crashed (or the user killed it).
