import AppStoreModels
import Foundation
import SQLKit
import StoreKeeperCore

/// A delivery's revenue facts: Apple's price and currency, the period it paid for, and the
/// percent kept by the core's `Proceeds` rule (nil in Sandbox and Xcode). The Small Business
/// Program is the developer's status, not the transaction's: applied when figures are read.
struct Revenue {
    var price: Int64?
    var currency: String?
    var percent: Int?
    var periodStart: Int64?
    var periodEnd: Int64?

    /// The paid periods already delivered for these auto-renewables, by original transaction
    /// id: one query for a whole batch (every id present, empty when none).
    static func periods(of originals: [String], sql: any SQLDatabase) async throws -> [String: [Proceeds.Period]] {
        var periods = Dictionary(uniqueKeysWithValues: originals.map { ($0, [Proceeds.Period]()) })
        guard !originals.isEmpty else { return periods }
        let rows = try await sql.raw(
            """
            SELECT original_transaction_id, period_start, period_end FROM deliveries
            WHERE original_transaction_id IN (\(binds: originals)) AND period_start IS NOT NULL AND period_end IS NOT NULL
            """
        ).all()
        for row in rows {
            periods[try row.decode(column: "original_transaction_id", as: String.self), default: []].append(
                Proceeds.Period(
                    start: Date(milliseconds: try row.decode(column: "period_start", as: Int64.self)),
                    end: Date(milliseconds: try row.decode(column: "period_end", as: Int64.self))))
        }
        return periods
    }

    /// `periods`: from `periods(of:sql:)`, extended here with this delivery's own period so
    /// later items of the same batch see it. A subscription missing from it is read alone.
    static func of(
        _ transaction: JWSTransactionDecodedPayload, originalId: String, isAutoRenewable: Bool,
        periods: inout [String: [Proceeds.Period]], sql: any SQLDatabase
    ) async throws -> Revenue {
        var earlier: [Proceeds.Period] = []
        var periodStart: Int64?
        var periodEnd: Int64?
        if isAutoRenewable, let start = transaction.purchaseDate, let end = transaction.expiresDate {
            if periods[originalId] == nil {
                periods.merge(try await Self.periods(of: [originalId], sql: sql)) { $1 }
            }
            earlier = periods[originalId] ?? []
            periodStart = start
            periodEnd = end
            periods[originalId, default: []].append(
                Proceeds.Period(start: Date(milliseconds: start), end: Date(milliseconds: end)))
        }
        return Revenue(
            price: transaction.price, currency: transaction.currency,
            // A web checkout's payment is the developer's own (Apple's commission on link-outs,
            // where one applies, is invoiced apart and not modelled here).
            percent: transaction.isWebPurchase
                ? 100 : Proceeds.percent(of: transaction, earlierPeriods: earlier), periodStart: periodStart,
            periodEnd: periodEnd)
    }
}
