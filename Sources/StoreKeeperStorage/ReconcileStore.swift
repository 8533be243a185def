import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// What reconciliation reads and applies besides notifications: overdue and silent
/// subscriptions, Apple's statuses, web lapses.
public struct ReconcileStore: Sendable {
    public let database: Database
    /// More accounts than this on one Apple Account (appTransactionId) raise `shared_apple_id`.
    public let sharedAppleIdLimit: Int
    /// The deployment's apps.
    public let apps: AppDirectory

    public init(
        database: Database, sharedAppleIdLimit: Int = OfferStore.defaultSharedAppleIdLimit,
        apps: AppDirectory = AppDirectory()
    ) {
        self.database = database
        self.sharedAppleIdLimit = sharedAppleIdLimit
        self.apps = apps
    }
}

/// What reconciliation reads and applies besides notifications.
extension ReconcileStore {
    /// Subscriptions that still entitle although their period (or grace) ended before `now`:
    /// Apple's news about them was missed. (Billing retry, which lasts up to 60 days, is not
    /// asked about every hour: its end arrives as a notification, and a missed one is in
    /// Notification History.)
    public func overdueSubscriptions(now: Date, limit: Int = 10_000) async throws -> [String] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT original_transaction_id FROM subscriptions
                WHERE status IN ('active', 'grace_period')
                AND COALESCE(grace_ends_at, expires_at) < \(bind: now.milliseconds)
                AND original_transaction_id NOT LIKE '%:%'
                ORDER BY original_transaction_id LIMIT \(unsafeRaw: String(limit))
                """
            ).all().map { try $0.decode(column: "original_transaction_id", as: String.self) }
        }
    }

    /// Accounts with a delivery since `since`, each with one of its transactions (the key to
    /// its Apple ID's transaction history).
    public func recentAccounts(since: Date, limit: Int = 10_000) async throws -> [(
        account: String, transactionId: String
    )] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT account_id, MAX(transaction_id) AS transaction_id FROM deliveries
                WHERE delivered_at >= \(bind: since.milliseconds) AND transaction_id NOT LIKE '%:%'
                GROUP BY account_id ORDER BY account_id
                LIMIT \(unsafeRaw: String(limit))
                """
            ).all().map {
                (
                    try $0.decode(column: "account_id", as: String.self),
                    try $0.decode(column: "transaction_id", as: String.self)
                )
            }
        }
    }

    /// Apple's status for a subscription (Get All Subscription Statuses), applied like any
    /// event: its latest transaction delivered to the owner if it is new, the state moved by
    /// SubscriptionMachine in `signedDate` order — under the subject's lock, like notifications.
    public func applyAppleStatus(
        _ status: Int, transaction: StoreTransaction, renewalInfo: StoreRenewal?,
        catalog: Catalog, policy: OwnershipPolicy, now: Date
    ) async throws -> PurchaseStore.DeliveryResult {
        let kind = database.kind
        let subject = transaction.originalTransactionId ?? transaction.transactionId ?? ""
        let signed = max(transaction.signedDate ?? 0, renewalInfo?.signedDate ?? 0)
        let event = SubscriptionEvent(
            .appleStatus(status), signedDate: signed > 0 ? Date(milliseconds: signed) : now, transaction: transaction,
            renewalInfo: renewalInfo)
        return try await database.transaction { sql in
            try await NotificationStore.lock([subject], sql: sql, kind: kind)
            return try await BatchDelivery.run(
                [
                    BatchDelivery.Item(
                        transaction: transaction, submittingAccount: nil, requestedOrderId: nil, catalog: catalog,
                        policy: policy, evidence: .device, now: now, event: event,
                        sharedAppleIdLimit: sharedAppleIdLimit, apps: apps)
                ], sql: sql, combineWrites: false)[0]
        }
    }

    /// Web subscriptions whose paid period ended without a payment for the next: expired
    /// through the subscription machine (`.lapsed`), their access removed, their status-change
    /// event written — up to `limit` per pass. Returns how many lapsed.
    public func lapseWebSubscriptions(catalog: Catalog, now: Date, limit: Int = 500) async throws -> Int {
        let due = try await database.read { sql in
            try await sql.raw(
                """
                SELECT original_transaction_id, account_id FROM subscriptions
                WHERE status IN ('active', 'grace_period')
                AND COALESCE(grace_ends_at, expires_at) <= \(bind: now.milliseconds)
                AND store = 'web'
                ORDER BY expires_at LIMIT \(unsafeRaw: String(max(1, limit)))
                """
            ).all().map {
                (
                    try $0.decode(column: "original_transaction_id", as: String.self),
                    try $0.decode(column: "account_id", as: String.self)
                )
            }
        }
        var lapsed = 0
        let kind = database.kind
        for (original, account) in due {
            lapsed += try await database.transaction { sql in
                try await NotificationStore.lock([original], sql: sql, kind: kind)
                let before = try await SubscriptionStore.states([original], sql: sql)[original]
                let (state, effects) = SubscriptionMachine.apply(before, SubscriptionEvent(.lapsed, signedDate: now))
                guard let state, state != before else { return 0 }
                try await SubscriptionStore.apply(
                    [.init(state: state, account: account, effects: effects, catalog: catalog, at: now.milliseconds)],
                    sql: sql)
                return 1
            }
        }
        return lapsed
    }

    /// Subscriptions of any store that the store went silent about: past their paid period (or
    /// grace) plus `SubscriptionMachine.silenceWindow` with no event, still active, in grace or
    /// in billing retry — an EXPIRED notification lost. Expired through the machine (`.silent`,
    /// signed at the window's end), so the stored state, exports and views agree with what the
    /// account view shows; up to `limit` per pass. Returns how many expired.
    public func expireSilentSubscriptions(catalog: Catalog, now: Date, limit: Int = 500) async throws -> Int {
        let window = Int64(SubscriptionMachine.silenceWindow * 1000)
        let due = try await database.read { sql in
            try await sql.raw(
                """
                SELECT original_transaction_id, account_id, COALESCE(grace_ends_at, expires_at) AS ends
                FROM subscriptions WHERE status IN ('active', 'grace_period', 'billing_retry')
                AND COALESCE(grace_ends_at, expires_at) <= \(bind: now.milliseconds - window)
                ORDER BY expires_at LIMIT \(unsafeRaw: String(max(1, limit)))
                """
            ).all().map {
                (
                    try $0.decode(column: "original_transaction_id", as: String.self),
                    try $0.decode(column: "account_id", as: String.self),
                    try $0.decode(column: "ends", as: Int64.self)
                )
            }
        }
        var expired = 0
        let kind = database.kind
        for (original, account, ends) in due {
            expired += try await database.transaction { sql in
                try await NotificationStore.lock([original], sql: sql, kind: kind)
                let before = try await SubscriptionStore.states([original], sql: sql)[original]
                let event = SubscriptionEvent(.silent, signedDate: Date(milliseconds: ends + window))
                let (state, effects) = SubscriptionMachine.apply(before, event)
                guard let state, state != before else { return 0 }
                try await SubscriptionStore.apply(
                    [.init(state: state, account: account, effects: effects, catalog: catalog, at: now.milliseconds)],
                    sql: sql)
                return 1
            }
        }
        return expired
    }
}
