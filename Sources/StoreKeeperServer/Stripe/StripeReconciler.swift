import Foundation
import ServiceLifecycle
import StoreKeeperStorage
import Stripe

/// What a missed webhook would have done: each Stripe app's events listed from Stripe's API
/// (newest first, every page — no cap), only the types the adapter applies, and recorded like a
/// webhook — once per event id, so those already received change nothing — then applied by the
/// same job. Each complete run records where it ended; the next resumes there, however long the
/// outage (within the 30 days Stripe keeps events: past that the report says so).
public struct StripeReconciler: Sendable {
    let app: StoreKeeperApp

    public init(app: StoreKeeperApp) { self.app = app }

    public struct Report: Codable, Sendable {
        public var listed = 0
        public var recorded = 0
        public var errors: [String] = []
        /// Apps whose resume point was older than Stripe keeps events: listed from 30 days ago.
        public var beyondRetention: [String] = []
    }

    /// The event types the adapter applies (Stripe filters at most 20 per list call).
    static let appliedTypes: [[String]] = [
        [
            "checkout.session.completed", "checkout.session.async_payment_succeeded",
            "checkout.session.async_payment_failed", "checkout.session.expired", "invoice.paid",
            "invoice.payment_succeeded", "invoice.payment_failed", "customer.subscription.created",
            "customer.subscription.updated", "customer.subscription.deleted", "customer.subscription.paused",
            "customer.subscription.resumed",
        ],
        [
            "charge.refunded", "charge.refund.updated", "refund.created", "refund.updated", "refund.failed",
            "charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed",
            "charge.dispute.funds_withdrawn", "charge.dispute.funds_reinstated",
        ],
    ]

    /// How long Stripe keeps events.
    static let retention: TimeInterval = 30 * 86_400

    /// Lists events created since `since` (nil: where the app's last complete run ended, else the
    /// last `window`) and records the new ones.
    public func run(since: Date? = nil, window: TimeInterval = 3 * 86_400, now: Date = Date()) async -> Report {
        var report = Report()
        let events = StripeStore(database: app.database)
        for stripe in app.stripe.values.sorted(by: { $0.configuration.id < $1.configuration.id }) {
            let appId = stripe.configuration.id
            do {
                var start = since
                if start == nil, let cursor = try await events.reconcileCursor(appId: appId) {
                    start = Date(timeIntervalSince1970: Double(cursor))
                }
                var from = start ?? now.addingTimeInterval(-window)
                let oldest = now.addingTimeInterval(-Self.retention)
                if from < oldest {
                    report.beyondRetention.append(appId)
                    from = oldest
                }
                for types in Self.appliedTypes {
                    var cursor: String?
                    while true {
                        let page = try await stripe.client.events(
                            createdAfter: Int64(from.timeIntervalSince1970), startingAfter: cursor, types: types)
                        for event in page.data {
                            // Another app sharing the Stripe account names its own app in the
                            // objects' metadata; events are recorded per app and read back per app.
                            let recorded = try await events.recordEvent(
                                id: event.id, appId: appId, type: event.type, objectId: event.objectId,
                                created: event.created, now: now)
                            if recorded == .new { report.recorded += 1 }
                        }
                        report.listed += page.data.count
                        guard page.hasMore == true, let last = page.data.last?.id else { break }
                        cursor = last
                    }
                }
                // Complete: the next run resumes here (less a margin for events Stripe dates
                // a little before it lists them).
                try await events.setReconcileCursor(appId: appId, through: Int64(now.timeIntervalSince1970) - 300)
            } catch {
                report.errors.append("\(appId): \(error)")
            }
        }
        return report
    }
}

/// The reconciler every `interval` (five minutes), over the last three days (Stripe's retries).
public struct StripeReconcileService: Service {
    let reconciler: StripeReconciler
    let interval: Duration
    let window: TimeInterval

    public init(app: StoreKeeperApp, interval: Duration = .seconds(300), window: TimeInterval = 3 * 86_400) {
        self.reconciler = StripeReconciler(app: app)
        self.interval = interval
        self.window = window
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: interval)
                _ = await reconciler.run(window: window)
            }
        }
    }
}
