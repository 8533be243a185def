import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport
import Synchronization

/// Group commit for deliveries: concurrent submissions that arrive while a commit is in
/// flight are planned and applied together in the next database transaction and made durable
/// by one commit (one fsync) instead of one each. Nobody is answered before that commit, so
/// durable-before-acknowledged holds (invariant 4); if anything in a batch fails, the batch
/// rolls back whole and each item is delivered on its own.
final class DeliveryBatcher: Sendable {
    struct Request: Sendable {
        var transaction: StoreTransaction
        var submittingAccount: String?
        var requestedOrderId: String?
        var catalog: Catalog
        var policy: OwnershipPolicy
        var evidence: DeliveryPlanner.Evidence
        var now: Date
        var event: SubscriptionEvent?
        var sideWrites: (any StoreSideWrites)?
        var continuation: CheckedContinuation<PurchaseStore.DeliveryResult, any Error>
        var enqueued = ContinuousClock.now
    }

    private struct State {
        var pending: [Request] = []
        var drains = 0
    }

    let database: Database
    let maxBatch: Int
    /// Batches committing at once: one on SQLite (one writer), two on PostgreSQL, where each
    /// batch has its own pooled connection — one commits while the next is being read and
    /// planned. (Measured on 2 cores: 1, 2 and 4 within noise of each other, 3 and 8 worse:
    /// more concurrent batches are smaller, so more statements per delivery.)
    let maxConcurrentBatches: Int
    private let state = Mutex(State())

    /// More accounts than this on one Apple Account: `shared_apple_id` (`offers.sharedAppleIdAccounts`).
    let sharedAppleIdLimit: Int
    /// The deployment's apps, recorded with each delivery.
    let apps: AppDirectory

    init(
        database: Database, maxBatch: Int = 128, sharedAppleIdLimit: Int = OfferStore.defaultSharedAppleIdLimit,
        apps: AppDirectory = AppDirectory()
    ) {
        self.database = database
        self.apps = apps
        self.sharedAppleIdLimit = sharedAppleIdLimit
        self.maxBatch = maxBatch
        self.maxConcurrentBatches = database.kind == .postgres ? 2 : 1
    }

    func deliver(
        _ transaction: StoreTransaction, submittingAccount: String?, requestedOrderId: String?,
        catalog: Catalog, policy: OwnershipPolicy, evidence: DeliveryPlanner.Evidence,
        event: SubscriptionEvent? = nil, sideWrites: (any StoreSideWrites)? = nil, now: Date
    ) async throws -> PurchaseStore.DeliveryResult {
        try await withCheckedThrowingContinuation { continuation in
            let request = Request(
                transaction: transaction, submittingAccount: submittingAccount, requestedOrderId: requestedOrderId,
                catalog: catalog, policy: policy, evidence: evidence, now: now, event: event,
                sideWrites: sideWrites, continuation: continuation)
            let startDrain = state.withLock { state -> Bool in
                state.pending.append(request)
                // Another drain whenever a slot is free: a lone request never waits behind a
                // slow batch.
                guard state.drains < maxConcurrentBatches else { return false }
                state.drains += 1
                return true
            }
            if startDrain { Task { await self.drain() } }
        }
    }

    private func drain() async {
        while true {
            let batch = state.withLock { state -> [Request] in
                let taken = Array(state.pending.prefix(maxBatch))
                state.pending.removeFirst(taken.count)
                if taken.isEmpty { state.drains -= 1 }
                return taken
            }
            if batch.isEmpty { return }
            await run(batch)
        }
    }

    private func run(_ batch: [Request]) async {
        let items = batch.map {
            BatchDelivery.Item(
                transaction: $0.transaction, submittingAccount: $0.submittingAccount,
                requestedOrderId: $0.requestedOrderId, catalog: $0.catalog, policy: $0.policy, evidence: $0.evidence,
                now: $0.now, event: $0.event, sharedAppleIdLimit: sharedAppleIdLimit, apps: apps,
                sideWrites: $0.sideWrites)
        }
        let results: [PurchaseStore.DeliveryResult]
        do {
            // An item fails only when another instance delivered the same transaction at the
            // same moment; then the whole batch rolls back and every item goes again alone.
            let combineWrites = database.kind == .postgres
            results = try await database.transaction { sql in
                try await BatchDelivery.run(items, sql: sql, combineWrites: combineWrites)
            }
        } catch {
            // The database cannot answer (down, restarting, deadline passed): every caller gets
            // a retryable failure now and the slot is free for the next batch. Only a conflict
            // with another instance goes again, one by one.
            if let unavailable = StorageUnavailable.classify(error) {
                for request in batch { request.continuation.resume(throwing: unavailable) }
                return
            }
            for request in batch { await retryAlone(request) }
            return
        }
        for (request, result) in zip(batch, results) { request.continuation.resume(returning: result) }
    }

    /// A conflicting item (another instance delivered the same transaction meanwhile) goes
    /// through the single-delivery path, which re-reads and answers already_delivered.
    /// How long the oldest delivery has been waiting for a batch (`/healthz`).
    var oldestWaiting: Duration? {
        state.withLock { state in state.pending.first.map { ContinuousClock.now - $0.enqueued } }
    }

    private func retryAlone(_ request: Request) async {
        do {
            let result = try await PurchaseStore.deliverAlone(
                database,
                BatchDelivery.Item(
                    transaction: request.transaction, submittingAccount: request.submittingAccount,
                    requestedOrderId: request.requestedOrderId, catalog: request.catalog, policy: request.policy,
                    evidence: request.evidence, now: request.now, event: request.event,
                    sharedAppleIdLimit: sharedAppleIdLimit, apps: apps, sideWrites: request.sideWrites))
            request.continuation.resume(returning: result)
        } catch {
            request.continuation.resume(throwing: error)
        }
    }
}
