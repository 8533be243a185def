import AppStoreModels
import AppStoreSigning
import Foundation
import LocalAppStore
import NIOCore
import StoreKeeperServer

/// `bench --notifications`: App Store Server Notifications through the real server. The
/// baseline, in the same run: deliveries of the subscriptions' first periods (`POST
/// /v1/purchases`, which also binds each to its account). Then a renewal notification per
/// subscription at `concurrency` senders — accepted per second (verify the payload, the
/// transaction and the renewal info, one group-committed insert, the answer) with the job
/// runner stopped — then applied per second once it starts, until the backlog is empty. Last,
/// a steady `rate` per second for `seconds` with both running: the backlog must return to
/// zero.
struct NotificationBench {
    let databaseURL: String?
    let concurrency: Int
    let count: Int
    let rate: Int
    let seconds: Int

    struct Phase {
        var answers: [LoadGenerator.Answer]
        var seconds: Double
        /// CPU time (user + system) this process — server and load generator — spent on the
        /// phase, when measured: unlike throughput, it barely moves with what else the
        /// machine (or its host) is doing.
        var cpuSeconds: Double? = nil

        /// CPU microseconds per accepted request.
        var cpuPerRequest: Double? {
            cpuSeconds.map { $0 * 1e6 / Double(max(accepted, 1)) }
        }

        /// This process's CPU time so far (user + system), in seconds.
        static func processCPU() -> Double {
            var usage = rusage()
            #if os(Linux)
                getrusage(RUSAGE_SELF.rawValue, &usage)
            #else
                getrusage(RUSAGE_SELF, &usage)
            #endif
            return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
                + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
        }

        var accepted: Int { answers.lazy.filter { $0.outcome == .delivered }.count }
        var perSecond: Double { Double(accepted) / seconds }

        func percentile(_ p: Double) -> Double {
            let sorted = answers.filter { $0.outcome == .delivered }.map(\.latency).sorted()
            guard !sorted.isEmpty else { return .nan }
            return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }
    }

