import AppStoreClient
import AppStoreModels
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import NIOCore
import SQLKit
import Synchronization
import Testing

@testable import StoreKeeperServer
@testable import StoreKeeperStorage

/// Faults are answers, never hangs (docs/api.md "Errors"): a database restart, a database that is
/// down, a full or locked disk, overload and a refused Apple token each get a retryable answer,
/// and afterwards every acknowledged delivery is present exactly once.
@Suite struct AvailabilityTests {
    typealias API = ServerAPITests

    /// Acknowledged deliveries (transaction ids answered 200), shared by the load workers.
    final class Acknowledged: Sendable {
        let ids = Mutex<Set<String>>([])
        let statuses = Mutex<[Int: Int]>([:])
    }

    final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    /// 0 lost, 0 doubled: every acknowledged transaction has exactly one delivery, and balances
    /// equal the ledger's sums.
    static func checkNothingLostOrDoubled(_ app: StoreKeeperApp, acknowledged: Set<String>) async throws {
        let rows = try await app.database.read { sql in
            try await sql.raw("SELECT transaction_id FROM deliveries").all().map {
                try $0.decode(column: "transaction_id", as: String.self)
            }
        }
        #expect(Set(rows).count == rows.count, "a transaction delivered twice")
        #expect(acknowledged.isSubset(of: Set(rows)), "lost: \(acknowledged.subtracting(Set(rows)).count)")
        let mismatched = try await app.database.read { sql in
            try await sql.raw(
                """
                SELECT b.account_id FROM balances b
                LEFT JOIN (SELECT account_id, currency, SUM(amount) AS total FROM ledger GROUP BY account_id, currency) l
                ON l.account_id = b.account_id AND l.currency = b.currency
                WHERE l.total IS NULL OR l.total <> b.amount
                """
            ).all().count
        }
        #expect(mismatched == 0)
    }

    /// Submits proofs from `streams` concurrent workers, recording answers: each proof once, or
    /// round and round (repeats answer "already delivered") until `stop` is set.
    static func load(
        _ client: any TestClientProtocol, proofs: [String], streams: Int, acknowledged: Acknowledged,
        until stop: Flag? = nil
    ) async {
        let next = Counter()
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<streams {
                group.addTask {
                    while true {
                        var index = next.value.add(1, ordering: .relaxed).oldValue
                        if let stop {
                            guard !stop.value.load(ordering: .relaxed) else { return }
                            index %= proofs.count
                        }
                        guard index < proofs.count else { return }
                        // One account per proof (stable across passes), so a repeat is "already delivered".
                        let account = "load-\(UInt(bitPattern: proofs[index].hashValue) % 16)"
                        _ = worker
                        guard
                            let reply = try? await API.call(
                                client, .post, "/v1/purchases",
                                body: #"{"accountId":"\#(account)","signedTransaction":"\#(proofs[index])"}"#)
                        else { continue }
                        acknowledged.statuses.withLock { $0[Int(reply.status.code), default: 0] += 1 }
                        if reply.status == .ok,
                            let id = (reply.json["transactions"] as? [[String: Any]])?.first?["transactionId"]
                                as? String
                        {
                            acknowledged.ids.withLock { _ = $0.insert(id) }
                        } else if reply.status != .ok {
                            // Faults are retryable answers with Retry-After, never 500.
                            #expect(reply.status == .serviceUnavailable, "\(reply.status) \(reply.json)")
                            #expect(reply.headers[.retryAfter] != nil)
                            try? await Task.sleep(for: .milliseconds(50))
                        }
                    }
                }
            }
        }
    }

    // MARK: SQLite full and locked

    /// The disk fills: SQLite may not grow the file, and what free pages it has are used up.
    static func fillDisk(_ app: StoreKeeperApp) async throws {
        try await app.database.transaction { sql in
            try await sql.raw("CREATE TABLE IF NOT EXISTS filler (x BLOB)").run()
        }
        let pages = try await app.database.read { sql in
            try await sql.raw("PRAGMA page_count").first()?.decode(column: "page_count", as: Int.self) ?? 0
        }
        try await app.database.onWritingConnection { sql in
            try await sql.raw("PRAGMA max_page_count = \(unsafeRaw: String(pages))").run()
        }
        // Large rows, then ever smaller ones, until not even a few bytes fit anywhere.
        for size in [2000, 400, 60, 8, 1] {
            for _ in 0..<10_000 {
                do {
                    try await app.database.transaction { sql in
                        try await sql.raw("INSERT INTO filler VALUES (randomblob(\(unsafeRaw: String(size))))").run()
                    }
                } catch {
                    #expect(StorageUnavailable.classify(error) != nil, "\(error)")
                    break
                }
            }
        }
    }

