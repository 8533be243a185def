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
