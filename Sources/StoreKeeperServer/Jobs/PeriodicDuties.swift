import Foundation
import Logging
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperStorage

/// A duty run once a minute in its own service: a failure is logged and tried again at the next
/// minute, and one duty never holds up another.
struct EveryMinute: Service {
    let name: String
    let logger: Logger
    var interval: Duration = .seconds(60)
    let pass: @Sendable (Date) async throws -> Void

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    try await pass(Date())
                } catch is CancellationError {
                    return
                } catch {
                    logger.warning("\(name) failed; will retry", metadata: ["error": "\(error)"])
                }
                try await Task.sleep(for: interval)
            }
        }
    }
}

/// The minute's duties, one service each.
enum MinuteDuties {
    /// Orders left `created` past their TTL are cancelled (a late verified payment for a
    /// cancelled order is still delivered to it).
    static func orderExpiry(_ store: PurchaseStore, ttl: TimeInterval, logger: Logger) -> EveryMinute {
        EveryMinute(name: "order expiry", logger: logger) { now in
            let cancelled = try await store.orders.cancelExpiredOrders(olderThan: ttl, now: now)
            if cancelled > 0 { logger.info("cancelled expired orders", metadata: ["count": "\(cancelled)"]) }
        }
    }

    /// Web subscriptions whose paid period ended without a renewal payment expire (no store
    /// tells us: the app's backend reports payments, not their absence).
    static func webLapses(_ store: PurchaseStore, catalog: Catalog, logger: Logger) -> EveryMinute {
        EveryMinute(name: "web subscription lapses", logger: logger) { now in
            let lapsed = try await store.reconciliation.lapseWebSubscriptions(catalog: catalog, now: now)
            if lapsed > 0 { logger.info("web subscriptions lapsed", metadata: ["count": "\(lapsed)"]) }
        }
    }

    /// Subscriptions a store went silent about past its retry window expire in the stored state.
    static func silentSubscriptions(_ store: PurchaseStore, catalog: Catalog, logger: Logger) -> EveryMinute {
        EveryMinute(name: "silent subscriptions", logger: logger) { now in
            let expired = try await store.reconciliation.expireSilentSubscriptions(catalog: catalog, now: now)
            if expired > 0 {
                logger.info("subscriptions the store went silent about expired", metadata: ["count": "\(expired)"])
            }
        }
    }

    /// `apple.finishTransactions`: deliveries this old are finished on the server.
    static func finishTransactions(_ store: PurchaseStore, after delay: TimeInterval, logger: Logger) -> EveryMinute {
        EveryMinute(name: "Finish Transaction", logger: logger) { now in
            let queued = try await store.appleAccounts.queueFinishes(delay: delay, now: now)
            if queued > 0 { logger.info("Finish Transaction queued", metadata: ["count": "\(queued)"]) }
        }
    }

    /// Google Play's periodic duties (acknowledgement sweep, voided purchases).
    static func googleHousekeeping(_ runner: JobRunner, logger: Logger) -> EveryMinute {
        EveryMinute(name: "Google Play housekeeping", logger: logger) { now in
            await runner.googleHousekeeping(now: now)
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
    /// Stripe events applied (or ignored) more than 30 days ago are deleted: Stripe retries a
    /// webhook for 3 days, the reconciler looks back 3 days and Stripe itself keeps events 30.
    var stripeEvents: StripeStore? = nil
    var stripeEventRetention: TimeInterval = 30 * 86_400

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
                    try await orders.orders.deleteUnpaidOrders(createdBefore: now.addingTimeInterval(-orderRetention))
                }
            } else { 0 }
        let tokenCount =
            if let externalTokens {
                try await Self.inSlices {
                    try await externalTokens.deleteUnconfirmedTokens(
                        registeredBefore: now.addingTimeInterval(-unconfirmedTokenRetention))
                }
            } else { 0 }
        let stripeCount =
            if let stripeEvents {
                try await Self.inSlices {
                    try await stripeEvents.pruneEvents(receivedBefore: now.addingTimeInterval(-stripeEventRetention))
                }
            } else { 0 }
        if proofs > 0 || events > 0 || orderCount > 0 || tokenCount > 0 || stripeCount > 0 {
            logger.info(
                "housekeeping",
                metadata: [
                    "rejectedProofs": "\(proofs)", "sentEvents": "\(events)", "unpaidOrders": "\(orderCount)",
                    "unconfirmedExternalTokens": "\(tokenCount)", "stripeEvents": "\(stripeCount)",
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
