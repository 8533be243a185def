import AppStoreClient
import AppStoreModels
import AppStoreSigning
import Foundation
import GooglePlay
import HummingbirdTesting
import KeyFiles
import LocalAppStore
import LocalGooglePlay
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// The third outside audit's findings, each reproduced at the HTTP level (SQLite and PostgreSQL
/// where storage is involved). The CSV export's findings are in `ExportTests`.
@Suite struct ThirdAuditTests {
    typealias API = ServerAPITests

    static func count(_ app: StoreKeeperApp, _ query: String) async throws -> Int {
        try await app.database.read { sql in
            try await sql.raw(SQLQueryString(query)).first()?.decode(column: "n", as: Int.self) ?? -1
        }
    }

    // MARK: 2. storage bounds

    @Test(arguments: API.databases)
    func ordersPerDayAreCappedAndUnpaidOrdersAreDeletedAfterTheirRetention(kind: String) async throws {
        try await API.withServer(kind, configure: { $0.maxOrdersPerAccountPerDay = 4 }) { app, client in
            // Cancelling an order no longer frees room: four a day, whatever became of them.
            for _ in 0..<4 {
                let order = try await ScenarioTests.order(client, account: "mallory", product: "coins_60")
                #expect(try await API.call(client, .post, "/v1/orders/\(order.id)/cancel").status == .ok)
            }
            let fifth = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"mallory","productId":"coins_60"}"#)
            #expect(fifth.status == .tooManyRequests && fifth.errorCode == "too_many_orders", "\(fifth.json)")
            #expect(fifth.headers[.retryAfter] != nil)
            // Another account is not held back; a paid order is kept for good.
            let paid = try await ScenarioTests.order(client, account: "payer", product: "coins_60")
            let bought = try await app.localAppStore!.buy(
                "apple-payer", items: [.init(productId: "coins_60")], appAccountToken: paid.token)
            #expect(
                try await API.submit(client, account: "payer", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let open = try await ScenarioTests.order(client, account: "other", product: "coins_60")
            #expect(try await Self.count(app, "SELECT COUNT(*) AS n FROM orders") == 6)

            // Retention: cancelled and never-paid orders go once their retention has passed.
            let housekeeping = Housekeeping(
                rejectedProofs: app.rejectedProofs, retentionDays: 90, outbox: OutboxStore(database: app.database),
                logger: .init(label: "t"), orders: app.store, orderRetention: 30 * 86_400)
            #expect(try await housekeeping.runOnce(now: Date().addingTimeInterval(86_400)).orders == 0)
            #expect(try await housekeeping.runOnce(now: Date().addingTimeInterval(31 * 86_400)).orders == 5)
            #expect(try await Self.count(app, "SELECT COUNT(*) AS n FROM orders") == 1)
            #expect(try await app.store.orders.order(paid.id)?.status == .delivered)
            #expect(try await app.store.orders.order(open.id) == nil)
        }
    }