    static func freeDisk(_ app: StoreKeeperApp) async throws {
        try await app.database.onWritingConnection { sql in
            try await sql.raw("PRAGMA max_page_count = 1073741823").run()
        }
        try await app.database.transaction { sql in try await sql.raw("DELETE FROM filler").run() }
    }

    @Test func aFullSQLiteDiskIs503AndRecovers() async throws {
        try await API.withServer("sqlite") { app, client in
            var proofs: [String] = []
            for index in 0..<120 {
                proofs.append(
                    try await app.localAppStore!.buy("f\(index)", items: [.init(productId: "coins_60")])
                        .signedTransactions[0])
            }
            try await Self.fillDisk(app)
            let acknowledged = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 4, acknowledged: acknowledged)
            #expect((acknowledged.statuses.withLock { $0[503] } ?? 0) > 0)
            #expect(acknowledged.statuses.withLock { $0[500] } == nil)
            // Space again: everything goes through, once.
            try await Self.freeDisk(app)
            let again = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 4, acknowledged: again)
            #expect(again.statuses.withLock { $0[200] } == proofs.count)
            try await Self.checkNothingLostOrDoubled(
                app, acknowledged: acknowledged.ids.withLock { $0 }.union(again.ids.withLock { $0 }))
        }
    }

    /// A database that turned read-only (SQLITE_READONLY: a remounted disk, a replica) is
    /// 503 `storage_unavailable`, and the server writes again as soon as it may.
    @Test func aReadOnlySQLiteIs503AndRecovers() async throws {
        try await API.withServer("sqlite") { app, client in
            let proof = try await app.localAppStore!.buy("ro", items: [.init(productId: "coins_60")])
                .signedTransactions[0]
            try await app.database.onWritingConnection { sql in try await sql.raw("PRAGMA query_only = ON").run() }
            let order = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"ro","productId":"coins_60"}"#)
            #expect(order.status == .serviceUnavailable)
            #expect(order.errorCode == "storage_unavailable")
            #expect(order.headers[.retryAfter] != nil)
            let refused = Acknowledged()
            await Self.load(client, proofs: [proof], streams: 1, acknowledged: refused)
            #expect(refused.statuses.withLock { $0 } == [503: 1])
            try await app.database.onWritingConnection { sql in try await sql.raw("PRAGMA query_only = OFF").run() }
            let delivered = Acknowledged()
            await Self.load(client, proofs: [proof], streams: 1, acknowledged: delivered)
            #expect(delivered.statuses.withLock { $0 } == [200: 1])
            try await Self.checkNothingLostOrDoubled(app, acknowledged: delivered.ids.withLock { $0 })
        }
    }

    /// Mounting a tmpfs needs root (CI runs as root); elsewhere the page-count disk above stands in.
    static let canMountTmpfs: Bool = {
        guard getuid() == 0 else { return false }
        let probe = FileManager.default.temporaryDirectory.appendingPathComponent("tmpfs-probe-\(UUID())").path
        try? FileManager.default.createDirectory(atPath: probe, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: probe) }
        guard mount("tmpfs", probe, "tmpfs", 0, "size=64k") == 0 else { return false }
        umount(probe)
        return true
    }()

    /// A real full disk: the database on an 8 MiB tmpfs, the rest of it taken by another file.
    @Test(.enabled(if: canMountTmpfs), .timeLimit(.minutes(3)))
    func aFullTmpfsDiskIs503AndRecovers() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tmpfs-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        #expect(mount("tmpfs", directory.path, "tmpfs", 0, "size=8m") == 0)
        defer {
            umount2(directory.path, Int32(MNT_DETACH))
            try? FileManager.default.removeItem(at: directory)
        }
        let path = directory.appendingPathComponent("storekeeper.sqlite").path
        let filler = directory.appendingPathComponent("filler").path
        try await API.withServer("sqlite", configure: { $0.databaseURL = "sqlite:\(path)" }) { app, client in
            var proofs: [String] = []
            for index in 0..<150 {
                proofs.append(
                    try await app.localAppStore!.buy("t\(index)", items: [.init(productId: "coins_60")])
                        .signedTransactions[0])
            }
            // Whatever is free on the disk is taken.
            let handle = try #require(
                FileHandle(forWritingAtPath: filler)
                    ?? {
                        FileManager.default.createFile(atPath: filler, contents: nil)
                        return FileHandle(forWritingAtPath: filler)
                    }())
            let block = Data(repeating: 0, count: 4096)
            while (try? handle.write(contentsOf: block)) != nil {}
            try? handle.close()
            let acknowledged = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 4, acknowledged: acknowledged)
            #expect((acknowledged.statuses.withLock { $0[503] } ?? 0) > 0)
            #expect(acknowledged.statuses.withLock { $0[500] } == nil)
            let health = try await API.call(client, .get, "/healthz", token: nil)
            #expect(health.status == .ok || health.status == .serviceUnavailable)
            // Space again: everything goes through, once.
            try FileManager.default.removeItem(atPath: filler)
            let again = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 4, acknowledged: again)
            #expect(again.statuses.withLock { $0[200] } == proofs.count)
            try await Self.checkNothingLostOrDoubled(
                app, acknowledged: acknowledged.ids.withLock { $0 }.union(again.ids.withLock { $0 }))
        }
    }

    @Test(.timeLimit(.minutes(2)))
    func aLockedSQLiteIs503NotAHang() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("locked-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("db.sqlite").path
        try await API.withServer("sqlite", configure: { $0.databaseURL = "sqlite:\(path)" }) { app, client in
            var proofs: [String] = []
            for index in 0..<20 {
                proofs.append(
                    try await app.localAppStore!.buy("lk\(index)", items: [.init(productId: "coins_60")])
                        .signedTransactions[0])
            }
            // Another process holds the write lock past the busy timeout.
            let intruder = try SQLiteHandle(path: path)
            try intruder.execute("BEGIN EXCLUSIVE", binds: []) { _ in }
            defer { try? intruder.execute("ROLLBACK", binds: []) { _ in } }
            let order = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"lk","productId":"coins_60"}"#)
            #expect(order.status == .serviceUnavailable)
            #expect(order.errorCode == "storage_unavailable")
            #expect(order.headers[.retryAfter] != nil)
            let locked = Acknowledged()
            await Self.load(client, proofs: Array(proofs.prefix(4)), streams: 4, acknowledged: locked)
            #expect(locked.statuses.withLock { $0 } == [503: 4])
            try intruder.execute("ROLLBACK", binds: []) { _ in }
            let after = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"lk","productId":"coins_60"}"#)
            #expect(after.status == .created)
            let again = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 4, acknowledged: again)
            #expect(again.statuses.withLock { $0 } == [200: proofs.count])
            try await Self.checkNothingLostOrDoubled(app, acknowledged: again.ids.withLock { $0 })
        }
    }

    // MARK: Overload

    /// The real server, purchases from 48 streams, at most 4 requests in flight: the rest are
    /// shed (503 `overloaded`, Retry-After) and a retry delivers them; each delivered once.
    @Test(arguments: ServerAPITests.databases)
    func overloadedPurchasesAreShedThenDeliveredOnce(kind: String) async throws {
        try await API.withServer(kind, configure: { $0.maxInFlightRequests = 4 }) { app, client in
            var proofs: [String] = []
            for index in 0..<300 {
                proofs.append(
                    try await app.localAppStore!.buy("ov\(index)", items: [.init(productId: "coins_60")])
                        .signedTransactions[0])
            }
            let flood = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 48, acknowledged: flood)
            #expect((flood.statuses.withLock { $0[503] } ?? 0) > 0, "\(flood.statuses.withLock { $0 })")
            #expect(Set(flood.statuses.withLock { $0 }.keys).isSubset(of: [200, 503]))
            // Retried calmly, every proof is delivered (or already was), once.
            let retry = Acknowledged()
            await Self.load(client, proofs: proofs, streams: 2, acknowledged: retry)
            #expect(retry.statuses.withLock { $0 } == [200: proofs.count])
            try await Self.checkNothingLostOrDoubled(
                app, acknowledged: flood.ids.withLock { $0 }.union(retry.ids.withLock { $0 }))
        }
    }

    @Test func aboveMaxInFlightRequestsAreShedWithRetryAfter() async throws {
        let gate = Gate()
        let router = Router()
        router.get("slow") { _, _ -> String in
            await gate.wait()
            return "done"
        }
        let responder = DeadlineRouter(router: router, limit: .seconds(20), maxInFlight: 3)
        try await Application(router: responder).test(.router) { client in
            let answers = await withTaskGroup(of: (HTTPResponse.Status, String?).self) { group in
                for _ in 0..<12 {
                    group.addTask {
                        (try? await client.execute(uri: "/slow", method: .get) {
                            ($0.status, $0.headers[.retryAfter])
                        }) ?? (.internalServerError, nil)
                    }
                }
                // The three admitted requests finish once the others have been shed.
                try? await Task.sleep(for: .milliseconds(500))
                await gate.open()
                var collected: [(HTTPResponse.Status, String?)] = []
                for await answer in group { collected.append(answer) }
                return collected
            }
            let shed = answers.filter { $0.0 == .serviceUnavailable }
            #expect(answers.filter { $0.0 == .ok }.count >= 3)
            #expect(shed.count == answers.count - answers.filter { $0.0 == .ok }.count)
            #expect(shed.count >= 1)
            #expect(shed.allSatisfy { $0.1 != nil })
        }
    }

    actor Gate {
        private var waiters: [CheckedContinuation<Void, Never>] = []
        private var isOpen = false
        func wait() async {
            if isOpen { return }
            await withCheckedContinuation { waiters.append($0) }
        }
        func open() {
            isOpen = true
            for waiter in waiters { waiter.resume() }
            waiters = []
        }
    }

    // MARK: Jobs and Apple's clock

    @Test func aJobMeetingADatabaseErrorIsRescheduledNotFailed() async throws {
        try await AppleLookupJobTests.withSetup { apple, app, databaseURL, client in
            let id = try await AppleLookupJobTests.buyForOrder(apple, client, account: "j1")
            var faults = Faults()
            faults.endpoints["transactionInfo"] = .init(status: 503, count: 1)
            await apple.setFaults(faults)
            let reply = try await API.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"j1","transactionId":"\#(id)"}"#)
            #expect(reply.status == .accepted)
            // The database is locked by another process when the job runs (past the busy
            // timeout): the delivery fails with a database error, and the job is not failed.
            let runner = JobRunner(app: app)
            let claimed = try #require(try await app.jobs.claimDue(now: Date().addingTimeInterval(60)).first)
            let intruder = try SQLiteHandle(path: String(databaseURL.dropFirst("sqlite:".count)))
            try intruder.execute("BEGIN EXCLUSIVE", binds: []) { _ in }
            #expect(await runner.run(claimed, now: Date().addingTimeInterval(60)) == false)
            try intruder.execute("ROLLBACK", binds: []) { _ in }
            #expect(try await app.jobs.status(claimed.id) == "pending")
            #expect(try await app.jobs.pendingCount() == 1)
            #expect(try await app.store.anomalies.anomalies(status: "open").isEmpty)
            #expect(await runner.runDue(now: Date().addingTimeInterval(7200)) == 1)
            #expect(try await AppleLookupJobTests.coins(client, "j1") == 60)
            try await Self.checkNothingLostOrDoubled(app, acknowledged: [id])
        }
    }

    @Test func aRefusedAppleTokenQueuesTheLookupAndMeasuresTheClock() async throws {
        try await AppleLookupJobTests.withSetup(wrongAPIKey: true) { apple, app, _, client in
            let id = try await AppleLookupJobTests.buyForOrder(apple, client, account: "c1")
            let reply = try await API.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"c1","transactionId":"\#(id)"}"#)
            #expect(reply.status == .accepted)
            #expect(try await app.jobs.pendingCount() == 1)
            let status = try await API.call(client, .get, "/v1/status")
            let skew = try #require(status.json["appleClockSkewSeconds"] as? Double)
            #expect(abs(skew) < 60)
            // The job keeps it: a refused token is not the purchase's fate.
            _ = await JobRunner(app: app).runDue(now: Date().addingTimeInterval(3600))
            #expect(try await app.jobs.pendingCount() == 1)
            #expect(
                AppStoreAPIErrorDates.parse("Sun, 06 Nov 1994 08:49:37 GMT") == Date(timeIntervalSince1970: 784_111_777)
            )
        }
    }

    // MARK: SQLite's write-ahead log

    @Test func theWALIsCheckpointedAndMeasured() async throws {
        try await API.withServer("sqlite") { app, client in
            for index in 0..<20 {
                let bought = try await app.localAppStore!.buy("w\(index)", items: [.init(productId: "coins_60")])
                _ = try await API.submit(client, account: "wal", signedTransaction: bought.signedTransactions[0])
            }
            #expect((app.database.walBytes ?? 0) > 0)
            #expect(try await app.database.checkpoint() == true)
            #expect(app.database.walBytes == 0)
            let metrics = try await client.execute(
                uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(API.secret)"]
            ) { String(buffer: $0.body) }
            #expect(metrics.contains("storekeeper_sqlite_wal_bytes"))
        }
    }
}

enum AppStoreAPIErrorDates {
    static func parse(_ text: String) -> Date? { AppStoreAPIError.httpDate(text) }
}
