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

#if canImport(Glibc)
    import Glibc
#endif

/// The outside audit's findings, each with the test that failed before its fix (docs/security.md).
@Suite struct HardeningTests {
    typealias API = ServerAPITests
    static let databases = ServerAPITests.databases

    // MARK: 1. Hostile receipts cannot hang the server

    /// A PKCS#7 signed with the attacker's RSA key, carrying `count` "intermediates" that share one
    /// name and one key and sign each other: path building used to try about count! chains.
    static func poisonReceipt(intermediates count: Int, payloadBytes: Int = 0) throws -> String {
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let name = try DistinguishedName { CommonName("Apple Worldwide Developer Relations Certification Authority") }
        let now = Date()
        let cas = try (0..<count).map { index in
            try CertificateFactory.make(
                subject: name, issuer: name, publicKey: .init(key.publicKey), issuerKey: .init(key),
                signatureAlgorithm: .sha256WithRSAEncryption, isCA: true, notBefore: now - 86_400,
                notAfter: now + 86_400, serialNumber: .init(bytes: [UInt8(index + 1)]))
        }
        let leaf = try CertificateFactory.make(
            subject: try DistinguishedName { CommonName("Mac App Store Receipt Signing") }, issuer: name,
            publicKey: .init(key.publicKey), issuerKey: .init(key), signatureAlgorithm: .sha256WithRSAEncryption,
            isCA: false, notBefore: now - 86_400, notAfter: now + 86_400, serialNumber: .init(bytes: [0x7F]))
        let signer = AppReceiptSigner(certificate: leaf, privateKey: key, intermediates: cas)
        var receipt = AppReceipt(
            inAppPurchases: [
                AppReceiptInAppPurchase(
                    quantity: 1, productId: "coins_60", transactionId: "2000000000000001", purchaseDate: now,
                    originalTransactionId: "2000000000000001", originalPurchaseDate: now)
            ])
        receipt.bundleId = "com.example.app"
        receipt.creationDate = now
        receipt.receiptType = "Production"
        receipt.opaqueValue = Array(repeating: 0x41, count: payloadBytes)
        return Data(try signer.sign(receipt)).base64EncodedString()
    }

