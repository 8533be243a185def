import Foundation
import SQLKit
import StoreKeeperCore

/// What the operator dashboard reads: figures summed by the database (one row per day and
/// currency, whatever the number of deliveries), search by any id, and one account's records.
public struct DashboardOverview: Sendable, Equatable {
    public struct Day: Sendable, Equatable {
        /// Midnight UTC of the day.
        public var day: Date
        public var deliveries: Int = 0
        /// What the developer keeps, milliunits per currency (Production only, as `revenue`).
        public var proceedsMilli: [String: Int64] = [:]
        public var refunds: Int = 0
        /// The proceeds those refunds took back, milliunits per currency.
        public var refundedMilli: [String: Int64] = [:]
    }
    /// Oldest first, one entry per day of the window (days without anything included).
    public var days: [Day]
    public var subscriptionsByStatus: [String: Int]
    public var openAnomalies: Int
    public var pendingJobs: Int
    public var pendingNotifications: Int
    public var pendingWebhooks: Int
    public var deadLetters: Int
}

extension ReportStore {
    static let millisecondsPerDay: Int64 = 86_400_000

    /// The overview: the last `days` days (UTC) up to `now`.
    /// `apps`: only those apps' rows (a key limited to some apps); nil: every app.
    public func dashboardOverview(days: Int, now: Date, smallBusinessProgram: Bool, apps: Set<String>? = nil)
        async throws -> DashboardOverview
    {
        // Bound, never spliced: ` AND app_id IN (…)` for a limited view.
        let only: SQLQueryString =
            apps.map { " AND app_id IN (\(binds: $0.sorted()))" } ?? ""
        let today = now.milliseconds / Self.millisecondsPerDay
        let firstDay = today - Int64(max(days, 1) - 1)
        let from = firstDay * Self.millisecondsPerDay
        let kept: SQLQueryString =
            "\(unsafeRaw: AnalyticsViews.kept(net: "price_milli", row: "", smallBusinessProgram: smallBusinessProgram))"
        return try await database.readStale { sql in
            var byDay: [Int64: DashboardOverview.Day] = [:]
            for index in firstDay...today {
                byDay[index] = .init(day: Date(milliseconds: index * Self.millisecondsPerDay))
            }
            let delivered = try await sql.raw(
                """
                SELECT delivered_at / 86400000 AS d, COUNT(*) AS n FROM deliveries
                WHERE delivered_at >= \(bind: from)\(only) GROUP BY 1
                """
            ).all()
            for row in delivered {
                let day = try row.decode(column: "d", as: Int64.self)
                byDay[day]?.deliveries = try row.decode(column: "n", as: Int.self)
            }
            let proceeds = try await sql.raw(
                """
                SELECT delivered_at / 86400000 AS d, COALESCE(currency, '?') AS currency,
                       CAST(SUM(\(kept)) AS BIGINT) AS kept
                FROM deliveries
                WHERE delivered_at >= \(bind: from) AND price_milli IS NOT NULL AND proceeds_percent IS NOT NULL
                      AND environment NOT IN ('Sandbox', 'Xcode')\(only)
                GROUP BY 1, 2
                """
            ).all()
            for row in proceeds {
                let day = try row.decode(column: "d", as: Int64.self)
                byDay[day]?.proceedsMilli[try row.decode(column: "currency", as: String.self)] =
                    try row.decode(column: "kept", as: Int64?.self) ?? 0
            }
            let refunds = try await sql.raw(
                """
                SELECT refunded_at / 86400000 AS d, COALESCE(currency, '?') AS currency, COUNT(*) AS n,
                       CAST(SUM(CASE WHEN price_milli IS NULL OR proceeds_percent IS NULL
                                     OR environment IN ('Sandbox', 'Xcode') THEN 0
                                     ELSE \(kept) * COALESCE(refund_share, 100000) / 100000 END) AS BIGINT) AS kept
                FROM deliveries WHERE refunded_at >= \(bind: from)\(only) GROUP BY 1, 2
                """
            ).all()
            for row in refunds {
                let day = try row.decode(column: "d", as: Int64.self)
                byDay[day]?.refunds += try row.decode(column: "n", as: Int.self)
                let amount = try row.decode(column: "kept", as: Int64?.self) ?? 0
                if amount != 0 {
                    byDay[day]?.refundedMilli[try row.decode(column: "currency", as: String.self), default: 0] += amount
                }
            }
            var statuses: [String: Int] = [:]
            for row in try await sql.raw(
                "SELECT status, COUNT(*) AS n FROM subscriptions WHERE 1 = 1\(only) GROUP BY status"
            )
            .all() {
                statuses[try row.decode(column: "status", as: String.self)] = try row.decode(column: "n", as: Int.self)
            }
            let counts = try await sql.raw(
                """
                SELECT (SELECT COUNT(*) FROM anomalies WHERE status = 'open'\(only)) AS anomalies,
                       (SELECT COUNT(*) FROM jobs WHERE status = 'pending') AS jobs,
                       (SELECT COUNT(*) FROM notifications WHERE status = 'pending') AS notifications,
                       (SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL) AS webhooks,
                       (SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND dead_at IS NOT NULL) AS dead
                """
            ).first()
            return DashboardOverview(
                days: byDay.keys.sorted().compactMap { byDay[$0] }, subscriptionsByStatus: statuses,
                openAnomalies: try counts?.decode(column: "anomalies", as: Int.self) ?? 0,
                pendingJobs: try counts?.decode(column: "jobs", as: Int.self) ?? 0,
                pendingNotifications: try counts?.decode(column: "notifications", as: Int.self) ?? 0,
                pendingWebhooks: try counts?.decode(column: "webhooks", as: Int.self) ?? 0,
                deadLetters: try counts?.decode(column: "dead", as: Int.self) ?? 0)
        }
    }

