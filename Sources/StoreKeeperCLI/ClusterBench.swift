import AppStoreModels
import Foundation
import LocalAppStore
import SQLKit
import StoreKeeperStorage

/// `bench --purchases --instances 1 2 4`: the same load through nginx to 1, 2 and 4 `storekeeper
/// serve` processes on one PostgreSQL (scripts/cluster), each level beside two baselines
/// measured in the same run: `GET /healthz` through the same balancer, and one instance
/// reached directly (what nginx costs). Fresh signed transactions only; afterwards every
/// acknowledged delivery is counted in the database.
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
        var health: NotificationBench.Phase
        var purchases: NotificationBench.Phase
        var reads: NotificationBench.Phase
        var requests: Int
    }

    func run() async throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        // The local App Store's keys, made here so this process signs what every instance trusts.
        let pki = try PKIStore.loadOrCreate(
            dataDirectory: directory.appendingPathComponent("data").appendingPathComponent("local-store"))
        let signer = pki.jwsSigner
        let issuer = TransactionIssuer()
        let run = UInt64.random(in: 0..<1_000_000)
        // One level per (instances, concurrency), plus the direct one-instance levels.
        let levels = (instances.count + 1) * concurrencies.count
        FileHandle.standardError.write(Data("signing \(levels * requestsPerLevel) transactions…\n".utf8))
        var next = 0
        func bodies() throws -> [String] {
            defer { next += requestsPerLevel }
            return try (next..<(next + requestsPerLevel)).map { index in
                var payload = issuer.transaction(
                    for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                    id: String(4_000_000_000_000_000 + run * 10_000_000 + UInt64(index)))
                payload.appTransactionId = String(706_000_000_000_000_000 + run * 1_000 + UInt64(index % 1000))
                return #"{"accountId":"cb\#(run)-\#(index % 1000)","signedTransaction":"\#(try signer.sign(payload))"}"#
            }
        }
        let port = 20_000 + Int.random(in: 0..<3_000) * 10
        let cluster = Cluster(script: script, binary: binary, directory: directory, config: "", port: port)
        var rows: [Row] = []
        do {
            try await measure(cluster: cluster, port: port, bodies: bodies, rows: &rows)
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
        try await report(rows, run: run)
    }

    func measure(cluster: Cluster, port: Int, bodies: () throws -> [String], rows: inout [Row]) async throws {
        for count in instances {
            FileHandle.standardError.write(Data("\(count) instance(s) behind nginx…\n".utf8))
            await cluster.stop()
            try await cluster.startDefault(count: count, databaseURL: databaseURL)
            let key = try String(contentsOf: directory.appendingPathComponent("secret-key"), encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines)
            // nginx, and (with one instance) the instance itself, at every concurrency.
            var targets = [("nginx", port)]
            if count == 1 { targets.insert(("direct", port + 1), at: 0) }
            for (via, target) in targets {
                for concurrency in concurrencies {
                    let send = { (path: String, bodies: [String], method: String, expect: String) in
                        let started = ContinuousClock.now
                        let answers = try await LoadGenerator.run(
                            host: "127.0.0.1", port: target, path: path, authorization: "Bearer \(key)",
                            bodies: bodies, concurrency: concurrency, expect: expect, method: method)
                        return NotificationBench.Phase(
                            answers: answers, seconds: BenchCommand.seconds(ContinuousClock.now - started))
                    }
                    let health = try await send(
                        "/healthz", Array(repeating: "", count: requestsPerLevel), "GET", "")
                    let purchases = try await send("/v1/purchases", try bodies(), "POST", #""status":"delivered""#)
                    let reads = try await send(
                        "/v1/accounts/cb\(run)-\(concurrency % 1000)", Array(repeating: "", count: requestsPerLevel),
                        "GET", #""balances""#)
                    rows.append(
                        Row(
                            instances: count, via: via, concurrency: concurrency, health: health,
                            purchases: purchases, reads: reads, requests: requestsPerLevel))
                }
            }
        }
    }

    func report(_ rows: [Row], run: UInt64) async throws {
        let database = try await Database.open(url: databaseURL)
        let stored: Int = try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE \(bind: "cb\(run)-%")")
                .first()?.decode(column: "n", as: Int.self) ?? 0
        }
        try? await database.close()
        let acknowledged = rows.map(\.purchases.accepted).reduce(0, +)

        print("## Several instances behind nginx — PostgreSQL")
        print("")
        print(
            "machine: \(BenchCommand.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores (load "
                + "generator, nginx, the instances and PostgreSQL all on them); \(requestsPerLevel) requests per measurement"
        )
        print("")
        print(
            "| instances | via | clients | `/healthz`/s | deliveries/s | p50 | p99 | vs 1 direct | account reads/s | p99 | vs 1 direct | failed |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        func format(_ value: Double) -> String { String(format: "%.0f", value) }
        func ms(_ value: Double) -> String { String(format: "%.1f ms", value * 1000) }
        for row in rows {
            let base = rows.first { $0.via == "direct" && $0.concurrency == row.concurrency } ?? row
            let failed =
                (row.requests - row.purchases.accepted) + (row.requests - row.reads.accepted)
                + (row.requests - row.health.accepted)
            print(
                "| \(row.instances) | \(row.via) | \(row.concurrency) | \(format(row.health.perSecond)) | "
                    + "\(format(row.purchases.perSecond)) | \(ms(row.purchases.percentile(0.5))) | "
                    + "\(ms(row.purchases.percentile(0.99))) | "
                    + "\(String(format: "%.2f", row.purchases.perSecond / base.purchases.perSecond)) | "
                    + "\(format(row.reads.perSecond)) | \(ms(row.reads.percentile(0.99))) | "
                    + "\(String(format: "%.2f", row.reads.perSecond / base.reads.perSecond)) | \(failed) |")
        }
        print("")
        print(
            "acknowledged deliveries: \(acknowledged); in the database: \(stored) (lost: \(max(0, acknowledged - stored)))"
        )
        print("")
        if stored < acknowledged {
            throw BenchFailure(description: "\(acknowledged - stored) acknowledged deliveries are not in the database")
        }
    }
}

extension Cluster {
    /// scripts/cluster's own configuration (the local App Store's keys in DIR/data, a secret key
    /// in DIR/secret-key) on `databaseURL`.
    func startDefault(count: Int, databaseURL: String) async throws {
        let status = try await Self.runProcess(
            "/bin/bash",
            [
                script, "start", String(count), "--database-url", databaseURL, "--port", String(port), "--dir",
                directory.path, "--binary", binary,
            ], log: directory.appendingPathComponent("cluster.log"))
        guard status == 0 else {
            let output =
                (try? String(contentsOf: directory.appendingPathComponent("cluster.log"), encoding: .utf8)) ?? ""
            throw ChaosError("scripts/cluster start exited \(status): \(output.suffix(500))")
        }
    }
}
