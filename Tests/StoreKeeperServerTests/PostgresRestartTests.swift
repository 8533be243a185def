import Foundation
import HTTPTypes
import HummingbirdTesting
import Synchronization
import Testing

@testable import StoreKeeperServer
@testable import StoreKeeperStorage

/// A PostgreSQL that restarts (fast and immediate) under load, or goes down for a while: every
/// request is answered (200 or a retryable 503, never a hang or a 500), deliveries resume by
/// themselves, and afterwards every acknowledged delivery is present exactly once.
///
/// These need a cluster of their own that may be restarted: `STOREKEEPER_TEST_POSTGRES_RESTART_URL`
/// and `STOREKEEPER_TEST_POSTGRES_RESTART_CLUSTER` ("15 chaos", as `pg_ctlcluster` names it).
/// `.ci/run` creates one; CI fails when it is missing rather than skipping.
@Suite(.serialized) struct PostgresRestartTests {
    typealias API = ServerAPITests
    typealias Availability = AvailabilityTests

    static let environment = ProcessInfo.processInfo.environment
    static var url: String? { environment["STOREKEEPER_TEST_POSTGRES_RESTART_URL"] }
    static var cluster: [String]? {
        environment["STOREKEEPER_TEST_POSTGRES_RESTART_CLUSTER"].map { $0.split(separator: " ").map(String.init) }
    }
    static var available: Bool { url != nil && cluster?.count == 2 }

