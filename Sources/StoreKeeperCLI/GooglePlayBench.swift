import AppStoreModels
import Foundation
import GooglePlay
import LocalAppStore
import LocalGooglePlay
import StoreKeeperServer

/// `storekeeper bench --purchases --store google_play`: POST /v1/purchases for Google Play
/// purchases end to end — the server reads each token from the local Google Play over HTTP
/// (service-account token cached), delivers through the one path, queues the consumption —
/// beside App Store purchases (JWS verified offline) on the same server in the same run, the
/// baseline its ratio is against.
struct GooglePlayBench {
    let databaseURL: String?
    let concurrencies: [Int]
    let requestsPerLevel: Int

    /// Rounds a level is cut into (`STOREKEEPER_BENCH_ROUNDS`, 6 unless set).
    static var rounds: Int {
        ProcessInfo.processInfo.environment["STOREKEEPER_BENCH_ROUNDS"].flatMap(Int.init).map { max(1, $0) } ?? 6
    }

    struct Row {
        var concurrency: Int
        var google: PurchaseBench.Level
        var apple: PurchaseBench.Level
        var googleCPU: Double
        var appleCPU: Double
        /// Google ÷ App Store of each round, in order.
        var roundRatios: [Double]
    }

    /// One store's windows of a level, summed: its deliveries over the seconds of its windows.
    struct Window {
        var concurrency: Int
        var answers: [LoadGenerator.Answer] = []
        var seconds: Double = 0
        /// This process's CPU time over the windows and their jobs' drain (server, local Google
        /// Play and load generator alike).
        var cpuSeconds: Double = 0

        mutating func add(_ answers: [LoadGenerator.Answer], seconds: Double, cpuSeconds: Double) {
            self.answers += answers
            self.seconds += seconds
            self.cpuSeconds += cpuSeconds
        }

        /// CPU microseconds per delivery, the window's background jobs included.
        var cpuPerDelivery: Double {
            cpuSeconds * 1e6 / Double(max(1, answers.lazy.filter { $0.outcome == .delivered }.count))
        }

        var level: PurchaseBench.Level {
            PurchaseBench.Level(
                concurrency: concurrency, requests: answers.count, seconds: seconds, answers: answers,
                peakMemory: Memory.peak(), startMemory: 0, restart: nil)
        }
    }

