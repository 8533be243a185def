import Foundation
import Logging
import ServiceLifecycle
import StoreKeeperStorage

/// Cancels orders left `created` past their TTL, once a minute. A late verified payment for a
/// cancelled order is still delivered to it.
struct OrderExpiry: Service {
    let store: PurchaseStore
    let ttl: TimeInterval
    let logger: Logger

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    let cancelled = try await store.cancelExpiredOrders(olderThan: ttl, now: Date())
                    if cancelled > 0 { logger.info("cancelled expired orders", metadata: ["count": "\(cancelled)"]) }
                } catch is CancellationError {
                    return
                } catch {
                    logger.warning("order expiry failed; will retry", metadata: ["error": "\(error)"])
                }
                try await Task.sleep(for: .seconds(60))
            }
        }
    }
}

/// Deletes kept rejected proofs past `rejectedProofs.retentionDays`, once an hour.
struct RejectedProofRetention: Service {
    let store: RejectedProofStore
    let retentionDays: Int
    let logger: Logger

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    let pruned = try await store.prune(olderThan: retentionDays, now: Date())
                    if pruned > 0 { logger.info("pruned rejected proofs", metadata: ["count": "\(pruned)"]) }
                } catch is CancellationError {
                    return
                } catch {
                    logger.warning("pruning rejected proofs failed; will retry", metadata: ["error": "\(error)"])
                }
                try await Task.sleep(for: .seconds(3600))
            }
        }
    }
}
