import AppStoreAdapter
import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Foundation
import Logging
import ServiceLifecycle
import StoreKeeperCore
import StoreKeeperStorage

/// Reconciliation (docs/scenarios.md S8): what Apple sent while we were not listening, pulled back
/// and applied through the same paths as live traffic — Notification History (failures
/// first), Get All Subscription Statuses for subscriptions whose period passed without news,
/// Transaction History for accounts active recently. Idempotent: notifications are unique by
/// UUID, deliveries by transaction id, and a status already applied changes nothing.
public struct Reconciler: Sendable {
    let app: StoreKeeperApp

    public init(app: StoreKeeperApp) { self.app = app }

    public struct Report: Codable, Sendable, Hashable {
        public var since: String
        public var notificationsSeen = 0
        public var notificationsRecorded = 0
        public var notificationsRefused = 0
        public var subscriptionsChecked = 0
        public var subscriptionsChanged = 0
        public var accountsChecked = 0
        public var transactionsDelivered = 0
        public var transactionsUnattributed = 0
        public var errors: [String] = []
    }

    public struct NotConfigured: Error, CustomStringConvertible {
        public var description =
            "reconciliation needs the App Store Server API: set apple.serverAPI.issuerId, .keyId and .privateKeyFile"
    }

    /// One pass over `since…now` (the transaction histories of accounts with deliveries since
    /// `accountsSince`, by default `since` too); applies what it recorded before it returns.
    public func run(since: Date, accountsSince: Date? = nil, now: Date = Date()) async throws -> Report {
        guard let api = app.appleAPI else { throw NotConfigured() }
        var report = Report(since: StoreKeeperApp.iso(since))
        // Each app's Production and Sandbox history: Apple keeps one per app and environment.
        let clients = api.allClients

        // 1. Notification History: the failures first (what Apple is still retrying), then
        // everything in the window (what a proxy or a bug swallowed after a 200).
        for onlyFailures in [true, false] {
            for client in clients {
                let request = NotificationHistoryRequest(
                    startDate: Int64(since.timeIntervalSince1970 * 1000),
                    endDate: Int64(now.timeIntervalSince1970 * 1000), onlyFailures: onlyFailures ? true : nil)
                let items: [NotificationHistoryResponseItem]
                do {
                    items = try await client.getAllNotificationHistory(request)
                } catch {
                    report.errors.append(
                        "notification history (\(client.configuration.environment.rawValue)): \(error)")
                    continue
                }
                for signed in items.compactMap(\.signedPayload) {
                    report.notificationsSeen += 1
                    do {
                        // A primary-key read per notification: what was recorded is skipped.
                        let record = try await app.verifiedNotification(signed)
                        guard try await app.notifications.notification(record.notificationUUID) == nil else { continue }
                        try await app.notifications.accept(record, signedPayload: signed, now: Date())
                        report.notificationsRecorded += 1
                    } catch {
                        report.notificationsRefused += 1
                    }
                }
            }
        }
        await drainJobs(now: now)

        // 2. Subscriptions whose period passed without news: Apple's status now.
        for original in try await app.store.reconciliation.overdueSubscriptions(now: now) {
            report.subscriptionsChecked += 1
            do {
                let statuses = try await withFallback(api) { try await $0.getAllSubscriptionStatuses(original) }
                for item in (statuses.data ?? []).flatMap({ $0.lastTransactions ?? [] })
                where item.originalTransactionId == original {
                    guard let status = item.status, let signed = item.signedTransactionInfo else { continue }
                    let transaction = StoreTransaction(apple: try await app.verifier.verifyTransaction(signed))
                    var renewal: StoreRenewal?
                    if let info = item.signedRenewalInfo {
                        renewal = StoreRenewal(apple: try await app.verifier.verifyRenewalInfo(info))
                    }
                    let result = try await app.store.reconciliation.applyAppleStatus(
                        Int(status.rawValue), transaction: transaction, renewalInfo: renewal, catalog: app.catalog,
                        policy: app.configuration.ownershipPolicy, now: now)
                    if result.subscriptionEffects.contains(where: {
                        if case .statusChanged = $0 { true } else { false }
                    }) {
                        report.subscriptionsChanged += 1
                    }
                }
            } catch {
                report.errors.append("statuses of \(original): \(error)")
            }
        }

        // 3. Accounts active recently: anything paid and not delivered is delivered now, or
        // becomes an anomaly.
        for (account, transactionId) in try await app.store.reconciliation.recentAccounts(since: accountsSince ?? since)
        {
            report.accountsChecked += 1
            do {
                var filter = TransactionHistoryFilter()
                filter.startDate = Int64(since.timeIntervalSince1970 * 1000)
                let signed = try await withFallback(api) {
                    try await $0.getAllTransactionHistory(transactionId, filter: filter)
                }
                for jws in signed {
                    let transaction = StoreTransaction(apple: try await app.verifier.verifyTransaction(jws))
                    // Refunds arrive as notifications (step 1), with their reversal of the grant.
                    guard !transaction.isRevoked else { continue }
                    let result = try await app.store.deliver(
                        transaction, submittingAccount: nil, catalog: app.catalog,
                        policy: app.configuration.ownershipPolicy, now: now)
                    switch result.plan.outcome {
                    case .delivered: report.transactionsDelivered += 1
                    case .unattributed: report.transactionsUnattributed += 1
                    default: break
                    }
                }
            } catch {
                report.errors.append("history of account \(account): \(error)")
            }
        }
        await drainJobs(now: now)
        app.logger.notice(
            "reconciled",
            metadata: [
                "since": "\(report.since)", "notificationsRecorded": "\(report.notificationsRecorded)",
                "subscriptionsChanged": "\(report.subscriptionsChanged)",
                "transactionsDelivered": "\(report.transactionsDelivered)", "errors": "\(report.errors.count)",
            ])
        return report
    }

    /// Applies what was recorded (the job runner would, a second later); bounded.
    func drainJobs(now: Date) async {
        let runner = JobRunner(app: app)
        var rounds = 0
        while rounds < 1000, await runner.runDueCounting(now: now).claimed > 0 { rounds += 1 }
    }

    /// Production first, then sandbox for an id production does not know.
    func withFallback<T: Sendable>(
        _ api: EnvironmentFallback, _ body: (AppStoreServerAPIClient) async throws -> T
    ) async throws -> T {
        try await EnvironmentFallback.first(api.allClients, body)
    }
}

/// Reconciliation on a schedule: every `interval`, notifications and statuses over the last
/// `window`; transaction histories only of accounts with deliveries since the previous run
/// (two intervals back) — one Server API call per account, so proportional to recent traffic,
/// not to every account of the last days. `storekeeper reconcile` does the whole window.
public struct ReconcileService: Service {
    let reconciler: Reconciler
    let interval: Duration
    let window: TimeInterval

    public init(app: StoreKeeperApp, interval: Duration = .seconds(3600), window: TimeInterval = 3 * 86_400) {
        self.reconciler = Reconciler(app: app)
        self.interval = interval
        self.window = window
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: interval)
                let now = Date()
                _ = try? await reconciler.run(
                    since: now.addingTimeInterval(-window),
                    accountsSince: now.addingTimeInterval(-2 * Double(interval.components.seconds)), now: now)
            }
        }
    }
}
