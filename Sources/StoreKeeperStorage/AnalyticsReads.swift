import Foundation
import SQLKit
import StoreKeeperCore

/// Which facts a metric reads: `nil` is every value.
public struct AnalyticsFilter: Sendable, Equatable {
    public var appId: String?
    public var store: String?
    public var productId: String?
    /// The storefront as the store gives it (the App Store's ISO 3166-1 alpha-3, `USA`).
    public var country: String?

    public init(appId: String? = nil, store: String? = nil, productId: String? = nil, country: String? = nil) {
        self.appId = appId
        self.store = store
        self.productId = productId
        self.country = country
    }

    /// ` AND …` over the deliveries aliased `alias`.
    func sql(_ alias: String) -> SQLQueryString {
        var text: SQLQueryString = ""
        if let appId { text = text + " AND \(unsafeRaw: alias).app_id = \(bind: appId)" }
        if let store {
            text =
                text
                + " AND \(unsafeRaw: AnalyticsViews.store.replacingOccurrences(of: "d.", with: "\(alias).")) = \(bind: store)"
        }
        if let productId { text = text + " AND \(unsafeRaw: alias).product_id = \(bind: productId)" }
        if let country { text = text + " AND \(unsafeRaw: alias).storefront = \(bind: country)" }
        return text
    }
}
/// What operators read across accounts: analytics, revenue, exports, the dashboard's
/// overview, search and account records.
public struct ReportStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }
}

