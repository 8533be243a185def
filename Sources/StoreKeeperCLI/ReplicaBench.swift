import AppStoreModels
import Foundation
import LocalAppStore
import StoreKeeperServer
import StoreKeeperStorage
import Synchronization

/// `bench --replica-reads --database-url P --replica-url R`: analytics and exports under write
/// load, without and then with `database.readReplicaURL` — the same database (prefilled with
/// `--transactions` deliveries), the same purchases written at `--concurrency` while one reader
/// asks for an analytics metric and an export page in turn; each read's latency and the write
/// rate, and how many reads the replica took.
struct ReplicaBench {
    let databaseURL: String
    let replicaURL: String
    let transactions: Int
    let concurrency: Int
    let requests: Int

    struct Phase {
        var replica: Bool
        var writesPerSecond: Double
        var reads: [Double]
        var replicaReads: Int
        var primaryReads: Int

        func percentile(_ p: Double) -> Double {
            guard !reads.isEmpty else { return 0 }
            let sorted = reads.sorted()
            return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }
    }

    func run() async throws {
        var phases: [Phase] = []
        let run = UInt64.random(in: 0..<1_000_000)
        for (index, withReplica) in [false, true].enumerated() {
            let server = try await PurchaseBench.Server.start(databaseURL: databaseURL) { configuration in
                if withReplica {
                    var replica = URLComponents(string: replicaURL)!
                    replica.path = URLComponents(string: databaseURL)!.path
                    configuration.readReplicaURL = replica.string
                }
            }
            if index == 0 {
                FileHandle.standardError.write(Data("writing \(transactions) deliveries…\n".utf8))
                _ = try await AnalyticsBench.prefill(server.app, transactions: transactions, now: Date())
            }
            let signer = server.store.pki.jwsSigner
            let issuer = TransactionIssuer()
            var bodies: [String] = []
            for item in 0..<requests {
                let payload = issuer.transaction(
                    for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                    id: String(4_200_000_000_000_000 + run * 10_000_000 + UInt64(index * requests + item)))
                bodies.append(
                    #"{"accountId":"rb\#(run)-\#(item % 1000)","signedTransaction":"\#(try signer.sign(payload))"}"#)
            }
            FileHandle.standardError.write(
                Data("\(withReplica ? "with" : "without") the replica: \(requests) purchases under reads…\n".utf8))
            let before = server.app.database.readReplica?.readCounts ?? (replica: 0, primary: 0)
            let finished = Mutex(false)
            let writing = Task {
                defer { finished.withLock { $0 = true } }
                return try await server.send(
                    concurrency: concurrency, "/v1/purchases", bodies, expect: #""status":"delivered""#)
            }
            var reads: [Double] = []
            let paths = ["/v1/analytics/mrr?interval=month", "/v1/export/transactions?format=ndjson&limit=1000"]
            var turn = 0
            while !finished.withLock({ $0 }) {
                let started = ContinuousClock.now
                let answer = try await server.send(concurrency: 1, paths[turn % 2], [""], method: "GET")
                guard answer.accepted == 1 else { throw BenchFailure(description: "\(paths[turn % 2]) failed") }
                reads.append(BenchCommand.seconds(ContinuousClock.now - started))
                turn += 1
            }
            let written = try await writing.value
            guard written.accepted == requests else {
                throw BenchFailure(description: "\(written.accepted) of \(requests) purchases delivered")
            }
            let after = server.app.database.readReplica?.readCounts ?? (replica: 0, primary: 0)
            phases.append(
                Phase(
                    replica: withReplica, writesPerSecond: Double(requests) / written.seconds, reads: reads,
                    replicaReads: after.replica - before.replica, primaryReads: after.primary - before.primary))
            await server.stop()
        }
        print("## Analytics and exports under write load, without and with a read replica — postgres")
        print("")
        print(
            "\(transactions) deliveries before; \(requests) purchases at \(concurrency) clients while one reader asks "
                + "`GET /v1/analytics/mrr?interval=month` and `GET /v1/export/transactions?limit=1000` in turn")
        print("")
        print("| reads | purchases/s | reads | read p50 | read p99 | on the replica |")
        print("|---|---:|---:|---:|---:|---:|")
        for phase in phases {
            print(
                "| \(phase.replica ? "replica (`readReplicaURL`)" : "primary only") | "
                    + "\(String(format: "%.0f", phase.writesPerSecond)) | \(phase.reads.count) | "
                    + "\(AnalyticsBench.ms(phase.percentile(0.5))) | \(AnalyticsBench.ms(phase.percentile(0.99))) | "
                    + "\(phase.replica ? "\(phase.replicaReads) of \(phase.replicaReads + phase.primaryReads)" : "—") |"
            )
        }
    }
}