    @Test(.timeLimit(.minutes(2)), arguments: [7, 12])
    func hostileReceiptChainsAreRefusedBeforeAnyPathBuilding(intermediates: Int) async throws {
        let poison = try Self.poisonReceipt(intermediates: intermediates)
        let twoCertificates = try Self.poisonReceipt(intermediates: 1, payloadBytes: 700_000)
        try await API.withServer("sqlite") { _, client in
            for receipt in [poison, twoCertificates] {
                let reply = try await API.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"mallory","receipt":"\#(receipt)"}"#)
                #expect(reply.status == .unprocessableContent)
                #expect(reply.errorCode == "invalid_chain")
                #expect((reply.json["error"] as? [String: Any])?["retryable"] as? Bool == false)
            }
            // Still serving (retried: /healthz's 2 s database deadline can pass on a machine
            // running every suite at once).
            #expect(try await API.becomesHealthy(client))
        }
    }

    /// A handler that ignores cancellation (CPU work, a driver call that never returns) is
    /// abandoned at the deadline: the client gets 503 while the handler is still running.
    @Test func theRequestDeadlineAnswersWithoutWaitingForTheHandler() async throws {
        let finished = Finished()
        let router = Router()
        router.get("stuck") { _, _ -> String in
            // Not cancellable: resumes only when the test lets it.
            await withCheckedContinuation { continuation in finished.release.withLock { $0 = continuation } }
            finished.done.withLock { $0 = true }
            return "late"
        }
        try await Application(router: DeadlineRouter(router: router, limit: .milliseconds(300))).test(.router) {
            client in
            let status = try await client.execute(uri: "/stuck", method: .get) { $0.status }
            #expect(status == .serviceUnavailable)
            #expect(finished.done.withLock { $0 } == false)
        }
        // Let the abandoned handler end.
        for _ in 0..<100 where finished.release.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(10)) }
        finished.release.withLock { $0?.resume() }
    }

    final class Finished: Sendable {
        let done = Mutex(false)
        let release = Mutex<CheckedContinuation<Void, Never>?>(nil)
    }

    // MARK: 2. Idle and half-sent connections are closed

    /// Connects, sends `bytes`, and waits (at most 20 s) for the server to close the socket.
    /// Returns true when it closed.
    static func serverCloses(port: Int, after bytes: String) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { return false }
        var timeout = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        if !bytes.isEmpty { _ = bytes.withCString { send(fd, $0, strlen($0), 0) } }
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count == 0 { return true }  // orderly close by the server
            if count < 0 { return errno == ECONNRESET }  // timed out: still open
        }
    }

    /// Sends a raw request and returns the status line.
    static func rawStatus(port: Int, _ request: [UInt8]) -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        var timeout = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(fd, &buffer, buffer.count, 0)
        guard count > 0 else { return "" }
        return String(decoding: buffer[0..<count], as: UTF8.self).components(separatedBy: "\r\n").first ?? ""
    }

    /// Runs blocking socket code on a thread of its own: blocking the (2-thread) cooperative pool
    /// would starve the very server it talks to.
    static func offPool<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: body()) }.start()
        }
    }

    /// The real application (server configuration, middleware, services) on a free port.
    static func withLiveServer(
        configure: @escaping @Sendable (inout ServerConfiguration) -> Void,
        _ body: @Sendable (StoreKeeperApp, Int) async throws -> Void
    ) async throws {
        try await API.withServer(
            "sqlite",
            configure: { configuration in
                configuration.port = 0
                configure(&configuration)
            }
        ) { app, _ in
            try await app.application().test(.live) { client in try await body(app, client.port!) }
        }
    }

    @Test func idleAndHalfSentConnectionsAreClosed() async throws {
        try await Self.withLiveServer(configure: { $0.idleTimeoutSeconds = 2 }) { _, port in
            #expect(await Self.offPool { Self.serverCloses(port: port, after: "") })
            #expect(await Self.offPool { Self.serverCloses(port: port, after: "GET /healthz HTTP/1.1\r\nHost: 127") })
            // A whole request is answered, and the connection is then closed when idle.
            #expect(
                await Self.offPool { Self.serverCloses(port: port, after: "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") })
        }
    }

    // MARK: 5. A chunked body over the limit is 413

    @Test func aChunkedBodyOverTheLimitIs413() async throws {
        try await Self.withLiveServer(configure: { $0.maxBodyBytes = 1024 }) { _, port in
            let chunk = String(repeating: "a", count: 4096)
            let request =
                "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(API.secret)\r\n"
                + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "\(String(chunk.utf8.count, radix: 16))\r\n\(chunk)\r\n0\r\n\r\n"
            #expect(await Self.offPool { Self.rawStatus(port: port, Array(request.utf8)) }.hasPrefix("HTTP/1.1 413"))
            let announced =
                "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(API.secret)\r\n"
                + "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n\(chunk)"
            #expect(await Self.offPool { Self.rawStatus(port: port, Array(announced.utf8)) }.hasPrefix("HTTP/1.1 413"))
        }
    }

    // MARK: 3. Open orders are bounded

    @Test(arguments: databases)
    func openOrdersAreCappedAndCancelledOnesDoNotCount(kind: String) async throws {
        try await API.withServer(kind, configure: { $0.maxOpenOrdersPerAccount = 3 }) { app, client in
            let body = #"{"accountId":"hoarder","productId":"coins_60"}"#
            for _ in 0..<3 {
                #expect(try await API.call(client, .post, "/v1/orders", body: body).status == .created)
            }
            let refused = try await API.call(client, .post, "/v1/orders", body: body)
            #expect(refused.status == .conflict)
            #expect(refused.errorCode == "too_many_open_orders")
            // Other accounts are not affected.
            let other = #"{"accountId":"someone","productId":"coins_60"}"#
            #expect(try await API.call(client, .post, "/v1/orders", body: other).status == .created)
            // Expired (cancelled) orders are not open.
            #expect(try await app.store.orders.cancelExpiredOrders(olderThan: -60, now: Date()) == 4)
            let afterExpiry = try await API.call(client, .post, "/v1/orders", body: body)
            #expect(afterExpiry.status == .created)
            // ...and a token-less purchase does not fall back to a cancelled order.
            let fresh = try #require(afterExpiry.json["orderId"] as? String)
            let bought = try await app.localAppStore!.buy("h", items: [.init(productId: "coins_60")])
            let reply = try await API.submit(
                client, account: "hoarder", signedTransaction: bought.signedTransactions[0])
            #expect((reply.json["transactions"] as? [[String: Any]])?.first?["orderId"] as? String == fresh)
        }
    }

    /// Orders created at once for one account never pass the cap together (each is counted and
    /// inserted under the account's lock on PostgreSQL; SQLite has one writer).
    @Test(arguments: databases)
    func concurrentOrdersNeverPassTheCapTogether(kind: String) async throws {
        try await API.withServer(kind, configure: { $0.maxOpenOrdersPerAccount = 3 }) { _, client in
            let statuses = try await withThrowingTaskGroup(of: HTTPResponse.Status.self) { group in
                for index in 0..<24 {
                    group.addTask {
                        let body = #"{"accountId":"rush\#(index % 2)","productId":"coins_60"}"#
                        return try await API.call(client, .post, "/v1/orders", body: body).status
                    }
                }
                return try await group.reduce(into: [HTTPResponse.Status]()) { $0.append($1) }
            }
            #expect(statuses.filter { $0 == .created }.count == 6, "\(statuses)")
            #expect(statuses.filter { $0 == .conflict }.count == 18, "\(statuses)")
        }
    }

    // MARK: 4. /metrics takes a key

    @Test func metricsNeedASecretKeyOrTheMetricsToken() async throws {
        let metricsToken = "metrics-token-0123456789abcdefghijklmn"
        try await API.withServer("sqlite", configure: { $0.metricsToken = metricsToken }) { _, client in
            #expect(try await API.call(client, .get, "/metrics", token: nil).status == .unauthorized)
            #expect(try await API.call(client, .get, "/metrics", token: "wrong").status == .unauthorized)
            let app = try await API.clientToken("u1")
            #expect(try await API.call(client, .get, "/metrics", token: app).status == .forbidden)
            #expect(try await API.call(client, .get, "/metrics", token: metricsToken).status == .ok)
            #expect(try await API.call(client, .get, "/metrics").status == .ok)
            // The metrics token opens nothing else.
            #expect(try await API.call(client, .get, "/v1/anomalies", token: metricsToken).status == .unauthorized)
            #expect(try await API.becomesHealthy(client))
        }
    }

    // MARK: 6. A bare transactionId delivers only to its payer

    @Test(arguments: databases)
    func aBareTransactionIdDeliversNothingToAStranger(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            // Alice's purchases, made without an order token (StoreKit 1 without applicationUsername).
            let bought = try await app.localAppStore!.buy(
                "alice-apple-id", items: [.init(productId: "remove_ads"), .init(productId: "coins_300")])
            let bob = try await API.clientToken("bob")
            for transaction in bought.transactions {
                let reply = try await API.call(
                    client, .post, "/v1/purchases", token: bob,
                    body: #"{"accountId":"bob","transactionId":"\#(transaction.transactionId!)"}"#)
                #expect(reply.status == .ok)
                let outcome = (reply.json["transactions"] as? [[String: Any]])?.first
                #expect(outcome?["outcome"] as? String == "unattributed")
                #expect(outcome?["orderId"] == nil)
            }
            let account = try await API.call(client, .get, "/v1/accounts/bob")
            #expect((account.json["balances"] as? [String: Int])?.isEmpty ?? true)
            #expect((account.json["entitlements"] as? [Any])?.isEmpty ?? true)
            let anomalies = try await API.call(client, .get, "/v1/anomalies?status=open")
            let kinds = (anomalies.json["anomalies"] as? [[String: Any]])?.compactMap { $0["kind"] as? String }
            #expect(kinds == ["unattributed_transaction", "unattributed_transaction"])
            // Alice, holding the signed transactions, gets them.
            for signed in bought.signedTransactions {
                let reply = try await API.submit(client, account: "alice", signedTransaction: signed)
                #expect((reply.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String == "delivered")
            }
            let alice = try await API.call(client, .get, "/v1/accounts/alice")
            #expect((alice.json["balances"] as? [String: Int])?["coins"] == 300)
            // Bob trying again now meets Alice's delivery: 409, never her order.
            let again = try await API.call(
                client, .post, "/v1/purchases", token: bob,
                body: #"{"accountId":"bob","transactionId":"\#(bought.transactions[1].transactionId!)"}"#)
            #expect(again.status == .conflict)
            #expect(again.errorCode == "owned_by_other_account")
            // With the token of one of his orders, a transactionId does deliver.
            let order = try await API.call(
                client, .post, "/v1/orders", token: bob, body: #"{"accountId":"bob","productId":"coins_60"}"#)
            let token = try #require(UUID(uuidString: order.json["appAccountToken"] as? String ?? ""))
            let own = try await app.localAppStore!.buy(
                "bob-apple-id", items: [.init(productId: "coins_60")], appAccountToken: token)
            let delivered = try await API.call(
                client, .post, "/v1/purchases", token: bob,
                body: #"{"accountId":"bob","transactionId":"\#(own.transactions[0].transactionId!)"}"#)
            #expect((delivered.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String == "delivered")
        }
    }

    // MARK: 7. Another account's delivered proof is 409

    @Test(arguments: databases)
    func anotherAccountsDeliveredProofIs409AndNeverShowsTheirOrder(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let order = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"alice","productId":"coins_60"}"#)
            let orderId = try #require(order.json["orderId"] as? String)
            let token = try #require(UUID(uuidString: order.json["appAccountToken"] as? String ?? ""))
            let bought = try await app.localAppStore!.buy(
                "a", items: [.init(productId: "coins_60")], appAccountToken: token)
            _ = try await API.submit(client, account: "alice", signedTransaction: bought.signedTransactions[0])
            let stolen = try await API.submit(client, account: "bob", signedTransaction: bought.signedTransactions[0])
            #expect(stolen.status == .conflict)
            #expect(stolen.errorCode == "owned_by_other_account")
            let text = String(describing: stolen.json)
            #expect(!text.contains(orderId))
            let anomalies = try await API.call(client, .get, "/v1/anomalies?status=open")
            let conflict = (anomalies.json["anomalies"] as? [[String: Any]])?.first
            #expect(conflict?["kind"] as? String == "ownership_conflict")
            #expect(conflict?["accountId"] as? String == "bob")
            let bobAccount = try await API.call(client, .get, "/v1/accounts/bob")
            #expect((bobAccount.json["balances"] as? [String: Int])?.isEmpty ?? true)
        }
    }

    // MARK: 8. Debit idempotency keys are bound to their request

    @Test(arguments: databases)
    func debitKeysAreBoundToTheirRequestAndClientTokensCannotDebit(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            for account in ["dave", "dave|x"] {
                let bought = try await app.localAppStore!.buy(account, items: [.init(productId: "coins_300")])
                _ = try await API.submit(client, account: account, signedTransaction: bought.signedTransactions[0])
            }
            func debit(_ account: String, _ currency: String, _ amount: Int, _ key: String, token: String? = API.secret)
                async throws -> API.Reply
            {
                try await API.call(
                    client, .post,
                    "/v1/accounts/\(account.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)/balances/\(currency.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)/debit",
                    token: token, body: #"{"amount":\#(amount),"idempotencyKey":"\#(key)"}"#)
            }
            let first = try await debit("dave", "coins", 10, "k1")
            #expect(first.json["balance"] as? Int == 290)
            #expect(try await debit("dave", "coins", 10, "k1").json["balance"] as? Int == 290)
            for (account, currency, amount) in [("dave", "coins", 20), ("dave", "gems", 10), ("dave|x", "coins", 10)] {
                let conflict = try await debit(account, currency, amount, "k1")
                #expect(conflict.status == .conflict, "\(account) \(currency) \(amount)")
                #expect(conflict.errorCode == "idempotency_conflict")
            }
            // The old `account|currency|key` concatenation let these two collide.
            #expect(try await debit("dave|x", "coins", 5, "k2").json["balance"] as? Int == 295)
            #expect(try await debit("dave", "x|coins", 5, "k2").errorCode == "idempotency_conflict")
            // A client token cannot debit, so it cannot pre-claim its backend's keys.
            let token = try await API.clientToken("dave")
            let claimed = try await debit("dave", "coins", 1, "backend-key-7", token: token)
            #expect(claimed.status == .forbidden)
            #expect(try await debit("dave", "coins", 100, "backend-key-7").json["balance"] as? Int == 190)
            #expect(try await app.store.accounts.balances(of: "dave") == ["coins": 190])
            // Control characters in a key are refused.
            #expect(try await debit("dave", "coins", 1, #"a\u0000b"#).status == .badRequest)
        }
    }

    // MARK: 9. A revoked proof after delivery reports refunded

    @Test(arguments: databases)
    func aRevokedProofAfterDeliveryReportsRefundedWithAnAnomaly(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("r", items: [.init(productId: "coins_60")])
            let id = try #require(bought.transactions[0].transactionId)
            _ = try await API.submit(client, account: "ria", signedTransaction: bought.signedTransactions[0])
            try await app.localAppStore!.refund(id)
            let revoked = try await app.localAppStore!.signTransaction(id)
            let reply = try await API.submit(client, account: "ria", signedTransaction: revoked)
            #expect(reply.status == .ok)
            #expect(reply.json["status"] as? String == "already_delivered")
            #expect((reply.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String == "refunded")
            let anomalies = try await API.call(client, .get, "/v1/anomalies?status=open")
            let anomaly = (anomalies.json["anomalies"] as? [[String: Any]])?.first
            #expect(anomaly?["kind"] as? String == "refunded_after_delivery")
            #expect(anomaly?["transactionId"] as? String == id)
        }
    }

    // MARK: 10. Overflow is an anomaly, never a crash

    @Test(arguments: databases)
    func anOverflowingGrantIsAnAnomalyAndTheServerStaysUp(kind: String) async throws {
        let catalog = try Catalog.parse(
            yaml: "products: [{ id: gems_max, type: consumable, grants: { currency: gems, amount: 1000000000000 } }]")
        try await API.withServer(kind, configure: { $0.catalog = catalog }) { app, client in
            var payload = JWSTransactionDecodedPayload(
                transactionId: "2000000000000777", originalTransactionId: "2000000000000777",
                bundleId: "com.example.app", productId: "gems_max", quantity: Int32.max,
                signedDate: Int64(Date().timeIntervalSince1970 * 1000), environment: .production)
            payload.type = .consumable
            let signed = try app.localAppStore!.pki.jwsSigner.sign(payload)
            let reply = try await API.submit(client, account: "whale", signedTransaction: signed)
            #expect(reply.status == .ok)
            #expect((reply.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String == "not_delivered")
            let anomalies = try await API.call(client, .get, "/v1/anomalies?status=open")
            #expect((anomalies.json["anomalies"] as? [[String: Any]])?.first?["kind"] as? String == "grant_overflow")
            #expect(try await API.becomesHealthy(client))
        }
        // Amounts beyond the bound stop the configuration.
        #expect(throws: CatalogError.self) {
            _ = try Catalog.parse(
                yaml: "products: [{ id: x, type: consumable, grants: { currency: c, amount: 4611686018427387904 } }]")
        }
    }
}
