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

    /// `periods`: the paid periods of the batch's auto-renewables by original transaction id,
    /// read from the deliveries when first needed, then extended by the batch itself.
    static func of(
        _ transaction: JWSTransactionDecodedPayload, originalId: String, isAutoRenewable: Bool,
        periods: inout [String: [Proceeds.Period]], sql: any SQLDatabase
    ) async throws -> Revenue {
        var earlier: [Proceeds.Period] = []
        var periodStart: Int64?
        var periodEnd: Int64?
        if isAutoRenewable, let start = transaction.purchaseDate, let end = transaction.expiresDate {
            if periods[originalId] == nil {
                let rows = try await sql.raw(
                    "SELECT period_start, period_end FROM deliveries WHERE original_transaction_id = \(bind: originalId) AND period_start IS NOT NULL AND period_end IS NOT NULL"
                ).all()
                periods[originalId] = try rows.map {
                    Proceeds.Period(
                        start: Date(milliseconds: try $0.decode(column: "period_start", as: Int64.self)),
                        end: Date(milliseconds: try $0.decode(column: "period_end", as: Int64.self)))
                }
            }
            earlier = periods[originalId] ?? []
            periodStart = start
            periodEnd = end
            periods[originalId, default: []].append(
                Proceeds.Period(start: Date(milliseconds: start), end: Date(milliseconds: end)))
        }
        return Revenue(
            price: transaction.price, currency: transaction.currency,
            percent: Proceeds.percent(of: transaction, earlierPeriods: earlier), periodStart: periodStart,
            periodEnd: periodEnd)
    }
}
