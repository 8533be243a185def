import Foundation
import SQLKit
import StoreKeeperCore
import StoreKeeperSupport

/// A delivery's revenue facts: Apple's price and currency, the period it paid for, and the
/// percent kept by the core's `Proceeds` rule (nil in Sandbox and Xcode). The Small Business
/// Program is the developer's status, not the transaction's: applied when figures are read.
struct Revenue {
    var price: Int64?
    var currency: String?
    var percent: Int?
    /// What the store stated the developer received (Stripe's net), when it did.
    var stated: Int64? = nil
    var periodStart: Int64?
    var periodEnd: Int64?
    /// Analytics' facts (migration 20): the store's purchase date, storefront, a free trial,
    /// Family Sharing; and whether this period overlaps another of the same subscription (an
    /// upgrade cuts the earlier one short: `superseded_at`).
    var purchasedAt: Int64?
    var storefront: String?
    var trial = false
    var familyShared = false
    var overlaps = false

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
        _ transaction: StoreTransaction, originalId: String, isAutoRenewable: Bool,
        periods: inout [String: [Proceeds.Period]], sql: any SQLDatabase
    ) async throws -> Revenue {
        var earlier: [Proceeds.Period] = []
        var periodStart: Int64?
        var periodEnd: Int64?
        var overlaps = false
        if isAutoRenewable, let start = transaction.purchaseDate, let end = transaction.expiresDate {
            if periods[originalId] == nil {
                periods.merge(try await Self.periods(of: [originalId], sql: sql)) { $1 }
            }
            earlier = periods[originalId] ?? []
            var start = start
            if !Proceeds.datesEachPeriod(transaction.store) {
                // The store names the subscription's start, not the period's: a renewal's
                // period starts where the one before it ended.
                let previous = earlier.map(\.end.milliseconds).filter { $0 > start && $0 < end }.max()
                start = previous ?? start
            }
            periodStart = start
            periodEnd = end
            let (from, to) = (Date(milliseconds: start), Date(milliseconds: end))
            overlaps = earlier.contains { ($0.start < from && $0.end > from) || ($0.start > from && $0.start < to) }
            periods[originalId, default: []].append(
                Proceeds.Period(start: Date(milliseconds: start), end: Date(milliseconds: end)))
        }
        return Revenue(
            price: transaction.price, currency: transaction.currency,
            percent: Proceeds.percent(of: transaction, earlierPeriods: earlier), stated: transaction.proceeds,
            periodStart: periodStart,
            periodEnd: periodEnd, purchasedAt: periodStart ?? transaction.purchaseDate,
            storefront: transaction.storefront,
            trial: transaction.offerDiscountType == .freeTrial
                || (transaction.offerType != nil && transaction.price == 0),
            familyShared: transaction.ownership == .familyShared, overlaps: overlaps)
    }

    /// Where periods of one subscription overlap (an upgrade starts a period before the current
    /// one ends), the earlier ends where the later starts: `superseded_at`, what analytics
    /// count as its end. Runs only for a delivery whose period overlaps another.
    static func supersede(originalId: String, start: Int64, end: Int64, sql: any SQLDatabase) async throws {
        try await sql.raw(
            """
            UPDATE deliveries SET superseded_at = \(bind: start)
            WHERE original_transaction_id = \(bind: originalId) AND period_start < \(bind: start)
            AND period_end > \(bind: start) AND (superseded_at IS NULL OR superseded_at > \(bind: start))
            """
        ).run()
        try await sql.raw(
            """
            UPDATE deliveries SET superseded_at = (
                SELECT MIN(n.period_start) FROM deliveries n WHERE n.original_transaction_id = \(bind: originalId)
                AND n.period_start > \(bind: start) AND n.period_start < \(bind: end))
            WHERE original_transaction_id = \(bind: originalId) AND period_start = \(bind: start)
            AND EXISTS (SELECT 1 FROM deliveries n WHERE n.original_transaction_id = \(bind: originalId)
                AND n.period_start > \(bind: start) AND n.period_start < \(bind: end))
            """
        ).run()
    }
}
