import Foundation
import SQLKit

/// `GET /v1/export/{events|transactions|subscriptions}`: pages of the SQL views in a stable
/// order (time, then a key), resumable from the last row's cursor. docs/analytics.md lists the
/// columns.
public enum ExportKind: String, Sendable, CaseIterable {
    case events, transactions, subscriptions, orders
}

public struct ExportCursor: Sendable, Equatable {
    public var at: Int64
    public var rank: Int
    public var key: String

    public init(at: Int64, rank: Int, key: String) {
        self.at = at
        self.rank = rank
        self.key = key
    }

    /// Opaque to clients: base64url of `at:rank:key`.
    public var token: String {
        Data("\(at):\(rank):\(key)".utf8).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    public init?(token: String) {
        guard token.utf8.count <= 400 else { return nil }
        var base64 = token.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        guard let data = Data(base64Encoded: base64), let text = String(data: data, encoding: .utf8) else { return nil }
        let parts = text.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let at = Int64(parts[0]), let rank = Int(parts[1]), (0..<5).contains(rank) else {
            return nil
        }
        self.init(at: at, rank: rank, key: String(parts[2]))
    }
}

public enum ExportValue: Sendable, Equatable {
    case null
    case text(String)
    case integer(Int64)
    /// Milliseconds since 1970, written as ISO 8601 (UTC).
    case time(Int64)
}

public struct ExportPage: Sendable {
    public var columns: [String]
    public var rows: [[ExportValue]]
    /// Where the next page starts; nil at the end.
    public var next: ExportCursor?

    public init(columns: [String], rows: [[ExportValue]], next: ExportCursor?) {
        self.columns = columns
        self.rows = rows
        self.next = next
    }
}

extension ReportStore {
    enum ColumnType { case text, integer, time }

    static let exportColumns: [ExportKind: [(String, ColumnType)]] = [
        .transactions: [
            ("transaction_id", .text), ("original_transaction_id", .text), ("account_id", .text), ("order_id", .text),
            ("app_id", .text), ("store", .text), ("product_id", .text), ("quantity", .integer), ("environment", .text),
            ("storefront", .text), ("purchased_at", .time), ("delivered_at", .time), ("period_start", .time),
            ("period_end", .time), ("ends_at", .time), ("trial", .integer), ("family_shared", .integer),
            ("offer_type", .integer), ("offer_identifier", .text), ("price_milli", .integer), ("currency", .text),
            ("proceeds_percent", .integer), ("refunded_at", .time), ("refund_share", .integer),
            ("net_price_milli", .integer), ("proceeds_milli", .integer), ("counts", .integer),
        ],
        .subscriptions: [
            ("original_transaction_id", .text), ("account_id", .text), ("app_id", .text), ("store", .text),
            ("product_id", .text), ("status", .text), ("expires_at", .time), ("auto_renew", .integer),
            ("next_product_id", .text), ("grace_ends_at", .time), ("latest_transaction_id", .text),
            ("billing_plan", .text), ("signed_at", .time), ("updated_at", .time),
        ],
        .orders: [
            ("order_id", .text), ("account_id", .text), ("app_id", .text), ("product_id", .text),
            ("quantity", .integer), ("status", .text), ("created_at", .time), ("transaction_id", .text),
            ("delivered_at", .time), ("offer_id", .text),
        ],
        .events: [
            ("type", .text), ("id", .text), ("at", .time), ("account_id", .text), ("app_id", .text), ("store", .text),
            ("transaction_id", .text), ("original_transaction_id", .text), ("product_id", .text),
            ("environment", .text), ("detail", .text),
        ],
    ]

