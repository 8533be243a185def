import Foundation
import LocalAppStore
import StoreKeeperServer
import StoreKeeperStorage

/// `bench --accounts`: what an app's backend does most once purchases are in — `GET
/// /v1/accounts/{id}` (balances, entitlements, subscriptions) and `POST …/balances/coins/debit`
/// (one durable ledger write each, all on one account: the hot-row worst case) — through the
/// real server at `concurrency` connections, beside `GET /healthz` in the same run.
struct AccountBench {
    let databaseURL: String?
    let concurrency: Int
    let count: Int

    func run() async throws {
        let server = try await PurchaseBench.Server.start(databaseURL: databaseURL)
        let app = server.app
        let signer = server.store.pki.jwsSigner
        let issuer = TransactionIssuer()
        let run = UInt64.random(in: 0..<1_000_000)
        let account = "ab\(run)"
        // Enough coins for every debit: 60 a purchase, 1 a debit.
        let mixed = max(count / 4, 1)
        let purchases = (count + mixed) / 60 + 1
        FileHandle.standardError.write(Data("crediting \(account) with \(purchases) purchases…\n".utf8))
        let coins = TransactionIssuer.Purchase(bundleId: "com.example.app", productId: "coins_60")
        var bodies: [String] = []
        for index in 0..<purchases {
            let id = String(6_000_000_000_000_000 + run * 100_000 + UInt64(index))
            let jws = try signer.sign(issuer.transaction(for: coins, at: Date().addingTimeInterval(-60), id: id))
            bodies.append(#"{"accountId":"\#(account)","signedTransaction":"\#(jws)"}"#)
        }
        let health = try await server.deliverThenMeasureHealth(
            concurrency: concurrency, purchases: bodies, healthRequests: count)
        let reads = try await server.send(
            concurrency: concurrency,
            "/v1/accounts/\(account)", Array(repeating: "", count: count), method: "GET", expect: #""balances""#)
        let debits = try await server.send(
            concurrency: concurrency,
            "/v1/accounts/\(account)/balances/coins/debit",
            (0..<count).map { #"{"amount":1,"idempotencyKey":"ab\#(run)-\#($0)"}"# }, expect: #""balance""#)
        // Reads while debits commit, half the connections each: what an app sees when one
        // account is read while its coins are spent. (CPU is shared, so not reported per row.)
        let half = max(concurrency / 2, 1)
        async let mixedDebits = server.send(
            concurrency: half,
            "/v1/accounts/\(account)/balances/coins/debit",
            (0..<mixed).map { #"{"amount":1,"idempotencyKey":"abm\#(run)-\#($0)"}"# }, expect: #""balance""#)
        var mixedReads = try await server.send(
            concurrency: half,
            "/v1/accounts/\(account)", Array(repeating: "", count: mixed), method: "GET", expect: #""balances""#)
        var debitsBeside = try await mixedDebits
        mixedReads.cpuSeconds = nil
        debitsBeside.cpuSeconds = nil
        // `/healthz` behind a backlog: it reads the oldest pending job, which must cost the same
        // with 100,000 waiting (not yet due, so the runner leaves them) as with none.
        FileHandle.standardError.write(Data("queueing a backlog of \(Self.backlog) jobs…\n".utf8))
        try await Self.queueBacklog(app, jobs: Self.backlog)
        let healthBehindBacklog = try await server.send(
            concurrency: concurrency, "/healthz", Array(repeating: "", count: count), method: "GET")
        try await Task.sleep(for: .milliseconds(2500))
        await server.stop()

        print("## Account reads and debits end to end — \(app.database.kind.rawValue)")
        print("")
        print(
            "machine: \(BenchCommand.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores; "
                + "\(count) requests each at \(concurrency) connections, one account")
        print("")
        PurchaseBench.Server.printTable(
            [
                ("`GET /v1/accounts/{id}` (balances, entitlements, subscriptions)", reads),
                ("`POST /v1/accounts/{id}/balances/coins/debit` (durable ledger write)", debits),
                ("`GET /v1/accounts/{id}` while debits run (\(half) connections each)", mixedReads),
                ("`POST …/debit` beside those reads (\(half) connections)", debitsBeside),
                ("`GET /healthz` behind \(Self.backlog) pending jobs", healthBehindBacklog),
            ], baseline: health)
        print("")
        if reads.accepted != count || debits.accepted != count || mixedReads.accepted != mixed
            || debitsBeside.accepted != mixed || healthBehindBacklog.accepted != count
        {
            throw BenchFailure(
                description: "\(reads.accepted) reads, \(debits.accepted) debits answered, of \(count); "
                    + "\(mixedReads.accepted) reads and \(debitsBeside.accepted) debits side by side, of \(mixed)")
        }
    }
}

extension AccountBench {
    static let backlog = 100_000

    /// `jobs` pending jobs, due in a day, written straight into the queue.
    static func queueBacklog(_ app: StoreKeeperApp, jobs: Int) async throws {
        try await app.jobs.queueBacklog(jobs, kind: "backlog", runAt: Date().addingTimeInterval(86_400))
    }
}

extension PurchaseBench.Server {
    /// `bodies` through the lean load generator at `concurrency` connections, timed.
    func send(concurrency: Int, _ path: String, _ bodies: [String], method: String = "POST", expect: String = "")
        async throws -> NotificationBench.Phase
    {
        let started = ContinuousClock.now
        let cpu = NotificationBench.Phase.processCPU()
        let answers = try await LoadGenerator.run(
            host: "127.0.0.1", port: port, path: path, authorization: "Bearer \(PurchaseBench.key)",
            bodies: bodies, concurrency: concurrency, expect: expect, interval: nil, method: method)
        return .init(
            answers: answers, seconds: BenchCommand.seconds(ContinuousClock.now - started),
            cpuSeconds: NotificationBench.Phase.processCPU() - cpu)
    }

    /// Delivers the setup purchases (every one must be delivered), then measures the baseline,
    /// `GET /healthz`, at the same concurrency.
    func deliverThenMeasureHealth(concurrency: Int, purchases: [String], healthRequests: Int) async throws
        -> NotificationBench.Phase
    {
        let delivered = try await send(
            concurrency: concurrency, "/v1/purchases", purchases, expect: #""status":"delivered""#)
        guard delivered.accepted == purchases.count else {
            throw BenchFailure(description: "only \(delivered.accepted) of \(purchases.count) purchases delivered")
        }
        FileHandle.standardError.write(Data("measuring…\n".utf8))
        let health = try await send(
            concurrency: concurrency, "/healthz", Array(repeating: "", count: healthRequests), method: "GET")
        // Each /healthz races its database ping against a 2 s timer, and a cancelled timer
        // still fires on Swift's timer queue when it is due: tens of thousands of them kept
        // that queue's thread busy through the next phase (~10 % of an account read's CPU). A
        // load balancer asks every few seconds; only a benchmark asks 20,000 times a second.
        try await Task.sleep(for: .milliseconds(2500))
        return health
    }

    /// The measurements beside `GET /healthz` measured in the same run, as a Markdown table.
    static func printTable(_ rows: [(String, NotificationBench.Phase)], baseline health: NotificationBench.Phase) {
        print("| measurement | count | per second | p50 | p99 | vs /healthz | CPU per request |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for (name, phase) in [("`GET /healthz` (baseline: one database round trip)", health)] + rows {
            print(
                "| \(name) | \(phase.accepted) | \(String(format: "%.0f", phase.perSecond)) | "
                    + "\(String(format: "%.1f ms", phase.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", phase.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.2f", phase.perSecond / health.perSecond)) | "
                    + "\(phase.cpuPerRequest.map { String(format: "%.0f µs", $0) } ?? "–") |")
        }
    }
}