extension ReportStore {
    /// One tally per bucket for `metric` (docs/analytics.md): the database sums per quarter hour
    /// (or per cohort); `Analytics` places the sums in the buckets. `now` caps the stock
    /// metrics' instants and what counts as ended.
    public func analytics(
        _ metric: AnalyticsMetric, filter: AnalyticsFilter, buckets: [AnalyticsCalendar.Bucket], now: Date,
        smallBusinessProgram: Bool, policy: AnalyticsScanPolicy = AnalyticsScanPolicy()
    ) async throws -> [AnalyticsTally] {
        guard let first = buckets.first, let last = buckets.last else { return [] }
        let from = first.startMilliseconds
        let to = last.endMilliseconds
        let nowQuarter = QuarterHour.of(now.milliseconds) * QuarterHour.milliseconds
        let counts = Self.counts("d")
        // The database groups by the coarsest unit every interval boundary falls on (a UTC day,
        // an hour, half an hour, or a quarter hour), quarter hours only from the unit under way
        // on: a few hundred rows back instead of one per quarter hour of history.
        let boundaries = buckets.map(\.startMilliseconds) + [to]
        let unit = [86_400_000, 3_600_000, 1_800_000, QuarterHour.milliseconds].first { unit in
            boundaries.allSatisfy { $0 % unit == 0 }
        }!
        let split = now.milliseconds / unit * unit
        @Sendable func key(_ time: String) -> SQLQueryString {
            """
            CASE WHEN \(unsafeRaw: time) >= \(unsafeRaw: String(split)) THEN \(unsafeRaw: time) / 900000 * 900000 \
            ELSE \(unsafeRaw: time) / \(unsafeRaw: String(unit)) * \(unsafeRaw: String(unit)) END
            """
        }
        let filtered = filter.sql("d")
        let scan = try await scanPlan(windowFrom: from, now: now.milliseconds, metric: metric, policy: policy)
        let table = scan.table
        func tallies(_ rows: [AnalyticsRow], money: Bool = false, total: Bool = false, reason: Bool = false)
            -> [Int64: AnalyticsTally]
        {
            var result: [Int64: AnalyticsTally] = [:]
            for row in rows {
                var tally = AnalyticsTally(count: row.n)
                if total { tally.total = row.total ?? 0 }
                if money, let amount = row.m {
                    // A money row's count is its transactions; the flows do not report it.
                    tally.milli[row.c ?? "?"] = amount
                    tally.count = 0
                }
                if reason { tally.byReason[row.r ?? ""] = tally.count }
                result[QuarterHour.of(row.q), default: AnalyticsTally()].add(tally)
            }
            return result
        }
        switch metric {
        case .mrr, .activeSubscriptions, .activeTrials:
            let kind: SQLQueryString = metric == .activeTrials ? "d.trial = 1" : "d.trial = 0"
            let select: SQLQueryString =
                metric == .mrr
                ? "COALESCE(d.currency, '?') AS c, COUNT(*) AS n, CAST(SUM(\(unsafeRaw: AnalyticsViews.monthly)) AS BIGINT) AS m"
                : "'' AS c, COUNT(*) AS n"
            // One scan: each group is a (start unit, end unit, currency) with its count and money.
            let rows = try await scan.rows { part in
                """
                SELECT \(key("d.period_start")) AS q, \(key("(" + AnalyticsViews.endsAt + ")")) AS e, \(select)
                FROM \(table) WHERE d.period_end >= \(bind: from) AND d.period_start IS NOT NULL
                AND d.refunded_at IS NULL AND \(kind) AND \(counts)\(filtered)\(part) GROUP BY 1, 2, 3
                """
            }
            var starts: [Int64: AnalyticsTally] = [:]
            var ends: [Int64: AnalyticsTally] = [:]
            for row in rows {
                var tally = AnalyticsTally(count: row.n)
                if metric == .mrr, let amount = row.m { tally.milli[row.c ?? "?"] = amount }
                starts[QuarterHour.of(row.q), default: AnalyticsTally()].add(tally)
                ends[QuarterHour.of(row.e ?? row.q), default: AnalyticsTally()].add(tally)
            }
            return Analytics.stock(starts: starts, ends: ends, at: Analytics.instants(buckets, now: now.milliseconds))
        case .newSubscriptions:
            let rows = try await scan.rows { part in
                """
                SELECT \(key("d.purchased_at")) AS q, COUNT(*) AS n FROM \(table)
                WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND d.period_start IS NOT NULL
                AND \(counts)\(filtered)\(part)
                AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.original_transaction_id = d.original_transaction_id
                    AND e.period_start < d.period_start AND \(Self.counts("e"))\(filter.sql("e")))
                GROUP BY 1
                """
            }
            return Analytics.flow(tallies(rows), into: buckets)
        case .churnedSubscriptions:
            let ends: SQLQueryString = "(\(unsafeRaw: AnalyticsViews.endsAt))"
            let rows = try await scan.rows { part in
                """
                SELECT \(key("x.e")) AS q, x.r AS r, COUNT(*) AS n FROM (
                    SELECT \(ends) AS e,
                           CASE WHEN d.refunded_at IS NOT NULL OR s.status = 'revoked' THEN 'refund'
                                WHEN s.status = 'billing_retry' OR (s.status = 'expired' AND s.auto_renew = 1) THEN 'billing'
                                ELSE 'voluntary' END AS r
                    FROM \(table) LEFT JOIN subscriptions s ON s.original_transaction_id = d.original_transaction_id
                    WHERE d.period_end >= \(bind: from) AND d.period_start IS NOT NULL AND d.trial = 0
                    AND \(counts)\(filtered)\(part) AND (s.status IS NULL OR s.status <> 'grace_period')
                    AND NOT EXISTS (SELECT 1 FROM deliveries n WHERE n.original_transaction_id = d.original_transaction_id
                        AND n.period_start > d.period_start AND \(Self.counts("n"))\(filter.sql("n")))
                ) x WHERE x.e >= \(bind: from) AND x.e < \(bind: min(to, nowQuarter))
                GROUP BY 1, 2
                """
            }
            return Analytics.flow(tallies(rows, reason: true), into: buckets)
        case .trialConversion:
            let rows = try await scan.rows { part in
                """
                SELECT \(key("d.purchased_at")) AS q, COUNT(*) AS total,
                       SUM(CASE WHEN EXISTS (SELECT 1 FROM deliveries p
                           WHERE p.original_transaction_id = d.original_transaction_id AND p.period_start >= d.period_start
                           AND p.trial = 0 AND p.refunded_at IS NULL AND \(Self.counts("p"))) THEN 1 ELSE 0 END) AS n
                FROM \(table)
                WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND d.period_start IS NOT NULL
                AND d.trial = 1 AND \(counts)\(filtered)\(part) AND (\(unsafeRaw: AnalyticsViews.endsAt)) <= \(bind: nowQuarter)
                GROUP BY 1
                """
            }
            return Analytics.flow(tallies(rows, total: true), into: buckets)
        case .refundRate:
            let rows = try await scan.rows { part in
                """
                SELECT \(key("d.purchased_at")) AS q, COUNT(*) AS total,
                       SUM(CASE WHEN d.refunded_at IS NOT NULL THEN 1 ELSE 0 END) AS n
                FROM \(table)
                WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND d.price_milli > 0
                AND \(counts)\(filtered)\(part)
                GROUP BY 1
                """
            }
            return Analytics.flow(tallies(rows, total: true), into: buckets)
        case .proceeds:
            let rows = try await scan.rows { part in
                """
                SELECT \(key("d.purchased_at")) AS q, COALESCE(d.currency, '?') AS c, COUNT(*) AS n,
                       CAST(SUM(\(Self.kept(smallBusinessProgram))) AS BIGINT) AS m
                FROM \(table)
                WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND \(counts)\(filtered)\(part)
                GROUP BY 1, 2
                """
            }
            return Analytics.flow(tallies(rows, money: true), into: buckets)
        case .realizedLTV:
            // One pass: per account and currency its first purchase and proceeds, then each
            // account's first purchase over all its currencies (a window), counted once. (The
            // parts, if any, split the accounts: each account's rows are in one part.)
            let rows = try await scan.rows { part in
                """
                SELECT \(key("x.first")) AS q, x.c AS c, CAST(SUM(x.m) AS BIGINT) AS m,
                       SUM(CASE WHEN x.c = x.fc THEN 1 ELSE 0 END) AS n
                FROM (
                    SELECT a.c, a.m, MIN(a.f) OVER (PARTITION BY a.account_id) AS first,
                           MIN(a.c) OVER (PARTITION BY a.account_id) AS fc
                    FROM (
                        SELECT d.account_id, COALESCE(d.currency, '?') AS c, MIN(d.purchased_at) AS f,
                               CAST(SUM(\(Self.kept(smallBusinessProgram))) AS BIGINT) AS m
                        FROM \(table) WHERE \(counts)\(filtered)\(part)
                        GROUP BY d.account_id, COALESCE(d.currency, '?')
                    ) a
                ) x WHERE x.first >= \(bind: from) AND x.first < \(bind: to)
                GROUP BY 1, 2
                """
            }
            var cohorts: [Int64: AnalyticsTally] = [:]
            for row in rows {
                var tally = AnalyticsTally(count: row.n)
                tally.milli[row.c ?? "?"] = row.m ?? 0
                cohorts[QuarterHour.of(row.q), default: AnalyticsTally()].add(tally)
            }
            return Analytics.flow(cohorts, into: buckets)
        }
    }