    /// One page of at most `limit` rows after `cursor` (or from `since`), of rows dated before
    /// `settled` only: a row is dated when its request began and committed up to a request's
    /// deadline later, so a cursor never passes a row that is still being written.
    public func export(
        _ kind: ExportKind, since: Date?, cursor: ExportCursor?, limit: Int, settled: Date
    ) async throws -> ExportPage {
        let columns = Self.exportColumns[kind]!
        let start = cursor ?? ExportCursor(at: since?.milliseconds ?? Int64.min, rank: -1, key: "")
        let limit = max(1, limit)
        return try await database.readStale { sql in
            func rows(_ query: SQLQueryString) async throws -> [(ExportCursor, [ExportValue])] {
                try await sql.raw(query).all().map { row in
                    // (Read in SQL's order; the merge below keeps it within a source.)
                    var values: [ExportValue] = []
                    for (name, type) in columns {
                        switch type {
                        case .text:
                            values.append(try row.decode(column: name, as: String?.self).map { .text($0) } ?? .null)
                        case .integer:
                            values.append(try row.decode(column: name, as: Int64?.self).map { .integer($0) } ?? .null)
                        case .time:
                            values.append(try row.decode(column: name, as: Int64?.self).map { .time($0) } ?? .null)
                        }
                    }
                    let at = try row.decode(column: "cursor_at", as: Int64.self)
                    let rank = try row.decode(column: "cursor_rank", as: Int.self)
                    return (
                        ExportCursor(at: at, rank: rank, key: try row.decode(column: "cursor_key", as: String.self)),
                        values
                    )
                }
            }
            // Rows after the cursor in (time, rank, key) order, for a source of `rank`.
            func after(_ time: String, _ key: String, rank: Int) -> SQLQueryString {
                let settled: SQLQueryString = " AND \(unsafeRaw: time) < \(bind: settled.milliseconds)"
                if start.rank < rank { return "\(unsafeRaw: time) >= \(bind: start.at)" + settled }
                if start.rank > rank { return "\(unsafeRaw: time) > \(bind: start.at)" + settled }
                return
                    "(\(unsafeRaw: time) > \(bind: start.at) OR (\(unsafeRaw: time) = \(bind: start.at) AND \(unsafeRaw: key) > \(bind: start.key)))"
                    + settled
            }
            var found: [(ExportCursor, [ExportValue])]
            switch kind {
            case .transactions:
                found = try await rows(
                    """
                    SELECT *, delivered_at AS cursor_at, 0 AS cursor_rank, transaction_id AS cursor_key
                    FROM storekeeper_transactions WHERE \(after("delivered_at", "transaction_id", rank: 0))
                    ORDER BY delivered_at, transaction_id LIMIT \(unsafeRaw: String(limit + 1))
                    """)
            case .subscriptions:
                found = try await rows(
                    """
                    SELECT *, updated_at AS cursor_at, 0 AS cursor_rank, original_transaction_id AS cursor_key
                    FROM storekeeper_subscriptions WHERE \(after("updated_at", "original_transaction_id", rank: 0))
                    ORDER BY updated_at, original_transaction_id LIMIT \(unsafeRaw: String(limit + 1))
                    """)
            case .orders:
                found = try await rows(
                    """
                    SELECT order_id, account_id, app_id, product_id, quantity, status, created_at, transaction_id,
                           delivered_at, offer_id, created_at AS cursor_at, 0 AS cursor_rank, order_id AS cursor_key
                    FROM orders WHERE \(after("created_at", "order_id", rank: 0))
                    ORDER BY created_at, order_id LIMIT \(unsafeRaw: String(limit + 1))
                    """)
            case .events:
                // Each source read in its own index order, then merged: a page never sorts the
                // whole history.
                let store = AnalyticsViews.store
                let sources: [SQLQueryString] = [
                    """
                    SELECT 'delivery' AS type, d.transaction_id AS id, d.delivered_at AS at, d.account_id, d.app_id,
                           \(unsafeRaw: store) AS store, d.transaction_id, d.original_transaction_id, d.product_id,
                           d.environment, CAST(NULL AS TEXT) AS detail,
                           d.delivered_at AS cursor_at, 0 AS cursor_rank, d.transaction_id AS cursor_key
                    FROM deliveries d WHERE d.quantity > 0 AND \(after("d.delivered_at", "d.transaction_id", rank: 0))
                    ORDER BY d.delivered_at, d.transaction_id LIMIT \(unsafeRaw: String(limit + 1))
                    """,
                    """
                    SELECT 'refund' AS type, d.transaction_id AS id, d.refunded_at AS at, d.account_id, d.app_id,
                           \(unsafeRaw: store) AS store, d.transaction_id, d.original_transaction_id, d.product_id,
                           d.environment, d.refund_type AS detail,
                           d.refunded_at AS cursor_at, 1 AS cursor_rank, d.transaction_id AS cursor_key
                    FROM deliveries d WHERE d.refunded_at IS NOT NULL AND \(after("d.refunded_at", "d.transaction_id", rank: 1))
                    ORDER BY d.refunded_at, d.transaction_id LIMIT \(unsafeRaw: String(limit + 1))
                    """,
                    """
                    SELECT 'notification' AS type, n.notification_uuid AS id, n.received_at AS at,
                           CAST(NULL AS TEXT) AS account_id, CAST(NULL AS TEXT) AS app_id, 'app_store' AS store,
                           n.transaction_id, n.subject AS original_transaction_id, CAST(NULL AS TEXT) AS product_id,
                           n.environment, n.notification_type || COALESCE('/' || n.subtype, '') || ' ' || n.status AS detail,
                           n.received_at AS cursor_at, 2 AS cursor_rank, n.notification_uuid AS cursor_key
                    FROM notifications n WHERE \(after("n.received_at", "n.notification_uuid", rank: 2))
                    ORDER BY n.received_at, n.notification_uuid LIMIT \(unsafeRaw: String(limit + 1))
                    """,
                    """
                    SELECT 'google_notification' AS type, g.message_id AS id, g.received_at AS at,
                           CAST(NULL AS TEXT) AS account_id, g.app_id, 'google_play' AS store,
                           CAST(NULL AS TEXT) AS transaction_id, CAST(NULL AS TEXT) AS original_transaction_id,
                           CAST(NULL AS TEXT) AS product_id, CAST(NULL AS TEXT) AS environment,
                           g.type || ' ' || g.status AS detail,
                           g.received_at AS cursor_at, 3 AS cursor_rank, g.message_id AS cursor_key
                    FROM google_notifications g WHERE \(after("g.received_at", "g.message_id", rank: 3))
                    ORDER BY g.received_at, g.message_id LIMIT \(unsafeRaw: String(limit + 1))
                    """,
                    """
                    SELECT 'anomaly' AS type, a.id AS id, a.created_at AS at, a.account_id, a.app_id,
                           CAST(NULL AS TEXT) AS store, a.transaction_id, CAST(NULL AS TEXT) AS original_transaction_id,
                           CAST(NULL AS TEXT) AS product_id, CAST(NULL AS TEXT) AS environment,
                           a.kind || ': ' || a.detail AS detail,
                           a.created_at AS cursor_at, 4 AS cursor_rank, a.id AS cursor_key
                    FROM anomalies a WHERE \(after("a.created_at", "a.id", rank: 4))
                    ORDER BY a.created_at, a.id LIMIT \(unsafeRaw: String(limit + 1))
                    """,
                ]
                // Merged by (time, source); within a source SQL's own order (its collation) stays.
                var merged: [(Int, (ExportCursor, [ExportValue]))] = []
                for source in sources { merged += try await rows(source).enumerated().map { ($0.offset, $0.element) } }
                merged.sort { ($0.1.0.at, $0.1.0.rank, $0.0) < ($1.1.0.at, $1.1.0.rank, $1.0) }
                found = merged.map(\.1)
            }
            let page = Array(found.prefix(limit))
            return ExportPage(
                columns: columns.map(\.0), rows: page.map(\.1), next: found.count > limit ? page.last?.0 : nil)
        }
    }
}
