import AppStoreModels
import AppStoreSigning
import Foundation
import LocalAppStore
import SQLKit
import StoreKeeperSimulator
import StoreKeeperStorage

/// `bench --purchases --instances 1 2 4`: the same load through nginx to 1, 2 and 4 `storekeeper
/// serve` processes on one PostgreSQL (scripts/cluster), beside two baselines measured in the
/// same run: `GET /healthz` through the same balancer, and one instance reached directly (what
/// nginx costs). Each level: fresh purchases, account reads, debits, and DID_RENEW
/// notifications (accepted by whichever instance nginx picks, applied by the instances' shared
/// job queue). Afterwards every acknowledged delivery, debit and notification is counted in
/// the database, and every notification must be applied.
struct ClusterBench {
    let databaseURL: String
    let instances: [Int]
    let concurrencies: [Int]
    let requestsPerLevel: Int
    let binary: String
    let script: String
    let directory: URL

    struct Row {
        var instances: Int
        var via: String
        var concurrency: Int
        var requests: Int
        var health: NotificationBench.Phase
        var purchases: NotificationBench.Phase
        var reads: NotificationBench.Phase
        var debits: NotificationBench.Phase
        /// Subscriptions' first periods delivered before their renewals are sent.
        var firstPeriods: Int
        var notifications: NotificationBench.Phase
        /// From the first notification sent to none pending: accepted and applied, end to end.
        var appliedSeconds: Double?

        var failed: Int {
            [health, purchases, reads, debits, notifications].map { requests - $0.accepted }.reduce(0, +)
                + (requests - firstPeriods)
        }
    }

    /// What one level sends: coins purchases, then subscriptions' first periods and their renewals.
    struct Load {
        var purchases: [String]
        var subscriptions: [String]
        var renewals: [String]
    }

