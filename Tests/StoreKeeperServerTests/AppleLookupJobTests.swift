import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import NIOCore
import StoreKeeperCatalog
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// `transactionId` submissions against an App Store that is slow or down: 202, a durable job,
/// retries with backoff until Apple answers, `verification_stuck` when it takes too long —
/// with the local App Store over HTTP playing Apple, faults on demand.
@Suite struct AppleLookupJobTests {
    static let apiKey = P256.Signing.PrivateKey()

    /// A StoreKeeper server configured like production (Apple credentials, pinned roots), whose
    /// "Apple" is a local App Store listening on a real port.
    static func withSetup(
        requestTimeout: Int = 30, lookupDeadline: Duration = .seconds(10), wrongAPIKey: Bool = false,
        _ body: @Sendable (LocalAppStore, StoreKeeperApp, String, any TestClientProtocol) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("jobs-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let pki = try PKIStore.loadOrCreate(dataDirectory: directory.appendingPathComponent("apple"))
        let apple = LocalAppStore(
            configuration: .init(
                catalog: .demo,
                serverAPIKey: .init(
                    issuerId: "issuer-1", keyId: "KEY1", publicKeyPEM: apiKey.publicKey.pemRepresentation)),
            pki: pki)
        let appleServer = try await LocalAppStoreServer(store: apple)
        let rootsFile = directory.appendingPathComponent("roots.pem")
        try Data(try PKIStore.rootsPEM(pki).utf8).write(to: rootsFile)
        let keyFile = directory.appendingPathComponent("key.p8")
        // A key the App Store does not know: every token is refused (401).
        try Data((wrongAPIKey ? P256.Signing.PrivateKey() : apiKey).pemRepresentation.utf8).write(to: keyFile)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: keyFile.path)

        try await Application(
            router: appleServer.router(), configuration: .init(address: .hostname("127.0.0.1", port: 0))
        )
        .test(.live) { appleClient in
            var configuration = ServerConfiguration()
            let databaseURL = "sqlite:\(directory.path)/storekeeper.sqlite"
            configuration.databaseURL = databaseURL
            configuration.secretKeys = [ServerAPITests.secret]
            configuration.rootCertificateFiles = [rootsFile.path]
            configuration.bundleId = "com.example.app"
            configuration.appAppleId = 1_234_567_890
            configuration.serverAPIIssuerId = "issuer-1"
            configuration.serverAPIKeyId = "KEY1"
            configuration.serverAPIPrivateKeyFile = keyFile.path
            configuration.serverAPIBaseURL = "http://127.0.0.1:\(appleClient.port!)"
            configuration.requestTimeoutSeconds = requestTimeout
            let app = try await StoreKeeperApp.make(
                configuration, dataDirectory: directory, lookupDeadline: lookupDeadline)
            #expect(app.localAppStore == nil)  // Apple credentials configured: no zero-config
            do {
                try await Application(router: app.router()).test(.router) { client in
                    try await body(apple, app, databaseURL, client)
                }
            } catch {
                try? await app.database.close()
                throw error
            }
            try? await app.database.close()
        }
    }

    /// A purchase carrying the token of an order of `account`: what a `transactionId`
    /// submission needs to be delivered (a bare id proves nothing about who paid).
    static func buyForOrder(_ apple: LocalAppStore, _ client: any TestClientProtocol, account: String) async throws
        -> String
    {
        // A 503 is retryable by contract: with a 1 s request timeout (one test's setup) on a machine
        // running every suite at once, the order itself can miss its deadline.
        var order = try await ServerAPITests.call(
            client, .post, "/v1/orders", body: #"{"accountId":"\#(account)","productId":"coins_60"}"#)
        for _ in 0..<5 where order.status == .serviceUnavailable {
            order = try await ServerAPITests.call(
                client, .post, "/v1/orders", body: #"{"accountId":"\#(account)","productId":"coins_60"}"#)
        }
        let token = try #require(UUID(uuidString: order.json["appAccountToken"] as? String ?? ""))
        return try await apple.buy("p", items: [.init(productId: "coins_60")], appAccountToken: token)
            .transactions[0].transactionId!
    }

    static func coins(_ client: any TestClientProtocol, _ account: String) async throws -> Int? {
        let reply = try await ServerAPITests.call(client, .get, "/v1/accounts/\(account)")
        return (reply.json["balances"] as? [String: Int])?["coins"]
    }

    @Test func appleAnsweringAtOnceDelivers() async throws {
        try await Self.withSetup { apple, _, _, client in
            let id = try await Self.buyForOrder(apple, client, account: "a1")
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"a1","transactionId":"\#(id)"}"#)
            #expect(reply.status == .ok)
            #expect(try await Self.coins(client, "a1") == 60)
            let unknown = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"a1","transactionId":"2000000000000404"}"#)
            #expect(unknown.status == .notFound)
        }
    }