    /// What an id names: an account, an order (or its appAccountToken), a transaction, an
    /// original transaction, or an anomaly holding it. Exact matches only, each by an index
    /// or a primary key, never a scan.
    public struct SearchHit: Sendable, Hashable {
        public enum Kind: String, Sendable { case account, order, transaction, originalTransaction, anomaly }
        public var kind: Kind
        /// The account it belongs to (nil: an anomaly no account holds yet).
        public var accountId: String?
        /// The anomaly, for `.anomaly`.
        public var anomalyId: String?
        /// For `.anomaly`: still open.
        public var open = false

        public init(kind: Kind, accountId: String?, anomalyId: String? = nil, open: Bool = false) {
            self.kind = kind
            self.accountId = accountId
            self.anomalyId = anomalyId
            self.open = open
        }
    }

    public func search(_ query: String) async throws -> [SearchHit] {
        let term = query.trimmingCharacters(in: .whitespaces)
        guard !term.isEmpty, term.count <= 200 else { return [] }
        return try await database.read { sql in
            var hits: [SearchHit] = []
            let account = try await sql.raw(
                """
                SELECT 1 AS found FROM deliveries WHERE account_id = \(bind: term)
                UNION ALL SELECT 1 FROM balances WHERE account_id = \(bind: term)
                UNION ALL SELECT 1 FROM orders WHERE account_id = \(bind: term)
                UNION ALL SELECT 1 FROM subscriptions WHERE account_id = \(bind: term)
                UNION ALL SELECT 1 FROM grants WHERE account_id = \(bind: term)
                LIMIT 1
                """
            ).first()
            if account != nil { hits.append(.init(kind: .account, accountId: term)) }
            for row in try await sql.raw(
                """
                SELECT account_id FROM orders
                WHERE order_id = \(bind: term) OR app_account_token = \(bind: term.lowercased()) LIMIT 5
                """
            ).all() {
                hits.append(.init(kind: .order, accountId: try row.decode(column: "account_id", as: String.self)))
            }
            // A transaction by any id support is quoted: the store's transaction id, a Google
            // order id as printed (`GPA.…`, with or without `gp:`), a purchase token, a web payment.
            let ids = try await TransactionStore.transactionIds(naming: term, sql: sql)
            if let row = try await sql.raw(
                "SELECT account_id FROM deliveries WHERE transaction_id IN (\(binds: ids)) LIMIT 1"
            ).first() {
                hits.append(.init(kind: .transaction, accountId: try row.decode(column: "account_id", as: String.self)))
            }
            if let row = try await sql.raw(
                """
                SELECT account_id FROM ownership WHERE original_transaction_id IN (\(binds: ids))
                UNION ALL SELECT account_id FROM subscriptions WHERE original_transaction_id IN (\(binds: ids))
                LIMIT 1
                """
            ).first() {
                hits.append(
                    .init(kind: .originalTransaction, accountId: try row.decode(column: "account_id", as: String.self)))
            }
            for row in try await sql.raw(
                """
                SELECT id, account_id, status FROM anomalies WHERE transaction_id IN (\(binds: ids))
                      OR order_id = \(bind: term) OR id = \(bind: term) ORDER BY created_at DESC LIMIT 20
                """
            ).all() {
                hits.append(
                    .init(
                        kind: .anomaly, accountId: try row.decode(column: "account_id", as: String?.self),
                        anomalyId: try row.decode(column: "id", as: String.self),
                        open: try row.decode(column: "status", as: String.self) == "open"))
            }
            return hits
        }
    }

    public struct LedgerRow: Sendable, Hashable {
        public var entryKey: String
        public var currency: String
        public var amount: Int64
        public var createdAt: Date
        /// Support's reason, for a credit or a debit given one.
        public var reason: String? = nil
    }

