import Foundation

/// What `purchase` ended with.
public enum PurchaseOutcome: Sendable, Equatable {
    /// The server delivered it (or had already): the transaction is finished.
    case delivered(PurchaseResponse)
    /// Paid — StoreKit returned the transaction — and being delivered: the server has not given
    /// its verdict yet (offline, busy, Apple slow). The device holds it and delivers it by
    /// itself; the app says "Payment received — your purchase will appear shortly".
    case processing
    /// StoreKit has not answered within `purchaseTimeout` (a slow sheet, SCA or 3-D Secure in
    /// another app): nothing is known to be charged yet. If StoreKit later reports the payment
    /// it is delivered without the user doing anything; the app says "Waiting for the App Store
    /// — we'll add it as soon as it confirms".
    case waitingForStore
    /// Ask to Buy: a parent must approve; it is delivered when they do, even days later.
    case deferred
    case cancelled
    /// StoreKit failed the payment (nothing charged), with what it said, typed.
    case failed(StoreKitFailure)
    /// The server refused the proof for good (for example `owned_by_other_account`).
    case rejected(code: String, message: String)
    /// StoreKit answered this payment with a transaction paid earlier (StoreKit 1's "restored
    /// for free", an unfinished one resurfacing): nothing was charged for this order, which is
    /// closed; the old transaction is submitted on its own.
    case notCharged(transactionId: String)

    /// Either of the two "not finished yet" outcomes (`processing`, `waitingForStore`).
    public var isPending: Bool { self == .processing || self == .waitingForStore }
}

/// What StoreKit threw or failed a payment with, kept typed: `kind` for the app's decision,
/// `code` naming Apple's error (`StoreKitError.networkError`,
/// `Product.PurchaseError.invalidOfferSignature`, `SKError.paymentNotAllowed`…) as the adapter
/// mapped it case by case, `underlying` the error itself.
public struct StoreKitFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable {
        case userCancelled, network, paymentNotAllowed, productUnavailable, invalidOffer, ineligibleForOffer
        case notAvailableInStorefront, notEntitled, systemError, unknown
    }
    public var kind: Kind
    public var code: String
    public var message: String
    public let underlying: (any Error & Sendable)?

    /// An error StoreKit threw: mapped by the adapter (`StoreKitFailureConvertible`) when it
    /// knows the type; otherwise `kind` unknown and `code` the error's type and NSError code.
    public init(_ error: Error) {
        if let failure = error as? StoreKitFailure {
            self = failure
            return
        }
        if let convertible = error as? StoreKitFailureConvertible {
            self = convertible.storeKitFailure
            return
        }
        let bridged = error as NSError
        kind = .unknown
        code = "\(type(of: error))(\(bridged.code))"
        message = String(describing: error)
        underlying = error as? any Error & Sendable
    }

    public init(
        kind: Kind = .unknown, code: String, message: String, underlying: (any Error & Sendable)? = nil
    ) {
        self.kind = kind
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public static func == (lhs: StoreKitFailure, rhs: StoreKitFailure) -> Bool {
        lhs.kind == rhs.kind && lhs.code == rhs.code && lhs.message == rhs.message
    }
    public var description: String { message }
}

/// An error type an adapter maps to a `StoreKitFailure` case by case (StoreKit's own errors).
public protocol StoreKitFailureConvertible: Error {
    var storeKitFailure: StoreKitFailure { get }
}

public enum PurchaseError: Error, Equatable, Sendable {
    case notConfigured
    case notLoggedIn
    /// One purchase in flight per account: a second tap gets this, and no second payment.
    case alreadyInProgress
    /// The server order could not be created; nothing was charged.
    case order(BackendError)
    /// The intent could not be written durably (or the storage cannot be read yet: a Keychain
    /// before the first unlock); the payment was not added.
    case storage(String)
    /// StoreKit threw before any payment happened.
    case storeKit(StoreKitFailure)
    /// No promoted purchase with this id is waiting.
    case unknownPromotedPurchase
}

/// What `restore()` found: the account afterwards, and each restored transaction's outcome, so
/// the app can say "nothing to restore" or "owned by another account".
public struct RestoreResult: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        public var transactionId: String
        public var productId: String
        /// The server's outcome (`delivered`, `already_delivered`, `not_delivered`, `rejected`,
        /// …), or `held` when no verdict came yet (it is retried in the background).
        public var outcome: String
        public var code: String?
    }
    public var customerInfo: CustomerInfo?
    public var transactions: [Entry]

    public var nothingToRestore: Bool { transactions.isEmpty }
    public var ownedByOtherAccount: [Entry] { transactions.filter { $0.code == "owned_by_other_account" } }
    public var held: [Entry] { transactions.filter { $0.outcome == "held" } }
}

/// Where the app notes that it was installed: a file in its own container, which an uninstall
/// removes while the Keychain survives — so a reinstall is told apart from an update.
public protocol InstallationMarker: Sendable {
    func isMarked() -> Bool
    func mark()
}

public struct FileInstallationMarker: InstallationMarker {
    public let url: URL
    public init(url: URL) { self.url = url }
    public func isMarked() -> Bool { FileManager.default.fileExists(atPath: url.path) }
    public func mark() {
        try? FileManager.default.createDirectory(
            at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: url.path, contents: Data())
    }
}

