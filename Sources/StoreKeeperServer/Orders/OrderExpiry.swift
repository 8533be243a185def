import Foundation
import Logging
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperStorage

/// Cancels orders left `created` past their TTL, once a minute. A late verified payment for a
/// cancelled order is still delivered to it.
struct OrderExpiry: Service {
    let store: PurchaseStore
    let ttl: TimeInterval
    let logger: Logger
    /// `apple.finishTransactions`: deliveries this old are finished on the server (Finish
    /// Transaction), in the same minute's pass.
    var finishAfter: TimeInterval? = nil
    /// Web subscriptions whose paid period ended without a renewal payment expire in the same
    /// pass (no store tells us: the app's backend reports payments, not their absence).
    var catalog: Catalog? = nil
    /// Google Play's periodic duties (acknowledgement sweep, voided purchases).
    var runner: JobRunner? = nil

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    let cancelled = try await store.cancelExpiredOrders(olderThan: ttl, now: Date())
                    if cancelled > 0 { logger.info("cancelled expired orders", metadata: ["count": "\(cancelled)"]) }
                    if let catalog {
                        let lapsed = try await store.lapseWebSubscriptions(catalog: catalog, now: Date())
                        if lapsed > 0 { logger.info("web subscriptions lapsed", metadata: ["count": "\(lapsed)"]) }
                    }
                    await runner?.googleHousekeeping(now: Date())
                    if let finishAfter {
                        let queued = try await store.queueFinishes(delay: finishAfter, now: Date())
                        if queued > 0 { logger.info("Finish Transaction queued", metadata: ["count": "\(queued)"]) }
                    }
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

/// Housekeeping, once an hour: kept rejected proofs past `rejectedProofs.retentionDays`, and
/// webhook events sent more than `sentEventRetention` ago, are deleted.
struct Housekeeping: Service {
    let rejectedProofs: RejectedProofStore
    let retentionDays: Int
    let outbox: OutboxStore
    var sentEventRetention: TimeInterval = 7 * 86_400
    let logger: Logger
    /// Unpaid orders (cancelled or expired) are deleted this long after their creation
    /// (`limits.orderRetentionDays`).
    var orders: PurchaseStore? = nil
    var orderRetention: TimeInterval = 90 * 86_400
    /// External purchase tokens Apple never reported are deleted this long after they were
    /// registered (`limits.unconfirmedExternalTokenDays`).
    var externalTokens: ExternalPurchaseStore? = nil
    var unconfirmedTokenRetention: TimeInterval = 7 * 86_400

    /// Deletes in slices of a thousand rows, each its own short transaction, until a slice
    /// comes back short; returns how many went.
    static func inSlices(_ delete: () async throws -> Int) async throws -> Int {
        var count = 0
        while true {
            let deleted = try await delete()
            count += deleted
            if deleted < 1_000 { return count }
        }
    }

    /// One pass; returns what it deleted.
    @discardableResult
    func runOnce(now: Date = Date()) async throws -> (proofs: Int, events: Int, orders: Int, tokens: Int) {
        let proofs = try await rejectedProofs.prune(olderThan: retentionDays, now: now)
        let events = try await outbox.pruneSent(before: now.addingTimeInterval(-sentEventRetention))
        let orderCount =
            if let orders {
                try await Self.inSlices {
                    try await orders.deleteUnpaidOrders(createdBefore: now.addingTimeInterval(-orderRetention))
                }
            } else { 0 }
        let tokenCount =
            if let externalTokens {
                try await Self.inSlices {
                    try await externalTokens.deleteUnconfirmedTokens(
                        registeredBefore: now.addingTimeInterval(-unconfirmedTokenRetention))
                }
            } else { 0 }
        if proofs > 0 || events > 0 || orderCount > 0 || tokenCount > 0 {
            logger.info(
                "housekeeping",
                metadata: [
                    "rejectedProofs": "\(proofs)", "sentEvents": "\(events)", "unpaidOrders": "\(orderCount)",
                    "unconfirmedExternalTokens": "\(tokenCount)",
                ])
        }
        return (proofs, events, orderCount, tokenCount)
    }

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    _ = try await runOnce()
                } catch is CancellationError {
                    return
                } catch {
                    logger.warning("housekeeping failed; will retry", metadata: ["error": "\(error)"])
                }
                try await Task.sleep(for: .seconds(3600))
            }
        }
    }
}

/// SQLite: checkpoints the write-ahead log into the database every 30 s and truncates it
/// (`journal_size_limit` caps what is left after a burst). A checkpoint that fails (disk full)
/// or cannot finish (long readers) is logged, so a growing WAL never goes unnoticed.
struct WALCheckpointer: Service {
    let database: Database
    var interval: Duration = .seconds(30)
    let logger: Logger

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: interval)
                do {
                    if try await database.checkpoint() == false {
                        logger.warning(
                            "WAL checkpoint could not finish (readers in the way); will retry",
                            metadata: ["walBytes": "\(database.walBytes ?? 0)"])
                    }
                } catch is CancellationError {
                    return
                } catch {
                    logger.error(
                        "WAL checkpoint failed; will retry",
                        metadata: ["error": "\(error)", "walBytes": "\(database.walBytes ?? 0)"])
                }
            }
        }
    }
}
