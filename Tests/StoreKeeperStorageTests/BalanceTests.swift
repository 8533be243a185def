import Foundation
import SQLKit
import StoreKeeperCore
import Testing

@testable import StoreKeeperStorage

/// Balances: kept beside the ledger in the same transactions, always equal to the sum of its
/// entries; debits never overdraw, even when many arrive at once on PostgreSQL.
@Suite struct BalanceTests {
    static let now = PurchaseStoreTests.now

    /// Every balance row against the sum of its ledger entries, both ways.
    static func expectBalancesMatchLedger(_ database: Database) async throws {
        let (balances, sums) = try await database.read { sql in
            let balances = try await sql.raw("SELECT account_id, currency, amount FROM balances").all().map {
                "\(try $0.decode(column: "account_id", as: String.self))/\(try $0.decode(column: "currency", as: String.self))=\(try $0.decode(column: "amount", as: Int64.self))"
            }
            let sums = try await sql.raw(
                "SELECT account_id, currency, CAST(SUM(amount) AS BIGINT) AS total FROM ledger GROUP BY account_id, currency"
            ).all().map {
                "\(try $0.decode(column: "account_id", as: String.self))/\(try $0.decode(column: "currency", as: String.self))=\(try $0.decode(column: "total", as: Int64.self))"
            }
            return (balances, sums)
        }
        #expect(Set(balances) == Set(sums))
        #expect(balances.count == sums.count)
    }

    static func fund(_ store: PurchaseStore, account: String, times: Int, base: Int) async throws {
        for index in 0..<times {
            _ = try await store.deliver(
                PurchaseStoreTests.transaction("coins_300", id: String(2_300_000_000_000_000 + base + index)),
                submittingAccount: account, catalog: PurchaseStoreTests.catalog, now: Self.now)
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func concurrentDebitsNeverOverdraw(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            try await Self.fund(store, account: "spender", times: 4, base: 0)  // 1,200 coins
            // 64 debits of 100 at once, each with its own key: exactly 12 can be paid.
            let results = try await withThrowingTaskGroup(of: AccountStore.DebitResult.self) { group in
                for index in 0..<64 {
                    group.addTask {
                        try await store.accounts.debit(
                            accountId: "spender", currency: "coins", amount: 100, idempotencyKey: "spend-\(index)",
                            now: Self.now)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let paid = results.compactMap { if case .debited(let after) = $0 { after } else { nil } }
            #expect(paid.count == 12)
            #expect(Set(paid) == Set(stride(from: 0, to: 1_200, by: 100).map(Int64.init)))  // each balance once
            #expect(results.allSatisfy { if case .insufficient(let balance) = $0 { balance < 100 } else { true } })
            #expect(try await store.accounts.balances(of: "spender") == ["coins": 0])
            try await Self.expectBalancesMatchLedger(database)
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func concurrentTwinsOfOneDebitPayOnce(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            try await Self.fund(store, account: "twin", times: 1, base: 100)  // 300 coins
            let results = try await withThrowingTaskGroup(of: AccountStore.DebitResult.self) { group in
                for _ in 0..<32 {
                    group.addTask {
                        try await store.accounts.debit(
                            accountId: "twin", currency: "coins", amount: 120, idempotencyKey: "same-key", now: Self.now
                        )
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.allSatisfy { $0 == .debited(balance: 180) })
            #expect(try await store.accounts.balances(of: "twin") == ["coins": 180])
            try await Self.expectBalancesMatchLedger(database)
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func deliveriesAndDebitsInterleavedKeepBalancesEqualToTheLedger(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<60 {
                    let account = "mix-\(index % 5)"
                    group.addTask {
                        _ = try await store.deliver(
                            PurchaseStoreTests.transaction(
                                index % 2 == 0 ? "coins_60" : "coins_300", id: String(2_310_000_000_000_000 + index)),
                            submittingAccount: account, catalog: PurchaseStoreTests.catalog, now: Self.now)
                    }
                    group.addTask {
                        _ = try await store.accounts.debit(
                            accountId: account, currency: "coins", amount: 50, idempotencyKey: "mix-\(index)",
                            now: Self.now)
                    }
                }
                try await group.waitForAll()
            }
            try await Self.expectBalancesMatchLedger(database)
            for index in 0..<5 {
                #expect((try await store.accounts.balances(of: "mix-\(index)")["coins"] ?? 0) >= 0)
            }
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func upgradingFillsBalancesFromTheLedger(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            try await Self.fund(store, account: "old-a", times: 3, base: 200)
            try await Self.fund(store, account: "old-b", times: 1, base: 300)
            _ = try await store.accounts.debit(
                accountId: "old-a", currency: "coins", amount: 250, idempotencyKey: "before-upgrade", now: Self.now)
            // A database from before version 4: no balances table, only the ledger.
            try await database.transaction { sql in
                try await sql.raw("DROP TABLE balances").run()
                try await sql.raw("DELETE FROM schema_migrations WHERE version = 4").run()
            }
            try await Migrations.run(on: database)
            #expect(try await store.accounts.balances(of: "old-a") == ["coins": 650])
            #expect(try await store.accounts.balances(of: "old-b") == ["coins": 300])
            try await Self.expectBalancesMatchLedger(database)
            #expect(try await Migrations.appliedVersions(on: database) == Migrations.all.map(\.version))
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func accountStatesReadBalancesAndEntitlementsTogether(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            try await Self.fund(store, account: "both", times: 2, base: 500)
            for (account, id) in [("both", "2390000000000001"), ("ads-only", "2390000000000002")] {
                _ = try await store.deliver(
                    PurchaseStoreTests.transaction("remove_ads", id: id), submittingAccount: account,
                    catalog: PurchaseStoreTests.catalog, now: Self.now)
            }
            let states = try await database.read { sql in
                try await AccountStore.accountStates(["both", "ads-only", "nobody"], sql: sql)
            }
            #expect(states["both"]?.balances == ["coins": 600])
            #expect(states["both"]?.entitlements.map(\.entitlementId) == ["no_ads"])
            #expect(states["both"]?.entitlements.first?.originalTransactionId == "2390000000000001")
            #expect(states["ads-only"]?.balances == [:])
            #expect(states["ads-only"]?.entitlements.map(\.productId) == ["remove_ads"])
            #expect(states["ads-only"]?.entitlements.first?.expiresAt == nil)
            #expect(states["nobody"] == nil)
            #expect(try await store.accounts.account("nobody") == PurchaseStore.AccountState())
        }
    }
}
