import AppStoreModels
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import Synchronization

/// Group commit for deliveries: concurrent submissions that arrive while a commit is in
/// flight are planned and applied together in the next database transaction, one savepoint
/// each, and made durable by one commit (one fsync) instead of one each. Nobody is answered
/// before that commit, so durable-before-acknowledged holds (invariant 4); a failed item is
/// rolled back to its savepoint alone and retried on its own.
final class DeliveryBatcher: Sendable {
    struct Request: Sendable {
        var transaction: JWSTransactionDecodedPayload
        var submittingAccount: String?
        var requestedOrderId: String?
        var catalog: Catalog
        var policy: OwnershipPolicy
        var now: Date
        var continuation: CheckedContinuation<PurchaseStore.DeliveryResult, any Error>
    }

    private struct State {
        var pending: [Request] = []
        var draining = false
    }

    let database: Database
    let maxBatch: Int
    private let state = Mutex(State())

    init(database: Database, maxBatch: Int = 128) {
        self.database = database
        self.maxBatch = maxBatch
    }

    func deliver(
        _ transaction: JWSTransactionDecodedPayload, submittingAccount: String?, requestedOrderId: String?,
        catalog: Catalog, policy: OwnershipPolicy, now: Date
    ) async throws -> PurchaseStore.DeliveryResult {
        try await withCheckedThrowingContinuation { continuation in
            let request = Request(
                transaction: transaction, submittingAccount: submittingAccount, requestedOrderId: requestedOrderId,
                catalog: catalog, policy: policy, now: now, continuation: continuation)
            let startDrain = state.withLock { state -> Bool in
                state.pending.append(request)
                guard !state.draining else { return false }
                state.draining = true
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
                if taken.isEmpty { state.draining = false }
                return taken
            }
            if batch.isEmpty { return }
            await run(batch)
        }
    }

    private func run(_ batch: [Request]) async {
        let items = batch.map {
            ($0.transaction, $0.submittingAccount, $0.requestedOrderId, $0.catalog, $0.policy, $0.now)
        }
        let outcomes: [Result<PurchaseStore.DeliveryResult, any Error>]
        do {
            outcomes = try await database.transaction { sql in
                var outcomes: [Result<PurchaseStore.DeliveryResult, any Error>] = []
                for (index, item) in items.enumerated() {
                    let savepoint = "sk_delivery_\(index)"
                    try await sql.raw("SAVEPOINT \(ident: savepoint)").run()
                    do {
                        let context = try await PurchaseStore.context(
                            sql, transaction: item.0, submittingAccount: item.1, requestedOrderId: item.2,
                            catalog: item.3,
                            policy: item.4)
                        let plan = DeliveryPlanner.plan(context, now: item.5)
                        try await PurchaseStore.apply(
                            plan, transaction: item.0, context: context, sql: sql, now: item.5)
                        try await sql.raw("RELEASE SAVEPOINT \(ident: savepoint)").run()
                        outcomes.append(.success(.init(plan: plan, existing: context.existingDelivery)))
                    } catch {
                        try await sql.raw("ROLLBACK TO SAVEPOINT \(ident: savepoint)").run()
                        try await sql.raw("RELEASE SAVEPOINT \(ident: savepoint)").run()
                        outcomes.append(.failure(error))
                    }
                }
                return outcomes
            }
        } catch {
            // The commit itself failed: nothing of the batch is durable; each goes again alone.
            for request in batch { await retryAlone(request) }
            return
        }
        for (request, outcome) in zip(batch, outcomes) {
            switch outcome {
            case .success(let result): request.continuation.resume(returning: result)
            case .failure: await retryAlone(request)
            }
        }
    }

    /// A conflicting item (another instance delivered the same transaction meanwhile) goes
    /// through the single-delivery path, which re-reads and answers already_delivered.
    private func retryAlone(_ request: Request) async {
        do {
            let result = try await PurchaseStore.deliverAlone(
                database, request.transaction, submittingAccount: request.submittingAccount,
                requestedOrderId: request.requestedOrderId, catalog: request.catalog, policy: request.policy,
                now: request.now)
            request.continuation.resume(returning: result)
        } catch {
            request.continuation.resume(throwing: error)
        }
    }
}
