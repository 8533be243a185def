import Foundation

/// What `purchase` ended with.
public enum PurchaseOutcome: Sendable, Equatable {
    /// The server delivered it (or had already): the transaction is finished.
    case delivered(PurchaseResponse)
    /// Paid, and the proof is kept on the device, unfinished, until the server gives a verdict
    /// (offline, server busy, Apple slow). Nothing for the user to do.
    case pending
    /// Ask to Buy: a parent must approve; it is delivered when they do, even days later.
    case deferred
    case cancelled
    case failed(String)
    /// The server refused the proof for good (for example `owned_by_other_account`).
    case rejected(code: String, message: String)
}

public enum PurchaseError: Error, Equatable, Sendable {
    case notConfigured
    case notLoggedIn
    /// One purchase in flight per account: a second tap gets this, and no second payment.
    case alreadyInProgress
    /// The server order could not be created; nothing was charged.
    case order(BackendError)
    /// The intent could not be written durably; the payment was not added.
    case storage(String)
    /// StoreKit threw before any payment happened.
    case storeKit(String)
}

/// The device half of "never lose a paid order": one purchase in flight per account, the
/// server order created first, the intent written durably before the payment is added, proof
/// submitted from a durable queue, and the StoreKit transaction finished only on a final
/// verdict — re-driven on launch, foreground, login and network change, with backoff.
public actor PurchaseCoordinator {
    public struct Configuration: Sendable {
        public var retry: RetryPolicy
        /// How far a token-less transaction's purchase date may precede its intent's creation
        /// (device and Apple clocks differ).
        public var clockTolerance: TimeInterval
        /// Open intents older than this no longer attract token-less transactions.
        public var intentLifetime: TimeInterval
        /// Settled transaction ids kept to recognize StoreKit's re-deliveries.
        public var settledMemory: Int
        public var random: @Sendable () -> Double

        public init(
            retry: RetryPolicy = RetryPolicy(), clockTolerance: TimeInterval = 120,
            intentLifetime: TimeInterval = 30 * 86_400, settledMemory: Int = 2_000,
            random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) }
        ) {
            self.retry = retry
            self.clockTolerance = clockTolerance
            self.intentLifetime = intentLifetime
            self.settledMemory = settledMemory
            self.random = random
        }
    }

    public enum Trigger: String, Sendable { case launch, foreground, login, networkChange }

    /// Where the device's Apple Account id comes from (StoreKit's AppTransaction), if anywhere.
    let appTransactions: AppTransactionSource?
    let queue: PaymentQueue
    let backend: Backend
    let store: PendingStore
    let proofs: ProofSource
    let clock: Clock
    let configuration: Configuration

    var state: PendingState
    public private(set) var accountId: String?
    var started = false
    var stopped = false
    var purchasing: Set<String> = []
    var submitting: Set<String> = []
    var verdictWaiters: [String: [CheckedContinuation<SubmissionVerdict?, Never>]] = [:]
    /// StoreKit 1 purchases waiting for their observer callback, by token.
    var purchaseWaiters: [UUID: CheckedContinuation<PurchaseOutcome, Never>] = [:]
    var promoted: [(productId: String, quantity: Int)] = []
    /// Final verdicts of this run, for a purchase whose transaction another path submitted.
    var recentVerdicts: [String: SubmissionVerdict] = [:]
    var listener: Task<Void, Never>?
    var wake: Task<Void, Never>?
    var background: [UUID: Task<Void, Never>] = [:]
    var infoObservers: [UUID: AsyncStream<CustomerInfo>.Continuation] = [:]

    /// Loads the durable state; `configure()` then starts everything.
    public init(
        queue: PaymentQueue, backend: Backend, store: PendingStore, proofs: ProofSource = TransactionProofSource(),
        clock: Clock = SystemClock(), configuration: Configuration = Configuration(),
        appTransactions: AppTransactionSource? = nil
    ) throws {
        self.appTransactions = appTransactions
        self.queue = queue
        self.backend = backend
        self.store = store
        self.proofs = proofs
        self.clock = clock
        self.configuration = configuration
        self.state = try store.load()
    }

    // MARK: Lifecycle

    /// Call at launch, before login: listens to the payment queue, sweeps StoreKit's
    /// unfinished transactions, and re-drives what the device still holds. Transactions that
    /// arrive while nobody is logged in are held, unfinished, until someone is.
    public func configure() async {
        guard !started, !stopped else { return }
        started = true
        let updates = queue.updates()
        listener = Task { [weak self] in
            for await update in updates {
                guard let self else { return }
                await self.handle(update)
            }
        }
        for transaction in await queue.unfinished() {
            await accept(transaction, reason: transaction.revocationDate == nil ? .purchase : .revocation)
        }
        await redrive(.launch)
    }

    /// Stops listening and retrying (the app is going away; tests rebuild a coordinator).
    public func shutdown() {
        stopped = true
        listener?.cancel()
        wake?.cancel()
        for task in background.values { task.cancel() }
        background = [:]
        for continuation in infoObservers.values { continuation.finish() }
        infoObservers = [:]
        for (_, waiters) in verdictWaiters { for waiter in waiters { waiter.resume(returning: nil) } }
        verdictWaiters = [:]
        for waiter in purchaseWaiters.values { waiter.resume(returning: .pending) }
        purchaseWaiters = [:]
    }

    /// A user logged in: held transactions are theirs to submit (unless an intent names
    /// another account — an owned purchase is never rebound), and waiting promoted purchases start.
    public func login(_ accountId: String) async {
        self.accountId = accountId
        for index in state.pending.indices where state.pending[index].accountId == nil {
            state.pending[index].accountId = accountId
        }
        try? persist()
        let waiting = promoted
        promoted = []
        for purchase in waiting {
            spawn { coordinator in
                _ = try? await coordinator.purchase(productId: purchase.productId, quantity: purchase.quantity)
            }
        }
        await redrive(.login)
    }

    /// The user logged out: nothing of theirs is dropped; it is submitted for them when the
    /// app can mint their token again.
    public func logout() {
        accountId = nil
    }

    /// Launch, foreground, login and network change bring every held submission forward (a
    /// server's Retry-After still holds).
    public func redrive(_ trigger: Trigger) async {
        let now = clock.now()
        for index in state.pending.indices { state.pending[index].nextAttemptAt = now }
        await drive()
    }

    // MARK: Purchasing

    /// Buys a product for the logged-in account: the server order first, the intent written
    /// durably, then the payment with the order's token.
    public func purchase(productId: String, quantity: Int = 1) async throws -> PurchaseOutcome {
        try await purchase(productId: productId, quantity: quantity, offerId: nil, winBackOfferId: nil)
    }

    /// Buys with a promotional offer: the server decides eligibility and signs it for this
    /// order (403 `offer_not_eligible` comes back as `PurchaseError.order`), StoreKit applies it.
    public func purchase(productId: String, offer offerId: String) async throws -> PurchaseOutcome {
        try await purchase(productId: productId, quantity: 1, offerId: offerId, winBackOfferId: nil)
    }

    /// Buys back a churned subscriber with a win-back offer listed in renewal info's
    /// `eligibleWinBackOfferIds` (Apple decides eligibility; nothing to sign).
    public func purchase(productId: String, winBackOffer offerId: String) async throws -> PurchaseOutcome {
        try await purchase(productId: productId, quantity: 1, offerId: nil, winBackOfferId: offerId)
    }

    func purchase(productId: String, quantity: Int, offerId: String?, winBackOfferId: String?) async throws
        -> PurchaseOutcome
    {
        guard started, !stopped else { throw PurchaseError.notConfigured }
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        guard !purchasing.contains(account) else { throw PurchaseError.alreadyInProgress }
        purchasing.insert(account)
        defer { purchasing.remove(account) }

        let order: ServerOrder
        do {
            order = try await backend.createOrder(
                accountId: account, productId: productId, quantity: quantity, offerId: offerId,
                appTransactionId: await appTransactions?.appTransactionId())
        } catch let error as BackendError {
            throw PurchaseError.order(error)
        } catch {
            throw PurchaseError.order(.network(String(describing: error)))
        }
        let intent = PurchaseIntent(
            orderId: order.orderId, appAccountToken: order.appAccountToken, productId: productId, quantity: quantity,
            accountId: account, createdAt: clock.now(), state: .created, transactionId: nil)
        state.intents.append(intent)
        do {
            try persist()
        } catch {
            state.intents.removeAll { $0.appAccountToken == intent.appAccountToken }
            throw PurchaseError.storage(String(describing: error))
        }
        setIntent(intent.appAccountToken, .paying)

        let result: PaymentResult
        do {
            // The server's intro decision rides on every subscription order when it makes one.
            let options = PurchaseOptions(
                promotionalOffer: order.offer, introductoryOfferEligibilityJWS: order.introductoryOfferEligibility?.jws,
                winBackOfferId: winBackOfferId)
            result = try await queue.purchase(
                productId: productId, quantity: quantity, appAccountToken: order.appAccountToken, options: options)
        } catch {
            setIntent(intent.appAccountToken, .closed)
            try? persist()
            throw PurchaseError.storeKit(String(describing: error))
        }
        // Shut down while StoreKit was busy: whatever it paid is swept at the next launch.
        guard !stopped else { return .pending }
        switch result {
        case .purchased(let transaction):
            let verdict = await accept(transaction, reason: .purchase, intentToken: intent.appAccountToken)
            return await outcome(of: transaction, verdict: verdict)
        case .deferred:
            setIntent(intent.appAccountToken, .deferred)
            try? persist()
            return .deferred
        case .cancelled:
            setIntent(intent.appAccountToken, .closed)
            try? persist()
            return .cancelled
        case .failed(let message):
            setIntent(intent.appAccountToken, .closed)
            try? persist()
            return .failed(message)
        case .enqueued:
            return await withCheckedContinuation { continuation in
                if stopped {
                    continuation.resume(returning: .pending)
                } else {
                    purchaseWaiters[intent.appAccountToken] = continuation
                }
            }
        }
    }

    /// Asks StoreKit to restore, and the server to deliver what it restores to the logged-in
    /// account (the server refuses what another account owns).
    public func restore() async throws {
        guard started, !stopped else { throw PurchaseError.notConfigured }
        guard accountId != nil else { throw PurchaseError.notLoggedIn }
        let transactions: [StoreTransaction]
        do {
            transactions = try await queue.restore()
        } catch {
            throw PurchaseError.storeKit(String(describing: error))
        }
        for transaction in transactions { await accept(transaction, reason: .restore) }
    }

    /// Submissions the device still holds (for the UI's "processing" badge, and tests).
    public var pendingSubmissions: [PendingSubmission] { state.pending }
    public var intents: [PurchaseIntent] { state.intents }

    // MARK: The account

    /// The server's view of the logged-in account, cached durably; offline, the last one seen.
    public func customerInfo() async throws -> CustomerInfo {
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        do {
            let info = try await backend.customerInfo(accountId: account)
            remember(info)
            return info
        } catch {
            if let cached = state.customerInfo[account] { return cached }
            throw error
        }
    }

    /// The last account view seen for the logged-in account, without asking the server.
    public func cachedCustomerInfo() -> CustomerInfo? {
        accountId.flatMap { state.customerInfo[$0] }
    }

    /// Every change of an account view the device sees (after a delivery, or a refresh).
    public func customerInfoUpdates() -> AsyncStream<CustomerInfo> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<CustomerInfo>.makeStream(bufferingPolicy: .bufferingNewest(8))
        infoObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.removeObserver(id) }
        }
        return stream
    }

    func removeObserver(_ id: UUID) { infoObservers[id] = nil }

    func remember(_ info: CustomerInfo) {
        guard state.customerInfo[info.accountId] != info else { return }
        state.customerInfo[info.accountId] = info
        try? persist()
        for continuation in infoObservers.values { continuation.yield(info) }
    }

    // MARK: What the queue reports

    func handle(_ update: PaymentUpdate) async {
        guard !stopped else { return }
        switch update {
        case .transaction(let transaction):
            await accept(transaction, reason: transaction.revocationDate == nil ? .purchase : .revocation)
        case .restored(let transaction):
            await accept(transaction, reason: .restore)
        case .deferred(let productId):
            if let index = payingIntent(productId) {
                state.intents[index].state = .deferred
                try? persist()
                purchaseWaiters.removeValue(forKey: state.intents[index].appAccountToken)?.resume(returning: .deferred)
            }
        case .failed(let productId, let transactionId, let cancelled):
            if let index = payingIntent(productId) {
                state.intents[index].state = .closed
                try? persist()
                purchaseWaiters.removeValue(forKey: state.intents[index].appAccountToken)?
                    .resume(returning: cancelled ? .cancelled : .failed("payment failed"))
            }
            // Nothing was charged: StoreKit 1 wants the failed transaction finished.
            if let transactionId { await queue.finish(transactionId: transactionId) }
        case .promoted(let productId, let quantity):
            if accountId == nil {
                promoted.append((productId, quantity))
            } else {
                spawn { coordinator in _ = try? await coordinator.purchase(productId: productId, quantity: quantity) }
            }
        }
    }

    /// The intent a StoreKit 1 callback without a transaction (deferred, failed) is about.
    func payingIntent(_ productId: String) -> Int? {
        let candidates = state.intents.indices.filter {
            state.intents[$0].productId == productId
                && (state.intents[$0].state == .paying || state.intents[$0].state == .created)
        }
        return candidates.first { state.intents[$0].accountId == accountId } ?? candidates.first
    }

    /// Takes a transaction in: deduplicated by id across the purchase result, `updates`, the
    /// unfinished sweep and restore; attributed; held durably; submitted.
    @discardableResult
    func accept(_ transaction: StoreTransaction, reason: PendingSubmission.Reason, intentToken: UUID? = nil) async
        -> SubmissionVerdict?
    {
        guard !stopped else { return nil }
        let key = PendingSubmission.key(transaction, reason)
        if state.settled.contains(where: { $0.key == key }) {
            // A final verdict is on record: StoreKit re-delivered it (a crash before finish).
            await queue.finish(transactionId: transaction.id)
            return recentVerdicts[key]
        }
        if let index = state.pending.firstIndex(where: { $0.key == key }) {
            // The same transaction again: keep the better copy (a token, a JWS).
            var held = state.pending[index].transaction
            if held.appAccountToken == nil { held.appAccountToken = transaction.appAccountToken }
            if held.signedTransaction == nil { held.signedTransaction = transaction.signedTransaction }
            state.pending[index].transaction = held
            try? persist()
            await drive()
            return nil
        }
        var (account, orderId, intentIndex) = attribute(transaction, intentToken: intentToken)
        if reason == .restore {
            account = accountId
            orderId = nil
            intentIndex = nil
        } else if reason == .revocation,
            let owner = state.settled.first(where: { $0.key == transaction.id })?.accountId
        {
            account = owner
        }
        if let intentIndex {
            state.intents[intentIndex].state = .bound
            state.intents[intentIndex].transactionId = transaction.id
        }
        state.pending.append(
            PendingSubmission(
                transaction: transaction, reason: reason, accountId: account, orderId: orderId, attempts: 0,
                nextAttemptAt: clock.now(), notBefore: nil, lastError: nil))
        try? persist()
        return await submit(key)
    }

    /// Who a transaction is for: the intent its token names; else the intent bound to its id;
    /// else the one open intent for its product created before it was paid (the logged-in
    /// account's first, then the oldest); else the logged-in account with no order, for the
    /// server to decide — or nobody yet (held until login).
    func attribute(_ transaction: StoreTransaction, intentToken: UUID?)
        -> (account: String?, orderId: String?, intent: Int?)
    {
        if let token = transaction.appAccountToken ?? intentToken,
            let index = state.intents.firstIndex(where: { $0.appAccountToken == token })
        {
            return (state.intents[index].accountId, state.intents[index].orderId, index)
        }
        if let index = state.intents.firstIndex(where: { $0.transactionId == transaction.id }) {
            return (state.intents[index].accountId, state.intents[index].orderId, index)
        }
        if transaction.appAccountToken == nil {
            let earliest = transaction.purchaseDate.addingTimeInterval(-configuration.intentLifetime)
            let latest = transaction.purchaseDate.addingTimeInterval(configuration.clockTolerance)
            let candidates = state.intents.indices.filter {
                let intent = state.intents[$0]
                return intent.isOpen && intent.productId == transaction.productId && intent.createdAt <= latest
                    && intent.createdAt >= earliest
            }.sorted { state.intents[$0].createdAt < state.intents[$1].createdAt }
            if let index = candidates.first(where: { state.intents[$0].accountId == accountId }) ?? candidates.first {
                return (state.intents[index].accountId, state.intents[index].orderId, index)
            }
        }
        return (accountId, nil, nil)
    }

    // MARK: Submitting

    /// Submits every held transaction that is due, one at a time.
    func drive() async {
        guard !stopped else { return }
        let now = clock.now()
        let due = state.pending.filter {
            $0.accountId != nil && $0.nextAttemptAt <= now && ($0.notBefore ?? now) <= now
                && !submitting.contains($0.key)
        }.map(\.key)
        for key in due {
            guard !stopped else { return }
            _ = await submit(key)
        }
        scheduleWake()
    }

    /// One submission; the transaction is finished if and only if the verdict is final.
    /// Returns nil when it could not be submitted now (no account, already in flight).
    @discardableResult
    func submit(_ key: String) async -> SubmissionVerdict? {
        guard !stopped, let item = state.pending.first(where: { $0.key == key }), let account = item.accountId,
            !submitting.contains(key)
        else { return nil }
        let now = clock.now()
        if let notBefore = item.notBefore, notBefore > now {
            scheduleWake()
            return nil
        }
        submitting.insert(key)
        let purchaseToken = item.transaction.appAccountToken ?? intentToken(for: item.transaction.id)
        let verdict: SubmissionVerdict
        do {
            let proof = try await proofs.proof(for: item.transaction)
            verdict = await backend.submitPurchase(accountId: account, orderId: item.orderId, proof: proof)
        } catch {
            verdict = .retryable(status: nil, code: "no_proof", retryAfter: nil)
        }
        submitting.remove(key)
        guard !stopped else { return nil }
        if verdict.isFinal {
            recentVerdicts[key] = verdict
            if recentVerdicts.count > 64 { recentVerdicts.removeValue(forKey: recentVerdicts.keys.first!) }
        }
        if verdict.isFinal {
            state.pending.removeAll { $0.key == key }
            state.settled.append(
                SettledTransaction(key: key, accountId: account, verdict: Self.describe(verdict), at: clock.now()))
            if state.settled.count > configuration.settledMemory {
                state.settled.removeFirst(state.settled.count - configuration.settledMemory)
            }
            prune()
            try? persist()
            // Durable verdict first, then finish: a crash in between re-delivers it, and the
            // settled record finishes it without asking the server again.
            await queue.finish(transactionId: item.transaction.id)
            if case .accepted(let response) = verdict, let info = response.account { remember(info) }
        } else if verdict.wasCancelled {
            // Our own cancellation (shutdown, the app's task torn down), not an answer: no attempt
            // counted, no backoff; due again a second from now (never a hot loop).
            if let index = state.pending.firstIndex(where: { $0.key == key }) {
                state.pending[index].nextAttemptAt = max(
                    state.pending[index].nextAttemptAt, clock.now().addingTimeInterval(1))
            }
            scheduleWake()
        } else if let index = state.pending.firstIndex(where: { $0.key == key }) {
            var held = state.pending[index]
            held.attempts += 1
            let after = clock.now()
            held.nextAttemptAt = after.addingTimeInterval(
                configuration.retry.delay(afterAttempt: held.attempts, random: configuration.random()))
            switch verdict {
            case .pending(let retryAfter), .retryable(_, _, let retryAfter):
                held.notBefore = retryAfter.map { after.addingTimeInterval(min($0, 3_600)) }
            default: break
            }
            held.lastError = Self.describe(verdict)
            state.pending[index] = held
            try? persist()
            scheduleWake()
        }
        for waiter in verdictWaiters.removeValue(forKey: key) ?? [] { waiter.resume(returning: verdict) }
        if let token = purchaseToken, let waiter = purchaseWaiters.removeValue(forKey: token) {
            waiter.resume(returning: Self.outcome(verdict))
        }
        return verdict
    }

    func intentToken(for transactionId: String) -> UUID? {
        state.intents.first { $0.transactionId == transactionId }?.appAccountToken
    }

    /// What `purchase` reports for a transaction it just handed in: its submission's verdict,
    /// or — when another path (an `updates` copy) is submitting it right now — that one's.
    func outcome(of transaction: StoreTransaction, verdict: SubmissionVerdict?) async -> PurchaseOutcome {
        if let verdict { return Self.outcome(verdict) }
        let key = PendingSubmission.key(transaction, .purchase)
        if let known = recentVerdicts[key] { return Self.outcome(known) }
        guard submitting.contains(key), !stopped else { return .pending }
        let verdict = await withCheckedContinuation { (continuation: CheckedContinuation<SubmissionVerdict?, Never>) in
            if stopped {
                continuation.resume(returning: nil)
            } else {
                verdictWaiters[key, default: []].append(continuation)
            }
        }
        return verdict.map(Self.outcome) ?? .pending
    }

    static func outcome(_ verdict: SubmissionVerdict) -> PurchaseOutcome {
        switch verdict {
        case .accepted(let response): .delivered(response)
        case .rejected(_, let code, let message): .rejected(code: code, message: message)
        case .pending, .retryable: .pending
        }
    }

    static func describe(_ verdict: SubmissionVerdict) -> String {
        switch verdict {
        case .accepted(let response): response.status
        case .rejected(let status, let code, _): "rejected:\(code.isEmpty ? "http_\(status)" : code)"
        case .pending: "pending"
        case .retryable(let status, let code, _): "retryable:\(code ?? status.map(String.init) ?? "network")"
        }
    }

    // MARK: Housekeeping

    func setIntent(_ token: UUID, _ newState: PurchaseIntent.State) {
        if let index = state.intents.firstIndex(where: { $0.appAccountToken == token }) {
            state.intents[index].state = newState
        }
    }

    /// Intents that can no longer matter: closed, or bound and settled, or past their lifetime.
    func prune() {
        let cutoff = clock.now().addingTimeInterval(-configuration.intentLifetime)
        let held = Set(state.pending.map(\.transaction.id))
        state.intents.removeAll { intent in
            if intent.createdAt < cutoff { return true }
            if intent.state == .closed { return true }
            if intent.state == .bound, let id = intent.transactionId { return !held.contains(id) }
            return false
        }
    }

    func persist() throws {
        guard !stopped else { return }
        try store.save(state)
    }

    /// Wakes when the earliest held submission is due. Rescheduling cancels only the sleep: the
    /// drive a wake starts runs in a task of its own, which no later rescheduling reaches — a
    /// cancelled drive would cancel its own request (URLSession honours cancellation), so one
    /// transaction the server keeps answering 202 would starve every other held one.
    func scheduleWake() {
        wake?.cancel()
        wake = nil
        guard !stopped else { return }
        let due = state.pending.filter { $0.accountId != nil && !submitting.contains($0.key) }
            .map { max($0.nextAttemptAt, $0.notBefore ?? $0.nextAttemptAt) }.min()
        guard let due else { return }
        let clock = self.clock
        wake = Task { [weak self] in
            do { try await clock.sleep(until: due) } catch { return }
            await self?.woke()
        }
    }

    /// The wake's sleep ended: drive in a task that rescheduling does not cancel.
    func woke() {
        wake = nil
        guard !stopped else { return }
        spawn { await $0.drive() }
    }

    func spawn(_ work: @escaping @Sendable (PurchaseCoordinator) async -> Void) {
        let id = UUID()
        background[id] = Task { [weak self] in
            guard let self else { return }
            await work(self)
            await self.finished(id)
        }
    }

    func finished(_ id: UUID) { background[id] = nil }
}