    func run() async throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        // The local App Store's keys, made here so this process signs what every instance trusts.
        let pki = try PKIStore.loadOrCreate(
            dataDirectory: directory.appendingPathComponent("data").appendingPathComponent("local-store"))
        let run = UInt64.random(in: 0..<1_000_000)
        // One level per (instances, concurrency), plus the direct one-instance levels.
        let levels = (instances.count + (instances.contains(1) ? 1 : 0)) * concurrencies.count
        FileHandle.standardError.write(
            Data("signing \(levels * requestsPerLevel) purchases and as many subscriptions with renewals…\n".utf8))
        let loads = try (0..<levels).map { level in
            try Self.load(pki.jwsSigner, run: run, level: level, requestsPerLevel)
        }
        let port = try FreePort.block(10)
        let cluster = Cluster(script: script, binary: binary, directory: directory, config: "", port: port)
        var rows: [Row] = []
        let database = try await Database.open(url: databaseURL)
        do {
            try await measure(cluster: cluster, port: port, loads: loads, run: run, database: database, rows: &rows)
        } catch {
            await cluster.stop()
            try? await database.close()
            FileHandle.standardError.write(Data("logs: \(directory.path)\n".utf8))
            throw error
        }
        await cluster.stop()
        do {
            try await report(rows, run: run, database: database)
        } catch {
            try? await database.close()
            throw error
        }
        try await database.close()
    }

    static func load(_ signer: JWSSigner, run: UInt64, level: Int, _ count: Int) throws -> Load {
        let issuer = TransactionIssuer()
        let offset = level * count
        let purchases = try (offset..<(offset + count)).map { index in
            var payload = issuer.transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(7_000_000_000_000_000 + run * 10_000_000 + UInt64(index)))
            payload.appTransactionId = String(706_000_000_000_000_000 + run * 1_000 + UInt64(index % 1000))
            return #"{"accountId":"cb\#(run)-\#(index % 1000)","signedTransaction":"\#(try signer.sign(payload))"}"#
        }
        let (subscriptions, renewals) = try NotificationBench.subscriptions(
            signer, run: run, indices: offset..<(offset + count), accountPrefix: "cs\(run)-")
        return Load(purchases: purchases, subscriptions: subscriptions, renewals: renewals)
    }

    func measure(
        cluster: Cluster, port: Int, loads: [Load], run: UInt64, database: Database, rows: inout [Row]
    ) async throws {
        var level = 0
        for count in instances {
            FileHandle.standardError.write(Data("\(count) instance(s) behind nginx…\n".utf8))
            await cluster.stop()
            try await cluster.start(count: count, databaseURL: databaseURL)
            let key = try String(contentsOf: directory.appendingPathComponent("secret-key"), encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines)
            // nginx, and (with one instance) the instance itself, at every concurrency.
            var targets = [("nginx", port)]
            if count == 1 { targets.insert(("direct", port + 1), at: 0) }
            for (via, target) in targets {
                for concurrency in concurrencies {
                    let load = loads[level]
                    FileHandle.standardError.write(
                        Data("  \(count) instance(s), \(via), \(concurrency) clients…\n".utf8))
                    func send(
                        _ paths: [String], _ bodies: [String], _ method: String = "POST", expect: String = ""
                    ) async throws -> NotificationBench.Phase {
                        let started = ContinuousClock.now
                        let answers = try await LoadGenerator.run(
                            host: "127.0.0.1", port: target, path: paths[0], authorization: "Bearer \(key)",
                            bodies: bodies, concurrency: concurrency, expect: expect, method: method,
                            paths: paths.count > 1 ? paths : nil)
                        return NotificationBench.Phase(
                            answers: answers, seconds: BenchCommand.seconds(ContinuousClock.now - started))
                    }
                    let requests = requestsPerLevel
                    let empty = Array(repeating: "", count: requests)
                    let health = try await send(["/healthz"], empty, "GET")
                    let purchases = try await send(["/v1/purchases"], load.purchases, expect: #""status":"delivered""#)
                    // The accounts just credited (60 coins a purchase): each read, and debited one
                    // coin, once per purchase it got.
                    let accounts = (0..<requests).map { "/v1/accounts/cb\(run)-\((level * requests + $0) % 1000)" }
                    let reads = try await send(accounts, empty, "GET", expect: #""balances""#)
                    let debits = try await send(
                        accounts.map { $0 + "/balances/coins/debit" },
                        (0..<requests).map { #"{"amount":1,"idempotencyKey":"cb\#(run)-\#(level)-\#($0)"}"# },
                        expect: #""balance""#)
                    let firstPeriods = try await send(
                        ["/v1/purchases"], load.subscriptions, expect: #""status":"delivered""#)
                    let sent = ContinuousClock.now
                    let notifications = try await send(["/v1/notifications/apple"], load.renewals)
                    let applied = try await Self.waitUntilApplied(database, since: sent)
                    rows.append(
                        Row(
                            instances: count, via: via, concurrency: concurrency, requests: requests, health: health,
                            purchases: purchases, reads: reads, debits: debits, firstPeriods: firstPeriods.accepted,
                            notifications: notifications, appliedSeconds: applied))
                    level += 1
                }
            }
        }
    }

    /// Seconds from `since` until no notification is pending, or nil after 120 s.
    static func waitUntilApplied(_ database: Database, since: ContinuousClock.Instant) async throws -> Double? {
        let deadline = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < deadline {
            let pending: Int = try await database.read { sql in
                try await sql.raw("SELECT COUNT(*) AS n FROM notifications WHERE status = 'pending'").first()?
                    .decode(column: "n", as: Int.self) ?? 0
            }
            if pending == 0 { return BenchCommand.seconds(ContinuousClock.now - since) }
            try await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    func report(_ rows: [Row], run: UInt64, database: Database) async throws {
        func count(_ query: SQLQueryString) async throws -> Int {
            try await database.read { sql in
                try await sql.raw(query).first()?.decode(column: "n", as: Int.self) ?? 0
            }
        }
        let deliveries = try await count(
            "SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE \(bind: "cb\(run)-%")")
        let renewed = try await count(
            "SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE \(bind: "cs\(run)-%")")
        let debited = try await count(
            "SELECT COUNT(*) AS n FROM debit_requests WHERE idempotency_key LIKE \(bind: "cb\(run)-%")")
        let pending = try await count("SELECT COUNT(*) AS n FROM notifications WHERE status = 'pending'")
        let acknowledged = rows.map(\.purchases.accepted).reduce(0, +)
        let acknowledgedDebits = rows.map(\.debits.accepted).reduce(0, +)
        let notifications = rows.map(\.notifications.accepted).reduce(0, +)

        print("## Several instances behind nginx — PostgreSQL")
        print("")
        print(
            "machine: \(BenchCommand.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores (load "
                + "generator, nginx, the instances and PostgreSQL all on them); \(requestsPerLevel) requests of each kind per row"
        )
        print("")
        func rate(_ value: Double) -> String { String(format: "%.0f", value) }
        func ms(_ value: Double) -> String { String(format: "%.1f ms", value * 1000) }
        func ratio(_ value: Double, _ base: Double) -> String { String(format: "%.2f", value / base) }
        func base(_ row: Row) -> Row { rows.first { $0.via == "direct" && $0.concurrency == row.concurrency } ?? row }
        print(
            "| instances | via | clients | `/healthz`/s | deliveries/s | p50 | p99 | vs 1 direct | account reads/s | p99 | vs 1 direct |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows {
            print(
                "| \(row.instances) | \(row.via) | \(row.concurrency) | \(rate(row.health.perSecond)) | "
                    + "\(rate(row.purchases.perSecond)) | \(ms(row.purchases.percentile(0.5))) | "
                    + "\(ms(row.purchases.percentile(0.99))) | "
                    + "\(ratio(row.purchases.perSecond, base(row).purchases.perSecond)) | "
                    + "\(rate(row.reads.perSecond)) | \(ms(row.reads.percentile(0.99))) | "
                    + "\(ratio(row.reads.perSecond, base(row).reads.perSecond)) |")
        }
        print("")
        print(
            "| instances | via | clients | debits/s | p99 | notifications accepted/s | p99 | accepted and applied/s | vs 1 direct | failed |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows {
            let applied = row.appliedSeconds.map { Double(row.requests) / $0 }
            let baseApplied = base(row).appliedSeconds.map { Double(row.requests) / $0 }
            print(
                "| \(row.instances) | \(row.via) | \(row.concurrency) | \(rate(row.debits.perSecond)) | "
                    + "\(ms(row.debits.percentile(0.99))) | \(rate(row.notifications.perSecond)) | "
                    + "\(ms(row.notifications.percentile(0.99))) | \(applied.map(rate) ?? "not within 120 s") | "
                    + "\(applied.flatMap { value in baseApplied.map { ratio(value, $0) } } ?? "—") | \(row.failed) |")
        }
        print("")
        print(
            "acknowledged deliveries: \(acknowledged); in the database: \(deliveries) (lost: \(max(0, acknowledged - deliveries))); "
                + "debits acknowledged \(acknowledgedDebits), stored \(debited); notifications acknowledged "
                + "\(notifications), renewals delivered \(renewed) (first periods + renewals), pending \(pending)")
        print("")
        if deliveries < acknowledged || debited < acknowledgedDebits {
            throw BenchFailure(description: "acknowledged deliveries or debits are not in the database")
        }
        let subscriptions = rows.map(\.firstPeriods).reduce(0, +)
        if pending > 0 || renewed != subscriptions + notifications {
            throw BenchFailure(
                description:
                    "\(renewed) subscription deliveries, expected \(subscriptions + notifications); \(pending) pending")
        }
    }
}