/// The device half of "never lose a paid order": one purchase in flight per account, the
/// server order created first, the intent written durably before the payment is added, proof
/// submitted from a durable queue, and the StoreKit transaction finished only when the server's
/// answer names it with a final outcome — re-driven on launch, foreground, login and network
/// change, with backoff, in one drive loop in the background.
public actor PurchaseCoordinator {
    public struct Configuration: Sendable {
        public var retry: RetryPolicy
        /// How far apart the device's and Apple's clocks may be when matching dates.
        public var clockTolerance: TimeInterval
        /// How long an intent stays open when its order did not say (`expiresAt`).
        public var intentLifetime: TimeInterval
        /// Settled transaction ids kept to recognize StoreKit's re-deliveries.
        public var settledMemory: Int
        /// The longest a `purchase` call waits for StoreKit; then it returns `.waitingForStore` (a late
        /// callback is still delivered) and the account may buy again.
        public var purchaseTimeout: TimeInterval
        /// The longest a server's Retry-After holds an item.
        public var maxRetryAfter: TimeInterval
        /// JWS per batch submission (the server takes 1…100).
        public var batchSize: Int
        /// Triggers (foreground, network change) closer together than this re-drive without
        /// resetting backoff.
        public var triggerDebounce: TimeInterval
        /// Replayed history (`Transaction.updates` at launch, a restore's copies) is gathered
        /// this long after the first of a flood arrives, then sent in full batches — on the
        /// coordinator's clock, so how many requests a flood costs never depends on how fast
        /// the server answers. New purchases never wait for it.
        public var replayGathering: TimeInterval = 2
        /// Asked when a purchase started outside the app arrives (a promoted in-app purchase,
        /// a `PurchaseIntent`): true buys it now for the logged-in account; false (or no
        /// handler) keeps it in `promotedPurchases` until the app calls `purchase(_:)`.
        public var shouldStartPromotedPurchase: (@Sendable (PromotedPurchase) async -> Bool)?
        /// Tells a reinstall from an update, to clear cached account views.
        public var installation: InstallationMarker?
        public var logger: StoreKeeperLogger
        public var random: @Sendable () -> Double

        public init(
            retry: RetryPolicy = RetryPolicy(), clockTolerance: TimeInterval = 120,
            intentLifetime: TimeInterval = 86_400, settledMemory: Int = 2_000, purchaseTimeout: TimeInterval = 180,
            maxRetryAfter: TimeInterval = 3_600, batchSize: Int = 100, triggerDebounce: TimeInterval = 5,
            shouldStartPromotedPurchase: (@Sendable (PromotedPurchase) async -> Bool)? = nil,
            installation: InstallationMarker? = nil, logger: StoreKeeperLogger = PrintLogger(),
            random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) }
        ) {
            self.retry = retry
            self.clockTolerance = clockTolerance
            self.intentLifetime = intentLifetime
            self.settledMemory = settledMemory
            self.purchaseTimeout = purchaseTimeout
            self.maxRetryAfter = maxRetryAfter
            self.batchSize = max(1, min(batchSize, 100))
            self.triggerDebounce = triggerDebounce
            self.shouldStartPromotedPurchase = shouldStartPromotedPurchase
            self.installation = installation
            self.logger = logger
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
    /// This process's run: intents it marks `.paying` carry it; a later launch knows them.
    let launch = UUID().uuidString.lowercased()

    var state = PendingState()
    /// The records as last written (what the next write is computed against).
    var persisted: [String: PendingRecords.Record] = [:]
    var settledKeys: Set<String> = []
    /// The store was read; until then nothing is written and nothing is submitted or finished.
    var loaded = false
    var early: [PaymentUpdate] = []
    public private(set) var accountId: String?
    var started = false
    var stopped = false
    var purchasing: Set<String> = []
    var submitting: Set<String> = []
    var verdictWaiters: [String: [CheckedContinuation<SubmissionVerdict?, Never>]] = [:]
    /// `purchase` calls waiting for their outcome, by the intent's token.
    var purchaseWaiters: [UUID: CheckedContinuation<Result<PurchaseOutcome, PurchaseError>, Never>] = [:]
    var promoted: [PromotedPurchase] = []
    var promotedObservers: [UUID: AsyncStream<[PromotedPurchase]>.Continuation] = [:]
    /// Final verdicts of this run, for a purchase whose transaction another path submitted.
    var recentVerdicts: [String: SubmissionVerdict] = [:]
    var listener: Task<Void, Never>?
    var wake: Task<Void, Never>?
    var background: [UUID: Task<Void, Never>] = [:]
    var timeouts: [UUID: Task<Void, Never>] = [:]
    var infoObservers: [UUID: AsyncStream<CustomerInfo>.Continuation] = [:]
    var viewObservers: [UUID: AsyncStream<AccountView>.Continuation] = [:]
    var lastPublishedView: AccountView?
    var driving = false
    var driveRequested = false
    var lastBackoffReset: Date?
    var restoring: (account: String, task: Task<RestoreResult, Error>)?
    var appTransactionId: Task<String?, Never>?
    var loadRetry: Task<Void, Never>?
    var swept = false
    var deferredFinishes: [String] = []
    var unverifiedAnswers = 0
    /// Payments whose `purchase` call returned `.waitingForStore` at the timeout (StoreKit may still answer).
    var timedOut: Set<UUID> = []
    /// When the current replay flood's gathering window ends (`gatherReplay`).
    var replayWindowEnd: TimeInterval?
    /// Receipt refreshes this launch, by transaction (`receiptRefresh`).
    var refreshedReceipt: Set<String> = []
    var refreshedMissingReceipt: Set<String> = []
    /// Whether the app is in the foreground (assumed at launch until told otherwise).
    var isForeground = true
    /// When each held item is due, in the clock's elapsed time (`uptime`): backoff and a
    /// server's Retry-After. The wall-clock times in the records only carry them to the next
    /// launch, clamped to their stated length; while the app runs nothing the user does to the
    /// date moves them.
    var dueAt: [String: TimeInterval] = [:]
    var holdUntil: [String: TimeInterval] = [:]
    /// Payments StoreKit 1 took without answering yet (their outcome comes through the observer).
    var enqueued: Set<UUID> = []
    var readyWaiters: [CheckedContinuation<Void, Never>] = []
    let launchedAt: Date

    /// Makes the coordinator; it cannot fail. The durable state is read at `configure()` (a
    /// Keychain locked before the first unlock is read again later, nothing written meanwhile).
    public init(
        queue: PaymentQueue, backend: Backend, store: PendingStore, proofs: ProofSource = TransactionProofSource(),
        clock: Clock = SystemClock(), configuration: Configuration = Configuration(),
        appTransactions: AppTransactionSource? = nil
    ) {
        self.appTransactions = appTransactions
        self.queue = queue
        self.backend = backend
        self.store = store
        self.proofs = proofs
        self.clock = clock
        self.configuration = configuration
        self.launchedAt = clock.now()
    }

    func log(_ level: LogLevel, _ message: String) { configuration.logger.log(level, message) }

    // MARK: Lifecycle

    /// Call at launch, before login. Returns at once: it reads the durable state, listens to
    /// the payment queue, and in the background sweeps StoreKit's unfinished transactions and
    /// re-drives what the device holds. Transactions that arrive while nobody is logged in are
    /// held, unfinished, until someone is.
    public func configure() {
        guard !started, !stopped else { return }
        started = true
        let updates = queue.updates()
        listener = Task { [weak self] in
            for await update in updates {
                guard let self else { return }
                await self.handle(update)
            }
        }
        if let source = appTransactions {
            appTransactionId = Task { await source.appTransactionId() }
        }
        loadState()
    }

    /// Reads the store; on failure tries again in 5 s (and at every trigger).
    func loadState() {
        guard !loaded, !stopped else { return }
        let records: [String: Data]
        do {
            records = try store.load()
        } catch {
            log(.warning, "pending state unreadable now (\(error)); retrying, nothing written meanwhile")
            loadRetry?.cancel()
            let clock = self.clock
            loadRetry = Task { [weak self] in
                do { try await clock.sleep(for: 5) } catch { return }
                await self?.loadState()
            }
            return
        }
        loadRetry = nil
        let (decoded, migrated) = PendingRecords.decode(records)
        state = decoded
        if !state.unreadable.isEmpty {
            log(.error, "kept \(state.unreadable.count) unreadable record(s) aside: \(state.unreadable.prefix(5))")
        }
        persisted = PendingRecords.records(state)
        if migrated {
            persisted = [:]
        }
        settledKeys = Set(state.settled.map(\.key))
        loaded = true
        recheckAtLaunch()
        attributeHeld()
        // A launch re-drives everything held (a server's Retry-After still holds).
        let now = clock.now()
        lastBackoffReset = now
        clampDelays(now)
        for index in state.pending.indices where state.pending[index].nextAttemptAt > now {
            state.pending[index].nextAttemptAt = now
        }
        for key in dueAt.keys { dueAt[key] = clock.uptime() }
        if let installation = configuration.installation, !installation.isMarked() {
            // A reinstall (the Keychain outlived the app): cached account views are not the
            // new install's to show.
            state.customerInfo = [:]
            installation.mark()
        }
        persistOrLog()
        if migrated {
            do {
                try store.write([:], removing: [PendingRecords.legacyKey])
            } catch {
                log(.error, "could not remove the migrated document: \(error)")
            }
        }
        let buffered = early
        early = []
        spawn { coordinator in
            for transaction in await coordinator.queue.unfinished() {
                // A restore's copy left unfinished is a restore again, never a new purchase.
                let reason: PendingSubmission.Reason =
                    transaction.revocationDate != nil
                    ? .revocation : transaction.isRestored == true ? .restore : .purchase
                await coordinator.accept(transaction, reason: reason, replayed: reason == .restore)
            }
            for update in buffered { await coordinator.handle(update) }
            await coordinator.sweepDone()
            await coordinator.requestDrive()
        }
    }

    func sweepDone() {
        swept = true
        releaseReadyWaiters()
    }

    /// Returns once the durable state is read and StoreKit's unfinished transactions of the
    /// launch are taken in (each attributed to whoever was logged in then): an app that lets the
    /// user switch accounts right at launch waits for this first.
    /// Waits at most `timeout` seconds (a Keychain still locked keeps the state unread).
    public func ready(timeout: TimeInterval = 10) async {
        guard !swept, !stopped else { return }
        let clock = self.clock
        let deadline = Task { [weak self] in
            do { try await clock.sleep(for: timeout) } catch { return }
            await self?.releaseReadyWaiters()
        }
        await withCheckedContinuation { readyWaiters.append($0) }
        deadline.cancel()
    }

    func releaseReadyWaiters() {
        for waiter in readyWaiters { waiter.resume() }
        readyWaiters = []
    }

    /// The Apple Account id read at `configure()`, waited for at most 2 seconds: StoreKit's
    /// `AppTransaction` never holds up a tap (the order goes without it).
    func knownAppTransactionId() async -> String? {
        guard let lookup = appTransactionId else { return nil }
        let clock = self.clock
        let waiter = Locked<CheckedContinuation<String?, Never>?>(nil)
        return await withCheckedContinuation { continuation in
            waiter.withValue { $0 = continuation }
            let timer = Task {
                try? await clock.sleep(for: 2)
                waiter.withValue { $0.take() }?.resume(returning: nil)
            }
            Task {
                let value = await lookup.value
                timer.cancel()
                waiter.withValue { $0.take() }?.resume(returning: value)
            }
        }
    }

    /// What a previous run left: `.paying` without anyone waiting is `.created` again (the
    /// payment may or may not have been added; a transaction carrying its token still binds);
    /// open intents past their order's end close; delays stored as absolute times are clamped
    /// to now + their stated length (a clock set back must not hold anything longer).
    func recheckAtLaunch() {
        let now = clock.now()
        for index in state.intents.indices where state.intents[index].launch != launch {
            if state.intents[index].state == .paying { state.intents[index].state = .created }
        }
        for index in state.intents.indices where state.intents[index].isOpen && state.intents[index].state != .deferred
        {
            if intentEnd(state.intents[index]) < now { state.intents[index].state = .closed }
        }
        clampDelays(now)
        prune()
    }

    func clampDelays(_ now: Date) {
        let uptime = clock.uptime()
        for index in state.pending.indices {
            var item = state.pending[index]
            if dueAt[item.key] == nil {
                let backoff = item.backoff ?? configuration.retry.cap
                dueAt[item.key] = uptime + min(max(item.nextAttemptAt.timeIntervalSince(now), 0), backoff)
            }
            if holdUntil[item.key] == nil, let notBefore = item.notBefore {
                let limit = min(item.retryAfter ?? configuration.maxRetryAfter, configuration.maxRetryAfter)
                holdUntil[item.key] = uptime + min(max(notBefore.timeIntervalSince(now), 0), limit)
            }
            let backoff = item.backoff ?? configuration.retry.cap
            if item.nextAttemptAt > now.addingTimeInterval(backoff) {
                item.nextAttemptAt = now.addingTimeInterval(backoff)
            }
            if let notBefore = item.notBefore {
                let limit = now.addingTimeInterval(
                    min(item.retryAfter ?? configuration.maxRetryAfter, configuration.maxRetryAfter))
                if notBefore > limit { item.notBefore = limit }
            }
            if item != state.pending[index] { state.pending[index] = item }
        }
    }

    func intentEnd(_ intent: PurchaseIntent) -> Date {
        intent.expiresAt ?? intent.createdAt.addingTimeInterval(configuration.intentLifetime)
    }

    /// Stops listening and retrying (the app is going away; tests rebuild a coordinator).
    public func shutdown() {
        stopped = true
        listener?.cancel()
        wake?.cancel()
        loadRetry?.cancel()
        for task in background.values { task.cancel() }
        background = [:]
        for task in timeouts.values { task.cancel() }
        timeouts = [:]
        for continuation in infoObservers.values { continuation.finish() }
        infoObservers = [:]
        for continuation in viewObservers.values { continuation.finish() }
        viewObservers = [:]
        for continuation in promotedObservers.values { continuation.finish() }
        promotedObservers = [:]
        for (_, waiters) in verdictWaiters { for waiter in waiters { waiter.resume(returning: nil) } }
        verdictWaiters = [:]
        for waiter in purchaseWaiters.values { waiter.resume(returning: .success(.waitingForStore)) }
        purchaseWaiters = [:]
        releaseReadyWaiters()
        purchasing = []
    }

    /// A user logged in: transactions held for nobody are attributed now, promoted purchases
    /// waiting are offered, and their held submissions are re-driven in the background.
    public func login(_ accountId: String) {
        let switched = !Self.same(self.accountId, accountId)
        self.accountId = accountId
        if switched, let view = state.customerInfo[accountId] {
            // The new account's own last view, so nothing shows the previous account's.
            for continuation in infoObservers.values { continuation.yield(view) }
        }
        attributeHeld()
        publishAccountView()
        offerPromoted()
        redrive(.login)
    }

    /// Transactions held for nobody go to the logged-in account (at login, and when the state
    /// is read after a login made while it could not be: a Keychain still locked at launch).
    func attributeHeld() {
        guard loaded, accountId != nil else { return }
        var changed = false
        for index in state.pending.indices where state.pending[index].accountId == nil {
            // A restore's copy is the logged-in account's, never an open order's payment.
            let (account, orderId, intentIndex) =
                state.pending[index].reason == .restore
                ? (accountId, nil, nil) : attribute(state.pending[index].transaction, intentToken: nil)
            guard let account else { continue }
            log(.debug, "\(state.pending[index].transaction.id) attributed at login to \(account)")
            state.pending[index].accountId = account
            state.pending[index].orderId = orderId
            changed = true
            if let intentIndex {
                state.intents[intentIndex].state = .bound
                state.intents[intentIndex].transactionId = state.pending[index].transaction.id
            }
        }
        if changed { persistOrLog() }
    }

    /// The user logged out: nothing of theirs is dropped (it is submitted for them when the
    /// app can mint their token again); their cached account view is removed from the device.
    public func logout() {
        if let account = accountId, state.customerInfo[account] != nil {
            state.customerInfo[account] = nil
            persistOrLog()
        }
        accountId = nil
        publishAccountView()
    }

    /// Who is logged in and their last view, after every change (login, logout, a delivery, a
    /// refresh); the current one first. What the SwiftUI models follow.
    public func accountViews() -> AsyncStream<AccountView> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<AccountView>.makeStream(bufferingPolicy: .bufferingNewest(1))
        continuation.yield(currentAccountView)
        viewObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in Task { await self?.removeViewObserver(id) } }
        return stream
    }

    var currentAccountView: AccountView {
        AccountView(
            accountId: accountId, customerInfo: cachedCustomerInfo(),
            pendingPurchases: accountId.map { account in state.pending.filter { Self.same($0.accountId, account) }.count
            }
                ?? 0)
    }

    func removeViewObserver(_ id: UUID) { viewObservers[id] = nil }

    func publishAccountView() {
        guard !viewObservers.isEmpty else { return }
        let view = currentAccountView
        guard view != lastPublishedView else { return }
        lastPublishedView = view
        for continuation in viewObservers.values { continuation.yield(view) }
    }

    /// Launch, foreground, login and network change bring held submissions forward (a server's
    /// Retry-After still holds; triggers closer than `triggerDebounce` do not reset backoff).
    /// Returns at once; the drive runs in the background.
    public func redrive(_ trigger: Trigger) {
        guard started, !stopped else { return }
        if !loaded {
            loadState()
            return
        }
        let now = clock.now()
        clampDelays(now)
        let debounced =
            (trigger == .foreground || trigger == .networkChange)
            && lastBackoffReset.map { abs(now.timeIntervalSince($0)) < configuration.triggerDebounce } == true
        if !debounced {
            lastBackoffReset = now
            for index in state.pending.indices where state.pending[index].nextAttemptAt > now {
                state.pending[index].nextAttemptAt = now
            }
            let uptime = clock.uptime()
            for key in dueAt.keys { dueAt[key] = min(dueAt[key] ?? uptime, uptime) }
        }
        requestDrive()
    }

    // MARK: Purchasing

    /// Buys a product for the logged-in account: the server order first, the intent written
    /// durably, then the payment with the order's token. Returns within
    /// `configuration.purchaseTimeout` of the payment whatever StoreKit does.
    public func purchase(productId: String, quantity: Int = 1) async throws -> PurchaseOutcome {
        try await purchase(productId: productId, quantity: quantity, offerId: nil, options: PurchaseOptions())
    }

    /// Buys with a promotional offer: the server decides eligibility and signs it for this
    /// order (403 `offer_not_eligible` comes back as `PurchaseError.order`), StoreKit applies it.
    public func purchase(productId: String, offer offerId: String) async throws -> PurchaseOutcome {
        try await purchase(productId: productId, quantity: 1, offerId: offerId, options: PurchaseOptions())
    }

    /// Buys back a churned subscriber with a win-back offer listed in renewal info's
    /// `eligibleWinBackOfferIds` (Apple decides eligibility; nothing to sign). The order names
    /// it, so the server's catalog policy may refuse first (403 `offer_not_eligible` comes back
    /// as `PurchaseError.order`).
    public func purchase(productId: String, winBackOffer offerId: String) async throws -> PurchaseOutcome {
        try await purchase(
            productId: productId, quantity: 1, offerId: nil, options: PurchaseOptions(winBackOfferId: offerId))
    }

    /// Buys a purchase the customer started outside the app, now that the app agrees: with
    /// Apple's offer and quantity, under an order of the logged-in account.
    public func purchase(_ promotedPurchase: PromotedPurchase) async throws -> PurchaseOutcome {
        guard promoted.contains(where: { $0.id == promotedPurchase.id }) else {
            throw PurchaseError.unknownPromotedPurchase
        }
        // Apple's offer is told to the server with the order: its offer policy (eligibility,
        // `maxPerAccount`) decides as for an offer the app asked for; a promotional offer is
        // then paid with the server's signature.
        let offer = promotedPurchase.offerId
        let outcome = try await purchase(
            productId: promotedPurchase.productId, quantity: promotedPurchase.quantity,
            offerId: promotedPurchase.offerKind == .promotional ? offer : nil,
            options: PurchaseOptions(
                winBackOfferId: promotedPurchase.offerKind == .winBack ? offer : nil,
                promotedPurchaseId: promotedPurchase.id))
        removePromoted(promotedPurchase.id)
        return outcome
    }

    /// Purchases started outside the app, waiting for the app (the current list first).
    public func promotedPurchases() -> AsyncStream<[PromotedPurchase]> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<[PromotedPurchase]>.makeStream(bufferingPolicy: .bufferingNewest(1))
        continuation.yield(promoted)
        promotedObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in Task { await self?.removePromotedObserver(id) } }
        return stream
    }

    public var waitingPromotedPurchases: [PromotedPurchase] { promoted }

    /// The app declines a purchase started outside it: nothing is bought.
    public func decline(_ promotedPurchase: PromotedPurchase) { removePromoted(promotedPurchase.id) }

    func removePromotedObserver(_ id: UUID) { promotedObservers[id] = nil }

    func removePromoted(_ id: String) {
        promoted.removeAll { $0.id == id }
        for continuation in promotedObservers.values { continuation.yield(promoted) }
    }

    func offerPromoted() {
        guard accountId != nil, let handler = configuration.shouldStartPromotedPurchase else { return }
        for purchase in promoted {
            spawn { coordinator in
                guard await handler(purchase) else { return }
                do {
                    _ = try await coordinator.purchase(purchase)
                } catch {
                    await coordinator.log(.warning, "promoted purchase of \(purchase.productId) failed: \(error)")
                }
            }
        }
    }

    func purchase(productId: String, quantity: Int, offerId: String?, options baseOptions: PurchaseOptions)
        async throws -> PurchaseOutcome
    {
        guard started, !stopped else { throw PurchaseError.notConfigured }
        guard loaded else { throw PurchaseError.storage("the pending state cannot be read yet (device locked?)") }
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        guard !purchasing.contains(account) else { throw PurchaseError.alreadyInProgress }
        purchasing.insert(account)
        var released = false
        defer { if !released { purchasing.remove(account) } }

        let appTransactionId = await knownAppTransactionId()
        let order: ServerOrder
        do {
            order = try await backend.createOrder(
                accountId: account, productId: productId, quantity: quantity, offerId: offerId,
                winBackOfferId: baseOptions.winBackOfferId, appTransactionId: appTransactionId)
        } catch let error as BackendError {
            throw PurchaseError.order(error)
        } catch {
            throw PurchaseError.order(.network(String(describing: error)))
        }
        guard !stopped else { throw PurchaseError.notConfigured }
        let intent = PurchaseIntent(
            orderId: order.orderId, appAccountToken: order.appAccountToken, productId: productId, quantity: quantity,
            accountId: account, createdAt: clock.now(), state: .paying, expiresAt: order.expiresAt, launch: launch)
        state.intents.append(intent)
        do {
            try persist()
        } catch {
            state.intents.removeAll { $0.appAccountToken == intent.appAccountToken }
            cancelOrder(order)
            throw PurchaseError.storage(String(describing: error))
        }
        var paymentOptions = baseOptions
        // The server's intro decision rides on every subscription order when it makes one.
        paymentOptions.promotionalOffer = order.offer
        paymentOptions.introductoryOfferEligibilityJWS = order.introductoryOfferEligibility?.jws
        let options = paymentOptions

        let token = intent.appAccountToken
        let timeout = configuration.purchaseTimeout
        let clock = self.clock
        let result = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<PurchaseOutcome, PurchaseError>, Never>) in
            purchaseWaiters[token] = continuation
            spawn { coordinator in
                await coordinator.pay(intent: intent, order: order, options: options)
            }
            timeouts[token] = Task { [weak self] in
                do { try await clock.sleep(for: timeout) } catch { return }
                await self?.timedOut(token, productId: productId)
            }
        }
        released = true
        purchasing.remove(account)
        return try result.get()
    }

    func timedOut(_ token: UUID, productId: String) {
        guard purchaseWaiters[token] != nil else { return }
        timedOut.insert(token)
        log(
            .warning,
            "no answer from StoreKit for \(productId) within \(configuration.purchaseTimeout) s: waiting for the store")
        resolve(token, .success(.waitingForStore))
    }

    /// Ends the `purchase` call waiting on this intent, once.
    func resolve(_ token: UUID, _ result: Result<PurchaseOutcome, PurchaseError>) {
        enqueued.remove(token)
        timeouts.removeValue(forKey: token)?.cancel()
        purchaseWaiters.removeValue(forKey: token)?.resume(returning: result)
    }

    /// Nothing running in the background (the drive loop, sweeps, cancellations): for tests
    /// and the simulator, which wait for the coordinator to be still.
    public var isIdle: Bool { loaded && !driving && submitting.isEmpty && background.isEmpty }

    /// Adds the payment and sorts StoreKit's answer (the `purchase` call waits on `resolve`).
    func pay(intent: PurchaseIntent, order: ServerOrder, options: PurchaseOptions) async {
        let token = intent.appAccountToken
        let result: PaymentResult
        do {
            result = try await queue.purchase(
                productId: intent.productId, quantity: intent.quantity, appAccountToken: token, options: options)
        } catch {
            setIntent(token, .closed)
            persistOrLog()
            cancelOrder(order)
            log(.info, "StoreKit refused the payment for \(intent.productId): \(error)")
            resolve(token, .failure(.storeKit(StoreKitFailure(error))))
            return
        }
        // Shut down while StoreKit was busy: whatever it paid is swept at the next launch.
        guard !stopped else { return }
        switch result {
        case .purchased(let transaction):
            if let stale = staleAnswer(transaction, for: token) {
                // StoreKit handed back a transaction paid before (P11, "restored for free"):
                // nothing was charged for this order; the old one goes its own way.
                log(.info, "payment for \(intent.productId) answered with old transaction \(transaction.id): \(stale)")
                setIntent(token, .closed)
                persistOrLog()
                cancelOrder(order)
                resolve(token, .success(.notCharged(transactionId: transaction.id)))
                await accept(transaction, reason: .purchase)
                return
            }
            let verdict = await accept(transaction, reason: .purchase, intentToken: token)
            let outcome = await outcome(of: transaction, verdict: verdict)
            resolve(token, .success(outcome))
        case .deferred:
            setIntent(token, .deferred)
            persistOrLog()
            resolve(token, .success(.deferred))
        case .cancelled:
            setIntent(token, .closed)
            persistOrLog()
            cancelOrder(order)
            resolve(token, .success(.cancelled))
        case .failed(let failure):
            setIntent(token, .closed)
            persistOrLog()
            cancelOrder(order)
            resolve(token, .success(.failed(failure)))
        case .enqueued:
            // StoreKit 1: the observer answers (or the timeout does).
            enqueued.insert(token)
        }
    }

    /// Why `transaction`, given as the answer to the payment of intent `token`, is not that
    /// payment; nil when it is. An id already settled or held, another order's token, another
    /// product or quantity: StoreKit re-delivered an old transaction instead of charging.
    func staleAnswer(_ transaction: StoreTransaction, for token: UUID) -> String? {
        guard let intent = state.intents.first(where: { $0.appAccountToken == token }) else { return nil }
        // Bound to this intent (it carries this order's token, or `Transaction.updates` brought
        // it first and it was bound then): this payment's own transaction, never stale.
        if transaction.appAccountToken == token || intent.transactionId == transaction.id { return nil }
        if let other = transaction.appAccountToken, other != token { return "it carries another order's token" }
        if settledKeys.contains(transaction.id) { return "it was settled before" }
        if state.pending.contains(where: { $0.transaction.id == transaction.id }) { return "it is held already" }
        if state.intents.contains(where: { $0.transactionId == transaction.id && $0.appAccountToken != token }) {
            return "it paid another order"
        }
        if transaction.productId != intent.productId { return "it is for \(transaction.productId)" }
        if transaction.quantity != intent.quantity { return "its quantity is \(transaction.quantity)" }
        return nil
    }

    func cancelOrder(_ order: ServerOrder) {
        let backend = self.backend
        spawn { coordinator in
            do {
                try await backend.cancelOrder(accountId: order.accountId, orderId: order.orderId)
            } catch {
                await coordinator.log(.info, "order \(order.orderId) not cancelled: \(error)")
            }
        }
    }

    /// Asks StoreKit to restore, then the server to deliver what it restored to the logged-in
    /// account in one submission (the JWS list in batches of 100, or the receipt once). A
    /// second call while one runs joins it.
    public func restore() async throws -> RestoreResult {
        guard started, !stopped else { throw PurchaseError.notConfigured }
        guard loaded else { throw PurchaseError.storage("the pending state cannot be read yet (device locked?)") }
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        // A restore of the same account joins the running one; another account's waits for it
        // to end, then restores for itself (never takes the other's result).
        while let running = restoring {
            if running.account == account { return try await running.task.value }
            _ = try? await running.task.value
            if restoring?.task == running.task { restoring = nil }
        }
        guard accountId == account else { throw PurchaseError.notLoggedIn }
        let task = Task { try await self.performRestore(account) }
        restoring = (account, task)
        defer { if restoring?.task == task { restoring = nil } }
        return try await task.value
    }

    func performRestore(_ account: String) async throws -> RestoreResult {
        let transactions: [StoreTransaction]
        do {
            transactions = try await queue.restore()
        } catch {
            throw PurchaseError.storeKit(StoreKitFailure(error))
        }
        var keys: [String] = []
        for transaction in transactions {
            let key = PendingSubmission.key(transaction, .restore)
            if settledKeys.contains(key) {
                // Settled in this or an earlier run: ask again, it may be owned since.
                settledKeys.remove(key)
                state.settled.removeAll { $0.key == key }
            }
            if !state.pending.contains(where: { $0.key == key }) {
                state.pending.append(
                    PendingSubmission(
                        transaction: transaction, reason: .restore, accountId: account, orderId: nil,
                        nextAttemptAt: clock.now()))
            }
            keys.append(key)
        }
        persistOrLog()
        var entries: [String: RestoreResult.Entry] = [:]
        var info: CustomerInfo?
        let signed = keys.filter { key in state.pending.first { $0.key == key }?.transaction.signedTransaction != nil }
        var start = 0
        while start < signed.count {
            let chunk = Array(signed[start..<min(start + configuration.batchSize, signed.count)])
            start += chunk.count
            let (verdict, perKey) = await submitBatch(chunk, account: account)
            if case .accepted(let response) = verdict, let account = response.account { info = account }
            for (key, entry) in perKey { entries[key] = entry }
        }
        let unsigned = keys.filter { !signed.contains($0) }
        if !unsigned.isEmpty {
            let (verdict, perKey) = await submitReceipt(unsigned, account: account)
            if case .accepted(let response) = verdict, let account = response.account { info = account }
            for (key, entry) in perKey { entries[key] = entry }
        }
        if info == nil { info = try? await customerInfo() }
        requestDrive()
        let list = transactions.map { transaction -> RestoreResult.Entry in
            let key = PendingSubmission.key(transaction, .restore)
            return entries[key]
                ?? RestoreResult.Entry(
                    transactionId: transaction.id, productId: transaction.productId, outcome: "held", code: nil)
        }
        return RestoreResult(customerInfo: info, transactions: list)
    }

    /// What the app's developers want to see when purchases stay held: answers refused because
    /// their signature did not verify (a key rotation this build was not given, a proxy
    /// stripping `StoreKeeper-Signature`), and what the device holds.
    public struct Diagnostics: Sendable, Equatable {
        public var unverifiedAnswers: Int
        public var lastSignatureProblem: SignatureProblem?
        public var heldSubmissions: Int
        public var oldestHeldError: String?
    }

    public var diagnostics: Diagnostics {
        Diagnostics(
            unverifiedAnswers: unverifiedAnswers, lastSignatureProblem: backend.signatureDiagnostics?.lastProblem,
            heldSubmissions: state.pending.count, oldestHeldError: state.pending.first?.lastError)
    }

    /// Counts an answer refused for its signature; the first of a run is logged as an error.
    func noteUnverifiedAnswer() {
        unverifiedAnswers += 1
        if unverifiedAnswers == 1 {
            let problem = backend.signatureDiagnostics?.lastProblem.map { "\($0)" } ?? "signature did not verify"
            log(
                .error,
                "an answer from the server was refused: \(problem). Purchases stay held (never lost) until answers verify: give this build every key GET /v1/status lists in responseSigningKeys"
            )
        }
    }

    /// Submissions the device still holds (for the UI's "processing" badge, and tests).
    public var pendingSubmissions: [PendingSubmission] { state.pending }
    public var intents: [PurchaseIntent] { state.intents }
    public var isLoaded: Bool { loaded }

    // MARK: The account

    /// The server's view of the logged-in account, cached durably; offline, the last one seen.
    /// Records the logged-in customer's consent to share consumption data with Apple when they
    /// ask for a refund (Apple's Send Consumption Information is sent only with it). Ask in your
    /// own words, opt-in, and let them change it later; not the App Tracking Transparency prompt.
    public func setConsumptionDataConsent(_ granted: Bool) async throws {
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        try await backend.setConsumptionDataConsent(accountId: account, granted: granted)
    }

    public func customerInfo() async throws -> CustomerInfo {
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        do {
            let info = try await backend.customerInfo(accountId: account)
            remember(info)
            return info
        } catch {
            if case BackendError.unverifiedAnswer = error { noteUnverifiedAnswer() }
            if let cached = state.customerInfo[account] { return cached }
            throw error
        }
    }

    /// The last account view seen for the logged-in account, without asking the server.
    public func cachedCustomerInfo() -> CustomerInfo? {
        accountId.flatMap { state.customerInfo[$0] }
    }

    /// Whether the logged-in account has the entitlement now, by the last view seen (offline
    /// too): an entitlement past its `expiresAt` is not active, whatever the cache said.
    public func isEntitled(_ entitlement: String) -> Bool {
        cachedCustomerInfo()?.isActive(entitlement, at: clock.now()) ?? false
    }

    /// Every change of an account view the device sees (after a delivery, or a refresh); the
    /// logged-in account's current view first.
    public func customerInfoUpdates() -> AsyncStream<CustomerInfo> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<CustomerInfo>.makeStream(bufferingPolicy: .bufferingNewest(8))
        if let current = cachedCustomerInfo() { continuation.yield(current) }
        infoObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.removeObserver(id) }
        }
        return stream
    }

    func removeObserver(_ id: UUID) { infoObservers[id] = nil }

    func remember(_ info: CustomerInfo) {
        // Only the logged-in account's view is kept on the device, and only it is shown: an
        // answer about another account (a submission for someone who switched away) is neither.
        guard Self.same(info.accountId, accountId), state.customerInfo[info.accountId] != info else { return }
        state.customerInfo[info.accountId] = info
        persistOrLog()
        for continuation in infoObservers.values { continuation.yield(info) }
        publishAccountView()
    }

    /// Byte-wise equality, as the server compares ids.
    static func same(_ lhs: String?, _ rhs: String?) -> Bool {
        switch (lhs, rhs) {
        case (nil, nil): true
        case (let lhs?, let rhs?): lhs.utf8.elementsEqual(rhs.utf8)
        default: false
        }
    }

    // MARK: What the queue reports

    func handle(_ update: PaymentUpdate) async {
        guard !stopped else { return }
        guard loaded else {
            // Nothing is decided before the state is read; StoreKit keeps what is unfinished.
            early.append(update)
            return
        }
        switch update {
        case .transaction(let transaction):
            if transaction.revocationDate == nil, let token = staleCallbackWaiter(for: transaction) {
                // StoreKit 1 answered the payment in flight with an old transaction ("restored for
                // free", an unfinished one resurfacing): nothing was charged for it.
                log(.info, "callback for a payment in flight is old transaction \(transaction.id): not charged")
                if let intent = state.intents.first(where: { $0.appAccountToken == token }) {
                    setIntent(token, .closed)
                    persistOrLog()
                    cancelOrder(intentOrder(intent))
                }
                resolve(token, .success(.notCharged(transactionId: transaction.id)))
            }
            // Older than this launch and no order of ours: a `Transaction.updates` replay.
            let ours = transaction.appAccountToken.map { token in state.intents.contains { $0.appAccountToken == token }
            }
            let replayed = ours != true && transaction.purchaseDate < launchedAt.addingTimeInterval(-60)
            await accept(
                transaction, reason: transaction.revocationDate == nil ? .purchase : .revocation, replayed: replayed)
        case .restored(let transaction):
            // During `restore()` the restore submits them in one go.
            await accept(transaction, reason: .restore, replayed: true, submit: restoring == nil)
        case .deferred(let productId, let token):
            if let index = payingIntent(productId, token: token) {
                state.intents[index].state = .deferred
                persistOrLog()
                resolve(state.intents[index].appAccountToken, .success(.deferred))
            }
        case .failed(let productId, let transactionId, let cancelled, let token, let failure):
            if let index = payingIntent(productId, token: token) {
                let intent = state.intents[index]
                state.intents[index].state = .closed
                persistOrLog()
                cancelOrder(intentOrder(intent))
                resolve(
                    intent.appAccountToken,
                    .success(
                        cancelled
                            ? .cancelled
                            : .failed(failure ?? StoreKitFailure(code: "payment_failed", message: "payment failed"))))
            }
            // Nothing was charged: StoreKit 1 wants the failed transaction finished.
            if let transactionId { await queue.finish(transactionId: transactionId) }
        case .promoted(let purchase):
            promoted.removeAll { $0.id == purchase.id }
            promoted.append(purchase)
            for continuation in promotedObservers.values { continuation.yield(promoted) }
            offerPromoted()
        }
    }

    func intentOrder(_ intent: PurchaseIntent) -> ServerOrder {
        ServerOrder(
            orderId: intent.orderId, appAccountToken: intent.appAccountToken, accountId: intent.accountId,
            productId: intent.productId, quantity: intent.quantity)
    }

    /// The `purchase` call an old transaction arriving through the StoreKit 1 observer answers
    /// instead of a charge: the logged-in account's payment of the same product waiting for
    /// the observer, when the transaction comes without a token and was seen before (settled,
    /// held, or bound to another intent). A new transaction is never taken for a stale one.
    func staleCallbackWaiter(for transaction: StoreTransaction) -> UUID? {
        // Only a StoreKit 1 payment waits for the observer; only a callback without its
        // `applicationUsername` can be taken for another payment's answer.
        guard transaction.appAccountToken == nil, !enqueued.isEmpty else { return nil }
        let known =
            settledKeys.contains(transaction.id) || state.pending.contains { $0.transaction.id == transaction.id }
            || state.intents.contains { $0.transactionId == transaction.id }
        guard known else { return nil }
        return state.intents.filter {
            $0.state == .paying && $0.launch == launch && $0.accountId == accountId
                && $0.productId == transaction.productId && enqueued.contains($0.appAccountToken)
                && purchaseWaiters[$0.appAccountToken] != nil
        }.max { $0.createdAt < $1.createdAt }?.appAccountToken
    }

    /// The intent a StoreKit 1 callback without a token (deferred, failed) is about: the newest
    /// payment in flight of the logged-in account for that product, in this run of the app —
    /// never another account's, never one a killed process left behind.
    ///
    /// With the payment's token, exactly its intent. Without one, the only candidate: when a
    /// payment whose `purchase` call timed out is still open for the same product, a tokenless
    /// callback may be its late answer as well as the newer one's — it resolves neither (each
    /// payment's own callback, or its timeout, still ends it).
    func payingIntent(_ productId: String, token: UUID? = nil) -> Int? {
        if let token {
            return state.intents.firstIndex {
                $0.appAccountToken == token && ($0.state == .paying || $0.state == .deferred)
            }
        }
        let candidates = state.intents.indices.filter {
            let intent = state.intents[$0]
            return intent.productId == productId && intent.state == .paying && intent.launch == launch
                && Self.same(intent.accountId, accountId)
        }
        guard
            candidates.count == 1
                || !candidates.contains(where: { timedOut.contains(state.intents[$0].appAccountToken) })
        else { return nil }
        return candidates.max { state.intents[$0].createdAt < state.intents[$1].createdAt }
    }

    /// Takes a transaction in: deduplicated by id across the purchase result, `updates`, the
    /// unfinished sweep and restore; attributed; held durably; submitted (a replayed one is
    /// left to the drive loop, which batches).
    @discardableResult
    func accept(
        _ transaction: StoreTransaction, reason: PendingSubmission.Reason, intentToken: UUID? = nil,
        replayed: Bool = false, submit shouldSubmit: Bool = true
    ) async -> SubmissionVerdict? {
        guard !stopped else { return nil }
        guard loaded else {
            early.append(reason == .restore ? .restored(transaction) : .transaction(transaction))
            return nil
        }
        let key = PendingSubmission.key(transaction, reason)
        if settledKeys.contains(key) {
            // A final verdict is on record: StoreKit re-delivered it (a crash before finish, a
            // replay). Finished without asking the server again.
            await queue.finish(transactionId: transaction.id)
            return recentVerdicts[key]
        }
        if let index = state.pending.firstIndex(where: { $0.key == key }) {
            // The same transaction again: keep the better copy (a token, a JWS).
            var held = state.pending[index]
            if held.transaction.appAccountToken == nil {
                held.transaction.appAccountToken = transaction.appAccountToken
            }
            if held.transaction.signedTransaction == nil {
                held.transaction.signedTransaction = transaction.signedTransaction
            }
            if held != state.pending[index] {
                state.pending[index] = held
                persistOrLog()
            }
            if shouldSubmit { requestDrive() }
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
        log(
            .debug,
            "took in \(transaction.id) (\(transaction.productId), \(reason.rawValue)\(transaction.appAccountToken == nil ? ", no token" : "")) for \(account ?? "nobody yet"), order \(orderId ?? "none")"
        )
        state.pending.append(
            PendingSubmission(
                transaction: transaction, reason: reason, accountId: account, orderId: orderId,
                nextAttemptAt: clock.now(), replayed: replayed))

        if replayed { gatherReplay(key) }
        persistOrLog()
        guard shouldSubmit else { return nil }
        if replayed {
            scheduleWake()
            return nil
        }
        return await submit(key, userInitiated: intentToken != nil)
    }

    /// Who a transaction is for: the intent its token names; else the intent bound to its id;
    /// else (no token: StoreKit 1 dropped `applicationUsername`, an offer code, a purchase
    /// started outside the app) the newest open intent for the same product and quantity whose
    /// order was still open when it was paid — the logged-in account's only; else the
    /// logged-in account with no order, for the server to decide; nobody logged in: held,
    /// attributed at login. Heuristics never cross accounts.
    func attribute(_ transaction: StoreTransaction, intentToken: UUID?)
        -> (account: String?, orderId: String?, intent: Int?)
    {
        if let token = transaction.appAccountToken ?? intentToken,
            let index = state.intents.firstIndex(where: { $0.appAccountToken == token })
        {
            let intent = state.intents[index]
            // A merged payment's other product rides on this token: delivered by its token to
            // the account, never named as this order's payment.
            let sameProduct = intent.productId == transaction.productId
            return (intent.accountId, sameProduct ? intent.orderId : nil, sameProduct ? index : nil)
        }
        if let index = state.intents.firstIndex(where: { $0.transactionId == transaction.id }) {
            return (state.intents[index].accountId, state.intents[index].orderId, index)
        }
        // Only StoreKit 1 loses the token of a payment the app made: a StoreKit 2 transaction
        // (signed, its token inside) without one was bought outside the app (an offer code, a
        // replay of old history), never an intent's payment.
        guard transaction.appAccountToken == nil, transaction.signedTransaction == nil else {
            return (accountId, nil, nil)
        }
        let candidates = state.intents.indices.filter {
            let intent = state.intents[$0]
            return intent.isOpen && intent.productId == transaction.productId && intent.quantity == transaction.quantity
                && intent.createdAt <= transaction.purchaseDate.addingTimeInterval(configuration.clockTolerance)
                && intentEnd(intent).addingTimeInterval(configuration.clockTolerance) >= transaction.purchaseDate
        }
        // The logged-in account's own open purchases only: a purchase without token (an offer
        // code, a promoted purchase) while another account's intent is open is the logged-in
        // account's, never credited across accounts.
        if let current = accountId,
            let index = candidates.filter({ state.intents[$0].accountId == current }).max(by: {
                state.intents[$0].createdAt < state.intents[$1].createdAt
            })
        {
            return (current, state.intents[index].orderId, index)
        }
        return (accountId, nil, nil)
    }

    // MARK: Submitting

    /// Asks the one drive loop to run (again, if it is running).
    func requestDrive() {
        guard !stopped, loaded else { return }
        driveRequested = true
        guard !driving else { return }
        driving = true
        spawn { await $0.driveLoop() }
    }

    func driveLoop() async {
        while driveRequested, !stopped {
            driveRequested = false
            await driveOnce()
        }
        driving = false
        scheduleWake()
    }

    /// Submits every held transaction that is due: new purchases one at a time first, then
    /// replayed and restored JWS of one account in batches.
    func driveOnce() async {
        guard !stopped else { return }
        let now = clock.now()
        clampDelays(now)
        let uptime = clock.uptime()
        let due = state.pending.filter {
            $0.accountId != nil && isDue($0.key, uptime) && !submitting.contains($0.key)
        }
        let single = due.filter { !($0.replayed && $0.transaction.signedTransaction != nil) }
        for item in single.sorted(by: { !$0.replayed && $1.replayed }) {
            guard !stopped else { return }
            _ = await submit(item.key)
        }
        let batched = due.filter { $0.replayed && $0.transaction.signedTransaction != nil }
        let byAccount = Dictionary(grouping: batched, by: { $0.accountId ?? "" })
        for (account, items) in byAccount.sorted(by: { $0.key < $1.key }) {
            var start = 0
            while start < items.count, !stopped {
                let chunk = items[start..<min(start + configuration.batchSize, items.count)].map(\.key)
                start += chunk.count
                if chunk.count == 1 {
                    _ = await submit(chunk[0])
                } else {
                    _ = await submitBatch(chunk, account: account)
                }
            }
        }
    }

    /// A replayed transaction waits for the end of its flood's gathering window (opened by the
    /// first replay of the flood), so the flood goes out in full batches.
    func gatherReplay(_ key: String) {
        let uptime = clock.uptime()
        if replayWindowEnd.map({ $0 <= uptime }) ?? true {
            replayWindowEnd = uptime + configuration.replayGathering
        }
        dueAt[key] = max(dueAt[key] ?? 0, replayWindowEnd ?? uptime)
    }

    func isDue(_ key: String, _ uptime: TimeInterval) -> Bool {
        (dueAt[key] ?? 0) <= uptime && (holdUntil[key] ?? 0) <= uptime
    }

    /// One submission; the transaction is finished if and only if the verdict is final and
    /// (for a 200) the answer names it with a final outcome. Nil when it could not be
    /// submitted now (no account, already in flight, not yet due).
    @discardableResult
    func submit(_ key: String, userInitiated: Bool = false) async -> SubmissionVerdict? {
        guard !stopped, let item = state.pending.first(where: { $0.key == key }), let account = item.accountId,
            !submitting.contains(key)
        else { return nil }
        if let hold = holdUntil[key], hold > clock.uptime() {
            scheduleWake()
            return nil
        }
        submitting.insert(key)
        var verdict: SubmissionVerdict
        do {
            let proof = try await proofs.proof(
                for: item.transaction,
                receiptRefresh: receiptRefresh(
                    for: item.transaction.id, wanted: item.refreshProof, userInitiated: userInitiated))
            let reported: String? = if case .receipt = proof { item.transaction.id } else { nil }
            verdict = await backend.submitPurchase(
                accountId: account, orderId: item.orderId, proof: proof, transactionId: reported)
        } catch {
            verdict = .retryable(status: nil, code: "no_proof", retryAfter: nil)
        }
        submitting.remove(key)
        guard !stopped else { return nil }
        if case .accepted(let response) = verdict {
            if let entry = response.entry(for: item.transaction), entry.isFinal {
                verdict = .accepted(
                    PurchaseResponse(status: response.status, transactions: [entry], account: response.account))
            } else {
                // A 200 that does not name this transaction with a final outcome (a receipt read
                // before it held the purchase): not a verdict on it. Refresh and try again.
                log(
                    .warning,
                    "the answer for transaction \(item.transaction.id) does not name it: held, proof refreshed")
                if let info = response.account { remember(info) }
                verdict = .retryable(status: 200, code: "transaction_not_in_answer", retryAfter: nil)
            }
        }
        conclude(key, verdict: verdict, account: account)
        return verdict
    }

    /// A batch: one request for many JWS of one account; each entry settles on its own.
    @discardableResult
    func submitBatch(_ keys: [String], account: String) async -> (SubmissionVerdict, [String: RestoreResult.Entry]) {
        let items = keys.compactMap { key in state.pending.first { $0.key == key } }
            .filter { !submitting.contains($0.key) && $0.transaction.signedTransaction != nil }
        guard !items.isEmpty else { return (.cancelled, [:]) }
        for item in items { submitting.insert(item.key) }
        let verdict = await backend.submitPurchase(
            accountId: account, orderId: nil,
            proof: .signedTransactions(items.compactMap(\.transaction.signedTransaction)),
            transactionId: nil)
        for item in items { submitting.remove(item.key) }
        guard !stopped else { return (verdict, [:]) }
        return (verdict, settle(items, answer: verdict, account: account, refused: "batch_refused"))
    }

    /// One answer for many held transactions (a batch, a restore's receipt): each settles on its
    /// own entry, matched by transaction id (never by position), or is held; the verdicts are
    /// written in one go, then the settled ones finished.
    func settle(
        _ items: [PendingSubmission], answer verdict: SubmissionVerdict, account: String,
        refused: String
    ) -> [String: RestoreResult.Entry] {
        var entries: [String: RestoreResult.Entry] = [:]
        defer { flushDeferred() }
        guard case .accepted(let response) = verdict else {
            // Not answered as a whole: each held, as one attempt.
            let held = verdict.isFinal ? .retryable(status: nil, code: refused, retryAfter: nil) : verdict
            for item in items { conclude(item.key, verdict: held, account: account, persisting: false) }
            return entries
        }
        if let info = response.account { remember(info) }
        for item in items {
            // By id, never by position: an entry the answer does not name by this transaction's
            // id settles nothing (it stays held and is asked again).
            let entry = response.entry(for: item.transaction)
            if let entry {
                entries[item.key] = RestoreResult.Entry(
                    transactionId: item.transaction.id, productId: item.transaction.productId, outcome: entry.outcome,
                    code: entry.code)
            }
            let settled: SubmissionVerdict =
                if let entry, entry.isFinal {
                    .accepted(
                        PurchaseResponse(status: response.status, transactions: [entry], account: response.account))
                } else {
                    .retryable(status: 200, code: entry?.code ?? "transaction_not_in_answer", retryAfter: nil)
                }
            conclude(item.key, verdict: settled, account: account, persisting: false)
        }
        return entries
    }

    /// A StoreKit 1 restore: the receipt once, naming no transaction; each restored transaction
    /// the answer lists settles.
    func submitReceipt(_ keys: [String], account: String) async -> (SubmissionVerdict, [String: RestoreResult.Entry]) {
        let items = keys.compactMap { key in state.pending.first { $0.key == key } }.filter {
            !submitting.contains($0.key)
        }
        guard !items.isEmpty else { return (.cancelled, [:]) }
        let receipt: String?
        do {
            receipt = try await proofs.receipt(
                receiptRefresh: receiptRefresh(for: "restore", wanted: false, userInitiated: true))
        } catch {
            receipt = nil
        }
        guard let receipt else {
            // No receipt: each on its own (the drive loop's way).
            for item in items { await submit(item.key) }
            return (.retryable(status: nil, code: "no_receipt", retryAfter: nil), [:])
        }
        for item in items { submitting.insert(item.key) }
        let verdict = await backend.submitPurchase(
            accountId: account, orderId: nil, proof: .receipt(receipt), transactionId: nil)
        for item in items { submitting.remove(item.key) }
        guard !stopped else { return (verdict, [:]) }
        return (verdict, settle(items, answer: verdict, account: account, refused: "receipt_refused"))
    }

    /// Records a verdict: a final one settles (durably, then StoreKit finishes it); a cancelled
    /// request is no attempt; anything else holds the item with backoff.
    func conclude(_ key: String, verdict: SubmissionVerdict, account: String, persisting: Bool = true) {
        guard let item = state.pending.first(where: { $0.key == key }) else { return }
        let purchaseToken = item.transaction.appAccountToken ?? intentToken(for: item.transaction.id)
        if verdict.isFinal {
            recentVerdicts[key] = verdict
            if recentVerdicts.count > 64 { recentVerdicts.removeValue(forKey: recentVerdicts.keys.first!) }
            state.pending.removeAll { $0.key == key }
            dueAt[key] = nil
            holdUntil[key] = nil
            state.settled.append(
                SettledTransaction(key: key, accountId: account, verdict: Self.describe(verdict), at: clock.now()))
            settledKeys.insert(key)
            if state.settled.count > configuration.settledMemory {
                let dropped = state.settled.prefix(state.settled.count - configuration.settledMemory)
                for settled in dropped { settledKeys.remove(settled.key) }
                state.settled.removeFirst(dropped.count)
            }
            prune()
            let durable = persisting ? persistOrLog() : true
            if case .rejected(_, let code, _) = verdict {
                log(.warning, "transaction \(item.transaction.id) refused for good: \(code)")
            }
            if case .accepted(let response) = verdict, let info = response.account { remember(info) }
            if !persisting {
                deferredFinishes.append(item.transaction.id)
            } else if durable {
                // Durable verdict first, then finish: a crash in between re-delivers it, and the
                // settled record finishes it without asking the server again.
                let queue = self.queue
                let id = item.transaction.id
                spawn { _ in await queue.finish(transactionId: id) }
            }
        } else if verdict.wasCancelled {
            // Our own cancellation (shutdown, the app's task torn down), not an answer: no attempt
            // counted, no backoff; due again a second from now (never a hot loop).
            if let index = state.pending.firstIndex(where: { $0.key == key }) {
                state.pending[index].nextAttemptAt = max(
                    state.pending[index].nextAttemptAt, clock.now().addingTimeInterval(1))
            }
            dueAt[key] = max(dueAt[key] ?? 0, clock.uptime() + 1)
        } else if let index = state.pending.firstIndex(where: { $0.key == key }) {
            var held = state.pending[index]
            held.attempts += 1
            let after = clock.now()
            let backoff = configuration.retry.delay(afterAttempt: held.attempts, random: configuration.random())
            held.backoff = backoff
            held.nextAttemptAt = after.addingTimeInterval(backoff)
            let uptime = clock.uptime()
            dueAt[key] = uptime + backoff
            switch verdict {
            case .pending(let retryAfter), .retryable(_, _, let retryAfter):
                let capped = retryAfter.map { min(max($0, 0), configuration.maxRetryAfter) }
                held.retryAfter = capped
                held.notBefore = capped.map { after.addingTimeInterval($0) }
                holdUntil[key] = capped.map { uptime + $0 }
            default: break
            }
            if case .retryable(_, let code, _) = verdict,
                code == "transaction_not_in_proof" || code == "transaction_not_in_answer"
            {
                held.refreshProof = true
            } else {
                held.refreshProof = false
            }
            held.lastError = Self.describe(verdict)
            if case .retryable(_, "unsigned_answer", _) = verdict {
                noteUnverifiedAnswer()
                if let problem = backend.signatureDiagnostics?.lastProblem {
                    held.lastError = "unsigned_answer: \(problem)"
                }
            }
            if held.attempts == 10 || held.attempts % 50 == 0 {
                log(
                    .warning,
                    "transaction \(held.transaction.id) still held after \(held.attempts) attempts: \(held.lastError ?? "")"
                )
            }
            state.pending[index] = held
            if persisting { persistOrLog() }
        }
        for waiter in verdictWaiters.removeValue(forKey: key) ?? [] { waiter.resume(returning: verdict) }
        if verdict.isFinal, let token = purchaseToken, purchaseWaiters[token] != nil {
            resolve(token, .success(Self.outcome(verdict)))
        } else if !verdict.wasCancelled, let token = purchaseToken, enqueued.contains(token),
            purchaseWaiters[token] != nil
        {
            // StoreKit 1 reported the payment (it is paid) and the server has not given its
            // verdict yet: the waiting `purchase` call learns it is processing, not "no answer".
            resolve(token, .success(.processing))
        }
        scheduleWake()
    }

    /// What a StoreKit 1 proof may do to the app receipt now: a refresh (a possible sign-in
    /// sheet) at most once per launch and transaction (and once more if there is no receipt at
    /// all), and only in the foreground or in a purchase or restore the user started — never
    /// from the background retry loop.
    func receiptRefresh(for transactionId: String, wanted: Bool, userInitiated: Bool) -> ReceiptRefresh {
        guard isForeground || userInitiated else { return .never }
        if wanted, !refreshedReceipt.contains(transactionId) {
            refreshedReceipt.insert(transactionId)
            return .now
        }
        if !refreshedMissingReceipt.contains(transactionId) {
            refreshedMissingReceipt.insert(transactionId)
            return .ifMissing
        }
        return .never
    }

    /// The app went to the background or came back (the lifecycle triggers say so): receipt
    /// refreshes wait for the foreground.
    public func setForeground(_ foreground: Bool) {
        isForeground = foreground
        if foreground { redrive(.foreground) }
    }

    /// A batch's verdicts: written in one go, then finished.
    func flushDeferred() {
        let ids = deferredFinishes
        deferredFinishes = []
        guard persistOrLog() else { return }
        let queue = self.queue
        for id in ids { spawn { _ in await queue.finish(transactionId: id) } }
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
        guard submitting.contains(key), !stopped else { return .processing }
        let verdict = await withCheckedContinuation { (continuation: CheckedContinuation<SubmissionVerdict?, Never>) in
            if stopped {
                continuation.resume(returning: nil)
            } else {
                verdictWaiters[key, default: []].append(continuation)
            }
        }
        return verdict.map(Self.outcome) ?? .processing
    }

    static func outcome(_ verdict: SubmissionVerdict) -> PurchaseOutcome {
        switch verdict {
        case .accepted(let response): .delivered(response)
        case .rejected(_, let code, let message): .rejected(code: code, message: message)
        case .pending, .retryable: .processing
        }
    }

    static func describe(_ verdict: SubmissionVerdict) -> String {
        switch verdict {
        case .accepted(let response): response.transactions.first?.outcome ?? response.status
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

    /// Intents that can no longer matter: closed, or bound and settled, or long past their end.
    func prune() {
        let now = clock.now()
        let held = Set(state.pending.map(\.transaction.id))
        state.intents.removeAll { intent in
            if intent.state == .closed { return true }
            if intent.state == .bound, let id = intent.transactionId { return !held.contains(id) }
            // Ask to Buy may take days: kept a month for its token-bearing transaction.
            let end = intent.state == .deferred ? intent.createdAt.addingTimeInterval(30 * 86_400) : intentEnd(intent)
            return end.addingTimeInterval(86_400) < now && intent.state != .paying
        }
    }

    /// Writes what changed since the last write (one record per changed item).
    func persist() throws {
        guard !stopped, loaded else { return }
        prune()
        let current = PendingRecords.records(state)
        let (write, remove) = try PendingRecords.changes(from: persisted, to: current)
        guard !write.isEmpty || !remove.isEmpty else { return }
        try store.write(write, removing: remove)
        persisted = current
        publishAccountView()
    }

    @discardableResult
    func persistOrLog() -> Bool {
        do {
            try persist()
            return true
        } catch {
            log(.error, "pending state not written: \(error)")
            return false
        }
    }

    /// Wakes when the earliest held submission is due, after a monotonic sleep (a clock set
    /// back does not stretch it). Rescheduling cancels only the sleep: the drive a wake starts
    /// runs in a task of its own (a cancelled drive would cancel its own request).
    func scheduleWake() {
        wake?.cancel()
        wake = nil
        guard !stopped, loaded else { return }
        clampDelays(clock.now())
        let due = state.pending.filter { $0.accountId != nil && !submitting.contains($0.key) }
            .map { max(dueAt[$0.key] ?? 0, holdUntil[$0.key] ?? 0) }.min()
        guard let due else { return }
        let clock = self.clock
        let seconds = max(0, min(due - clock.uptime(), configuration.maxRetryAfter))
        wake = Task { [weak self] in
            do { try await clock.sleep(for: seconds) } catch { return }
            await self?.woke()
        }
    }

    /// The wake's sleep ended: drive in a task that rescheduling does not cancel.
    func woke() {
        wake = nil
        guard !stopped else { return }
        requestDrive()
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
