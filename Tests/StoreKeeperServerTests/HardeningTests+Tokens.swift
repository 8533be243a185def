import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import NIOCore
import StoreKeeperCatalog
import StoreKeeperStorage
import Synchronization
import Testing
import X509
import _CryptoExtras

@testable import StoreKeeperServer

/// Audit findings 11–14 and the smaller ones: secret keys, client tokens, request ids, file
/// modes, the rate limiter, webhook retention, the local App Store's control API.
extension HardeningTests {
    // MARK: 11. Secret keys

    @Test func secretKeysAreLongAndNoneIsGeneratedOutsideDemoMode() async throws {
        var short = ServerConfiguration()
        short.bundleId = "com.example.app"
        short.appAppleId = 1
        short.secretKeys = ["x"]
        #expect(throws: ServerConfiguration.Invalid.self) { try short.validate() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("keys-\(UUID())")
        defer { try? FileManager.default.removeItem(at: directory) }
        var configured = ServerConfiguration()
        configured.bundleId = "com.example.app"
        configured.appAppleId = 1
        configured.databaseURL = "sqlite:\(directory.path).sqlite"
        let app = try await StoreKeeperApp.make(configured, dataDirectory: directory)
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("dev-secret-key").path))
        try await app.database.close()
        try? FileManager.default.removeItem(atPath: "\(directory.path).sqlite")
    }

    // MARK: 12. Client tokens are checked strictly

    static func handMadeToken(
        header: String, claims: String, secret: String = ServerAPITests.tokenSecret, sha384: Bool = false
    )
        -> String
    {
        func base64url(_ data: Data) -> String {
            data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
        }
        let signingInput = base64url(Data(header.utf8)) + "." + base64url(Data(claims.utf8))
        let key = SymmetricKey(data: Data(secret.utf8))
        let mac =
            sha384
            ? Data(HMAC<SHA384>.authenticationCode(for: Data(signingInput.utf8), using: key))
            : Data(HMAC<SHA256>.authenticationCode(for: Data(signingInput.utf8), using: key))
        return signingInput + "." + base64url(mac)
    }

    @Test func clientTokensAreHS256BoundedAndHonourNotBefore() async throws {
        try await API.withServer("sqlite") { _, client in
            let now = Int(Date().timeIntervalSince1970)
            let good = Self.handMadeToken(
                header: #"{"alg":"HS256","typ":"JWT"}"#, claims: #"{"sub":"u1","exp":\#(now + 600)}"#)
            #expect(try await API.call(client, .get, "/v1/accounts/u1", token: good).status == .ok)
            let cases = [
                Self.handMadeToken(
                    header: #"{"alg":"HS384"}"#, claims: #"{"sub":"u1","exp":\#(now + 600)}"#, sha384: true),
                Self.handMadeToken(header: #"{"alg":"none"}"#, claims: #"{"sub":"u1","exp":\#(now + 600)}"#),
                Self.handMadeToken(header: #"{"alg":"HS256"}"#, claims: #"{"sub":"u1","exp":1e300}"#),
                Self.handMadeToken(header: #"{"alg":"HS256"}"#, claims: #"{"sub":"u1","exp":\#(now + 3 * 86_400)}"#),
                Self.handMadeToken(
                    header: #"{"alg":"HS256"}"#, claims: #"{"sub":"u1","exp":\#(now + 600),"nbf":\#(now + 300)}"#),
                Self.handMadeToken(header: #"{"alg":"HS256"}"#, claims: #"{"sub":"u1"}"#),
                Self.handMadeToken(header: #"{"alg":"HS256"}"#, claims: #"{"sub":"u1","exp":\#(now - 10)}"#),
            ]
            for (index, token) in cases.enumerated() {
                let reply = try await API.call(client, .get, "/v1/accounts/u1", token: token)
                #expect(reply.status == .unauthorized, "case \(index)")
            }
            let started = Self.handMadeToken(
                header: #"{"alg":"HS256"}"#, claims: #"{"sub":"u1","exp":\#(now + 600),"nbf":\#(now - 5)}"#)
            #expect(try await API.call(client, .get, "/v1/accounts/u1", token: started).status == .ok)
        }
    }

    // MARK: 14. Request ids and control characters

    @Test(arguments: databases)
    func requestIdsCannotForgeLogsAndControlCharactersAre400(kind: String) async throws {
        try await API.withServer(kind) { _, client in
            func get(_ path: String, requestId: String) async throws -> (HTTPResponse.Status, String?) {
                try await client.execute(
                    uri: path, method: .get,
                    headers: [.authorization: "Bearer \(API.secret)", HTTPField.Name("X-Request-Id")!: requestId]
                ) { ($0.status, $0.headers[HTTPField.Name("X-Request-Id")!]) }
            }
            let forged = try await get("/v1/accounts/u1", requestId: "abc status=200 account=admin")
            #expect(forged.1 != nil)
            #expect(forged.1 != "abc status=200 account=admin")
            #expect(forged.1?.contains(" ") == false)
            // The server's own id instead: a random (version 4) UUID in lower case, new each time.
            let own = try #require(forged.1)
            #expect(UUID(uuidString: own)?.uuidString.lowercased() == own)
            #expect(Array(own)[14] == "4" && "89ab".contains(Array(own)[19]))
            #expect(try await get("/v1/accounts/u1", requestId: "abc def").1 != own)
            let fine = try await get("/v1/accounts/u1", requestId: "req-42_a.b")
            #expect(fine.1 == "req-42_a.b")
            #expect(try await get("/v1/accounts/u1", requestId: String(repeating: "a", count: 129)).1?.count != 129)
            for body in [
                #"{"accountId":"a\u0000b","productId":"coins_60"}"#, #"{"accountId":"a\nb","productId":"coins_60"}"#,
                #"{"accountId":"a\u001bb","productId":"coins_60"}"#,
            ] {
                let reply = try await API.call(client, .post, "/v1/orders", body: body)
                #expect(reply.status == .badRequest)
            }
            #expect(try await API.call(client, .get, "/v1/accounts/a%00b").status == .badRequest)
            #expect(try await API.call(client, .get, "/v1/orders/x%00y").status == .badRequest)
        }
    }

    // MARK: Smaller findings

    @Test func theSQLiteFileIsOwnerOnly() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("perm-\(UUID()).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let database = try await Database.open(url: "sqlite:\(path)")
        try await Migrations.run(on: database)
        for suffix in ["", "-wal"] {
            let attributes = try FileManager.default.attributesOfItem(atPath: path + suffix)
            #expect((attributes[.posixPermissions] as? Int).map { $0 & 0o077 } == 0, "\(suffix)")
        }
        try await database.close()
    }

    @Test func theRateLimiterForgetsIdleCallers() {
        let start = ContinuousClock.now
        let limiter = RateLimiter(clientPerSecond: 5, secretPerSecond: nil)
        for index in 0..<(RateLimiter.evictionThreshold + 500) {
            _ = limiter.admit(.account("passer-by-\(index)"), now: start)
        }
        #expect(limiter.trackedCallers > RateLimiter.evictionThreshold)
        _ = limiter.admit(.account("later"), now: start + .seconds(2))
        #expect(limiter.trackedCallers == 1)
        // A caller still inside its second keeps its bucket (and its limit).
        let busy = RateLimiter(clientPerSecond: 1, secretPerSecond: nil)
        #expect(busy.admit(.account("a"), now: start) == nil)
        #expect(busy.admit(.account("a"), now: start + .milliseconds(100)) != nil)
    }

    @Test(arguments: databases)
    func sentWebhookEventsArePrunedAfterTheirRetention(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("w", items: [.init(productId: "coins_60")])
            _ = try await API.submit(client, account: "w1", signedTransaction: bought.signedTransactions[0])
            let outbox = OutboxStore(database: app.database)
            let claimed = try await outbox.claimDue(now: Date())
            #expect(claimed.count == 1)
            try await outbox.markSent(claimed.map(\.id), now: Date())
            let housekeeping = Housekeeping(
                rejectedProofs: app.rejectedProofs, retentionDays: 90, outbox: outbox, logger: .init(label: "t"))
            #expect(try await housekeeping.runOnce(now: Date().addingTimeInterval(86_400)).events == 0)
            #expect(try await housekeeping.runOnce(now: Date().addingTimeInterval(8 * 86_400)).events == 1)
            #expect(try await outbox.all().isEmpty)
        }
    }

    @Test func theLocalAppStoresControlAPIBoundsItemsAndKeepsItsInternals() async throws {
        try await API.withServer("sqlite", configure: { $0.mode = .demo }) { _, client in
            let items = (0..<21).map { _ in #"{"productId":"coins_60","quantity":1}"# }.joined(separator: ",")
            let many = try await API.call(
                client, .post, "/local-app-store/control/purchases", token: nil,
                body: #"{"appleId":"x","items":[\#(items)]}"#)
            #expect(many.status == .badRequest)
            let malformed = try await API.call(
                client, .post, "/local-app-store/control/purchases", token: nil, body: #"{"appleId":12}"#)
            #expect(malformed.status == .badRequest)
            let message = (malformed.json["error"] as? [String: Any])?["message"] as? String ?? ""
            #expect(!message.contains("Swift.") && !message.contains("CodingKeys"))
        }
    }
}