    @Test(arguments: API.databases)
    func externalPurchaseTokensAreBoundedAndUnconfirmedOnesExpire(kind: String) async throws {
        try await API.withServer(
            kind,
            configure: {
                $0.maxUnconfirmedExternalTokensPerAccount = 3
                $0.maxUnconfirmedExternalTokens = 5
            }
        ) { app, client in
            func register(_ account: String, _ id: String) async throws -> API.Reply {
                let token = try await API.clientToken(account)
                return try await API.call(
                    client, .post, "/v1/external-purchases/tokens", token: token,
                    body: #"{"accountId":"\#(account)","externalPurchaseId":"\#(id)"}"#)
            }
            for index in 0..<3 { #expect(try await register("a", "tok-a-\(index)").status == .ok) }
            let fourth = try await register("a", "tok-a-3")
            #expect(fourth.status == .tooManyRequests && fourth.errorCode == "too_many_external_tokens")
            // Registering a token it already has stays idempotent.
            #expect(try await register("a", "tok-a-0").status == .ok)
            // The server-wide budget.
            #expect(try await register("b", "tok-b-0").status == .ok)
            #expect(try await register("b", "tok-b-1").status == .ok)
            let over = try await register("c", "tok-c-0")
            #expect(over.status == .serviceUnavailable && over.errorCode == "external_token_budget")
            #expect(try await Self.count(app, "SELECT COUNT(*) AS n FROM external_tokens") == 5)

            // Never reported by Apple: gone after limits.unconfirmedExternalTokenDays.
            let housekeeping = Housekeeping(
                rejectedProofs: app.rejectedProofs, retentionDays: 90, outbox: OutboxStore(database: app.database),
                logger: .init(label: "t"), externalTokens: ExternalPurchaseStore(database: app.database),
                unconfirmedTokenRetention: 7 * 86_400)
            #expect(try await housekeeping.runOnce(now: Date().addingTimeInterval(6 * 86_400)).tokens == 0)
            #expect(try await housekeeping.runOnce(now: Date().addingTimeInterval(8 * 86_400)).tokens == 5)
            #expect(try await register("c", "tok-c-0").status == .ok)
        }
    }

    // MARK: 3. consent

    @Test(arguments: API.databases)
    func theAppCannotUndoAParentsRescission(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            _ = try await relay.buy("kid", "coins_60", appleId: "apple-family")
            _ = try await relay.deliver()
            let token = try await API.clientToken("kid")
            let given = try await API.call(
                relay.client, .put, "/v1/accounts/kid/consent", token: token, body: #"{"consumptionData":true}"#)
            #expect(given.status == .ok && given.json["source"] as? String == "app")

            try await relay.store.rescindConsent("apple-family")
            #expect(try await relay.deliver() == ["RESCIND_CONSENT"])
            let rescinded = try await API.call(relay.client, .get, "/v1/accounts/kid/consent").json
            #expect(rescinded["consumptionData"] as? Bool == false)
            #expect(rescinded["rescindedAt"] is String)

            // The app (a client token) cannot give it back …
            let again = try await API.call(
                relay.client, .put, "/v1/accounts/kid/consent", token: token, body: #"{"consumptionData":true}"#)
            #expect(again.status == .forbidden && again.errorCode == "consent_rescinded", "\(again.json)")
            #expect(
                try await API.call(relay.client, .get, "/v1/accounts/kid/consent").json["consumptionData"] as? Bool
                    == false)
            // … withdrawing stays possible; the operator's backend restores it and ends the rescission.
            #expect(
                try await API.call(
                    relay.client, .put, "/v1/accounts/kid/consent", token: token, body: #"{"consumptionData":false}"#
                ).status == .ok)
            let restored = try await API.call(
                relay.client, .put, "/v1/accounts/kid/consent", body: #"{"consumptionData":true}"#)
            #expect(restored.status == .ok && restored.json["source"] as? String == "backend")
            #expect(restored.json["rescindedAt"] is NSNull)
            #expect(
                try await API.call(
                    relay.client, .put, "/v1/accounts/kid/consent", token: token, body: #"{"consumptionData":true}"#
                ).status == .ok)
        }
    }

    // MARK: 4. batches

    @Test(arguments: API.databases)
    func aBatchOfForgeriesIsChargedPerEntryAndCutShort(kind: String) async throws {
        let frozen = ContinuousClock.now
        try await API.withServer(kind, clientRate: 20, rateLimitClock: { frozen }) { app, client in
            let forger = try ApplePKI.generate(name: "Forged")
            var batch: [String] = []
            for index in 0..<30 {
                batch.append(
                    try forger.jwsSigner.sign(
                        JWSTransactionDecodedPayload(
                            transactionId: "29990000000\(100 + index)",
                            originalTransactionId: "29990000000\(100 + index)",
                            bundleId: "com.example.app", productId: "coins_60", quantity: 1,
                            signedDate: Int64(Date().timeIntervalSince1970 * 1000), environment: .production)))
            }
            let token = try await API.clientToken("mallory")
            let reply = try await API.call(
                client, .post, "/v1/purchases", token: token,
                body: try DevicePurchaseContractTests.json(["accountId": "mallory", "signedTransactions": batch]))
            #expect(reply.status == .ok, "\(reply.json)")
            let entries = try #require(reply.json["transactions"] as? [[String: Any]])
            #expect(entries.count == 30)
            #expect(entries.prefix(3).allSatisfy { $0["code"] as? String == "invalid_chain" })
            #expect(entries.dropFirst(3).allSatisfy { $0["code"] as? String == "not_verified" }, "\(entries)")
            #expect(entries.allSatisfy { $0["outcome"] as? String == "rejected" })
            // Three kept (the rest never checked), and the batch cost 30 requests of the burst of 20.
            #expect(try await Self.count(app, "SELECT COUNT(*) AS n FROM rejected_proofs") <= 3)
            let next = try await API.call(client, .get, "/v1/accounts/mallory", token: token)
            #expect(next.status == .tooManyRequests)
        }
    }

    // MARK: 6. the importer

    @Test func theImporterUsesTheServersIdRulesAndReadsCRLF() throws {
        let crlf = "accountId,originalTransactionId\r\nalice,1000000001\r\nbob,1000000002\r\n"
        let parsed = Importer.parseCSV(crlf)
        #expect(parsed.rows.map(\.accountId) == ["alice", "bob"] && parsed.invalid.isEmpty, "\(parsed)")
        #expect(parsed.rows.map(\.line) == [2, 3])
        let hostile = Importer.parseCSV(
            "jose\u{301},1000000003\n\u{212A}ate,1000000004\nzed,\u{661}\u{662}\u{663}\nok,1000000005\n\"q,uoted\",1000000006\n"
        )
        #expect(hostile.rows.map(\.accountId) == ["ok", "q,uoted"], "\(hostile)")
        #expect(hostile.invalid.count == 3)
        #expect(hostile.invalid.contains { $0.hasPrefix("line 1:") && $0.contains("NFC") })
        #expect(hostile.invalid.contains { $0.hasPrefix("line 3:") && $0.contains("ASCII digits") })
        // A permanent 4xx about one row is that row's; the server's credentials or a rate limit are not.
        func error(_ status: Int, retryable: Bool = false) -> AppStoreAPIError {
            AppStoreAPIError(kind: .apple, httpStatus: status, message: "m", isRetryable: retryable)
        }
        #expect(Importer.isPermanentForTheRow(error(400)))
        #expect(!Importer.isPermanentForTheRow(error(401)))
        #expect(!Importer.isPermanentForTheRow(error(429, retryable: true)))
        #expect(!Importer.isPermanentForTheRow(error(500, retryable: true)))
    }

    // MARK: 7. /healthz under a backlog

    @Test(arguments: API.databases)
    func healthzReadsTheOldestPendingJobFromAnIndexWhateverTheBacklog(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            // A backlog of 100,000 pending jobs.
            try await app.jobs.queueBacklog(100_000, kind: "backlog", runAt: Date())
            if kind == "postgres" { try await app.database.read { sql in try await sql.raw("ANALYZE jobs").run() } }
            let plan: String = try await app.database.read { sql in
                if kind == "postgres" {
                    return try await sql.raw(SQLQueryString("EXPLAIN " + JobStore.oldestPendingQuery)).all().map {
                        try $0.decode(column: "QUERY PLAN", as: String.self)
                    }.joined(separator: "\n")
                }
                return try await sql.raw(SQLQueryString("EXPLAIN QUERY PLAN " + JobStore.oldestPendingQuery)).all().map
                {
                    try $0.decode(column: "detail", as: String.self)
                }.joined(separator: "\n")
            }
            // The first entry of the index: no scan of the backlog, no sort.
            #expect(plan.contains("jobs_pending_age"), "\(plan)")
            #expect(!plan.contains("TEMP B-TREE") && !plan.contains("Sort"), "\(plan)")
            // The first 200 (a loaded machine may take the 2 s deadline's 503 first).
            var health: [String: Any]?
            for _ in 0..<30 where health == nil {
                let answer = try await API.call(client, .get, "/healthz", token: nil)
                if answer.status == .ok { health = answer.json } else { try await Task.sleep(for: .milliseconds(300)) }
            }
            #expect((health?["oldestPendingJobSeconds"] as? Double ?? -1) >= 0, "\(String(describing: health))")
        }
    }

