import Foundation

/// Launch, login, logout and the triggers that re-drive held submissions.
extension PurchaseCoordinator {

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
                // Cancelled: the lookup answered first and has resumed (a cancelled sleep throws;
                // swallowing it raced the answer and sent the order without the id).
                do { try await clock.sleep(for: 2) } catch { return }
                waiter.withValue { $0.take() }?.resume(returning: nil)
            }
            Task {
                let value = await lookup.value
                waiter.withValue { $0.take() }?.resume(returning: value)
                timer.cancel()
            }
        }
    }

    /// What a previous run left: `.paying` without anyone waiting is `.created` again (the
    /// payment may or may not have been added; a transaction carrying its token still binds);
    /// delays stored as absolute times are clamped to now + their stated length (a clock set
    /// back must not hold anything longer).
    ///
    /// A `.created` intent is never closed by time: its payment may be an Ask to Buy whose
    /// deferral the app never heard (a crash right after the sheet) and a parent approves days
    /// later, carrying the intent's token — it must still find its account (not whoever is
    /// logged in then), like a `.deferred` one. Its order's end only stops token-less
    /// transactions from being attributed to it (`attribute`), and `prune` keeps it as long as a
    /// deferred intent. (Closing it at launch once its order ended — or when the device's clock
    /// jumped a day ahead — gave such an approval to the next account that logged in.)
    func recheckAtLaunch() {
        let now = clock.now()
        for index in state.intents.indices where state.intents[index].launch != launch {
            if state.intents[index].state == .paying { state.intents[index].state = .created }
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
        expiryRepublish?.cancel()
        expiryRepublish = nil
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
        // The server's view, fresh: a subscriber on a new device, after a reinstall or a logout,
        // sees what they paid for without tapping Restore (a web purchase, a support grant, coins
        // spent elsewhere too). The cached view shows meanwhile; offline it stays.
        fetchAccountViewInBackground(force: true)
    }

    /// How old the account view may be before launch or a return to the foreground asks the
    /// server again.
    public static let accountViewMaxAge: TimeInterval = 300

    /// Asks the server for the logged-in account's view without waiting for it (published to
    /// the observers when it comes): at login always; at launch and foreground when the last
    /// ask is older than `accountViewMaxAge` (or the clock went back).
    func fetchAccountViewInBackground(force: Bool) {
        guard let account = accountId, started, !stopped else { return }
        let now = clock.now()
        if !force, let asked = accountViewAskedAt[account], asked <= now,
            now.timeIntervalSince(asked) < Self.accountViewMaxAge
        {
            return
        }
        accountViewAskedAt[account] = now
        Task { [weak self] in _ = try? await self?.customerInfo() }
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
            if let intentIndex { bind(intentIndex, to: state.pending[index].transaction, intentToken: nil) }
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
        scheduleExpiryRepublish()
        continuation.onTermination = { [weak self] _ in Task { await self?.removeViewObserver(id) } }
        return stream
    }

    var currentAccountView: AccountView {
        let info = cachedCustomerInfo()
        let now = entitlementNow()
        return AccountView(
            accountId: accountId, customerInfo: info,
            pendingPurchases: accountId.map { account in
                state.pending.filter { Self.same($0.accountId, account) && Self.isPayment($0) }.count
            } ?? 0,
            activeEntitlementIds: Set((info?.entitlements ?? []).filter { $0.isActive(at: now) }.map(\.id)).sorted())
    }

    /// A payment the customer is waiting for: not a restore's copy nor a refund's revocation
    /// (those are held and sent too, but nobody is waiting to be charged or delivered).
    static func isPayment(_ submission: PendingSubmission) -> Bool {
        submission.reason == .purchase && submission.transaction.revocationDate == nil
    }

    func removeViewObserver(_ id: UUID) { viewObservers[id] = nil }

    func publishAccountView() {
        guard !viewObservers.isEmpty else { return }
        let view = currentAccountView
        scheduleExpiryRepublish()
        guard view != lastPublishedView else { return }
        lastPublishedView = view
        for continuation in viewObservers.values { continuation.yield(view) }
    }

    /// At the earliest future `expiresAt` of an active entitlement (elapsed time on the
    /// coordinator's clock), the view is published again: the models re-render the moment
    /// access ends, not at the next unrelated change.
    func scheduleExpiryRepublish() {
        expiryRepublish?.cancel()
        expiryRepublish = nil
        let now = entitlementNow()
        guard !stopped,
            let next = cachedCustomerInfo()?.entitlements.compactMap({ $0.active ? $0.expiresAt : nil })
                .filter({ $0 > now }).min()
        else { return }
        let delay = min(next.timeIntervalSince(now) + 0.1, 30 * 86_400)
        let clock = self.clock
        expiryRepublish = Task { [weak self] in
            do { try await clock.sleep(for: delay) } catch { return }
            guard !Task.isCancelled else { return }
            await self?.publishAccountView()
        }
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
        if trigger == .launch || trigger == .foreground { fetchAccountViewInBackground(force: false) }
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
}
