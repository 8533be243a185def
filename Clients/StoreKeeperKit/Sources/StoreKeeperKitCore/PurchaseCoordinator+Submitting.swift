import Foundation

/// The one drive loop: held transactions submitted (alone or in batches) and their verdicts recorded.
extension PurchaseCoordinator {

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
}