    public struct OrderRow: Sendable, Hashable {
        public var orderId: String
        public var productId: String
        public var quantity: Int
        public var status: String
        public var createdAt: Date
        public var transactionId: String?
        /// The app the order was made for.
        public var appId: String? = nil
    }

    /// One account's records for the dashboard: its ledger and orders (newest first, at most
    /// `limit` each) and the audit entries about it, its transactions or its subscriptions.
    public struct AccountRecords: Sendable {
        public var ledger: [LedgerRow]
        public var orders: [OrderRow]
        public var audit: [AnomalyStore.AuditEntry]
    }

    /// The store each of `ids` (transaction or original transaction ids) was bought in, as its
    /// deliveries recorded it; ids never delivered are absent.
    public func stores(of ids: [String]) async throws -> [String: Store] {
        let ids = Array(Set(ids))
        guard !ids.isEmpty else { return [:] }
        return try await database.read { sql in
            var stores: [String: Store] = [:]
            for row in try await sql.raw(
                """
                SELECT transaction_id, original_transaction_id, store FROM deliveries
                WHERE transaction_id IN (\(binds: ids)) OR original_transaction_id IN (\(binds: ids))
                """
            ).all() {
                guard let store = Store(rawValue: try row.decode(column: "store", as: String.self)) else { continue }
                stores[try row.decode(column: "transaction_id", as: String.self)] = store
                stores[try row.decode(column: "original_transaction_id", as: String.self)] = store
            }
            return stores
        }
    }

    public func accountRecords(_ accountId: String, limit: Int = 200) async throws -> AccountRecords {
        try await database.read { sql in
            let ledger = try await sql.raw(
                """
                SELECT entry_key, currency, amount, created_at, reason FROM ledger WHERE account_id = \(bind: accountId)
                ORDER BY created_at DESC, entry_key LIMIT \(unsafeRaw: String(limit))
                """
            ).all().map {
                LedgerRow(
                    entryKey: try $0.decode(column: "entry_key", as: String.self),
                    currency: try $0.decode(column: "currency", as: String.self),
                    amount: try $0.decode(column: "amount", as: Int64.self),
                    createdAt: Date(milliseconds: try $0.decode(column: "created_at", as: Int64.self)),
                    reason: try $0.decode(column: "reason", as: String?.self))
            }
            let orders = try await sql.raw(
                """
                SELECT order_id, product_id, quantity, status, created_at, transaction_id, app_id FROM orders
                WHERE account_id = \(bind: accountId) ORDER BY created_at DESC, order_id LIMIT \(unsafeRaw: String(limit))
                """
            ).all().map {
                OrderRow(
                    orderId: try $0.decode(column: "order_id", as: String.self),
                    productId: try $0.decode(column: "product_id", as: String.self),
                    quantity: try $0.decode(column: "quantity", as: Int.self),
                    status: try $0.decode(column: "status", as: String.self),
                    createdAt: Date(milliseconds: try $0.decode(column: "created_at", as: Int64.self)),
                    transactionId: try $0.decode(column: "transaction_id", as: String?.self),
                    appId: try $0.decode(column: "app_id", as: String?.self))
            }
            let audit = try await sql.raw(
                """
                SELECT * FROM audit
                WHERE subject = \(bind: accountId)
                   OR subject IN (SELECT transaction_id FROM deliveries WHERE account_id = \(bind: accountId))
                   OR subject IN (SELECT original_transaction_id FROM subscriptions WHERE account_id = \(bind: accountId))
                   OR subject IN (SELECT grant_id FROM grants WHERE account_id = \(bind: accountId))
                ORDER BY created_at DESC, id LIMIT \(unsafeRaw: String(limit))
                """
            ).all().map(AnomalyStore.decodeAudit)
            return AccountRecords(ledger: ledger, orders: orders, audit: audit)
        }
    }
}

// MARK: Refunds, as the stores report them

extension ReportStore {
    /// One line of an account's refund history: a refund applied to one of its purchases, or an
    /// App Store refund request and its outcome as Apple's notifications report them.
    public struct RefundHistoryRow: Sendable, Hashable {
        public var at: Date
        public var store: String
        public var transactionId: String
        public var productId: String?
        /// `refunded` (with its share), or Apple's `CONSUMPTION_REQUEST` (a refund asked),
        /// `REFUND`, `REFUND_DECLINED`, `REFUND_REVERSED`.
        public var event: String
        public var detail: String
    }