    /// How a metric reads the deliveries: through the indexes for a short window; for a long one
    /// (or a metric that reads every row, as realized LTV does) as a whole — a lookup per row
    /// costs more than reading them all.
    /// PostgreSQL plans by its statistics, which miss two cases (BENCHMARKS.md), each corrected
    /// for a window reaching back over a quarter of the history or more by a planner setting
    /// for that statement alone (`SET LOCAL`, in a transaction of its own): churn's periods
    /// alive in the window (an expression of two columns) are estimated at a few hundred where
    /// there are hundreds of thousands, and each one's later periods looked up by index
    /// (~1.3 µs a row) — `enable_nestloop` off, it hashes them; realized LTV's million rows
    /// grouped by account and currency are sorted where hashing is faster — `enable_sort` off.
    /// SQLite keeps no statistics of ranges and takes an index for any window — a lookup of the
    /// row for each entry, about 2 µs, where a scan costs about 0.1 µs a row: for a window
    /// reaching back over a sixteenth of the history or more (a period alive in it may have
    /// started long before: 30 days of a year matched 18 % of the rows, read in 552 ms through
    /// the index, 256 ms by a scan) it scans (`NOT INDEXED`), in parts read at once on separate
    /// connections — SQLite groups by sorting, and smaller sorts on both cores are the faster.
    /// Rowid ranges split the rows; realized LTV, which groups by account, splits the accounts
    /// instead.
    func scanPlan(windowFrom from: Int64, now: Int64, metric: AnalyticsMetric, policy: AnalyticsScanPolicy)
        async throws -> AnalyticsScan
    {
        let byAccount = metric == .realizedLTV
        let indexed = AnalyticsScan(database: database, table: "deliveries d", parts: [""])
        guard !policy.alwaysIndex else { return indexed }
        let sqlite = database.kind == .sqlite
        let (oldest, last) = try await database.readStale { sql in
            let row = try await sql.raw(
                sqlite
                    ? "SELECT (SELECT MIN(purchased_at) FROM deliveries) AS oldest, (SELECT MAX(rowid) FROM deliveries) AS last"
                    : "SELECT (SELECT MIN(purchased_at) FROM deliveries) AS oldest, CAST(0 AS BIGINT) AS last"
            ).first()
            return (
                try row?.decode(column: "oldest", as: Int64?.self), try row?.decode(column: "last", as: Int64?.self)
            )
        }
        // The window's reach back as a share of the history: 1/4 for PostgreSQL, 1/16 for SQLite.
        let share: Int64 = sqlite ? 16 : 4
        guard let last,
            policy.alwaysScan || byAccount || oldest.map({ (now - from) * share >= now - $0 }) == true
        else { return indexed }
        guard sqlite else {
            let settings =
                switch metric {
                case .churnedSubscriptions: ["SET LOCAL enable_nestloop = off"]
                case .realizedLTV: ["SET LOCAL enable_sort = off"]
                default: [String]()
                }
            return AnalyticsScan(database: database, table: "deliveries d", parts: [""], settings: settings)
        }
        let table: SQLQueryString = "deliveries d NOT INDEXED"
        guard last >= policy.rowsPerPart else { return AnalyticsScan(database: database, table: table, parts: [""]) }
        if byAccount {
            let count = AnalyticsScan.accountParts
            return AnalyticsScan(
                database: database, table: table,
                parts: (0..<count).map {
                    " AND COALESCE(unicode(substr(d.account_id, -1)), 0) % \(unsafeRaw: String(count)) = \(unsafeRaw: String($0))"
                })
        }
        let count = AnalyticsScan.rowParts
        let bounds = (1..<count).map { String(last * Int64($0) / Int64(count)) }
        return AnalyticsScan(
            database: database, table: table,
            parts: (0..<count).map { index in
                let above: SQLQueryString = index == 0 ? "" : " AND d.rowid > \(unsafeRaw: bounds[index - 1])"
                let below: SQLQueryString = index == count - 1 ? "" : " AND d.rowid <= \(unsafeRaw: bounds[index])"
                return above + below
            })
    }

