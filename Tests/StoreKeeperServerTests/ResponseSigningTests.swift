import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import StoreKeeperKitCore
import StoreKeeperSimulator
import Testing

@testable import StoreKeeperServer

/// `auth.responseSigningKey` (docs/api.md "Purchases from the device"): answers to account reads and
/// purchases carry `StoreKeeper-Signature`, Ed25519 over the request's nonce, its path and the
/// body — so a man in the middle can neither make nor change nor replay one.
@Suite struct ResponseSigningTests {
    typealias API = ServerAPITests

    /// Written by `openssl genpkey -algorithm ed25519`; its public key by `openssl pkey -pubout`.
    static let opensslPEM = """
        -----BEGIN PRIVATE KEY-----
        MC4CAQAwBQYDK2VwBCIEIJz+56IyrR8Zis+Ugb9Nh6dKliaqA0IekUZ5dskXAAG+
        -----END PRIVATE KEY-----
        """
    static let opensslPublicKey = "UCWK2N5U9mlfVrFCLbhOXdxgj9gD48rhzAS8B44LjwI="

    @Test func keysAreReadAsOpenSSLWritesThemAndWrittenBack() throws {
        let key = try ResponseSigner.key(pem: Self.opensslPEM)
        #expect(ResponseSigner(key: key).publicKeyBase64 == Self.opensslPublicKey)
        let again = try ResponseSigner.key(pem: ResponseSigner.pem(key))
        #expect(again.rawRepresentation == key.rawRepresentation)
        for bad in [
            "", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            Self.opensslPEM.replacingOccurrences(of: "MC4C", with: "MC4D"),
        ] {
            #expect(throws: (any Error).self) { try ResponseSigner.key(pem: bad) }
        }
        // A P-256 key is not an Ed25519 key.
        #expect(throws: (any Error).self) { try ResponseSigner.key(pem: P256.Signing.PrivateKey().pemRepresentation) }
    }

    struct Signed {
        var status: HTTPResponse.Status
        var body: [UInt8]
        var signature: String?
        var keyId: String?
    }

