import AppStoreAdapter
import AppStoreModels
import AppStoreSigning
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import JWTKit
import LocalAppStore
import NIOCore
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// The HTTP API of docs/api.md against the real server on a real database (SQLite, and PostgreSQL
/// when STOREKEEPER_TEST_POSTGRES_URL is set), with the local App Store signing the proofs.
@Suite struct ServerAPITests {
    static let secret = "sk_test_secret_0123456789abcdefghij"
    static let tokenSecret = "client-token-secret-for-tests-0123456789"

    static var databases: [String] {
        ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] == nil
            ? ["sqlite"] : ["sqlite", "postgres"]
    }

    /// A configured server with `localAppStore.enabled` (the local App Store built in and trusted) on a fresh database.
    static func withServer(
        _ kind: String, maxBodyBytes: Int = 1_048_576, clientRate: Int = 1000,
        environments: Set<AppStoreEnvironment> = [.production, .sandbox],
        rateLimitClock: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now },
        postgresURL: String? = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"],
        configure: @Sendable (inout ServerConfiguration) -> Void = { _ in },
        prepare: @Sendable (inout StoreKeeperApp) -> Void = { _ in },
        _ body: @Sendable (StoreKeeperApp, any TestClientProtocol) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("server-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var url = "sqlite:\(directory.path)/storekeeper.sqlite"
        var lease: ScratchDatabases.Lease?
        if kind == "postgres", let base = postgresURL {
            lease = try await ScratchDatabases.shared.lend(base: base)
            url = lease!.url
        }
        var configuration = ServerConfiguration()
        configuration.databaseURL = url
        configuration.secretKeys = [secret]
        configuration.clientTokenSecret = tokenSecret
        configuration.maxBodyBytes = maxBodyBytes
        configuration.clientRequestsPerSecond = clientRate
        configuration.environments = environments
        // The local App Store signs the proofs: enabled explicitly (a configuration never trusts it otherwise).
        configuration.localAppStoreEnabled = true
        configuration.bundleId = "com.example.app"
        configuration.appAppleId = 1_234_567_890
        configure(&configuration)
        try await SharedLocalPKI.seed(directory)
        do {
            var app = try await StoreKeeperApp.make(
                configuration, dataDirectory: directory, rateLimitClock: rateLimitClock)
            prepare(&app)
            try await drive(app, body)
        } catch {
            if let lease { await ScratchDatabases.shared.giveBack(lease) }
            throw error
        }
        if let lease { await ScratchDatabases.shared.giveBack(lease) }
    }

    /// Drives `app`'s routes with a test client, then closes its database (also on failure).
    static func drive(
        _ app: StoreKeeperApp, _ body: @Sendable (StoreKeeperApp, any TestClientProtocol) async throws -> Void
    )
        async throws
    {
        do {
            try await Application(router: app.router()).test(.router) { client in try await body(app, client) }
        } catch {
            try? await app.database.close()
            throw error
        }
        try? await app.database.close()
    }

    /// `/healthz` answers 200 (retried a few times: its 2 s database deadline can pass on a
    /// machine running every suite at once).
    static func becomesHealthy(_ client: any TestClientProtocol) async throws -> Bool {
        for _ in 0..<30 {
            let status = try await call(client, .get, "/healthz", token: nil).status
            if status == .ok { return true }
            #expect(status == .serviceUnavailable)
            try await Task.sleep(for: .milliseconds(300))
        }
        return false
    }

    static func clientToken(
        _ account: String, expires: Date = Date().addingTimeInterval(600), secret: String = tokenSecret
    )
        async throws -> String
    {
        let keys = await JWTKeyCollection().add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        return try await keys.sign(ClientTokenClaims(accountId: account, expires: expires))
    }

    struct Reply {
        var status: HTTPResponse.Status
        var json: [String: Any]
        var headers: HTTPFields
        var errorCode: String? { (json["error"] as? [String: Any])?["code"] as? String }
        var errorMessage: String? { (json["error"] as? [String: Any])?["message"] as? String }
    }

    static func call(
        _ client: any TestClientProtocol, _ method: HTTPRequest.Method, _ path: String, token: String? = secret,
        body: String? = nil
    ) async throws -> Reply {
        var headers: HTTPFields = [.contentType: "application/json"]
        if let token { headers[.authorization] = "Bearer \(token)" }
        return try await client.execute(
            uri: path, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) }
        ) { response in
            let json = (try? JSONSerialization.jsonObject(with: Data(buffer: response.body))) as? [String: Any] ?? [:]
            return Reply(status: response.status, json: json, headers: response.headers)
        }
    }

    /// `POST /v1/purchases` with a signed transaction (and an order id when given).
    static func submit(
        _ client: any TestClientProtocol, account: String, signedTransaction: String, orderId: String? = nil
    ) async throws -> Reply {
        let order = orderId.map { #","orderId":"\#($0)""# } ?? ""
        return try await call(
            client, .post, "/v1/purchases",
            body: #"{"accountId":"\#(account)"\#(order),"signedTransaction":"\#(signedTransaction)"}"#)
    }

    @Test(arguments: databases)
    func orderThenSignedTransactionDeliversOnce(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            let created = try await Self.call(
                client, .post, "/v1/orders", body: #"{"accountId":"u42","productId":"coins_60","quantity":2}"#)
            #expect(created.status == .created)
            #expect(created.json["status"] as? String == "created")
            let token = try #require(UUID(uuidString: created.json["appAccountToken"] as? String ?? ""))
            let orderId = try #require(created.json["orderId"] as? String)
            let bought = try await app.localAppStore!.buy(
                "player", items: [.init(productId: "coins_60", quantity: 2)], appAccountToken: token)
            let body = #"{"accountId":"u42","signedTransaction":"\#(bought.signedTransactions[0])"}"#
            let first = try await Self.call(client, .post, "/v1/purchases", body: body)
            #expect(first.status == .ok)
            #expect(first.json["status"] as? String == "delivered")
            let transaction = try #require((first.json["transactions"] as? [[String: Any]])?.first)
            #expect(transaction["outcome"] as? String == "delivered")
            #expect(transaction["orderId"] as? String == orderId)
            #expect(((first.json["account"] as? [String: Any])?["balances"] as? [String: Int])?["coins"] == 120)
            let again = try await Self.call(client, .post, "/v1/purchases", body: body)
            #expect(again.json["status"] as? String == "already_delivered")
            let order = try await Self.call(client, .get, "/v1/orders/\(orderId)")
            #expect(order.json["status"] as? String == "delivered")
            #expect(order.json["transactionId"] as? String == bought.transactions[0].transactionId)
            let account = try await Self.call(client, .get, "/v1/accounts/u42")
            #expect((account.json["balances"] as? [String: Int])?["coins"] == 120)
        }
    }

    @Test(arguments: databases)
    func mergedPaymentReceiptDeliversEachOrderOnce(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            _ = try await Self.call(client, .post, "/v1/orders", body: #"{"accountId":"p7","productId":"coins_60"}"#)
            _ = try await Self.call(client, .post, "/v1/orders", body: #"{"accountId":"p7","productId":"coins_300"}"#)
            let bought = try await app.localAppStore!.buy(
                "merged", items: [.init(productId: "coins_60"), .init(productId: "coins_300")])
            let receipt = Data(bought.receipt).base64EncodedString()
            let reply = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"p7","receipt":"\#(receipt)"}"#)
            #expect(reply.status == .ok)
            let outcomes = (reply.json["transactions"] as? [[String: Any]])?.compactMap { $0["outcome"] as? String }
            #expect(outcomes == ["delivered", "delivered"])
            #expect(((reply.json["account"] as? [String: Any])?["balances"] as? [String: Int])?["coins"] == 360)
            let again = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"p7","receipt":"\#(receipt)"}"#)
            #expect(again.json["status"] as? String == "already_delivered")
        }
    }

    @Test(arguments: databases)
    func transactionIdIsLookedUpAtTheAppStore(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            let order = try await Self.call(
                client, .post, "/v1/orders", body: #"{"accountId":"t1","productId":"remove_ads"}"#)
            let token = try #require(UUID(uuidString: order.json["appAccountToken"] as? String ?? ""))
            let bought = try await app.localAppStore!.buy(
                "tid", items: [.init(productId: "remove_ads")], appAccountToken: token)
            let reply = try await Self.call(
                client, .post, "/v1/purchases",
                body: #"{"accountId":"t1","transactionId":"\#(bought.transactions[0].transactionId!)"}"#)
            #expect(reply.status == .ok)
            let entitlements = (reply.json["account"] as? [String: Any])?["entitlements"] as? [[String: Any]]
            #expect(entitlements?.first?["id"] as? String == "no_ads")
            #expect(entitlements?.first?["active"] as? Bool == true)
            let unknown = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"t1","transactionId":"123"}"#)
            #expect(unknown.status == .notFound)
        }
    }

    @Test(arguments: databases)
    func forgeriesAreRejectedWith422AndGrantNothing(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            let stranger = try ApplePKI.generate(name: "Stranger", includeReceiptChain: false)
            let forged = try stranger.jwsSigner.sign(
                JWSTransactionDecodedPayload(
                    transactionId: "1", originalTransactionId: "1", bundleId: "com.example.app", productId: "coins_60",
                    quantity: 10, signedDate: Int64(Date().timeIntervalSince1970 * 1000), environment: .production))
            let reply = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"x","signedTransaction":"\#(forged)"}"#)
            #expect(reply.status == .unprocessableContent)
            #expect(reply.errorCode == "invalid_chain")
            let garbage = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"x","signedTransaction":"a.b.c"}"#)
            #expect(garbage.status == .unprocessableContent)
            #expect(garbage.errorCode == "invalid_signature")
            let badReceipt = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"x","receipt":"!!!"}"#)
            #expect(badReceipt.status == .unprocessableContent)
            // A refunded transaction.
            let bought = try await app.localAppStore!.buy("r", items: [.init(productId: "coins_60")])
            try await app.localAppStore!.refund(bought.transactions[0].transactionId!)
            let refunded = try await app.localAppStore!.signTransaction(bought.transactions[0].transactionId!)
            let revoked = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"x","signedTransaction":"\#(refunded)"}"#)
            #expect(revoked.status == .unprocessableContent)
            #expect(revoked.errorCode == "revoked")
            let account = try await Self.call(client, .get, "/v1/accounts/x")
            #expect((account.json["balances"] as? [String: Int])?.isEmpty == true)
        }
    }

    @Test(arguments: databases)
    func ownershipConflictIs409WithAnAnomalyThenOperatorResolves(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("shared-apple-id", items: [.init(productId: "remove_ads")])
            let jws = bought.signedTransactions[0]
            #expect(
                try await Self.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"alice","signedTransaction":"\#(jws)"}"#
                ).status == .ok)
            // A restore on another app account: a new transaction id, the same original.
            let restored = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"bob","signedTransaction":"\#(jws)"}"#)
            // Alice's own transaction: refused, with an anomaly, never "already delivered".
            #expect(restored.status == .conflict)
            #expect(restored.errorCode == "owned_by_other_account")
            let anomalies = try await Self.call(client, .get, "/v1/anomalies?status=open")
            let first = try #require((anomalies.json["anomalies"] as? [[String: Any]])?.first)
            #expect(first["kind"] as? String == "ownership_conflict")
            #expect(first["accountId"] as? String == "bob")
            _ = try await Self.call(
                client, .post, "/v1/anomalies/\(first["id"] as? String ?? "")/resolve",
                body: #"{"action":"dismiss","note":"same family"}"#)
            // A restore on bob's app account: a new transaction id for alice's original purchase.
            var restore = bought.transactions[0]
            restore.transactionId = "2888888888888888"
            restore.signedDate = Int64(Date().timeIntervalSince1970 * 1000)
            let restoreJWS = try app.localAppStore!.pki.jwsSigner.sign(restore)
            let conflict = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"bob","signedTransaction":"\#(restoreJWS)"}"#)
            #expect(conflict.status == .conflict)
            #expect(conflict.errorCode == "owned_by_other_account")
            let conflicts = try await Self.call(client, .get, "/v1/anomalies?status=open")
            let conflictAnomaly = try #require((conflicts.json["anomalies"] as? [[String: Any]])?.first)
            #expect(conflictAnomaly["kind"] as? String == "ownership_conflict")
            _ = try await Self.call(
                client, .post, "/v1/anomalies/\(conflictAnomaly["id"] as? String ?? "")/resolve",
                body: #"{"action":"dismiss","note":"same family"}"#)

            // Unattributed: an operator delivers it by hand, exactly once.
            let orphan = try await app.store.deliver(
                StoreTransaction(apple: bought.transactions[0].with(id: "2999999999999999", product: "coins_60")),
                submittingAccount: nil,
                catalog: app.catalog, now: Date())
            #expect(orphan.plan.outcome == .unattributed)
            let open = try await Self.call(client, .get, "/v1/anomalies?status=open")
            let anomaly = try #require((open.json["anomalies"] as? [[String: Any]])?.first)
            #expect(anomaly["kind"] as? String == "unattributed_transaction")
            let id = try #require(anomaly["id"] as? String)
            let resolve = #"{"action":"deliver","accountId":"carol","note":"ticket 42"}"#
            let resolved = try await Self.call(client, .post, "/v1/anomalies/\(id)/resolve", body: resolve)
            #expect(resolved.json["status"] as? String == "resolved")
            _ = try await Self.call(client, .post, "/v1/anomalies/\(id)/resolve", body: resolve)
            let carol = try await Self.call(client, .get, "/v1/accounts/carol")
            #expect((carol.json["balances"] as? [String: Int])?["coins"] == 60)
            let audit = try await Self.call(client, .get, "/v1/audit")
            #expect(
                (audit.json["entries"] as? [[String: Any]])?.contains { $0["action"] as? String == "manual_delivery" }
                    == true)
        }
    }

    @Test(arguments: databases)
    func debitIsIdempotentAndChecksTheBalance(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("d", items: [.init(productId: "coins_300")])
            _ = try await Self.call(
                client, .post, "/v1/purchases",
                body: #"{"accountId":"d1","signedTransaction":"\#(bought.signedTransactions[0])"}"#)
            let debit = #"{"amount":100,"idempotencyKey":"spend-1"}"#
            let first = try await Self.call(client, .post, "/v1/accounts/d1/balances/coins/debit", body: debit)
            #expect(first.json["balance"] as? Int == 200)
            let repeated = try await Self.call(client, .post, "/v1/accounts/d1/balances/coins/debit", body: debit)
            #expect(repeated.json["balance"] as? Int == 200)
            let tooMuch = try await Self.call(
                client, .post, "/v1/accounts/d1/balances/coins/debit",
                body: #"{"amount":500,"idempotencyKey":"spend-2"}"#)
            #expect(tooMuch.status == .conflict)
            #expect(tooMuch.errorCode == "insufficient_balance")
            let negative = try await Self.call(
                client, .post, "/v1/accounts/d1/balances/coins/debit", body: #"{"amount":-5,"idempotencyKey":"k"}"#)
            #expect(negative.status == .badRequest)
        }
    }

    @Test(arguments: databases)
    func accountIdsInPathsArePercentDecoded(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            // An account id that needs escaping in a URL: space, slash, non-ASCII.
            let account = "player one/é"
            let bought = try await app.localAppStore!.buy("pe", items: [.init(productId: "coins_300")])
            let purchase = try await Self.call(
                client, .post, "/v1/purchases",
                body: #"{"accountId":"\#(account)","signedTransaction":"\#(bought.signedTransactions[0])"}"#)
            #expect(purchase.status == .ok)
            let path = "/v1/accounts/player%20one%2F%C3%A9"
            let read = try await Self.call(client, .get, path)
            #expect(read.json["accountId"] as? String == account)
            #expect((read.json["balances"] as? [String: Int])?["coins"] == 300)
            let debit = try await Self.call(
                client, .post, path + "/balances/coins/debit", body: #"{"amount":100,"idempotencyKey":"pe-1"}"#)
            #expect(debit.json["balance"] as? Int == 200)
            // A client token for that account may read it through the escaped path, and only it.
            let own = try await Self.clientToken(account)
            #expect(try await Self.call(client, .get, path, token: own).status == .ok)
            #expect(try await Self.call(client, .get, "/v1/accounts/player%20one", token: own).status == .forbidden)
            // Broken escapes and ids the body would refuse are 400, never a lookup of something else.
            for bad in ["/v1/accounts/%E9", "/v1/accounts/%zz", "/v1/accounts/a%0Ab", "/v1/orders/%FF"] {
                let reply = try await Self.call(client, .get, bad)
                #expect(reply.status == .badRequest, "\(bad)")
                #expect(reply.errorCode == "bad_request")
            }
        }
    }

    /// V1: App Review buys in Sandbox against the production server.
    @Test(arguments: databases)
    func sandboxPurchasesAreAcceptedWhenConfiguredAndFlaggedEverywhere(kind: String) async throws {
        for environments: Set<AppStoreEnvironment> in [[.production, .sandbox], [.production]] {
            try await Self.withServer(kind, environments: environments) { app, client in
                // A Sandbox store signing with the same (local) Apple chain, as App Review's device would.
                let local = try #require(app.localAppStore)
                let sandbox = LocalAppStore(
                    configuration: .init(
                        bundleId: "com.example.app", appAppleId: 1_234_567_890, environment: .sandbox,
                        catalog: app.catalog),
                    pki: local.pki)
                let bought = try await sandbox.buy("reviewer", items: [.init(productId: "coins_60")])
                let reply = try await Self.call(
                    client, .post, "/v1/purchases",
                    body: #"{"accountId":"review","signedTransaction":"\#(bought.signedTransactions[0])"}"#)
                guard environments.contains(.sandbox) else {
                    #expect(reply.status == .unprocessableContent)
                    #expect(reply.errorCode == "wrong_environment")
                    #expect(try await app.store.accounts.balances(of: "review").isEmpty)
                    return
                }
                #expect(reply.status == .ok)
                let transaction = try #require((reply.json["transactions"] as? [[String: Any]])?.first)
                #expect(transaction["environment"] as? String == "Sandbox")
                let stored = try await app.database.read { sql in
                    try await sql.raw("SELECT environment FROM deliveries").all().map {
                        try $0.decode(column: "environment", as: String.self)
                    }
                }
                #expect(stored == ["Sandbox"])
                let event = try #require(try await OutboxStore(database: app.database).all().first)
                #expect(event.event.payload.contains(#""environment":"Sandbox""#))
            }
        }
    }

    @Test func authenticationAndScopes() async throws {
        try await Self.withServer("sqlite") { _, client in
            #expect(try await Self.call(client, .get, "/v1/accounts/u1", token: nil).status == .unauthorized)
            #expect(try await Self.call(client, .get, "/v1/accounts/u1", token: "wrong").errorCode == "unauthenticated")
            let own = try await Self.clientToken("u1")
            #expect(try await Self.call(client, .get, "/v1/accounts/u1", token: own).status == .ok)
            #expect(try await Self.call(client, .get, "/v1/accounts/u2", token: own).status == .forbidden)
            #expect(
                try await Self.call(
                    client, .post, "/v1/orders", token: own, body: #"{"accountId":"u2","productId":"coins_60"}"#
                ).status == .forbidden)
            #expect(try await Self.call(client, .get, "/v1/anomalies", token: own).status == .forbidden)
            let expired = try await Self.clientToken("u1", expires: Date().addingTimeInterval(-60))
            #expect(try await Self.call(client, .get, "/v1/accounts/u1", token: expired).status == .unauthorized)
            let forged = try await Self.clientToken("u1", secret: "another-secret-that-is-long-enough-000")
            #expect(try await Self.call(client, .get, "/v1/accounts/u1", token: forged).status == .unauthorized)
        }
    }

    @Test func badInputIsACleanFourHundred() async throws {
        try await Self.withServer("sqlite", maxBodyBytes: 4096) { _, client in
            let cases: [(String, String, HTTPResponse.Status, String)] = [
                ("/v1/orders", "{", .badRequest, "bad_request"),
                ("/v1/orders", #"{"productId":"coins_60"}"#, .badRequest, "bad_request"),
                ("/v1/orders", #"{"accountId":"u","productId":"nope"}"#, .notFound, "unknown_product"),
                ("/v1/orders", #"{"accountId":"u","productId":"coins_60","quantity":11}"#, .badRequest, "bad_request"),
                ("/v1/orders", #"{"accountId":"","productId":"coins_60"}"#, .badRequest, "bad_request"),
                ("/v1/purchases", #"{"accountId":"u"}"#, .badRequest, "bad_request"),
                (
                    "/v1/purchases", #"{"accountId":"u","receipt":"x","signedTransaction":"y"}"#, .badRequest,
                    "bad_request"
                ),
                ("/v1/purchases", #"{"accountId":"u","transactionId":"abc"}"#, .badRequest, "bad_request"),
                (
                    "/v1/purchases",
                    "{\"accountId\":\"u\",\"receipt\":\"" + String(repeating: "A", count: 10_000) + "\"}",
                    .contentTooLarge, "payload_too_large"
                ),
                ("/v1/anomalies/nope/resolve", #"{"action":"explode"}"#, .notFound, "not_found"),
            ]
            for (path, body, status, code) in cases {
                let reply = try await Self.call(client, .post, path, body: body)
                #expect(reply.status == status, "\(path) \(body.prefix(60))")
                #expect(reply.errorCode == code, "\(path) \(body.prefix(60))")
                #expect((reply.json["error"] as? [String: Any])?["retryable"] as? Bool == false)
            }
            #expect(try await Self.call(client, .get, "/v1/orders/does-not-exist").status == .notFound)
            #expect(try await Self.call(client, .get, "/v1/nothing-here").status == .notFound)
            #expect(try await Self.becomesHealthy(client))
        }
    }
}
