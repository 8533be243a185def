import AppStoreModels
import Foundation
import LocalAppStore
import StoreKeeperCatalog
import StoreKeeperServer

/// `bench --retention`: Apple's Get Retention Message through the real server at `concurrency`
/// connections — verify, one indexed read (the offer history when an offer rule is reached),
/// a V2 signature for half of them (the rule's sample), one insert, the answer — beside
/// `GET /healthz` (one database round trip) in the same run. Apple allows 700 ms.
struct RetentionBench {
    let databaseURL: String?
    let concurrency: Int
    let count: Int

    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - id: pro_monthly
                type: auto_renewable
                group: pro
                grants: { entitlement: pro }
                offers:
                  - { id: stay_20, eligible: active }
            retention:
              - id: monthly-offer
                when: { productId: pro_monthly, sample: 0.5 }
                promotionalOffer: { messageId: "22222222-2222-2222-2222-222222222222", offerId: stay_20 }
              - message: { messageId: "33333333-3333-3333-3333-333333333333" }
            """)

    func run() async throws {
        let server = try await PurchaseBench.Server.start(databaseURL: databaseURL) {
            $0.catalog = Self.catalog
        }
        let app = server.app
        let signer = server.store.pki.jwsSigner
        let issuer = TransactionIssuer()
        let run = UInt64.random(in: 0..<1_000_000)
        let subscribers = min(count, 1_000)
        FileHandle.standardError.write(Data("subscribing \(subscribers) accounts, signing \(count) requests…\n".utf8))
        let purchase = TransactionIssuer.Purchase(
            bundleId: "com.example.app", productId: "pro_monthly", type: .autoRenewable, unitPrice: 4990,
            subscriptionGroupIdentifier: "pro", subscriptionPeriod: 30 * 86_400)
        var originals: [String] = []
        var purchases: [String] = []
        for index in 0..<subscribers {
            let original = String(5_000_000_000_000_000 + run * 10_000 + UInt64(index))
            let first = issuer.transaction(for: purchase, at: Date().addingTimeInterval(-3600), id: original)
            originals.append(original)
            purchases.append(#"{"accountId":"rb\#(run)-\#(index)","signedTransaction":"\#(try signer.sign(first))"}"#)
        }
        var requests: [String] = []
        requests.reserveCapacity(count)
        for index in 0..<count {
            let body = DecodedRealtimeRequestBody(
                originalTransactionId: originals[index % subscribers], appAppleId: 1_234_567_890,
                productId: "pro_monthly", userLocale: "en-US", requestIdentifier: UUID().uuidString,
                signedDate: Int64(Date().timeIntervalSince1970 * 1000), environment: .production)
            requests.append(#"{"signedPayload":"\#(try signer.sign(body))"}"#)
        }
        let health = try await server.deliverThenMeasureHealth(
            concurrency: concurrency, purchases: purchases, healthRequests: count)
        let answered = try await server.send(concurrency: concurrency, "/v1/retention/apple", requests)
        let offers = try await app.database.read { sql in
            try await sql.raw(
                "SELECT COUNT(*) AS n, SUM(holdout) AS h FROM retention_requests WHERE original_transaction_id LIKE \(bind: "5%")"
            ).first().map { (try $0.decode(column: "n", as: Int.self), try $0.decode(column: "h", as: Int?.self) ?? 0) }
                ?? (0, 0)
        }
        await server.stop()

        print("## Retention Messaging: Get Retention Message end to end — \(app.database.kind.rawValue)")
        print("")
        print(
            "machine: \(BenchCommand.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores; "
                + "\(count) requests over \(subscribers) subscriptions at \(concurrency) connections")
        print("")
        PurchaseBench.Server.printTable(
            [("`POST /v1/retention/apple` (verify, read, sign half, insert)", answered)], baseline: health)
        print("")
        print("recorded: \(offers.0) requests (\(offers.1) in the rule's holdout, answered {}); Apple's budget: 700 ms")
        print("")
        if answered.accepted != count || offers.0 != count {
            throw BenchFailure(description: "\(answered.accepted) answered, \(offers.0) recorded, of \(count)")
        }
    }
}
