import Foundation
import StoreKeeperCore
import Testing

@testable import StoreKeeperStorage

/// The outbox as the webhook sender uses it: claims lease events, retries wait, and on
/// PostgreSQL several instances never hold the same event at once.
@Suite struct OutboxStoreTests {
    static func deliverMany(_ database: Database, count: Int) async throws {
        let store = PurchaseStore(database: database)
        for index in 0..<count {
            _ = try await store.deliver(
                PurchaseStoreTests.transaction(id: String(2_400_000_000_000_000 + index)),
                submittingAccount: "outbox-\(index)", catalog: PurchaseStoreTests.catalog,
                now: PurchaseStoreTests.now.addingTimeInterval(Double(index)))
        }
    }

    @Test(arguments: PurchaseStoreTests.kinds)
    func claimsLeaseAndRetriesWait(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            try await Self.deliverMany(database, count: 3)
            let outbox = OutboxStore(database: database)
            let now = Date()
            let claimed = try await outbox.claimDue(now: now, limit: 2)
            #expect(claimed.count == 2)  // oldest first
            #expect(claimed.map { $0.payload.contains("outbox-0") || $0.payload.contains("outbox-1") } == [true, true])
            #expect(try await outbox.claimDue(now: now).count == 1)  // the two are leased
            try await outbox.markSent([claimed[0].id], now: now)
            try await outbox.reschedule(claimed[1].id, at: now.addingTimeInterval(300), error: "HTTP 500")
            #expect(
                try await outbox.claimDue(now: now.addingTimeInterval(120)).map(\.id).contains(claimed[1].id) == false)
            let later = try await outbox.claimDue(now: now.addingTimeInterval(301))
            #expect(later.map(\.id).contains(claimed[1].id))
            #expect(later.first { $0.id == claimed[1].id }?.attempts == 1)
            #expect(try await outbox.pendingCount() == 2)
        }
    }

    @Test func instancesOnOnePostgreSQLNeverClaimTheSameEvent() async throws {
        guard PurchaseStoreTests.kinds.contains(.postgres) else { return }
        try await TestDatabase.with(.postgres) { database, url in
            try await Self.deliverMany(database, count: 120)
            let other = try await Database.open(url: url)
            let stores = [OutboxStore(database: database), OutboxStore(database: other)]
            let now = Date()
            let claimed = try await withThrowingTaskGroup(of: [String].self) { group in
                for worker in 0..<8 {
                    group.addTask { try await stores[worker % 2].claimDue(now: now, limit: 10).map(\.id) }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            #expect(claimed.count == Set(claimed).count)  // no event handed out twice
            #expect(claimed.count == 80)
            try await other.close()
        }
    }

    @Test func eventIdsAreVersion7UUIDsInWritingOrder() {
        let now = Date(timeIntervalSince1970: 1_767_225_600.123)
        // Many in one millisecond (past the 4,096 a millisecond holds), then a later one.
        var generator = OutboxStore.EventIdGenerator()
        let ids = (0..<5_000).map { _ in generator.next(now: now) } + [generator.next(now: now.addingTimeInterval(10))]
        #expect(UUID(uuidString: OutboxStore.newEventId()) != nil)  // the process-wide one
        #expect(ids == ids.sorted())
        #expect(Set(ids).count == ids.count)
        for id in ids.prefix(3) + ids.suffix(1) {
            let uuid = UUID(uuidString: id)
            #expect(uuid != nil)
            #expect(id == id.lowercased())
            #expect(Array(id)[14] == "7")  // version
            #expect("89ab".contains(Array(id)[19]))  // variant
        }
        // The first 48 bits are the millisecond time.
        #expect(
            ids[0].replacingOccurrences(of: "-", with: "").prefix(12)
                == String(1_767_225_600_123, radix: 16).leftPadded(12))
    }
}

extension String {
    fileprivate func leftPadded(_ width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
