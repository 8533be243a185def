import Foundation
import StoreKeeperStorage
import Stripe
import Synchronization

/// The purchase a Stripe payment is, for its refunds and disputes: the one delivered here, or
/// the one its delivery will be (`delivered` false).
struct StripeTarget: Sendable {
    var transactionId: String
    var originalTransactionId: String
    var productId: String
    var delivered: Bool
    /// Not delivered yet: the checkout whose completion claims it.
    var sessionId: String? = nil
}

extension StripePayments {
    /// The purchase `paymentIntent` paid: the delivered one; else, for a one-time checkout's
    /// payment (its order's token in the intent's metadata), `stripe:<payment intent>` — the
    /// transaction its delivery will be. A subscription's invoice payment not delivered yet has
    /// none: its delivery reads the charge and states what was taken back first.
    func stripeTarget(paymentIntent: String?, app: StripeApp) async throws -> StripeTarget? {
        guard let paymentIntent else { return nil }
        let stripeStore = StripeStore(database: database)
        if let payment = try await stripeStore.payment(paymentIntent: paymentIntent),
            try await stripeStore.isDelivered(payment.transactionId)
        {
            return StripeTarget(
                transactionId: payment.transactionId, originalTransactionId: payment.originalTransactionId,
                productId: payment.productId, delivered: true)
        }
        let intent = try await app.client.paymentIntent(paymentIntent)
        guard let token = intent.metadata?[stripeTokenKey],
            let checkout = try await stripeStore.checkout(token: token), checkout.appId == app.configuration.id,
            catalog.product(checkout.productId)?.type != .autoRenewable
        else { return nil }
        let id = "stripe:\(intent.id)"
        return StripeTarget(
            transactionId: id, originalTransactionId: id, productId: checkout.productId, delivered: false,
            sessionId: checkout.sessionId)
    }
}

/// At most `limit` admissions per key within `window` seconds; the oldest keys are forgotten
/// beyond 10,000 (memory stays bounded whatever the callers).
final class SlidingWindowLimiter: Sendable {
    let limit: Int
    let window: TimeInterval
    private let admitted = Mutex<[String: [Date]]>([:])

    init(limit: Int, window: TimeInterval) {
        self.limit = limit
        self.window = window
    }

    /// Nil when admitted; else the seconds to wait.
    func admit(_ key: String, now: Date = Date()) -> Int? {
        admitted.withLock { table in
            var times = (table[key] ?? []).filter { now.timeIntervalSince($0) < window }
            if times.count >= limit, let oldest = times.first {
                table[key] = times
                return max(1, Int((window - now.timeIntervalSince(oldest)).rounded(.up)))
            }
            times.append(now)
            if table.count >= 10_000, table[key] == nil { table.removeAll() }
            table[key] = times
            return nil
        }
    }
}
