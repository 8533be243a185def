import AppStoreAdapter
import AppStoreModels
import Foundation
import StoreKeeperCatalog
import StoreKeeperCore
import Testing

@testable import StoreKeeperStorage

/// Orders and exactly-once delivery on real databases: SQLite always, PostgreSQL when
/// STOREKEEPER_TEST_POSTGRES_URL is set (CI always sets it).
@Suite struct PurchaseStoreTests {
    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
              - { id: coins_300, type: consumable, grants: { currency: coins, amount: 300 } }
              - { id: remove_ads, type: non_consumable, grants: { entitlement: no_ads } }
            """)
    static let now = Date(timeIntervalSince1970: 1_767_225_600)

    static var kinds: [Database.Kind] {
        ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] == nil ? [.sqlite] : [.sqlite, .postgres]
    }

    static func transaction(
        _ productId: String = "coins_60", id: String = "2000000000000001", quantity: Int32 = 1, token: UUID? = nil
    ) -> StoreTransaction {
        StoreTransaction.appStore(
            transactionId: id, originalTransactionId: id, bundleId: "com.example.app", productId: productId,
            purchaseDate: now.milliseconds, quantity: quantity, appAccountToken: token?.uuidString.lowercased(),
            environment: .production)
    }

    @Test(arguments: kinds)
    func happyPathAndRepeatsDeliverOnce(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            let order = try await store.orders.createOrder(
                accountId: "u42", productId: "coins_60", quantity: 2, now: Self.now)
            let transaction = Self.transaction(quantity: 2, token: order.appAccountToken)
            let first = try await store.deliver(
                transaction, submittingAccount: "u42", catalog: Self.catalog, now: Self.now)
            #expect(first.plan.outcome == .delivered)
            #expect(try await store.orders.order(order.orderId)?.status == .delivered)
            #expect(try await store.orders.order(order.orderId)?.transactionId == "2000000000000001")
            let again = try await store.deliver(
                transaction, submittingAccount: "u42", catalog: Self.catalog, now: Self.now)
            #expect(again.plan.outcome == .alreadyDelivered)
            #expect(again.existing?.orderId == order.orderId)
            #expect(try await store.accounts.balances(of: "u42") == ["coins": 120])
            #expect(try await store.accounts.deliveries(of: "u42").count == 1)
        }
    }

    @Test(arguments: kinds)
    func sixtyFourConcurrentSubmissionsDeliverOnce(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            let order = try await store.orders.createOrder(
                accountId: "u1", productId: "coins_60", quantity: 1, now: Self.now)
            let transaction = Self.transaction(token: order.appAccountToken)
            let outcomes = try await withThrowingTaskGroup(of: DeliveryPlanner.Outcome.self) { group in
                for _ in 0..<64 {
                    group.addTask {
                        try await store.deliver(
                            transaction, submittingAccount: "u1", catalog: Self.catalog, now: Self.now
                        ).plan
                            .outcome
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == .delivered }.count == 1)
            #expect(outcomes.filter { $0 == .alreadyDelivered }.count == 63)
            #expect(try await store.accounts.balances(of: "u1") == ["coins": 60])
        }
    }

    @Test(arguments: kinds)
    func groupCommitKeepsEveryDeliveryDistinctAndExact(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            // 150 distinct transactions, each submitted twice, all at once: batches mix
            // first deliveries and duplicates of items in the same batch.
            let ids = (0..<150).map { String(2_100_000_000_000_000 + $0) }
            let outcomes = try await withThrowingTaskGroup(of: DeliveryPlanner.Outcome.self) { group in
                for id in ids + ids {
                    group.addTask {
                        try await store.deliver(
                            Self.transaction(id: id), submittingAccount: "bulk", catalog: Self.catalog, now: Self.now
                        ).plan.outcome
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == .delivered }.count == 150)
            #expect(outcomes.filter { $0 == .alreadyDelivered }.count == 150)
            #expect(try await store.accounts.balances(of: "bulk") == ["coins": 150 * 60])
            #expect(try await store.accounts.deliveries(of: "bulk").count == 150)
        }
    }

    @Test(arguments: kinds)
    func batchedDeliveriesConsumeEachOpenOrderOnce(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            let older = try await store.orders.createOrder(
                accountId: "fifo", productId: "coins_60", quantity: 1, now: Self.now)
            let newer = try await store.orders.createOrder(
                accountId: "fifo", productId: "coins_60", quantity: 1, now: Self.now.addingTimeInterval(10))
            let ids = (0..<5).map { String(2_200_000_000_000_000 + $0) }
            // Five payments without a token, at once: two pay the open orders (oldest first),
            // three are delivered to the account without an order; no order is paid twice.
            let results = try await withThrowingTaskGroup(of: DeliveryPlanner.Plan.self) { group in
                for id in ids {
                    group.addTask {
                        try await store.deliver(
                            Self.transaction(id: id), submittingAccount: "fifo", catalog: Self.catalog, now: Self.now
                        ).plan
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let paid = results.compactMap { $0.order?.orderId }
            #expect(Set(paid) == [older.orderId, newer.orderId])
            #expect(paid.count == 2)
            #expect(results.filter { $0.outcome == .delivered && $0.order == nil }.count == 3)
            #expect(try await store.orders.order(older.orderId)?.status == .delivered)
            #expect(try await store.orders.order(newer.orderId)?.status == .delivered)
            #expect(try await store.accounts.balances(of: "fifo") == ["coins": 300])
            // A token that matches no order still pays the oldest open order.
            let third = try await store.orders.createOrder(
                accountId: "fifo", productId: "coins_60", quantity: 1, now: Self.now)
            async let strayToken = store.deliver(
                Self.transaction(id: "2200000000000050", token: UUID()), submittingAccount: "fifo",
                catalog: Self.catalog,
                now: Self.now)
            async let other = store.deliver(
                Self.transaction(id: "2200000000000051"), submittingAccount: "someone", catalog: Self.catalog,
                now: Self.now)
            let (stray, _) = try await (strayToken, other)
            #expect(stray.plan.order?.orderId == third.orderId)
            // Two accounts claiming one non-consumable in the same burst: one owner, one conflict.
            let unlock = StoreTransaction.appStore(
                transactionId: "2200000000000100", originalTransactionId: "2200000000000100", productId: "remove_ads",
                environment: .production)
            let restore = StoreTransaction.appStore(
                transactionId: "2200000000000101", originalTransactionId: "2200000000000100", productId: "remove_ads",
                environment: .production)
            async let first = store.deliver(unlock, submittingAccount: "owner", catalog: Self.catalog, now: Self.now)
            async let second = store.deliver(restore, submittingAccount: "thief", catalog: Self.catalog, now: Self.now)
            let (a, b) = try await (first, second)
            let refusals = [a.plan.refusal, b.plan.refusal].compactMap { $0 }
            #expect(refusals.count == 1)
            #expect(try await store.anomalies.anomalies(status: "open").map(\.kind) == ["ownership_conflict"])
        }
    }

    @Test func twoServerInstancesOnOnePostgreSQLDeliverOnce() async throws {
        guard Self.kinds.contains(.postgres) else { return }
        try await TestDatabase.with(.postgres) { database, url in
            let second = try await Database.open(url: url)
            defer { Task { try? await second.close() } }
            let stores = [PurchaseStore(database: database), PurchaseStore(database: second)]
            let transaction = Self.transaction(id: "2000000000000777")
            let outcomes = try await withThrowingTaskGroup(of: DeliveryPlanner.Outcome.self) { group in
                for index in 0..<64 {
                    group.addTask {
                        try await stores[index % 2].deliver(
                            transaction, submittingAccount: "u9", catalog: Self.catalog, now: Self.now
                        ).plan.outcome
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == .delivered || $0 == .unattributed }.count == 1)
            #expect(try await stores[1].accounts.balances(of: "u9") == ["coins": 60])
        }
    }

    @Test(arguments: kinds)
    func anomaliesArePersistedOnceAndNothingIsGranted(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            _ = try await store.deliver(
                Self.transaction("remove_ads", id: "2000000000000010"), submittingAccount: "alice",
                catalog: Self.catalog,
                now: Self.now)
            for _ in 0..<3 {
                let conflict = try await store.deliver(
                    Self.transaction("remove_ads", id: "2000000000000010"), submittingAccount: "bob",
                    catalog: Self.catalog,
                    now: Self.now)
                // Delivered to alice: bob gets a refusal, never "already delivered".
                #expect(conflict.plan.outcome == .notDelivered)
                #expect(conflict.plan.refusal == .ownedByOtherAccount(owner: "alice"))
            }
            let restore = StoreTransaction.appStore(
                transactionId: "2000000000000011", originalTransactionId: "2000000000000010", productId: "remove_ads",
                environment: .production)
            for _ in 0..<3 {
                let conflict = try await store.deliver(
                    restore, submittingAccount: "bob", catalog: Self.catalog, now: Self.now)
                #expect(conflict.plan.refusal == .ownedByOtherAccount(owner: "alice"))
            }
            let anomalies = try await store.anomalies.anomalies(status: "open")
            // One per conflicting transaction, not one per attempt.
            #expect(anomalies.map(\.kind) == ["ownership_conflict", "ownership_conflict"])
            #expect(try await store.accounts.deliveries(of: "bob").isEmpty)

            let order = try await store.orders.createOrder(
                accountId: "carl", productId: "coins_300", quantity: 1, now: Self.now)
            let mismatch = try await store.deliver(
                Self.transaction("coins_60", id: "2000000000000020", token: order.appAccountToken),
                submittingAccount: "carl",
                catalog: Self.catalog, now: Self.now)
            #expect(mismatch.plan.outcome == .delivered)
            #expect(try await store.orders.order(order.orderId)?.status == .created)
            #expect(try await store.accounts.balances(of: "carl") == ["coins": 60])
            #expect(
                try await store.anomalies.anomalies().map(\.kind).sorted() == [
                    "ownership_conflict", "ownership_conflict", "product_mismatch",
                ])
        }
    }

    @Test(arguments: kinds)
    func expiredOrdersStillTakeLatePayments(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            let order = try await store.orders.createOrder(
                accountId: "dora", productId: "coins_60", quantity: 1, now: Self.now)
            #expect(
                try await store.orders.cancelExpiredOrders(olderThan: 3600, now: Self.now.addingTimeInterval(7200)) == 1
            )
            #expect(try await store.orders.order(order.orderId)?.status == .cancelled)
            // Without a token, a cancelled (expired) order is not open: nothing to fall back to,
            // and the payment still reaches the submitting account.
            let tokenless = try await store.deliver(
                Self.transaction(id: "2000000000000031"), submittingAccount: "dora", catalog: Self.catalog,
                now: Self.now)
            #expect(tokenless.plan.order == nil)
            #expect(tokenless.plan.outcome == .delivered)
            // With its token (Ask to Buy approved late, P10): the expired order takes the payment.
            let late = try await store.deliver(
                Self.transaction(id: "2000000000000030", token: order.appAccountToken), submittingAccount: "dora",
                catalog: Self.catalog, now: Self.now)
            #expect(late.plan.order?.orderId == order.orderId)
            #expect(try await store.orders.order(order.orderId)?.status == .delivered)
        }
    }

    @Test(arguments: kinds)
    func nonRenewingPassesTakeTheOneByOnePathAndExtendAccess(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            let catalog = try Catalog.parse(
                yaml:
                    "products: [{ id: season_pass, type: non_renewing, duration: P30D, grants: { entitlement: season } }]"
            )
            for (index, id) in ["2300000000000001", "2300000000000002"].enumerated() {
                let result = try await store.deliver(
                    Self.transaction("season_pass", id: id), submittingAccount: "pass", catalog: catalog, now: Self.now)
                #expect(result.plan.outcome == .delivered, "pass \(index)")
            }
            let rows = try await store.accounts.entitlements(of: "pass")
            let latest = try #require(rows.compactMap(\.expiresAt).max())
            // The second pass starts when the first ends: 60 days of access in all.
            #expect(latest == Self.now.addingTimeInterval(60 * 86_400))
        }
    }

    /// Passes bought at once land in one batch: each window starts where the batch's previous
    /// grant ended (the batch keeps the expiry it read up to date), never where the database's did.
    @Test(arguments: kinds)
    func concurrentNonRenewingPassesAddUpInOneBatch(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = PurchaseStore(database: database)
            let catalog = try Catalog.parse(
                yaml:
                    "products: [{ id: season_pass, type: non_renewing, duration: P30D, grants: { entitlement: season } }]"
            )
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<5 {
                    group.addTask {
                        let result = try await store.deliver(
                            Self.transaction("season_pass", id: "24000000000000\(10 + index)"),
                            submittingAccount: "passes", catalog: catalog, now: Self.now)
                        #expect(result.plan.outcome == .delivered)
                    }
                }
                try await group.waitForAll()
            }
            let latest = try #require(try await store.accounts.entitlements(of: "passes").compactMap(\.expiresAt).max())
            #expect(latest == Self.now.addingTimeInterval(5 * 30 * 86_400))
        }
    }

    @Test(arguments: kinds)
    func migrationsApplyOnceEvenConcurrently(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            async let first: Void = Migrations.run(on: database)
            async let second: Void = Migrations.run(on: database)
            _ = try await (first, second)
            #expect(try await Migrations.appliedVersions(on: database) == Migrations.all.map(\.version))
        }
    }

    @Test func badURLsAreClearErrors() async {
        for url in ["", "mysql://x", "sqlite:", "postgres://"] {
            await #expect(throws: (any Error).self) { _ = try await Database.open(url: url) }
        }
    }
}

/// A fresh, migrated database per test: a temporary SQLite file, or a new PostgreSQL database.
enum TestDatabase {
    static func with(_ kind: Database.Kind, _ body: (Database) async throws -> Void) async throws {
        try await with(kind) { database, _ in try await body(database) }
    }

    static func with(_ kind: Database.Kind, _ body: (Database, String) async throws -> Void) async throws {
        let url: String
        var cleanup: () async throws -> Void = {}
        switch kind {
        case .sqlite:
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("storekeeper-\(UUID()).sqlite")
                .path
            url = "sqlite:\(path)"
            cleanup = {
                for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
            }
        case .postgres:
            let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"]!
            let lease = try await ScratchDatabases.shared.lend(base: base)
            url = lease.url
            cleanup = { await ScratchDatabases.shared.giveBack(lease) }
        }
        let database = try await Database.open(url: url)
        do {
            try await Migrations.run(on: database)
            try await body(database, url)
        } catch {
            try? await database.close()
            try await cleanup()
            throw error
        }
        try? await database.close()
        try await cleanup()
    }

}

/// The outbox event is written by hand on the hot path: it must be exact JSON for any string.
@Suite struct OutboxPayloadTests {
    @Test func outboxPayloadIsExactJSONForAnyString() throws {
        let hostile = "quote\" back\\slash \n\r\t \u{0}\u{1f} é ✓ 🎮 </script>"
        for orderId in [nil, hostile] {
            let delivery = DeliveryPlanner.Delivery(
                transactionId: "2000000000000001", accountId: hostile, orderId: orderId, productId: "p\u{7f}",
                quantity: 3)
            let payload = PurchaseStore.outboxPayload(delivery, environment: "Sandbox", store: .appStore)
            let object = try #require(JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any])
            #expect(object["accountId"] as? String == hostile)
            #expect(object["orderId"] as? String == orderId)
            #expect(orderId != nil || object["orderId"] is NSNull)
            #expect(object["productId"] as? String == "p\u{7f}")
            #expect(object["quantity"] as? Int == 3)
            #expect(object["transactionId"] as? String == "2000000000000001")
            #expect(object["environment"] as? String == "Sandbox")
            #expect(object["store"] as? String == "app_store")
            #expect(object.count == 7)
        }
    }
}
