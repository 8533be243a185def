import Foundation

/// What the payment queue reports on its own, and how each transaction is taken in and attributed.
extension PurchaseCoordinator {

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
        if let intentIndex { bind(intentIndex, to: transaction, intentToken: intentToken) }
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

    /// Binds an intent to the transaction that paid it; by a guess when the transaction came
    /// back without the intent's token (see `PurchaseIntent.boundByGuess`).
    func bind(_ index: Int, to transaction: StoreTransaction, intentToken: UUID?) {
        let byToken = (transaction.appAccountToken ?? intentToken) == state.intents[index].appAccountToken
        if !byToken && state.intents[index].transactionId != transaction.id { state.intents[index].boundByGuess = true }
        state.intents[index].state = .bound
        state.intents[index].transactionId = transaction.id
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
            // The intent's own payment after a token-less purchase was taken for it (an offer
            // code while this Ask to Buy waited): its account by the token, its order already
            // named by the other.
            if intent.boundByGuess, intent.transactionId != transaction.id { return (intent.accountId, nil, nil) }
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
}
