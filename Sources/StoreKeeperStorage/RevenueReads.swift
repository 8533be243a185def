import Foundation
import SQLKit
import StoreKeeperCore

/// Revenue per currency over a time range, from each delivery's revenue facts (migration 11):
/// Production and other real environments only, refunded deliveries left out, partially
/// refunded ones counted for the share Apple kept (price less the refunded share, rounded down).
public struct RevenueSummary: Codable, Sendable, Equatable {
    public struct Currency: Codable, Sendable, Equatable {
        public var currency: String
        public var transactions: Int
        /// Apple's price, milliunits of `currency`.
        public var grossMilli: Int64
        /// What the developer keeps, milliunits of `currency`, rounded down per transaction.
        public var proceedsMilli: Int64
    }
    public var currencies: [Currency]
    /// Left out: Sandbox and Xcode deliveries, and refunded ones.
    public var sandboxTransactions: Int
    public var refundedTransactions: Int
    /// Prorated refunds: counted in `currencies` for what was not refunded.
    public var partiallyRefundedTransactions: Int
    public var smallBusinessProgram: Bool
}

extension ReportStore {
    /// A delivery's price less what a refund gave back (its share, rounded down), milliunits.
    static let netPrice =
        "(price_milli - CASE WHEN refunded_at IS NULL THEN 0 ELSE price_milli * COALESCE(refund_share, 100000) / 100000 END)"

    /// Summed by the database (one row per currency and kind, whatever the number of
    /// deliveries); each transaction's proceeds are rounded down before the sum, as Apple's
    /// milliunits are integers.
    public func revenue(from start: Date?, to end: Date?, smallBusinessProgram: Bool) async throws -> RevenueSummary {
        let from = start?.milliseconds ?? Int64.min
        let to = end?.milliseconds ?? Int64.max
        return try await database.readStale { sql in
            let net: SQLQueryString = "\(unsafeRaw: Self.netPrice)"
            let kept: SQLQueryString =
                "\(unsafeRaw: AnalyticsViews.kept(net: Self.netPrice, row: "", smallBusinessProgram: smallBusinessProgram))"
            let rows = try await sql.raw(
                """
                SELECT COALESCE(currency, '?') AS currency,
                       CASE WHEN proceeds_percent IS NULL OR environment IN ('Sandbox', 'Xcode') THEN 'sandbox'
                            WHEN refunded_at IS NOT NULL AND COALESCE(refund_share, 100000) >= 100000 THEN 'refunded'
                            WHEN refunded_at IS NOT NULL THEN 'partial' ELSE 'revenue' END AS kind,
                       COUNT(*) AS n, CAST(SUM(\(net)) AS BIGINT) AS gross, CAST(SUM(\(kept)) AS BIGINT) AS kept
                FROM deliveries
                WHERE delivered_at >= \(bind: from) AND delivered_at < \(bind: to) AND price_milli IS NOT NULL
                GROUP BY 1, 2 ORDER BY 1
                """
            ).all()
            var summary = RevenueSummary(
                currencies: [], sandboxTransactions: 0, refundedTransactions: 0, partiallyRefundedTransactions: 0,
                smallBusinessProgram: smallBusinessProgram)
            for row in rows {
                let count = try row.decode(column: "n", as: Int.self)
                let kind = try row.decode(column: "kind", as: String.self)
                switch kind {
                case "sandbox": summary.sandboxTransactions += count
                case "refunded": summary.refundedTransactions += count
                default:
                    if kind == "partial" { summary.partiallyRefundedTransactions += count }
                    let currency = try row.decode(column: "currency", as: String.self)
                    let gross = try row.decode(column: "gross", as: Int64.self)
                    let kept = try row.decode(column: "kept", as: Int64.self)
                    if let index = summary.currencies.firstIndex(where: { $0.currency == currency }) {
                        summary.currencies[index].transactions += count
                        summary.currencies[index].grossMilli += gross
                        summary.currencies[index].proceedsMilli += kept
                    } else {
                        summary.currencies.append(
                            RevenueSummary.Currency(
                                currency: currency, transactions: count, grossMilli: gross, proceedsMilli: kept))
                    }
                }
            }
            return summary
        }
    }
}
