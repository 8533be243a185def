import AppStoreModels
import Foundation
import LocalAppStore
import LocalStripe
import StoreKeeperServer
import Stripe

/// `storekeeper bench --purchases --store stripe`: webhook-driven deliveries end to end — paid
/// Checkout Sessions' `checkout.session.completed` events posted as Stripe signs them to
/// `POST /v1/notifications/stripe`; each verified, recorded once, its session re-read from the
/// local Stripe over HTTP, delivered through the one path — beside App Store purchases (JWS
/// verified offline) on the same server in the same run, the baseline its ratio is against.
struct StripeBench {
    let databaseURL: String?
    let concurrencies: [Int]
    let requestsPerLevel: Int

    struct Row {
        var concurrency: Int
        var stripe: PurchaseBench.Level
        var stripeDelivered: Int
        var apple: PurchaseBench.Level
    }

    func run() async throws {
        let stripe = LocalStripe(configuration: .init(catalog: .demo))
        let stripeServer = LocalStripeServer(stripe: stripe)
        let running = try await stripeServer.start()
        let secret = "whsec_bench_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        let server = try await PurchaseBench.Server.start(databaseURL: databaseURL) { configuration in
            var web = StripeAppConfiguration(id: "web")
            web.secretKey = stripeServer.secretKey
            web.apiBaseURL = running.baseURL
            web.webhookSecrets = [secret]
            configuration.stripeApps = [web]
        }
        let total = requestsPerLevel * concurrencies.count
        FileHandle.standardError.write(Data("opening and paying \(total) Stripe checkouts…\n".utf8))
        let run = UInt64.random(in: 0..<1_000_000)
        let orders = (0..<total).map {
            #"{"accountId":"st\#(run)-\#($0 % 1000)","productId":"coins_60","appId":"web"}"#
        }
        let opened = try await LoadGenerator.run(
            host: "127.0.0.1", port: server.port, path: "/v1/orders", authorization: "Bearer \(PurchaseBench.key)",
            bodies: orders, concurrency: 16, expect: #""checkout""#)
        guard opened.allSatisfy({ $0.outcome == .delivered }) else {
            throw BenchFailure(description: "not every order opened a checkout")
        }
        let sessions = try await server.app.database.read { sql in
            try await sql.raw(
                "SELECT session_id FROM stripe_checkouts WHERE account_id LIKE \(bind: "st\(run)-%") ORDER BY created_at"
            ).all().map { try $0.decode(column: "session_id", as: String.self) }
        }
        for session in sessions { _ = try stripe.pay(session: session) }
        // Stripe renders its answers on its own machines: the local Stripe's are rendered
        // before the timed window, so the ratio is the server's work alone.
        for session in sessions {
            _ = try stripe.renderedSession(
                session, expand: ["line_items", "payment_intent.latest_charge.balance_transaction", "subscription"])
        }
        let completions = stripeServer.takeDeliveries(secrets: [secret]).filter {
            $0.type == "checkout.session.completed"
        }
        guard completions.count == total else {
            throw BenchFailure(description: "\(completions.count) completions for \(total) checkouts")
        }
        var appleBodies: [String] = []
        let signer = server.store.pki.jwsSigner
        let issuer = TransactionIssuer()
        for index in 0..<total {
            let payload = issuer.transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(4_100_000_000_000_000 + run * 10_000_000 + UInt64(index)))
            appleBodies.append(
                #"{"accountId":"as\#(run)-\#(index % 1000)","signedTransaction":"\#(try signer.sign(payload))"}"#)
        }
        func stripeDeliveries() async throws -> Int {
            try await server.app.database.read { sql in
                try await sql.raw(
                    "SELECT COUNT(*) AS n FROM deliveries WHERE store = 'stripe' AND account_id LIKE \(bind: "st\(run)-%")"
                ).first()?.decode(column: "n", as: Int.self) ?? 0
            }
        }
        var rows: [Row] = []
        var offset = 0
        for concurrency in concurrencies {
            let appleSlice = Array(appleBodies[offset..<(offset + requestsPerLevel)])
            var startMemory = Memory.resetPeak()
            var started = ContinuousClock.now
            let appleAnswers = try await LoadGenerator.run(
                host: "127.0.0.1", port: server.port, path: "/v1/purchases",
                authorization: "Bearer \(PurchaseBench.key)", bodies: appleSlice, concurrency: concurrency,
                expect: #""status":"delivered""#)
            let apple = PurchaseBench.Level(
                concurrency: concurrency, requests: appleSlice.count,
                seconds: BenchCommand.seconds(ContinuousClock.now - started), answers: appleAnswers,
                peakMemory: Memory.peak(), startMemory: startMemory, restart: nil)
            // Signed now, as Stripe signs each attempt.
            let slice = completions[offset..<(offset + requestsPerLevel)].map {
                stripeServer.signedDelivery($0.body, secrets: [secret])
            }
            let before = try await stripeDeliveries()
            startMemory = Memory.resetPeak()
            started = ContinuousClock.now
            let answers = try await LoadGenerator.run(
                host: "127.0.0.1", port: server.port, path: "/v1/notifications/stripe", authorization: "none",
                bodies: slice.map { String(decoding: $0.body, as: UTF8.self) }, concurrency: concurrency,
                expect: #""received":true"#, headers: slice.map { "Stripe-Signature: \($0.header)" })
            // Every delivery committed (applied inline; a straggler by its job).
            let deadline = ContinuousClock.now + .seconds(120)
            while try await stripeDeliveries() - before < requestsPerLevel, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(5))
            }
            let seconds = BenchCommand.seconds(ContinuousClock.now - started)
            let delivered = try await stripeDeliveries() - before
            let level = PurchaseBench.Level(
                concurrency: concurrency, requests: slice.count, seconds: seconds, answers: answers,
                peakMemory: Memory.peak(), startMemory: startMemory, restart: nil)
            offset += requestsPerLevel
            rows.append(Row(concurrency: concurrency, stripe: level, stripeDelivered: delivered, apple: apple))
        }
        let kind = server.app.database.kind.rawValue
        await server.stop()
        await running.stop()

        print("## Stripe webhooks (checkout.session.completed) beside App Store purchases — \(kind)")
        print("")
        print(
            "| concurrency | webhooks | Stripe deliveries/s | p50 | p99 | App Store deliveries/s (same run) | Stripe ÷ App Store |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows {
            let perSecond = Double(row.stripeDelivered) / row.stripe.seconds
            print(
                "| \(row.concurrency) | \(row.stripe.requests) | \(String(format: "%.0f", perSecond)) | "
                    + "\(String(format: "%.1f ms", row.stripe.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", row.stripe.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.0f", row.apple.deliveriesPerSecond)) | "
                    + "\(String(format: "%.2f", perSecond / max(1, row.apple.deliveriesPerSecond))) |")
        }
        print("")
        print(
            "Each webhook: the signature verified, the event recorded durably (once), the session re-read from the "
                + "local Stripe over HTTP (loopback), delivered through the one path. An App Store purchase is "
                + "verified offline.")
        for row in rows where row.stripeDelivered != row.stripe.requests {
            throw BenchFailure(description: "\(row.stripe.requests) webhooks, \(row.stripeDelivered) delivered")
        }
    }
}