    @Test func appleDownGives202ThenTheJobDelivers() async throws {
        try await Self.withSetup { apple, app, _, client in
            let id = try await Self.buyForOrder(apple, client, account: "a2")
            var faults = Faults()
            // Three failures: the submission, its repeat, and the job's first attempt.
            faults.endpoints["transactionInfo"] = .init(status: 503, count: 3)
            await apple.setFaults(faults)
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"a2","transactionId":"\#(id)"}"#)
            #expect(reply.status == .accepted)
            #expect(reply.json["status"] as? String == "pending")
            #expect((reply.json["retryAfterSeconds"] as? Int ?? 0) >= 1)
            // Submitting again while pending queues nothing new.
            _ = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"a2","transactionId":"\#(id)"}"#)
            #expect(try await app.jobs.pendingCount() == 1)
            #expect(try await Self.coins(client, "a2") == nil)

            let runner = JobRunner(app: app)
            #expect(await runner.runDue(now: Date().addingTimeInterval(10)) == 0)  // third 503: retried later
            #expect(await runner.runDue(now: Date().addingTimeInterval(3600)) == 1)
            #expect(try await Self.coins(client, "a2") == 60)
            #expect(try await app.jobs.pendingCount() == 0)
            // Nothing is delivered twice, whatever runs again.
            #expect(await runner.runDue(now: Date().addingTimeInterval(7200)) == 0)
            #expect(try await Self.coins(client, "a2") == 60)
        }
    }

    @Test func slowAppleBecomesAJobToo() async throws {
        try await Self.withSetup(lookupDeadline: .milliseconds(1500)) { apple, app, _, client in
            let id = try await Self.buyForOrder(apple, client, account: "a3")
            var faults = Faults()
            faults.endpoints["transactionInfo"] = .init(latencyMilliseconds: 4000, count: 1)
            await apple.setFaults(faults)
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"a3","transactionId":"\#(id)"}"#)
            #expect(reply.status == .accepted)
            #expect(await JobRunner(app: app).runDue(now: Date().addingTimeInterval(60)) == 1)
            #expect(try await Self.coins(client, "a3") == 60)
        }
    }

    @Test func requestsOverTheTimeoutAre503Retryable() async throws {
        try await Self.withSetup(requestTimeout: 1, lookupDeadline: .seconds(20)) { apple, _, _, client in
            let id = try await Self.buyForOrder(apple, client, account: "t9")
            var faults = Faults()
            faults.endpoints["transactionInfo"] = .init(latencyMilliseconds: 3000, count: 1)
            await apple.setFaults(faults)
            let reply = try await ServerAPITests.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"t9","transactionId":"\#(id)"}"#)
            #expect(reply.status == .serviceUnavailable)
            #expect(reply.errorCode == "timeout")
            #expect((reply.json["error"] as? [String: Any])?["retryable"] as? Bool == true)
        }
    }

    @Test func aLookupStuckTooLongIsAnAnomalyAndStillDelivers() async throws {
        try await Self.withSetup { apple, app, _, client in
            let id = try await Self.buyForOrder(apple, client, account: "a4")
            var faults = Faults()
            faults.endpoints["transactionInfo"] = .init(status: 500)
            await apple.setFaults(faults)
            #expect(
                try await ServerAPITests.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"a4","transactionId":"\#(id)"}"#
                ).status == .accepted)
            let runner = JobRunner(app: app, stuckAfter: 600)
            for minutes in [1, 5, 11, 30, 60] {
                await runner.runDue(now: Date().addingTimeInterval(Double(minutes) * 60 * 60))
            }
            let anomalies = try await app.store.anomalies.anomalies(status: "open")
            #expect(anomalies.map(\.kind) == ["verification_stuck"])  // once, not per attempt
            #expect(anomalies.first?.transactionId == id)
            await apple.setFaults(Faults())
            await runner.runDue(now: Date().addingTimeInterval(100 * 3600))
            #expect(try await Self.coins(client, "a4") == 60)
        }
    }

    @Test func pendingJobsSurviveARestart() async throws {
        try await Self.withSetup { apple, app, databaseURL, client in
            let id = try await Self.buyForOrder(apple, client, account: "a5")
            var faults = Faults()
            faults.endpoints["transactionInfo"] = .init(status: 503, count: 1)
            await apple.setFaults(faults)
            #expect(
                try await ServerAPITests.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"a5","transactionId":"\#(id)"}"#
                ).status == .accepted)
            // A second server process on the same database picks the job up.
            var configuration = app.configuration
            configuration.databaseURL = databaseURL
            let restarted = try await StoreKeeperApp.make(
                configuration, dataDirectory: FileManager.default.temporaryDirectory)
            #expect(await JobRunner(app: restarted).runDue(now: Date().addingTimeInterval(60)) == 1)
            try await restarted.database.close()
            #expect(try await Self.coins(client, "a5") == 60)
        }
    }
}