    func run() async throws {
        let play = LocalGooglePlay(
            configuration: .init(packageName: "com.example.android", catalog: .demo),
            clock: StoreClock(start: Date(), scale: 0))
        let playServer = try await LocalGooglePlayServer(store: play)
        // Google's API runs on Google's machines: the fake gets an event loop of its own, so its
        // answers never wait behind the 32–64 purchase connections on the server's loops.
        let running = try await playServer.start(threads: 1)
        let server = try await PurchaseBench.Server.start(databaseURL: databaseURL) { configuration in
            var google = GooglePlayAppConfiguration(id: "android", packageName: "com.example.android")
            google.serviceAccountKey = playServer.serviceAccountKey(baseURL: running.baseURL)
            google.apiBaseURL = running.baseURL
            google.pushAudience = "http://127.0.0.1/v1/notifications/google"
            google.pushServiceAccount = LocalGooglePlayServer.pushServiceAccount
            google.pushCertificatesURL = running.baseURL + "/oauth2/v3/certs"
            configuration.googlePlayApps = [google]
        }
        let total = requestsPerLevel * concurrencies.count
        FileHandle.standardError.write(Data("buying \(total) purchases at each store…\n".utf8))
        let run = UInt64.random(in: 0..<1_000_000)
        var googleBodies: [String] = []
        var appleBodies: [String] = []
        let signer = server.store.pki.jwsSigner
        let issuer = TransactionIssuer()
        for index in 0..<total {
            let token = try await play.buy("coins_60", obfuscatedAccountId: nil)
            googleBodies.append(
                #"{"store":"google_play","appId":"android","accountId":"gp\#(run)-\#(index % 1000)","productId":"coins_60","purchaseToken":"\#(token)"}"#
            )
            let payload = issuer.transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(4_000_000_000_000_000 + run * 10_000_000 + UInt64(index)))
            appleBodies.append(
                #"{"accountId":"as\#(run)-\#(index % 1000)","signedTransaction":"\#(try signer.sign(payload))"}"#)
        }
        var rows: [Row] = []
        var offset = 0
        for concurrency in concurrencies {
            // A level is cut into rounds, each an App Store window and a Google Play window, in
            // turn first (ABBA): a shared machine's speed drifts over a level's minutes, and two
            // long windows one after the other measured the drift as much as the stores (the
            // same build's ratio ranged 0.24–0.72 over four runs on 2026-12-01).
            let rounds = max(1, min(Self.rounds, requestsPerLevel / 100))
            var google = Window(concurrency: concurrency)
            var apple = Window(concurrency: concurrency)
            var roundRatios: [Double] = []
            for round in 0..<rounds {
                let start = offset + requestsPerLevel * round / rounds
                let end = offset + requestsPerLevel * (round + 1) / rounds
                // Each window starts on a quiet server: the other window's background work (the
                // App Store's Set App Account Token claims, Google's acknowledgements) runs to its
                // end first, so neither store's window carries the other's jobs.
                func measure(_ bodies: [String], into window: inout Window) async throws -> Double {
                    try await drainJobs()
                    let started = ContinuousClock.now
                    let cpu = NotificationBench.Phase.processCPU()
                    let answers = try await LoadGenerator.run(
                        host: "127.0.0.1", port: server.port, path: "/v1/purchases",
                        authorization: "Bearer \(PurchaseBench.key)", bodies: Array(bodies[start..<end]),
                        concurrency: concurrency, expect: #""status":"delivered""#)
                    let seconds = BenchCommand.seconds(ContinuousClock.now - started)
                    // The CPU a window cost includes its jobs, run to their end.
                    try await drainJobs()
                    window.add(answers, seconds: seconds, cpuSeconds: NotificationBench.Phase.processCPU() - cpu)
                    return Double(answers.lazy.filter { $0.outcome == .delivered }.count) / seconds
                }
                let appleRate: Double
                let googleRate: Double
                if round % 2 == 0 {
                    appleRate = try await measure(appleBodies, into: &apple)
                    googleRate = try await measure(googleBodies, into: &google)
                } else {
                    googleRate = try await measure(googleBodies, into: &google)
                    appleRate = try await measure(appleBodies, into: &apple)
                }
                roundRatios.append(googleRate / max(1, appleRate))
            }
            offset += requestsPerLevel
            rows.append(
                Row(
                    concurrency: concurrency, google: google.level, apple: apple.level,
                    googleCPU: google.cpuPerDelivery, appleCPU: apple.cpuPerDelivery, roundRatios: roundRatios))
        }
        /// Waits (up to three minutes) until no job is due within the next two minutes: a window's
        /// jobs run to their end before the next window starts. The App Store's Set App Account
        /// Token claims are paced at Apple's 20 calls a second — a 500-purchase window's take 25 s,
        /// rescheduled ahead in batches — and with a ten-second horizon the last of them came due
        /// in the next (Google Play) window and were counted against it.
        func drainJobs() async throws {
            let deadline = ContinuousClock.now + .seconds(180)
            while ContinuousClock.now < deadline {
                let soon = Int64((Date().timeIntervalSince1970 + 120) * 1000)
                let due = try await server.app.database.read { sql in
                    try await sql.raw(
                        "SELECT COUNT(*) AS n FROM jobs WHERE status = 'pending' AND run_at <= \(bind: soon)"
                    ).first()?.decode(column: "n", as: Int.self) ?? 0
                }
                if due == 0 { return }
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        let delivered = try await server.app.database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE \(bind: "gp\(run)-%")")
                .first()?.decode(column: "n", as: Int.self) ?? 0
        }
        let kind = server.app.database.kind.rawValue
        await server.stop()
        await running.stop()

        print("## POST /v1/purchases, Google Play beside the App Store — \(kind)")
        print("")
        print(
            "| concurrency | requests | Google Play deliveries/s | p50 | p99 | App Store deliveries/s (same run) | Google ÷ App Store | rounds' ratios | CPU µs per delivery, Google / App Store |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for row in rows {
            print(
                "| \(row.concurrency) | \(row.google.requests) | \(String(format: "%.0f", row.google.deliveriesPerSecond)) | "
                    + "\(String(format: "%.1f ms", row.google.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", row.google.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.0f", row.apple.deliveriesPerSecond)) | "
                    + "\(String(format: "%.2f", row.google.deliveriesPerSecond / max(1, row.apple.deliveriesPerSecond))) | "
                    + row.roundRatios.map { String(format: "%.2f", $0) }.joined(separator: " ") + " | "
                    + String(format: "%.0f / %.0f", row.googleCPU, row.appleCPU) + " |"
            )
        }
        let acknowledged = rows.map(\.google.delivered).reduce(0, +)
        print("")
        print(
            "Google Play deliveries acknowledged: \(acknowledged); rows in the database: \(delivered) (each once). "
                + "Each Google Play purchase is one Play Developer API read over HTTP (loopback, the local Google Play) "
                + "before the same delivery path; an App Store purchase is verified offline. Each level is cut into "
                + "rounds of an App Store window and a Google Play window, in turn first (\"rounds' ratios\": each "
                + "round's ratio); each window starts once the previous one's jobs (claims, acknowledgements) are done; a rate "
                + "is a store's deliveries over the seconds of its windows. CPU per delivery: this process's CPU time (server, "
                + "local Google Play, load generator) over a store's windows and their jobs run to their end.")
        guard delivered == acknowledged else {
            throw BenchFailure(description: "\(acknowledged) acknowledged, \(delivered) in the database")
        }
    }
}
