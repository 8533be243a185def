import Foundation
import Synchronization
import Testing

@testable import StoreKeeperStorage

/// The durable job queue: dedupe, leases, and on PostgreSQL several instances claiming at once
/// without ever handing one job to two of them.
@Suite struct JobStoreTests {
    @Test(arguments: PurchaseStoreTests.kinds)
    func enqueueDedupesAndClaimsLease(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let jobs = JobStore(database: database)
            let now = Date(timeIntervalSince1970: 1_767_225_600)
            let first = try await jobs.enqueue(kind: "k", dedupeKey: "same", payload: "{}", runAt: now, now: now)
            let second = try await jobs.enqueue(kind: "k", dedupeKey: "same", payload: "{}", runAt: now, now: now)
            #expect(first == second)
            #expect(try await jobs.pendingCount() == 1)
            #expect(try await jobs.claimDue(now: now.addingTimeInterval(-1)).isEmpty)  // not due yet
            #expect(try await jobs.claimDue(now: now).map(\.id) == [first])
            #expect(try await jobs.claimDue(now: now.addingTimeInterval(30)).isEmpty)  // leased
            #expect(try await jobs.claimDue(now: now.addingTimeInterval(61)).map(\.id) == [first])  // lease ran out
            try await jobs.complete(first)
            #expect(try await jobs.pendingCount() == 0)
            #expect(try await jobs.status(first) == "done")
        }
    }

    @Test func instancesOnOnePostgreSQLNeverClaimTheSameJob() async throws {
        guard PurchaseStoreTests.kinds.contains(.postgres) else { return }
        try await TestDatabase.with(.postgres) { database, url in
            let other = try await Database.open(url: url)
            let now = Date()
            let queue = JobStore(database: database)
            for index in 0..<200 {
                try await queue.enqueue(kind: "k", dedupeKey: "job-\(index)", payload: "{}", runAt: now, now: now)
            }
            let stores = [JobStore(database: database), JobStore(database: other)]
            let claimed = try await withThrowingTaskGroup(of: [String].self) { group in
                for worker in 0..<8 {
                    group.addTask {
                        var mine: [String] = []
                        while true {
                            let batch = try await stores[worker % 2].claimDue(now: now, limit: 7)
                            if batch.isEmpty { return mine }
                            mine += batch.map(\.id)
                        }
                    }
                }
                return try await group.reduce(into: [String]()) { $0 += $1 }
            }
            #expect(claimed.count == 200)
            #expect(Set(claimed).count == 200)
            try await other.close()
        }
    }
}
