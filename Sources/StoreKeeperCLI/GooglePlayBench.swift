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

    struct Row {
        var concurrency: Int
        var google: PurchaseBench.Level
        var apple: PurchaseBench.Level
    }

    func run() async throws {
        let play = LocalGooglePlay(
            configuration: .init(packageName: "com.example.android", catalog: .demo),
            clock: StoreClock(start: Date(), scale: 0))
        let playServer = try await LocalGooglePlayServer(store: play)
        let running = try await playServer.start()
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
            func level(_ bodies: [String]) async throws -> PurchaseBench.Level {
                let slice = Array(bodies[offset..<(offset + requestsPerLevel)])
                let startMemory = Memory.resetPeak()
                let started = ContinuousClock.now
                let answers = try await LoadGenerator.run(
                    host: "127.0.0.1", port: server.port, path: "/v1/purchases",
                    authorization: "Bearer \(PurchaseBench.key)", bodies: slice, concurrency: concurrency,
                    expect: #""status":"delivered""#)
                return PurchaseBench.Level(
                    concurrency: concurrency, requests: slice.count,
                    seconds: BenchCommand.seconds(ContinuousClock.now - started), answers: answers,
                    peakMemory: Memory.peak(), startMemory: startMemory, restart: nil)
            }
            // Each level starts on a quiet server: the previous level's background work (the App
            // Store's Set App Account Token claims, Google's acknowledgements) runs to its end
            // first, so neither store's window carries the other's jobs.
            try await drainJobs()
            let apple = try await level(appleBodies)
            try await drainJobs()
            let google = try await level(googleBodies)
            offset += requestsPerLevel
            rows.append(Row(concurrency: concurrency, google: google, apple: apple))
        }
        /// Waits (up to two minutes) until no job is due within the next ten seconds.
        func drainJobs() async throws {
            let deadline = ContinuousClock.now + .seconds(120)
            while ContinuousClock.now < deadline {
                let soon = Int64((Date().timeIntervalSince1970 + 10) * 1000)
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
            "| concurrency | requests | Google Play deliveries/s | p50 | p99 | App Store deliveries/s (same run) | Google ÷ App Store |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows {
            print(
                "| \(row.concurrency) | \(row.google.requests) | \(String(format: "%.0f", row.google.deliveriesPerSecond)) | "
                    + "\(String(format: "%.1f ms", row.google.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", row.google.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.0f", row.apple.deliveriesPerSecond)) | "
                    + "\(String(format: "%.2f", row.google.deliveriesPerSecond / max(1, row.apple.deliveriesPerSecond))) |"
            )
        }
        let acknowledged = rows.map(\.google.delivered).reduce(0, +)
        print("")
        print(
            "Google Play deliveries acknowledged: \(acknowledged); rows in the database: \(delivered) (each once). "
                + "Each Google Play purchase is one Play Developer API read over HTTP (loopback, the local Google Play) "
                + "before the same delivery path; an App Store purchase is verified offline. Each level starts once "
                + "the previous one's jobs (claims, acknowledgements) are done.")
        guard delivered == acknowledged else {
            throw BenchFailure(description: "\(acknowledged) acknowledged, \(delivered) in the database")
        }
    }
}