    /// For each index: a `pro_monthly` subscription's first period, as a `POST /v1/purchases`
    /// body for account `accountPrefix + index`, and its DID_RENEW notification (the renewal's
    /// signed transaction and renewal info), as a `POST /v1/notifications/apple` body. Ids are
    /// fresh for each `run`.
    static func subscriptions(_ signer: JWSSigner, run: UInt64, indices: Range<Int>, accountPrefix: String) throws
        -> (purchases: [String], notifications: [String])
    {
        let issuer = TransactionIssuer()
        // Short periods in the recent past: the local App Store's certificates are valid from a
        // day ago, and a signature is checked at its signing date.
        let firstPeriod = Date().addingTimeInterval(-20 * 3600)
        let purchase = TransactionIssuer.Purchase(
            bundleId: "com.example.app", productId: "pro_monthly", type: .autoRenewable, unitPrice: 4990,
            subscriptionGroupIdentifier: "pro", subscriptionPeriod: 10 * 3600)
        var purchases: [String] = []
        var notifications: [String] = []
        purchases.reserveCapacity(indices.count)
        notifications.reserveCapacity(indices.count)
        for index in indices {
            let original = String(4_000_000_000_000_000 + run * 100_000_000 + UInt64(index) * 2)
            let first = issuer.transaction(for: purchase, at: firstPeriod, id: original)
            purchases.append(
                #"{"accountId":"\#(accountPrefix)\#(index)","signedTransaction":"\#(try signer.sign(first))"}"#)
            let renewedAt = Date(timeIntervalSince1970: Double(first.expiresDate!) / 1000)
            var renewal = issuer.transaction(
                for: purchase, at: renewedAt, id: String(4_000_000_000_000_001 + run * 100_000_000 + UInt64(index) * 2))
            renewal.originalTransactionId = original
            renewal.originalPurchaseDate = first.purchaseDate
            renewal.transactionReason = .renewal
            let renewalInfo = JWSRenewalInfoDecodedPayload(
                originalTransactionId: original, productId: "pro_monthly", autoRenewProductId: "pro_monthly",
                autoRenewStatus: .on, signedDate: renewal.signedDate, environment: .production,
                renewalDate: renewal.expiresDate, renewalPrice: 4990, currency: "USD")
            let payload = ResponseBodyV2DecodedPayload(
                notificationType: .didRenew, notificationUUID: UUID().uuidString.lowercased(), version: "2.0",
                signedDate: renewal.signedDate,
                data: NotificationData(
                    appAppleId: 1_234_567_890, bundleId: "com.example.app", bundleVersion: "1",
                    environment: .production, signedTransactionInfo: try signer.sign(renewal),
                    signedRenewalInfo: try signer.sign(renewalInfo), status: .init(rawValue: 1)))
            notifications.append(#"{"signedPayload":"\#(try signer.sign(payload))"}"#)
        }
        return (purchases, notifications)
    }

    func run() async throws {
        // The job runner is started by hand: accepting is measured alone, then applying.
        let server = try await PurchaseBench.Server.start(databaseURL: databaseURL, runJobs: false)
        let app = server.app
        let signer = server.store.pki.jwsSigner
        let steady = rate * seconds
        let total = count + steady
        FileHandle.standardError.write(Data("signing \(total) subscriptions and their renewal notifications…\n".utf8))
        // Fresh ids on every run, so a database reused between runs measures new work.
        let run = UInt64.random(in: 0..<1_000_000)
        let (purchases, notifications) = try Self.subscriptions(
            signer, run: run, indices: 0..<total, accountPrefix: "nb\(run)-")

        func send(
            _ path: String, _ bodies: ArraySlice<String>, concurrency: Int, expect: String,
            interval: TimeAmount? = nil
        ) async throws -> Phase {
            let started = ContinuousClock.now
            let cpu = Phase.processCPU()
            let answers = try await LoadGenerator.run(
                host: "127.0.0.1", port: server.port, path: path, authorization: "Bearer \(PurchaseBench.key)",
                bodies: Array(bodies), concurrency: concurrency, expect: expect, interval: interval)
            return Phase(
                answers: answers, seconds: BenchCommand.seconds(ContinuousClock.now - started),
                cpuSeconds: Phase.processCPU() - cpu)
        }

        FileHandle.standardError.write(Data("measuring…\n".utf8))
        // 1. The baseline: the first periods, delivered.
        let deliveries = try await send(
            "/v1/purchases", purchases[...], concurrency: concurrency, expect: #""status":"delivered""#)
        // 2. A renewal for `count` of them, as fast as `concurrency` senders go: verified and
        // recorded, nothing applied yet.
        let accepted = try await send(
            "/v1/notifications/apple", notifications[..<count], concurrency: concurrency, expect: "")
        // 3. The job runner starts: how fast it applies the backlog.
        let runner = Task { try await JobRunner(app: app, pollInterval: .milliseconds(200)).run() }
        let burstStart = ContinuousClock.now
        var drained: Double?
        for _ in 0..<1200 {
            if try await app.notifications.pendingCount() == 0 {
                drained = BenchCommand.seconds(ContinuousClock.now - burstStart)
                break
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        // 4. A steady rate while it runs: `rate` a second over `concurrency` connections, the
        // backlog sampled meanwhile.
        let backlogSamples = Task { () -> [Int] in
            var samples: [Int] = []
            while !Task.isCancelled {
                samples.append((try? await app.notifications.pendingCount()) ?? 0)
                try? await Task.sleep(for: .milliseconds(100))
            }
            return samples
        }
        let steadyStart = ContinuousClock.now
        let steadyAnswers =
            steady == 0
            ? []
            : try await send(
                "/v1/notifications/apple", notifications[count...], concurrency: concurrency, expect: "",
                interval: .nanoseconds(1_000_000_000 / Int64(rate))
            ).answers
        let steadySent = BenchCommand.seconds(ContinuousClock.now - steadyStart)
        backlogSamples.cancel()
        var backlog = await backlogSamples.value
        var settled: Double?
        let stopped = ContinuousClock.now
        for _ in 0..<600 {
            let pending = try await app.notifications.pendingCount()
            backlog.append(pending)
            if pending == 0 {
                settled = BenchCommand.seconds(ContinuousClock.now - stopped)
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        let steadyPhase = Phase(answers: steadyAnswers, seconds: steadySent)
        runner.cancel()

        // Every acknowledged notification is recorded, once, and applied: each renewal delivered.
        let recorded = try await app.notifications.count()
        let statuses = try await app.notifications.counts()
        let renewals = try await app.database.read { sql in
            try await sql.raw(
                "SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE \(bind: "nb\(run)-%")"
            ).first()?.decode(column: "n", as: Int.self) ?? 0
        }
        await server.stop()

        let acknowledged = accepted.accepted + steadyPhase.accepted
        print("## App Store Server Notifications end to end — \(app.database.kind.rawValue)")
        print("")
        print(
            "machine: \(BenchCommand.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores; "
                + "\(count) renewals at \(concurrency) senders, then \(rate)/s for \(seconds) s")
        print("")
        print("| measurement | count | per second | p50 | p99 | vs deliveries | CPU per request |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        func row(_ name: String, _ phase: Phase) {
            print(
                "| \(name) | \(phase.accepted) | \(String(format: "%.0f", phase.perSecond)) | "
                    + "\(String(format: "%.1f ms", phase.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", phase.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.2f", phase.perSecond / deliveries.perSecond)) | "
                    + "\(phase.cpuPerRequest.map { String(format: "%.0f µs", $0) } ?? "–") |")
        }
        row("deliveries, `POST /v1/purchases` (baseline)", deliveries)
        row("notifications accepted (verify + durable insert, answered; nothing applied meanwhile)", accepted)
        if let drained {
            let applied = Double(count) / drained
            print(
                "| notifications applied (the backlog of \(count), by the job runner) | \(count) | \(String(format: "%.0f", applied)) | | | "
                    + "\(String(format: "%.2f", applied / deliveries.perSecond)) | – |")
        } else {
            print("| notifications applied | not all within 60 s | | | | | |")
        }
        print("")
        print(
            "steady \(rate)/s: sent \(steadyPhase.accepted) in \(String(format: "%.1f", steadySent)) s "
                + "(p99 \(String(format: "%.1f ms", steadyPhase.percentile(0.99) * 1000))); backlog at most "
                + "\(backlog.max() ?? 0), back to zero "
                + (settled.map { String(format: "%.2f s after the last one", $0) } ?? "NOT within 60 s"))
        print(
            "acknowledged: \(acknowledged); recorded: \(recorded) (\(statuses.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))); "
                + "deliveries: \(renewals) (first periods \(deliveries.accepted) + renewals)")
        print("")
        if recorded < acknowledged {
            throw BenchFailure(description: "\(acknowledged - recorded) acknowledged notifications are not recorded")
        }
        if renewals != deliveries.accepted + acknowledged {
            throw BenchFailure(
                description: "\(renewals) deliveries, expected \(deliveries.accepted + acknowledged): applied wrongly")
        }
    }
}
