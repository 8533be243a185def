import Foundation

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
    public internal(set) var accountId: String?
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
    /// Republishes the account view when its earliest active entitlement expires.
    var expiryRepublish: Task<Void, Never>?
    /// The server's time at its last fresh answer and this device's elapsed time then: what
    /// "now" is for entitlements (server time plus monotonic time since), whatever the device's
    /// wall clock says. Nil until the server answered in this run.
    var timeAnchor: (server: Date, uptime: TimeInterval)?
    /// When each account's view was last asked of the server (this run; on the coordinator's
    /// clock): launch and foreground ask again once it is older than `accountViewMaxAge`.
    var accountViewAskedAt: [String: Date] = [:]
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
}
