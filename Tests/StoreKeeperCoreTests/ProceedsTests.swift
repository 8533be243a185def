import AppStoreAdapter
import AppStoreModels
import Foundation
import Testing

@testable import StoreKeeperCore

/// Proceeds: 70 %, 85 % after a year of paid subscription service (reset by a gap of more
/// than 60 days) or under the Small Business Program, nothing for Sandbox.
@Suite struct ProceedsTests {
    static let start = Date(timeIntervalSince1970: 1_700_000_000)
    static func at(_ days: Double) -> Date { start.addingTimeInterval(days * 86_400) }

    static func transaction(
        price: Int64 = 9_990, type: ProductType = .autoRenewable, purchased days: Double = 0,
        environment: AppStoreEnvironment = .production
    ) -> StoreTransaction {
        var payload = StoreTransaction.appStore()
        payload.transactionId = "1"
        payload.price = price
        payload.kind = StoreTransaction.ProductKind(rawValue: type.rawValue)
        payload.purchaseDate = Int64(at(days).timeIntervalSince1970 * 1000)
        payload.environment = StoreEnvironment(rawValue: environment.rawValue)
        return payload
    }

    /// Twelve monthly periods of ~30.4 days from `first` on, back to back.
    static func year(from first: Double) -> [Proceeds.Period] {
        (0..<12).map { month in
            Proceeds.Period(start: at(first + Double(month) * 30.42), end: at(first + Double(month + 1) * 30.42))
        }
    }

    @Test func seventyPercentByDefaultExactInIntegers() {
        #expect(Proceeds.amount(of: Self.transaction(price: 990, type: .consumable)) == 693)
        #expect(Proceeds.amount(of: Self.transaction(price: 9_990)) == 6_993)
        #expect(Proceeds.percent(of: Self.transaction(type: .nonConsumable)) == 70)
    }

    /// Each store's economics is a per-store value in the core, never read from an id.
    @Test func eachStoreKeepsItsOwnShare() {
        func on(_ store: Store, _ transaction: StoreTransaction) -> StoreTransaction {
            var transaction = transaction
            transaction.store = store
            return transaction
        }
        let subscription = Self.transaction(price: 9_990)
        let coins = Self.transaction(price: 990, type: .consumable)
        #expect(Proceeds.percent(of: on(.googlePlay, subscription)) == 85)
        #expect(Proceeds.percent(of: on(.googlePlay, coins)) == 70)
        #expect(Proceeds.percent(of: on(.googlePlay, coins), smallBusinessProgram: true) == 85)
        #expect(Proceeds.percent(of: on(.web, coins)) == 100)
        #expect(Proceeds.percent(of: on(.web, coins), smallBusinessProgram: true) == 100)
        #expect(Proceeds.amount(of: on(.web, coins)) == 990)
        #expect(!Proceeds.datesEachPeriod(.googlePlay) && Proceeds.datesEachPeriod(.appStore))
    }

    @Test func eightyFivePercentAfterAYearOfPaidService() {
        let history = Self.year(from: 0)
        let renewal = Self.transaction(purchased: 365.1)
        #expect(Proceeds.percent(of: renewal, earlierPeriods: history) == 85)
        // Before the year is full: still 70 %.
        #expect(Proceeds.percent(of: Self.transaction(purchased: 200), earlierPeriods: history) == 70)
        #expect(Proceeds.amount(of: renewal, earlierPeriods: history) == 8_491)
    }

    @Test func aGapOfMoreThanSixtyDaysStartsTheYearAgain() {
        let history = Self.year(from: 0)
        // Back after 61 days without paid service: the year starts over.
        #expect(Proceeds.percent(of: Self.transaction(purchased: 365.1 + 61), earlierPeriods: history) == 70)
        // Back after 59 days: the year of service still counts.
        #expect(Proceeds.percent(of: Self.transaction(purchased: 365.1 + 59), earlierPeriods: history) == 85)
        // A long gap in the middle: only the service after it counts.
        let split = Array(Self.year(from: 0).prefix(6)) + Self.year(from: 300).prefix(6)
        #expect(Proceeds.paidService(before: Self.at(500), periods: split) < Proceeds.oneYear)
    }

    @Test func smallBusinessProgramAndSandbox() {
        #expect(Proceeds.percent(of: Self.transaction(type: .consumable), smallBusinessProgram: true) == 85)
        #expect(Proceeds.percent(of: Self.transaction(environment: .sandbox)) == nil)
        #expect(Proceeds.amount(of: Self.transaction(environment: .xcode)) == nil)
        var free = Self.transaction()
        free.price = nil
        #expect(Proceeds.amount(of: free) == nil)
        #expect(Proceeds.amount(of: Self.transaction(price: .max)) != nil)
    }
}