    static func send(
        _ client: any TestClientProtocol, _ method: HTTPRequest.Method, _ path: String, token: String? = API.secret,
        nonce: String?, body: String? = nil, version: String? = nil
    ) async throws -> Signed {
        var headers: HTTPFields = [.contentType: "application/json"]
        if let token { headers[.authorization] = "Bearer \(token)" }
        if let nonce { headers[ResponseSigner.nonceHeader] = nonce }
        if let version { headers[ResponseSigner.versionHeader] = version }
        return try await client.execute(
            uri: path, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) }
        ) { response in
            Signed(
                status: response.status, body: Array(buffer: response.body),
                signature: response.headers[ResponseSigner.signatureHeader],
                keyId: response.headers[ResponseSigner.keyHeader])
        }
    }

    @Test(arguments: API.databases)
    func accountReadsAndPurchasesAreSignedOverNoncePathAndBody(kind: String) async throws {
        try await API.withServer(kind, configure: { $0.responseSigningKey = Self.opensslPEM }) { app, client in
            let publicKey = try Curve25519.Signing.PublicKey(
                rawRepresentation: Data(base64Encoded: Self.opensslPublicKey)!)
            func valid(_ answer: Signed, nonce: String, path: String) -> Bool {
                guard let signature = answer.signature else { return false }
                return ResponseSigner.isValid(
                    signature, publicKey: publicKey, nonce: nonce, path: path, body: answer.body)
            }
            let nonce = UUID().uuidString
            let read = try await Self.send(client, .get, "/v1/accounts/u1", nonce: nonce)
            #expect(read.status == .ok)
            #expect(valid(read, nonce: nonce, path: "/v1/accounts/u1"))
            // Changed, replayed for another request, or moved to another path: no longer valid.
            var changed = read
            changed.body[changed.body.count / 2] ^= 0x01
            #expect(!valid(changed, nonce: nonce, path: "/v1/accounts/u1"))
            #expect(!valid(read, nonce: "another", path: "/v1/accounts/u1"))
            #expect(!valid(read, nonce: nonce, path: "/v1/accounts/u2"))
            // Without a nonce: signed over an empty one.
            let plain = try await Self.send(client, .get, "/v1/accounts/u1", nonce: nil)
            #expect(valid(plain, nonce: "", path: "/v1/accounts/u1"))

            // Purchases, their errors, and a refused token: signed too.
            let bought = try await app.localAppStore!.buy("apple-sig", items: [.init(productId: "coins_60")])
            let purchase = try await Self.send(
                client, .post, "/v1/purchases", nonce: "n1",
                body: #"{"accountId":"sig","signedTransaction":"\#(bought.signedTransactions[0])"}"#)
            #expect(purchase.status == .ok && valid(purchase, nonce: "n1", path: "/v1/purchases"))
            let forged = try await Self.send(
                client, .post, "/v1/purchases", nonce: "n2", body: #"{"accountId":"sig","signedTransaction":"a.b.c"}"#)
            #expect(forged.status == .unprocessableContent && valid(forged, nonce: "n2", path: "/v1/purchases"))
            let stranger = try await Self.send(client, .get, "/v1/accounts/u1", token: "nope", nonce: "n3")
            #expect(stranger.status == .unauthorized && valid(stranger, nonce: "n3", path: "/v1/accounts/u1"))
            // Other routes are not signed; a nonce that is not printable ASCII (or too long) is 400.
            let order = try await Self.send(
                client, .post, "/v1/orders", nonce: "n4", body: #"{"accountId":"sig","productId":"coins_60"}"#)
            #expect(order.status == .created && order.signature == nil)
            #expect(try await Self.send(client, .get, "/v1/accounts/u1", nonce: "a b").status == .badRequest)
            #expect(
                try await Self.send(client, .get, "/v1/accounts/u1", nonce: String(repeating: "n", count: 129)).status
                    == .badRequest)
            // /v1/status names the key.
            let status = try await API.call(client, .get, "/v1/status")
            let key = status.json["responseSigningKey"] as? [String: Any]
            #expect(key?["publicKey"] as? String == Self.opensslPublicKey)
            #expect(key?["algorithm"] as? String == "Ed25519")
        }
    }

    @Test func unsignedWithoutAKeyAndGeneratedOnceInDemoMode() async throws {
        try await API.withServer("sqlite") { _, client in
            let read = try await Self.send(client, .get, "/v1/accounts/u1", nonce: "n")
            #expect(read.status == .ok && read.signature == nil)
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("signing-\(UUID())")
        defer { try? FileManager.default.removeItem(at: directory) }
        var demo = ServerConfiguration()
        demo.mode = .demo
        let logger = Logger(label: "test")
        let first = try #require(try StoreKeeperApp.responseSigner(demo, dataDirectory: directory, logger: logger))
        let second = try #require(try StoreKeeperApp.responseSigner(demo, dataDirectory: directory, logger: logger))
        #expect(first.publicKeyBase64 == second.publicKeyBase64)
        let file = directory.appendingPathComponent("response-signing-key.pem").path
        let mode = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        var configured = ServerConfiguration()
        configured.bundleId = "com.example.app"
        #expect(try StoreKeeperApp.responseSigner(configured, dataDirectory: directory, logger: logger) == nil)
        configured.responseSigningKey = "/no/such/key.pem"
        #expect(throws: ServerConfiguration.Invalid.self) { try configured.validate() }
        configured.responseSigningKey = file
        #expect(
            try StoreKeeperApp.responseSigner(configured, dataDirectory: directory, logger: logger)?.publicKeyBase64
                == first.publicKeyBase64)
    }

    /// v2 (issue 45): the signature names its key and binds the method, the status and the
    /// request body; `/v1/status` lists the current and the next key during a rotation.
    @Test(arguments: API.databases)
    func v2SignaturesNameTheirKeyAndBindTheRequest(kind: String) async throws {
        let next = Curve25519.Signing.PrivateKey()
        try await API.withServer(
            kind,
            configure: { $0.responseSigningKeys = [Self.opensslPEM, ResponseSigner.pem(next)] }
        ) { app, client in
            let publicKey = try Curve25519.Signing.PublicKey(
                rawRepresentation: Data(base64Encoded: Self.opensslPublicKey)!)
            let keyId = ResponseSigner.keyId(of: publicKey.rawRepresentation)
            let bought = try await app.localAppStore!.buy("apple-v2", items: [.init(productId: "coins_60")])
            let body = #"{"accountId":"v2","signedTransaction":"\#(bought.signedTransactions[0])"}"#
            let answer = try await Self.send(client, .post, "/v1/purchases", nonce: "n1", body: body, version: "2")
            #expect(answer.status == .ok)
            #expect(answer.keyId == keyId)
            let header = try #require(answer.signature)
            #expect(header.hasPrefix("keyid=\(keyId);v2="))
            func valid(method: String = "POST", status: Int = 200, requestBody: String = body) -> Bool {
                ResponseSigner.isValidV2(
                    header, publicKey: publicKey, nonce: "n1", method: method, path: "/v1/purchases", status: status,
                    requestBody: Array(requestBody.utf8), body: answer.body)
            }
            #expect(valid())
            // Another request body (changed in transit), method or status: not this answer.
            #expect(!valid(requestBody: body.replacingOccurrences(of: "\"v2\"", with: "\"v3\"")))
            #expect(!valid(method: "PUT"))
            #expect(!valid(status: 409))
            // The next key does not sign; an unknown version is a 400.
            #expect(
                !ResponseSigner.isValidV2(
                    header, publicKey: next.publicKey, nonce: "n1", method: "POST", path: "/v1/purchases", status: 200,
                    requestBody: Array(body.utf8), body: answer.body))
            #expect(
                try await Self.send(client, .get, "/v1/accounts/v2", nonce: "n", version: "3").status == .badRequest)
            // An error is signed as v2 too, over its own status.
            let refused = try await Self.send(
                client, .post, "/v1/purchases", nonce: "n2", body: #"{"accountId":"v2","signedTransaction":"a.b.c"}"#,
                version: "2")
            #expect(refused.status == .unprocessableContent)
            #expect(
                ResponseSigner.isValidV2(
                    try #require(refused.signature), publicKey: publicKey, nonce: "n2", method: "POST",
                    path: "/v1/purchases", status: 422,
                    requestBody: Array(#"{"accountId":"v2","signedTransaction":"a.b.c"}"#.utf8), body: refused.body))
            // Both keys published, each with its use.
            let status = try await API.call(client, .get, "/v1/status")
            let keys = try #require(status.json["responseSigningKeys"] as? [[String: Any]])
            #expect(keys.map { $0["use"] as? String } == ["signing", "published"])
            #expect(keys.first?["id"] as? String == keyId)
            #expect(keys.last?["publicKey"] as? String == next.publicKey.rawRepresentation.base64EncodedString())
        }
    }

    /// StoreKeeperKit holding the current and the next key keeps delivering when the server
    /// switches; a build holding only the old key holds its purchases and says why.
    @Test func theSDKFollowsAKeyRotationOfTheRealServer() async throws {
        let old = Curve25519.Signing.PrivateKey()
        let new = Curve25519.Signing.PrivateKey()
        let both = try [old, new].map { try ResponseSigningKey($0.publicKey.rawRepresentation.base64EncodedString()) }
        let tokens: ClientTokenProvider = { account, _ in try await API.clientToken(account) }
        for (signing, index) in [(old, 0), (new, 1)] {
            try await API.withServer(
                "sqlite",
                configure: {
                    $0.port = 0
                    // Before the rotation the next key is published beside the signing one; after
                    // it, the server signs with the new key alone.
                    if index == 0 {
                        $0.responseSigningKeys = [ResponseSigner.pem(signing), ResponseSigner.pem(new)]
                    } else {
                        $0.responseSigningKey = ResponseSigner.pem(signing)
                    }
                }
            ) { app, _ in
                try await app.application().test(.live) { client in
                    let server = URL(string: "http://127.0.0.1:\(client.port!)")!
                    let account = "rotation-\(index)"
                    let rotating = HTTPBackend(
                        baseURL: server, transport: AsyncHTTPTransport(), responseSigningKeys: both, tokens: tokens)
                    let order = try await rotating.createOrder(accountId: account, productId: "coins_60", quantity: 1)
                    let bought = try await app.localAppStore!.buy(
                        "apple-\(account)", items: [.init(productId: "coins_60")],
                        appAccountToken: order.appAccountToken)
                    let proof = Proof.signedTransaction(bought.signedTransactions[0])
                    let stale = HTTPBackend(
                        baseURL: server, transport: AsyncHTTPTransport(), responseSigningKeys: [both[0]],
                        tokens: tokens)
                    let staleVerdict = await stale.submitPurchase(
                        accountId: account, orderId: order.orderId, proof: proof, transactionId: nil)
                    if index == 0 {
                        #expect(staleVerdict.isFinal)
                    } else {
                        #expect(staleVerdict == .retryable(status: nil, code: "unsigned_answer", retryAfter: nil))
                        #expect(stale.signatureDiagnostics?.lastProblem == .unknownKey(both[1].keyId))
                    }
                    let verdict = await rotating.submitPurchase(
                        accountId: account, orderId: order.orderId, proof: proof, transactionId: nil)
                    guard case .accepted(let response) = verdict else {
                        Issue.record("not accepted with key \(index): \(verdict)")
                        return
                    }
                    #expect(response.transactions.first?.isFinal == true)
                    let view = try await rotating.customerInfo(accountId: account)
                    #expect(view.accountId == account)
                    #expect(rotating.signatureDiagnostics?.unverifiedAnswers == 0)
                }
            }
        }
    }

    /// SIGHUP's reload: the configuration's keys are switched to at once; a bad key or turning
    /// signing off leaves the keys in use.
    @Test func theKeysAreReloadedFromTheConfigurationWithoutARestart() async throws {
        let next = Curve25519.Signing.PrivateKey()
        try await API.withServer(
            "sqlite",
            configure: { $0.responseSigningKeys = [Self.opensslPEM, ResponseSigner.pem(next)] }
        ) { app, client in
            var rotated = app.configuration
            rotated.responseSigningKeys = [ResponseSigner.pem(next)]
            #expect(try app.reloadResponseSigningKeys(from: rotated).contains(ResponseSigner(key: next).keyId))
            let answer = try await Self.send(client, .get, "/v1/accounts/u1", nonce: "n", version: "2")
            #expect(answer.keyId == ResponseSigner(key: next).keyId)
            let status = try await API.call(client, .get, "/v1/status")
            #expect((status.json["responseSigningKeys"] as? [[String: Any]])?.count == 1)
            var broken = rotated
            broken.responseSigningKeys = ["-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----"]
            #expect(throws: ServerConfiguration.Invalid.self) { try app.reloadResponseSigningKeys(from: broken) }
            broken.responseSigningKeys = [ResponseSigner.pem(next), ResponseSigner.pem(next)]
            #expect(throws: ServerConfiguration.Invalid.self) { try app.reloadResponseSigningKeys(from: broken) }
            broken.responseSigningKeys = []
            #expect(throws: ServerConfiguration.Invalid.self) { try app.reloadResponseSigningKeys(from: broken) }
            let still = try await Self.send(client, .get, "/v1/accounts/u1", nonce: "n", version: "2")
            #expect(still.keyId == ResponseSigner(key: next).keyId, "the keys in use stay")
        }
    }
}