    // MARK: 8a. a push's identity is bound to its app

    @Test(arguments: API.databases)
    func aPushVerifiedForOneGoogleAppIsNotAppliedToAnother(kind: String) async throws {
        try await GooglePlayServerTests.withPlay(kind, secondApp: true) { play in
            let order = try await play.order("droid", "coins_60")
            _ = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            let pushes = await play.store.takeDuePushes()
            #expect(pushes.count == 1)
            // com.example.android's notification, with the other app's push identity.
            let (body, otherIdentity) = try await play.server.pushRequest(
                pushes[0], audience: GooglePlayServerTests.audience + "/other",
                serviceAccount: GooglePlayServerTests.pushAccount)
            #expect(try await play.post(body, authorization: otherIdentity) == .noContent)
            await play.runJobs()
            #expect(try await play.balance("droid") == 0)
            // Its own identity (its own subscription: another Pub/Sub message): applied.
            let (own, ownIdentity) = try await play.server.pushRequest(
                pushes[0], audience: GooglePlayServerTests.audience, serviceAccount: GooglePlayServerTests.pushAccount)
            var message = try #require(try JSONSerialization.jsonObject(with: own) as? [String: Any])
            var inner = try #require(message["message"] as? [String: Any])
            inner["messageId"] = "own-subscription-1"
            message["message"] = inner
            #expect(
                try await play.post(JSONSerialization.data(withJSONObject: message), authorization: ownIdentity)
                    == .noContent)
            await play.runJobs()
            #expect(try await play.balance("droid") == 60)
        }
    }

    // MARK: 8b. license testers

    @Test(arguments: API.databases)
    func aLicenseTestersPurchaseIsRefusedByEveryPathWhenSandboxIs(kind: String) async throws {
        try await GooglePlayServerTests.withPlay(kind, testPurchases: true, environments: [.production]) { play in
            let order = try await play.order("tester", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            // The notification's job and the sweep deliver nothing …
            #expect(try await play.push() == [.noContent])
            await play.runJobs()
            await play.app.runGoogleHousekeeping(now: Date().addingTimeInterval(7200))
            await play.runJobs(now: Date().addingTimeInterval(7200))
            #expect(try await play.balance("tester") == 0)
            // … and the device's submission is refused.
            let submitted = try await play.submit("tester", "coins_60", token, orderId: order.id)
            #expect(submitted.errorCode == "wrong_environment", "\(submitted.json)")
            #expect(try await play.balance("tester") == 0)
        }
    }

    // MARK: 8c. one app's payment never pays another app's order

    @Test(arguments: API.databases)
    func aPaymentOfOneAppStoreAppDoesNotPayAnotherAppsOrder(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: SeveralAppsTests.configure) { relay in
            let ipadOrder = try await SeveralAppsTests.order(relay, "kim", "coins_60", app: "ipad")
            // Bought in the iPhone app (com.example.app) with the iPad order's token.
            let phoneBuy = try await relay.store.buy(
                "apple-kim", items: [.init(productId: "coins_60")],
                appAccountToken: UUID(uuidString: ipadOrder.json["appAccountToken"] as? String ?? ""))
            let reply = try await API.submit(
                relay.client, account: "kim", signedTransaction: phoneBuy.signedTransactions[0])
            #expect(reply.status == .conflict && reply.errorCode == "order_of_another_app", "\(reply.json)")
            #expect((try await relay.account("kim")["balances"] as? [String: Int])?["coins"] == nil)
            let anomalies =
                try await API.call(relay.client, .get, "/v1/anomalies").json["anomalies"] as? [[String: Any]]
            #expect(anomalies?.contains { $0["kind"] as? String == "app_mismatch" } == true, "\(anomalies ?? [])")
            #expect(
                try await ScenarioTests.status(relay.client, order: ipadOrder.json["orderId"] as? String ?? "")
                    == "created")
        }
    }

    // MARK: 8d. key files

    @Test func keyFilesOthersCanReadAreRefusedAndDemoKeysAreNeverWrittenOpen() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("keys-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("signing.pem").path
        try Data(ResponseSigner.pem(.init()).utf8).write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: path)
        #expect(KeyFiles.exposure(of: path) != nil)
        #expect(throws: ServerConfiguration.Invalid.self) { try ServerConfiguration.responseSigner(path) }
        try FileManager.default.setAttributes([.posixPermissions: 0o640], ofItemAtPath: path)
        #expect(KeyFiles.exposure(of: path) == nil)
        _ = try ServerConfiguration.responseSigner(path)
        // Written by the server: 0600 from creation, atomically.
        let written = directory.appendingPathComponent("written").path
        try KeyFiles.writePrivate(Data("secret".utf8), to: written)
        #expect(try FileManager.default.attributesOfItem(atPath: written)[.posixPermissions] as? Int == 0o600)
        #expect(FileManager.default.contents(atPath: written) == Data("secret".utf8))
        let key = try StoreKeeperApp.developmentKey(in: directory, logger: .init(label: "t"))
        let devKey = directory.appendingPathComponent("dev-secret-key").path
        #expect(try FileManager.default.attributesOfItem(atPath: devKey)[.posixPermissions] as? Int == 0o600)
        #expect(key.hasPrefix("sk_dev_"))
    }

    @Test func aServiceAccountsTokenURIMustBeHTTPS() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sa-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let good = try AppsConfigurationTests.keyFile()
        defer { try? FileManager.default.removeItem(atPath: good) }
        _ = try ServiceAccountKey.load(path: good)
        let text = String(decoding: FileManager.default.contents(atPath: good)!, as: UTF8.self)
        for (name, uri) in [("plain", "http://oauth2.example.com/token"), ("other", "ftp://x/token")] {
            let path = directory.appendingPathComponent(name).path
            try KeyFiles.writePrivate(
                Data(text.replacingOccurrences(of: "https://oauth2.googleapis.com/token", with: uri).utf8), to: path)
            #expect(throws: GooglePlayError.self) { _ = try ServiceAccountKey.load(path: path) }
        }
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: good)
        #expect(throws: GooglePlayError.self) { _ = try ServiceAccountKey.load(path: good) }
    }

    // MARK: 8e. Google's tokens are not kept in the audit log

    @Test(arguments: API.databases)
    func theAuditLogHoldsGoogleTokenDigestsOnly(kind: String) async throws {
        try await GooglePlayServerTests.withPlay(kind) { play in
            let first = try await play.store.buy("pro_monthly", obfuscatedAccountId: nil)
            #expect(try await play.submit("sub", "pro_monthly", first).status == .ok)
            let second = try await play.store.buy("pro_yearly", obfuscatedAccountId: nil, linkedPurchaseToken: first)
            _ = try await play.submit("sub", "pro_yearly", second)
            await play.runJobs()
            let audit = try await play.app.database.read { sql in
                try await sql.raw("SELECT subject, detail FROM audit").all().map {
                    "\(try $0.decode(column: "subject", as: String?.self) ?? "") \(try $0.decode(column: "detail", as: String.self))"
                }.joined(separator: "\n")
            }
            let jobs = try await play.app.database.read { sql in
                try await sql.raw("SELECT dedupe_key FROM jobs").all().map {
                    try $0.decode(column: "dedupe_key", as: String.self)
                }.joined(separator: "\n")
            }
            #expect(!audit.contains(first) && !audit.contains(second))
            #expect(!jobs.contains(first) && !jobs.contains(second))
            #expect(audit.contains(GooglePlayStore.tokenDigest(first)))
        }
    }
}

extension ThirdAuditTests {
    @Test func theStorageBoundsAreValidatedAndReported() throws {
        for (key, set) in [
            ("limits.maxOrdersPerAccountPerDay", { (c: inout ServerConfiguration) in c.maxOrdersPerAccountPerDay = 0 }),
            ("limits.orderRetentionDays", { (c: inout ServerConfiguration) in c.orderRetentionDays = 0 }),
            ("limits.maxUnconfirmedExternalTokensPerAccount", { c in c.maxUnconfirmedExternalTokensPerAccount = -1 }),
            ("limits.unconfirmedExternalTokenDays", { c in c.unconfirmedExternalTokenDays = 366 }),
            ("limits.maxUnconfirmedExternalTokens", { c in c.maxUnconfirmedExternalTokens = 0 }),
        ] as [(String, (inout ServerConfiguration) -> Void)] {
            var configuration = ServerConfiguration()
            configuration.mode = .demo
            set(&configuration)
            #expect(throws: ServerConfiguration.Invalid.self) { try configuration.validate() }
            do {
                try configuration.validate()
            } catch let error as ServerConfiguration.Invalid {
                #expect(error.key == key, "\(error)")
            }
        }
    }
}