    /// What earns money (AnalyticsViews.counts) over the deliveries aliased `alias`, as plain
    /// conditions (the view's CASE … = 1 is the same test, but opaque to PostgreSQL's row
    /// estimates: with it the planner expected a few hundred rows and chose a lookup per row).
    static func counts(_ alias: String) -> SQLQueryString {
        "\(unsafeRaw: alias).quantity > 0 AND \(unsafeRaw: AnalyticsViews.earns.replacingOccurrences(of: "d.", with: "\(alias)."))"
    }

    /// Proceeds after refunds and commission, rounded down per transaction.
    /// (The Small Business Program reduces a store's commission; a web payment has none.)
    static func kept(_ smallBusinessProgram: Bool) -> SQLQueryString {
        "\(unsafeRaw: AnalyticsViews.kept(net: AnalyticsViews.netPrice, smallBusinessProgram: smallBusinessProgram))"
    }
}

/// How a metric reads the deliveries (`PurchaseStore.scanPlan`): tests force each plan on small
/// data.
public struct AnalyticsScanPolicy: Sendable {
    /// Read as a whole (SQLite: scan in parts; PostgreSQL: with its corrections) whatever the window.
    public var alwaysScan = false
    /// Read through the indexes (PostgreSQL: as it plans, without corrections) whatever the
    /// window; realized LTV included.
    public var alwaysIndex = false
    /// Below this many rows one part does.
    public var rowsPerPart: Int64 = 100_000