    /// The account's refunds and refund requests, newest first.
    public func refundHistory(of accountId: String, limit: Int = 200) async throws -> [RefundHistoryRow] {
        try await database.read { sql in
            var rows: [RefundHistoryRow] = []
            var originals: [String] = []
            for row in try await sql.raw(
                """
                SELECT transaction_id, original_transaction_id, product_id, store, refunded_at, refund_share, refund_type
                FROM deliveries WHERE account_id = \(bind: accountId) ORDER BY delivered_at DESC LIMIT 1000
                """
            ).all() {
                let original =
                    try row.decode(column: "original_transaction_id", as: String?.self)
                    ?? row.decode(column: "transaction_id", as: String.self)
                originals.append(original)
                guard let at = try row.decode(column: "refunded_at", as: Int64?.self) else { continue }
                let share = try row.decode(column: "refund_share", as: Int32?.self) ?? RefundPlanner.wholeShare
                rows.append(
                    RefundHistoryRow(
                        at: Date(milliseconds: at), store: try row.decode(column: "store", as: String.self),
                        transactionId: try row.decode(column: "transaction_id", as: String.self),
                        productId: try row.decode(column: "product_id", as: String?.self), event: "refunded",
                        detail: "\(RefundPlanner.percent(share)) refunded"
                            + ((try row.decode(column: "refund_type", as: String?.self)).map { " (\($0))" } ?? "")))
            }
            let unique = Array(Set(originals))
            var start = 0
            while start < unique.count {
                let slice = Array(unique[start..<min(start + 200, unique.count)])
                start += 200
                for row in try await sql.raw(
                    """
                    SELECT notification_type, subtype, subject, transaction_id, signed_date, outcome FROM notifications
                    WHERE subject IN (\(binds: slice))
                      AND notification_type IN ('CONSUMPTION_REQUEST', 'REFUND', 'REFUND_DECLINED', 'REFUND_REVERSED')
                    """
                ).all() {
                    let type = try row.decode(column: "notification_type", as: String.self)
                    let meaning =
                        switch type {
                        case "CONSUMPTION_REQUEST":
                            "the player asked Apple for a refund; Apple asked for consumption information"
                        case "REFUND": "Apple refunded"
                        case "REFUND_DECLINED": "Apple declined the refund request"
                        default: "Apple reversed a refund"
                        }
                    rows.append(
                        RefundHistoryRow(
                            at: Date(milliseconds: try row.decode(column: "signed_date", as: Int64.self)),
                            store: Store.appStore.rawValue,
                            transactionId: try row.decode(column: "transaction_id", as: String?.self)
                                ?? row.decode(column: "subject", as: String.self),
                            productId: nil, event: type,
                            detail: meaning
                                + ((try row.decode(column: "outcome", as: String?.self)).map { ": \($0)" } ?? "")))
                }
            }
            return Array(rows.sorted { ($0.at, $0.transactionId) > ($1.at, $1.transactionId) }.prefix(limit))
        }
    }
}

extension ReportStore {
    /// One purchase an account holds, as the account page's support form lists it.
    public struct AccountPurchase: Sendable, Hashable {
        public var transactionId: String
        public var originalTransactionId: String
        public var productId: String
        public var store: String
        public var appId: String?
        public var purchasedAt: Date?
        /// A renewing purchase's period end (nil: it does not renew).
        public var expiresAt: Date?
        public var refunded: Bool
    }

    /// The account's purchases, newest first: a subscription once (its latest period).
    /// `apps`: only those apps' purchases (a key limited to some apps); nil: every app.
    public func purchases(of accountId: String, apps: Set<String>? = nil, limit: Int = 200) async throws
        -> [AccountPurchase]
    {
        let only: SQLQueryString = apps.map { " AND app_id IN (\(binds: $0.sorted()))" } ?? ""
        return try await database.read { sql in
            var seen: Set<String> = []
            var purchases: [AccountPurchase] = []
            for row in try await sql.raw(
                """
                SELECT transaction_id, original_transaction_id, product_id, store, app_id, purchased_at, period_end,
                       refunded_at
                FROM deliveries WHERE account_id = \(bind: accountId)\(only)
                ORDER BY delivered_at DESC, transaction_id DESC LIMIT \(unsafeRaw: String(max(1, limit) * 4))
                """
            ).all() {
                let transactionId = try row.decode(column: "transaction_id", as: String.self)
                let original = try row.decode(column: "original_transaction_id", as: String?.self) ?? transactionId
                guard seen.insert(original).inserted else { continue }
                purchases.append(
                    AccountPurchase(
                        transactionId: transactionId, originalTransactionId: original,
                        productId: try row.decode(column: "product_id", as: String.self),
                        store: try row.decode(column: "store", as: String.self),
                        appId: try row.decode(column: "app_id", as: String?.self),
                        purchasedAt: try row.decode(column: "purchased_at", as: Int64?.self).map(
                            Date.init(milliseconds:)),
                        expiresAt: try row.decode(column: "period_end", as: Int64?.self).map(Date.init(milliseconds:)),
                        refunded: try row.decode(column: "refunded_at", as: Int64?.self) != nil))
                if purchases.count == limit { break }
            }
            return purchases
        }
    }
}
