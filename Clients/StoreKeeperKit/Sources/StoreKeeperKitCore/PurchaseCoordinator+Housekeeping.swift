import Foundation

/// Intents pruned, state written, the wake scheduled, background tasks tracked.
extension PurchaseCoordinator {

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
            if intent.state == .bound, !intent.boundByGuess, let id = intent.transactionId { return !held.contains(id) }
            // Ask to Buy may take days: kept a month for its token-bearing transaction — also a
            // `.created` one, whose payment may be an Ask to Buy the app never heard deferred,
            // and one bound by a guess, whose own payment may still come.
            if intent.state == .bound, let id = intent.transactionId, held.contains(id) { return false }
            let end =
                intent.state == .deferred || intent.state == .created || intent.boundByGuess
                ? max(intent.createdAt.addingTimeInterval(30 * 86_400), intentEnd(intent)) : intentEnd(intent)
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
