import Foundation
import ServiceLifecycle
import StoreKeeperStorage
import Stripe

/// What a missed webhook would have done: each Stripe app's recent events listed from Stripe's
/// API (newest first, every page within the window) and recorded like a webhook — once per
/// event id, so those already received change nothing — then applied by the same job.
public struct StripeReconciler: Sendable {
    let app: StoreKeeperApp

    public init(app: StoreKeeperApp) { self.app = app }

    public struct Report: Codable, Sendable {
        public var listed = 0
        public var recorded = 0
        public var errors: [String] = []
    }

    /// Lists events created since `since` (at most `limit` per app) and records the new ones.
    public func run(since: Date, limit: Int = 5000, now: Date = Date()) async -> Report {
        var report = Report()
        let events = StripeStore(database: app.database)
        for stripe in app.stripe.values.sorted(by: { $0.configuration.id < $1.configuration.id }) {
            var cursor: String?
            var seen = 0
            do {
                while seen < limit {
                    let page = try await stripe.client.events(
                        createdAfter: Int64(since.timeIntervalSince1970), startingAfter: cursor)
                    for event in page.data {
                        seen += 1
                        let recorded = try await events.recordEvent(
                            id: event.id, appId: stripe.configuration.id, type: event.type, objectId: event.objectId,
                            created: event.created, now: now)
                        if recorded == .new { report.recorded += 1 }
                    }
                    report.listed += page.data.count
                    guard page.hasMore == true, let last = page.data.last?.id else { break }
                    cursor = last
                }
            } catch {
                report.errors.append("\(stripe.configuration.id): \(error)")
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
                _ = await reconciler.run(since: Date().addingTimeInterval(-window))
            }
        }
    }
}
