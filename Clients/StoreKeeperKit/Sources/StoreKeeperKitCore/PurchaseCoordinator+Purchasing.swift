import Foundation

/// Buying: the server order first, the intent written durably, the payment, its answer; restores.
extension PurchaseCoordinator {

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
}