    @Test func theRestartClusterIsConfiguredInCI() {
        if Self.environment["CI"] == "true" { #expect(Self.available, "CI must run the PostgreSQL restart tests") }
    }

    /// `pg_ctlcluster VERSION NAME action [options]`.
    static func pgctl(_ action: String, _ options: [String] = []) async throws {
        let arguments = ["/usr/bin/pg_ctlcluster"] + (try #require(Self.cluster)) + [action] + options
        let status = await Spawn.run(arguments)
        #expect(status == 0, "pg_ctlcluster \(action) exited with status \(status)")
    }

    /// Fresh proofs, one per purchase, signed by the local App Store.
    static func proofs(_ app: StoreKeeperApp, _ prefix: String, count: Int) async throws -> [String] {
        var proofs: [String] = []
        for index in 0..<count {
            proofs.append(
                try await app.localAppStore!.buy("\(prefix)\(index)", items: [.init(productId: "coins_60")])
                    .signedTransactions[0])
        }
        return proofs
    }

    /// Submits `proof` until it is delivered (each answer 200 or 503 with Retry-After); returns
    /// its transaction id and how long that took.
    static func deliverWhenPossible(
        _ client: any TestClientProtocol, _ proof: String, within limit: Duration
    ) async throws -> (String?, Duration) {
        let start = ContinuousClock.now
        while ContinuousClock.now - start < limit {
            let reply = try await API.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"probe","signedTransaction":"\#(proof)"}"#)
            if reply.status == .ok {
                let id = (reply.json["transactions"] as? [[String: Any]])?.first?["transactionId"] as? String
                return (id, ContinuousClock.now - start)
            }
            #expect(reply.status == .serviceUnavailable, "\(reply.status) \(reply.json)")
            #expect(reply.headers[.retryAfter] != nil)
            try await Task.sleep(for: .milliseconds(200))
        }
        return (nil, ContinuousClock.now - start)
    }

    func restartUnderLoad(mode: String) async throws {
        try await API.withServer("postgres", postgresURL: Self.url) { app, client in
            let load = try await Self.proofs(app, "load-\(mode)-", count: 300)
            let probes = try await Self.proofs(app, "probe-\(mode)-", count: 12)
            let acknowledged = Availability.Acknowledged()
            let stop = Availability.Flag()
            let streams = Task {
                await Availability.load(client, proofs: load, streams: 16, acknowledged: acknowledged, until: stop)
            }
            defer { stop.value.store(true, ordering: .relaxed) }
            // Under way: deliveries are being acknowledged when PostgreSQL goes away.
            while acknowledged.ids.withLock({ $0.count }) < 50 { try await Task.sleep(for: .milliseconds(20)) }
            try await Self.pgctl("restart", ["-m", mode])
            print("PostgreSQL \(mode) restart done; answers so far \(acknowledged.statuses.withLock { $0 })")
            // Deliveries resume by themselves, while the load goes on.
            let (first, recovery) = try await Self.deliverWhenPossible(client, probes[0], within: .seconds(90))
            #expect(first != nil, "no delivery within 90 s of a \(mode) restart")
            print(
                "PostgreSQL \(mode) restart: probe after \(recovery); answers \(acknowledged.statuses.withLock { $0 })")
            // The load's own streams deliver again (within 10 s: on two busy cores a second can
            // pass between two of their answers).
            let before = acknowledged.statuses.withLock { $0[200] ?? 0 }
            let resumeBy = ContinuousClock.now + .seconds(10)
            while acknowledged.statuses.withLock({ $0[200] ?? 0 }) <= before, ContinuousClock.now < resumeBy {
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(acknowledged.statuses.withLock { $0[200] ?? 0 } > before, "the load did not resume")
            stop.value.store(true, ordering: .relaxed)
            await streams.value
            // Ten fresh purchases in a row, each delivered at once.
            var ids = Set(acknowledged.ids.withLock { $0 })
            if let first { ids.insert(first) }
            for proof in probes.dropFirst(2) {
                let reply = try await API.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"after","signedTransaction":"\#(proof)"}"#)
                #expect(reply.status == .ok, "\(reply.status) \(reply.json)")
                if let id = (reply.json["transactions"] as? [[String: Any]])?.first?["transactionId"] as? String {
                    ids.insert(id)
                }
            }
            #expect(acknowledged.statuses.withLock { $0[500] } == nil)
            try await Availability.checkNothingLostOrDoubled(app, acknowledged: ids)
            print(
                "PostgreSQL \(mode) restart: first delivery \(recovery) after pg_ctlcluster returned;"
                    + " answers \(acknowledged.statuses.withLock { $0 })")
        }
    }

    @Test(.enabled(if: available), .timeLimit(.minutes(6)))
    func aFastRestartUnderLoadRecoversByItself() async throws {
        try await restartUnderLoad(mode: "fast")
    }

    @Test(.enabled(if: available), .timeLimit(.minutes(6)))
    func anImmediateRestartUnderLoadRecoversByItself() async throws {
        try await restartUnderLoad(mode: "immediate")
    }

    @Test(.enabled(if: available), .timeLimit(.minutes(6)))
    func postgresDownIsAnsweredThenRecovers() async throws {
        try await API.withServer("postgres", postgresURL: Self.url) { app, client in
            let proofs = try await Self.proofs(app, "down-", count: 3)
            let (before, _) = try await Self.deliverWhenPossible(client, proofs[0], within: .seconds(30))
            #expect(before != nil)
            try await Self.pgctl("stop", ["-m", "fast"])
            do {
                // Every kind of request is answered, retryably, while nothing listens.
                let purchase = try await API.call(
                    client, .post, "/v1/purchases",
                    body: #"{"accountId":"probe","signedTransaction":"\#(proofs[1])"}"#)
                #expect(purchase.status == .serviceUnavailable, "\(purchase.status) \(purchase.json)")
                #expect(purchase.errorCode == "storage_unavailable")
                #expect(purchase.headers[.retryAfter] != nil)
                let order = try await API.call(
                    client, .post, "/v1/orders", body: #"{"accountId":"probe","productId":"coins_60"}"#)
                #expect(order.status == .serviceUnavailable)
                #expect(order.errorCode == "storage_unavailable")
                let account = try await API.call(client, .get, "/v1/accounts/probe")
                #expect(account.status == .serviceUnavailable)
                #expect(account.errorCode == "storage_unavailable")
                let started = ContinuousClock.now
                let health = try await API.call(client, .get, "/healthz", token: nil)
                #expect(health.status == .serviceUnavailable)
                // docs/api.md: /healthz answers within 2 s; a loaded machine may add seconds of its own,
                // so this checks only that it answers rather than hangs (never a wall-time race).
                #expect(ContinuousClock.now - started < .seconds(60))
            } catch {
                try await Self.pgctl("start")
                throw error
            }
            try await Self.pgctl("start")
            let (after, _) = try await Self.deliverWhenPossible(client, proofs[1], within: .seconds(90))
            #expect(after != nil, "no delivery within 90 s of PostgreSQL starting again")
            #expect(try await API.becomesHealthy(client))
            let (third, _) = try await Self.deliverWhenPossible(client, proofs[2], within: .seconds(5))
            try await Availability.checkNothingLostOrDoubled(
                app, acknowledged: Set([before, after, third].compactMap { $0 }))
        }
    }
}
