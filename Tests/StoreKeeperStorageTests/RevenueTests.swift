import AppStoreAdapter
import AppStoreModels
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import Testing

@testable import StoreKeeperStorage

/// Each delivery keeps its revenue facts: Apple's price and currency, the period paid for,
/// and the percent kept by `Proceeds` (70 %, 85 % after a year of paid service — a lapse of
/// more than 60 days starts the year again — none in Sandbox).
@Suite struct RevenueTests {
    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
              - { id: pro_monthly, type: auto_renewable, group: pro, period: P1M, grants: { entitlement: pro } }
            """)
    static let start = Date(timeIntervalSince1970: 1_735_689_600)  // 2025-01-01
    static let day: TimeInterval = 86_400

    static func row(_ database: Database, _ id: String) async throws -> (Int64?, String?, Int?, Int64?) {
        try await database.read { sql in
            let row = try #require(
                try await sql.raw(
                    "SELECT price_milli, currency, proceeds_percent, period_start FROM deliveries WHERE transaction_id = \(bind: id)"
                ).first())
            return (
                try row.decode(column: "price_milli", as: Int64?.self),
                try row.decode(column: "currency", as: String?.self),
                try row.decode(column: "proceeds_percent", as: Int?.self),
                try row.decode(column: "period_start", as: Int64?.self)
            )
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func consumablesKeepSeventyPercentAndSandboxNothing(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            for (id, environment) in [("9001", AppStoreEnvironment.production), ("9002", .sandbox)] {
                let transaction = StoreTransaction.appStore(
                    transactionId: id, originalTransactionId: id, bundleId: "com.example.app", productId: "coins_60",
                    purchaseDate: Self.start.milliseconds, quantity: 1, environment: environment, currency: "USD",
                    price: 990)
                _ = try await store.deliver(
                    transaction, submittingAccount: "u1", catalog: Self.catalog, now: Self.start)
            }
            let production = try await Self.row(database, "9001")
            #expect(production.0 == 990 && production.1 == "USD" && production.2 == 70 && production.3 == nil)
            let sandbox = try await Self.row(database, "9002")
            #expect(sandbox.0 == 990 && sandbox.2 == nil, "Sandbox is never revenue")
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func subscriptionsKeepEightyFivePercentAfterAYearAndAGapStartsItAgain(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            var periodStart = Self.start
            var percents: [Int?] = []
            func renew(_ index: Int) async throws {
                let id = String(9_100 + index)
                let end = periodStart.addingTimeInterval(31 * Self.day)
                let transaction = StoreTransaction.appStore(
                    transactionId: id, originalTransactionId: "9100", bundleId: "com.example.app",
                    productId: "pro_monthly", purchaseDate: periodStart.milliseconds,
                    expiresDate: end.milliseconds, quantity: 1, type: .autoRenewable,
                    signedDate: periodStart.milliseconds,
                    environment: .production, currency: "USD", price: 4_990)
                _ = try await store.deliver(
                    transaction, submittingAccount: "u2", catalog: Self.catalog, now: periodStart)
                percents.append(try await Self.row(database, id).2)
                periodStart = end
            }
            for index in 0..<14 { try await renew(index) }
            // 12 periods of 31 days = 372 days of paid service before the 13th.
            #expect(percents == Array(repeating: 70, count: 12) + [85, 85], "\(percents)")
            // A lapse of 70 days: the year starts again.
            periodStart = periodStart.addingTimeInterval(70 * Self.day)
            try await renew(14)
            #expect(percents.last == 70)
        }
    }
}
