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

extension PurchaseStore {
    /// One tally per bucket for `metric` (docs/analytics.md): the database sums per quarter hour
    /// (or per cohort); `Analytics` places the sums in the buckets. `now` caps the stock
    /// metrics' instants and what counts as ended.
    public func analytics(
        _ metric: AnalyticsMetric, filter: AnalyticsFilter, buckets: [AnalyticsCalendar.Bucket], now: Date,
        smallBusinessProgram: Bool
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
        return try await database.read { sql in
            func tallies(_ query: SQLQueryString, money: Bool = false, total: Bool = false, reason: Bool = false)
                async throws -> [Int64: AnalyticsTally]
            {
                var result: [Int64: AnalyticsTally] = [:]
                for row in try await sql.raw(query).all() {
                    let quarter = QuarterHour.of(try row.decode(column: "q", as: Int64.self))
                    var tally = AnalyticsTally()
                    tally.count = try row.decode(column: "n", as: Int64?.self) ?? 0
                    if total { tally.total = try row.decode(column: "total", as: Int64?.self) ?? 0 }
                    if money, let amount = try row.decode(column: "m", as: Int64?.self) {
                        // A money row's count is its transactions; the flows do not report it.
                        tally.milli[try row.decode(column: "c", as: String.self)] = amount
                        tally.count = 0
                    }
                    if reason { tally.byReason[try row.decode(column: "r", as: String.self)] = tally.count }
                    result[quarter, default: AnalyticsTally()].add(tally)
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
                let rows = try await sql.raw(
                    """
                    SELECT \(key("d.period_start")) AS q, \(key("(" + AnalyticsViews.endsAt + ")")) AS e, \(select)
                    FROM deliveries d WHERE d.period_end >= \(bind: from) AND d.period_start IS NOT NULL
                    AND d.refunded_at IS NULL AND \(kind) AND \(counts)\(filtered) GROUP BY 1, 2, 3
                    """
                ).all()
                var starts: [Int64: AnalyticsTally] = [:]
                var ends: [Int64: AnalyticsTally] = [:]
                for row in rows {
                    var tally = AnalyticsTally(count: try row.decode(column: "n", as: Int64.self))
                    if metric == .mrr, let amount = try row.decode(column: "m", as: Int64?.self) {
                        tally.milli[try row.decode(column: "c", as: String.self)] = amount
                    }
                    starts[QuarterHour.of(try row.decode(column: "q", as: Int64.self)), default: AnalyticsTally()].add(
                        tally)
                    ends[QuarterHour.of(try row.decode(column: "e", as: Int64.self)), default: AnalyticsTally()].add(
                        tally)
                }
                return Analytics.stock(
                    starts: starts, ends: ends, at: Analytics.instants(buckets, now: now.milliseconds))
            case .newSubscriptions:
                let quarters = try await tallies(
                    """
                    SELECT \(key("d.purchased_at")) AS q, COUNT(*) AS n FROM deliveries d
                    WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND d.period_start IS NOT NULL
                    AND \(counts)\(filtered)
                    AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.original_transaction_id = d.original_transaction_id
                        AND e.period_start < d.period_start AND \(Self.counts("e"))\(filter.sql("e")))
                    GROUP BY 1
                    """)
                return Analytics.flow(quarters, into: buckets)
            case .churnedSubscriptions:
                let ends: SQLQueryString = "(\(unsafeRaw: AnalyticsViews.endsAt))"
                let quarters = try await tallies(
                    """
                    SELECT \(key("x.e")) AS q, x.r AS r, COUNT(*) AS n FROM (
                        SELECT \(ends) AS e,
                               CASE WHEN d.refunded_at IS NOT NULL OR s.status = 'revoked' THEN 'refund'
                                    WHEN s.status = 'billing_retry' OR (s.status = 'expired' AND s.auto_renew = 1) THEN 'billing'
                                    ELSE 'voluntary' END AS r
                        FROM deliveries d LEFT JOIN subscriptions s ON s.original_transaction_id = d.original_transaction_id
                        WHERE d.period_end >= \(bind: from) AND d.period_start IS NOT NULL AND d.trial = 0
                        AND \(counts)\(filtered) AND (s.status IS NULL OR s.status <> 'grace_period')
                        AND NOT EXISTS (SELECT 1 FROM deliveries n WHERE n.original_transaction_id = d.original_transaction_id
                            AND n.period_start > d.period_start AND \(Self.counts("n"))\(filter.sql("n")))
                    ) x WHERE x.e >= \(bind: from) AND x.e < \(bind: min(to, nowQuarter))
                    GROUP BY 1, 2
                    """, reason: true)
                return Analytics.flow(quarters, into: buckets)
            case .trialConversion:
                let quarters = try await tallies(
                    """
                    SELECT \(key("d.purchased_at")) AS q, COUNT(*) AS total,
                           SUM(CASE WHEN EXISTS (SELECT 1 FROM deliveries p
                               WHERE p.original_transaction_id = d.original_transaction_id AND p.period_start >= d.period_start
                               AND p.trial = 0 AND p.refunded_at IS NULL AND \(Self.counts("p"))) THEN 1 ELSE 0 END) AS n
                    FROM deliveries d
                    WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND d.period_start IS NOT NULL
                    AND d.trial = 1 AND \(counts)\(filtered) AND (\(unsafeRaw: AnalyticsViews.endsAt)) <= \(bind: nowQuarter)
                    GROUP BY 1
                    """, total: true)
                return Analytics.flow(quarters, into: buckets)
            case .refundRate:
                let quarters = try await tallies(
                    """
                    SELECT \(key("d.purchased_at")) AS q, COUNT(*) AS total,
                           SUM(CASE WHEN d.refunded_at IS NOT NULL THEN 1 ELSE 0 END) AS n
                    FROM deliveries d
                    WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND d.price_milli > 0
                    AND \(counts)\(filtered)
                    GROUP BY 1
                    """, total: true)
                return Analytics.flow(quarters, into: buckets)
            case .proceeds:
                let quarters = try await tallies(
                    """
                    SELECT \(key("d.purchased_at")) AS q, COALESCE(d.currency, '?') AS c, COUNT(*) AS n,
                           CAST(SUM(\(Self.kept(smallBusinessProgram))) AS BIGINT) AS m
                    FROM deliveries d
                    WHERE d.purchased_at >= \(bind: from) AND d.purchased_at < \(bind: to) AND \(counts)\(filtered)
                    GROUP BY 1, 2
                    """, money: true)
                return Analytics.flow(quarters, into: buckets)
            case .realizedLTV:
                // One pass: per account and currency its first purchase and proceeds, then each
                // account's first purchase over all its currencies (a window), counted once.
                let rows = try await sql.raw(
                    """
                    SELECT \(key("x.first")) AS q, x.c AS c, CAST(SUM(x.m) AS BIGINT) AS m,
                           SUM(CASE WHEN x.rn = 1 THEN 1 ELSE 0 END) AS n
                    FROM (
                        SELECT a.c, a.m, MIN(a.f) OVER (PARTITION BY a.account_id) AS first,
                               ROW_NUMBER() OVER (PARTITION BY a.account_id ORDER BY a.c) AS rn
                        FROM (
                            SELECT d.account_id, COALESCE(d.currency, '?') AS c, MIN(d.purchased_at) AS f,
                                   CAST(SUM(\(Self.kept(smallBusinessProgram))) AS BIGINT) AS m
                            FROM deliveries d WHERE \(counts)\(filtered)
                            GROUP BY d.account_id, COALESCE(d.currency, '?')
                        ) a
                    ) x WHERE x.first >= \(bind: from) AND x.first < \(bind: to)
                    GROUP BY 1, 2
                    """
                ).all()
                var cohorts: [Int64: AnalyticsTally] = [:]
                for row in rows {
                    var tally = AnalyticsTally(count: try row.decode(column: "n", as: Int64.self))
                    tally.milli[try row.decode(column: "c", as: String.self)] = try row.decode(
                        column: "m", as: Int64.self)
                    cohorts[QuarterHour.of(try row.decode(column: "q", as: Int64.self)), default: AnalyticsTally()]
                        .add(tally)
                }
                return Analytics.flow(cohorts, into: buckets)
            }
        }
    }

    /// What earns money (AnalyticsViews.counts) over the deliveries aliased `alias`.
    static func counts(_ alias: String) -> SQLQueryString {
        "\(unsafeRaw: alias).quantity > 0 AND (\(unsafeRaw: AnalyticsViews.counts.replacingOccurrences(of: "d.", with: "\(alias)."))) = 1"
    }

    /// Proceeds after refunds and commission, rounded down per transaction.
    static func kept(_ smallBusinessProgram: Bool) -> SQLQueryString {
        smallBusinessProgram
            ? "\(unsafeRaw: AnalyticsViews.netPrice) * \(unsafeRaw: String(Proceeds.reducedCommissionPercent)) / 100"
            : "\(unsafeRaw: AnalyticsViews.netPrice) * d.proceeds_percent / 100"
    }
}
