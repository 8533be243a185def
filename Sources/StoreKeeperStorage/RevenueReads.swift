import Foundation
import SQLKit
import StoreKeeperCore

/// Revenue per currency over a time range, from each delivery's revenue facts (migration 11):
/// Production and other real environments only, refunded deliveries left out.
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
    public var smallBusinessProgram: Bool
}

extension PurchaseStore {
    public func revenue(from start: Date?, to end: Date?, smallBusinessProgram: Bool) async throws -> RevenueSummary {
        let from = start?.milliseconds ?? Int64.min
        let to = end?.milliseconds ?? Int64.max
        return try await database.read { sql in
            let rows = try await sql.raw(
                """
                SELECT currency, price_milli, proceeds_percent, environment, refunded_at FROM deliveries
                WHERE delivered_at >= \(bind: from) AND delivered_at < \(bind: to) AND price_milli IS NOT NULL
                """
            ).all()
            var byCurrency: [String: RevenueSummary.Currency] = [:]
            var sandbox = 0
            var refunded = 0
            for row in rows {
                let environment = try row.decode(column: "environment", as: String.self)
                guard environment != "Sandbox", environment != "Xcode",
                    let percent = try row.decode(column: "proceeds_percent", as: Int?.self)
                else {
                    sandbox += 1
                    continue
                }
                if try row.decode(column: "refunded_at", as: Int64?.self) != nil {
                    refunded += 1
                    continue
                }
                let currency = try row.decode(column: "currency", as: String?.self) ?? "?"
                let price = try row.decode(column: "price_milli", as: Int64.self)
                let kept = smallBusinessProgram ? Proceeds.reducedCommissionPercent : percent
                let (product, overflow) = price.multipliedReportingOverflow(by: Int64(kept))
                var line =
                    byCurrency[currency]
                    ?? RevenueSummary.Currency(currency: currency, transactions: 0, grossMilli: 0, proceedsMilli: 0)
                line.transactions += 1
                line.grossMilli = line.grossMilli &+ price
                line.proceedsMilli = line.proceedsMilli &+ (overflow ? price / 100 * Int64(kept) : product / 100)
                byCurrency[currency] = line
            }
            return RevenueSummary(
                currencies: byCurrency.values.sorted { $0.currency < $1.currency }, sandboxTransactions: sandbox,
                refundedTransactions: refunded, smallBusinessProgram: smallBusinessProgram)
        }
    }
}