    public init(alwaysScan: Bool = false, alwaysIndex: Bool = false, rowsPerPart: Int64 = 100_000) {
        self.alwaysScan = alwaysScan
        self.alwaysIndex = alwaysIndex
        self.rowsPerPart = rowsPerPart
    }
}

/// One grouped row of an analytics statement: `q` its quarter hour (or unit), `e` a stock's end
/// unit, `c` a currency, `r` a churn reason, `n` a count, `total` a ratio's denominator, `m`
/// money in milli-units.
struct AnalyticsRow: Sendable {
    var q: Int64
    var e: Int64?
    var c: String?
    var r: String?
    var n: Int64
    var total: Int64?
    var m: Int64?
}

/// A metric's statement as `PurchaseStore.scanPlan` reads it: the table clause, and the parts
/// (extra conditions that split the rows between them, `""` for one part) it runs at once,
/// each in a read of its own off the event loops. The grouped rows of the parts are simply
/// concatenated: every row of the table is in exactly one part, and the callers add tallies.
struct AnalyticsScan: Sendable {
    static let rowParts = 4
    static let accountParts = 2

    let database: Database
    let table: SQLQueryString
    let parts: [SQLQueryString]
    /// PostgreSQL planner settings for the statement (`SET LOCAL …`, so in a transaction).
    var settings: [String] = []

    func rows(_ statement: @escaping @Sendable (SQLQueryString) -> SQLQueryString) async throws -> [AnalyticsRow] {
        let settings = self.settings
        @Sendable func read(_ body: @escaping @Sendable (any SQLDatabase) async throws -> [AnalyticsRow]) async throws
            -> [AnalyticsRow]
        {
            // Analytics tolerate a replica's bounded staleness (`database.readReplicaURL`).
            let database = await database.forStaleReads()
            guard !settings.isEmpty else { return try await database.read(body) }
            return try await database.transaction { sql in
                for setting in settings { try await sql.raw(SQLQueryString(setting)).run() }
                return try await body(sql)
            }
        }
        return try await withThrowingTaskGroup(of: [AnalyticsRow].self) { group in
            for part in parts {
                group.addTask(executorPreference: globalConcurrentExecutor) {
                    try await read { sql in
                        try await sql.raw(statement(part)).all().map { row in
                            func optional<T: Decodable>(_ column: String, _ type: T.Type) throws -> T? {
                                row.contains(column: column) ? try row.decode(column: column, as: T?.self) : nil
                            }
                            return AnalyticsRow(
                                q: try row.decode(column: "q", as: Int64.self), e: try optional("e", Int64.self),
                                c: try optional("c", String.self), r: try optional("r", String.self),
                                n: try optional("n", Int64.self) ?? 0, total: try optional("total", Int64.self),
                                m: try optional("m", Int64.self))
                        }
                    }
                }
            }
            var all: [AnalyticsRow] = []
            for try await rows in group { all += rows }
            return all
        }
    }
}
