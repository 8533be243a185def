import AppStoreModels
import AppStoreSigning
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// docs/api.md "Purchases from the device" (issue 32's server contract): orders say when they
/// expire and can be cancelled; a batch of signed transactions answers per entry; a receipt
/// must contain the transaction the device reports.
@Suite struct DevicePurchaseContractTests {
    typealias API = ServerAPITests

    static func json(_ object: [String: Any]) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
    }

    @Test(arguments: API.databases)
    func ordersCarryExpiresAtAndUnpaidOnesCanBeCancelled(kind: String) async throws {
        try await API.withServer(kind, configure: { $0.maxOpenOrdersPerAccount = 2 }) { app, client in
            let token = try await API.clientToken("cara")
            let first = try await API.call(
                client, .post, "/v1/orders", token: token, body: #"{"accountId":"cara","productId":"coins_60"}"#)
            #expect(first.status == .created)
            let iso = ISO8601DateFormatter()
            iso.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            let created = try #require(iso.date(from: first.json["createdAt"] as? String ?? ""))
            let expires = try #require(iso.date(from: first.json["expiresAt"] as? String ?? ""))
            #expect(abs(expires.timeIntervalSince(created) - app.configuration.orderTTL) < 1)
            let orderId = try #require(first.json["orderId"] as? String)
            let read = try await API.call(client, .get, "/v1/orders/\(orderId)", token: token)
            #expect(read.json["expiresAt"] as? String == first.json["expiresAt"] as? String)

            // The cap: two open orders, the third refused until one is cancelled.
            _ = try await API.call(
                client, .post, "/v1/orders", token: token, body: #"{"accountId":"cara","productId":"coins_60"}"#)
            let third = try await API.call(
                client, .post, "/v1/orders", token: token, body: #"{"accountId":"cara","productId":"coins_60"}"#)
            #expect(third.errorCode == "too_many_open_orders")
            // Another account's token may not cancel it; the owner may, twice (idempotent).
            let stranger = try await API.clientToken("mallory")
            #expect(
                try await API.call(client, .post, "/v1/orders/\(orderId)/cancel", token: stranger).status == .forbidden)
            let cancelled = try await API.call(client, .post, "/v1/orders/\(orderId)/cancel", token: token)
            #expect(cancelled.status == .ok && cancelled.json["status"] as? String == "cancelled")
            let again = try await API.call(client, .post, "/v1/orders/\(orderId)/cancel", token: token)
            #expect(again.status == .ok && again.json["status"] as? String == "cancelled")
            #expect(
                try await API.call(
                    client, .post, "/v1/orders", token: token, body: #"{"accountId":"cara","productId":"coins_60"}"#
                ).status == .created)
            #expect(try await API.call(client, .post, "/v1/orders/no-such-order/cancel").status == .notFound)

            // Paid: 409 order_not_cancellable, and it stays delivered. A late payment of the
            // cancelled order is still delivered.
            let paid = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"dov","productId":"coins_60"}"#)
            let paidId = try #require(paid.json["orderId"] as? String)
            let tokenUUID = try #require(UUID(uuidString: paid.json["appAccountToken"] as? String ?? ""))
            let bought = try await app.localAppStore!.buy(
                "apple-dov", items: [.init(productId: "coins_60")], appAccountToken: tokenUUID)
            #expect(
                try await API.submit(client, account: "dov", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let refused = try await API.call(client, .post, "/v1/orders/\(paidId)/cancel")
            #expect(refused.status == .conflict && refused.errorCode == "order_not_cancellable")
            #expect(try await API.call(client, .get, "/v1/orders/\(paidId)").json["status"] as? String == "delivered")
            let late = try await app.localAppStore!.buy(
                "apple-cara", items: [.init(productId: "coins_60")],
                appAccountToken: UUID(uuidString: first.json["appAccountToken"] as? String ?? ""))
            let lateReply = try await API.submit(client, account: "cara", signedTransaction: late.signedTransactions[0])
            #expect(lateReply.status == .ok && lateReply.json["status"] as? String == "delivered")
        }
    }

    @Test(arguments: API.databases)
    func aBatchOfSignedTransactionsAnswersEveryEntry(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let store = try #require(app.localAppStore)
            let fresh = try await store.buy("apple-bea", items: [.init(productId: "coins_60")])
            let earlier = try await store.buy("apple-bea", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "bea", signedTransaction: earlier.signedTransactions[0]).status
                    == .ok)
            let others = try await store.buy("apple-olga", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "olga", signedTransaction: others.signedTransactions[0]).status
                    == .ok)
            // A forgery: signed by a chain no root vouches for, claiming a transaction id.
            let forger = try ApplePKI.generate(name: "Forged")
            var claim = fresh.transactions[0]
            claim.transactionId = "2999000000000001"
            claim.originalTransactionId = "2999000000000001"
            let forged = try forger.jwsSigner.sign(claim)
            let batch = [
                fresh.signedTransactions[0], earlier.signedTransactions[0], forged, others.signedTransactions[0],
            ]
            let reply = try await API.call(
                client, .post, "/v1/purchases", body: try Self.json(["accountId": "bea", "signedTransactions": batch]))
            #expect(reply.status == .ok, "\(reply.json)")
            let entries = try #require(reply.json["transactions"] as? [[String: Any]])
            #expect(
                entries.map { $0["outcome"] as? String } == [
                    "delivered", "already_delivered", "rejected", "not_delivered",
                ])
            #expect(entries[0]["transactionId"] as? String == fresh.transactions[0].transactionId)
            #expect(entries[2]["transactionId"] as? String == "2999000000000001")
            #expect(["invalid_chain", "invalid_signature"].contains(entries[2]["code"] as? String ?? ""))
            #expect(entries[3]["code"] as? String == "owned_by_other_account")
            #expect(entries[0]["code"] == nil)
            #expect(((reply.json["account"] as? [String: Any])?["balances"] as? [String: Int])?["coins"] == 120)
            // The same batch again: nothing new.
            let again = try await API.call(
                client, .post, "/v1/purchases", body: try Self.json(["accountId": "bea", "signedTransactions": batch]))
            #expect(again.json["status"] as? String == "already_delivered")
            #expect(try await app.store.accounts.balances(of: "bea") == ["coins": 120])
            // Bounds and combinations.
            for body: [String: Any] in [
                ["accountId": "bea", "signedTransactions": [String]()],
                ["accountId": "bea", "signedTransactions": Array(repeating: "x.y.z", count: 101)],
                ["accountId": "bea", "signedTransactions": [""]],
                ["accountId": "bea", "signedTransactions": ["x.y.z"], "signedTransaction": "x.y.z"],
                ["accountId": "bea", "signedTransactions": ["x.y.z"], "receipt": "AAAA"],
                ["accountId": "bea", "signedTransactions": ["x.y.z"], "transactionId": "1"],
                ["accountId": "bea", "signedTransactions": ["x.y.z"], "orderId": "some-order"],
            ] {
                let refused = try await API.call(client, .post, "/v1/purchases", body: try Self.json(body))
                #expect(refused.status == .badRequest, "\(body)")
            }
            // A client token for another account cannot submit a batch for bea.
            let token = try await API.clientToken("mallory")
            let foreign = try await API.call(
                client, .post, "/v1/purchases", token: token,
                body: try Self.json(["accountId": "bea", "signedTransactions": [fresh.signedTransactions[0]]]))
            #expect(foreign.status == .forbidden)
        }
    }

    @Test(arguments: API.databases)
    func aReceiptMustContainTheTransactionTheDeviceReports(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let store = try #require(app.localAppStore)
            let old = try await store.buy("apple-rex", items: [.init(productId: "coins_60")])
            let staleReceipt = Data(old.receipt).base64EncodedString()
            let new = try await store.buy("apple-rex", items: [.init(productId: "coins_300")])
            let newId = try #require(new.transactions[0].transactionId)
            // A receipt read before StoreKit wrote the new purchase into it: 422, retryable,
            // and nothing of it delivered (not even the old entry).
            let stale = try await API.call(
                client, .post, "/v1/purchases",
                body: try Self.json(["accountId": "rex", "receipt": staleReceipt, "transactionId": newId]))
            #expect(stale.status == .unprocessableContent)
            #expect(stale.errorCode == "transaction_not_in_proof")
            #expect((stale.json["error"] as? [String: Any])?["retryable"] as? Bool == true)
            #expect(try await app.store.accounts.balances(of: "rex").isEmpty)
            // The refreshed receipt holds it: delivered, and the answer lists it.
            let fresh = Data(new.receipt).base64EncodedString()
            let reply = try await API.call(
                client, .post, "/v1/purchases",
                body: try Self.json(["accountId": "rex", "receipt": fresh, "transactionId": newId]))
            #expect(reply.status == .ok, "\(reply.json)")
            let listed = (reply.json["transactions"] as? [[String: Any]] ?? []).compactMap {
                $0["transactionId"] as? String
            }
            #expect(listed.contains(newId))
            let bad = try await API.call(
                client, .post, "/v1/purchases",
                body: try Self.json(["accountId": "rex", "receipt": fresh, "transactionId": "12x"]))
            #expect(bad.status == .badRequest)
        }
    }

    /// Two app accounts on one device share its receipt: a receipt sent to report one
    /// transaction delivers that one alone; the other account's unfinished entry is left for its
    /// own report (never credited to whoever uploads first), with no anomaly. Without
    /// `transactionId` (a restore) every entry is delivered as before.
    @Test(arguments: API.databases)
    func aReceiptReportingOneTransactionLeavesTheOthersToTheirOwnReports(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let store = try #require(app.localAppStore)
            let alices = try await store.buy("apple-shared", items: [.init(productId: "coins_60")])
            let bobs = try await store.buy("apple-shared", items: [.init(productId: "coins_300")])
            let aliceId = try #require(alices.transactions[0].transactionId)
            let bobId = try #require(bobs.transactions[0].transactionId)
            let receipt = Data(bobs.receipt).base64EncodedString()
            let bob = try await API.call(
                client, .post, "/v1/purchases",
                body: try Self.json(["accountId": "bob", "receipt": receipt, "transactionId": bobId]))
            #expect(bob.status == .ok, "\(bob.json)")
            let listed = (bob.json["transactions"] as? [[String: Any]] ?? []).compactMap {
                $0["transactionId"] as? String
            }
            #expect(listed == [bobId], "only the reported transaction")
            #expect(try await app.store.accounts.balances(of: "bob") == ["coins": 300])
            let alice = try await API.call(
                client, .post, "/v1/purchases",
                body: try Self.json(["accountId": "alice", "receipt": receipt, "transactionId": aliceId]))
            #expect(alice.status == .ok, "\(alice.json)")
            let aliceListed = (alice.json["transactions"] as? [[String: Any]] ?? []).compactMap {
                $0["transactionId"] as? String
            }
            #expect(aliceListed == [aliceId], "Bob's entry, delivered to Bob, is not listed to Alice")
            #expect(try await app.store.accounts.balances(of: "alice") == ["coins": 60])
            let anomalies = try await API.call(client, .get, "/v1/anomalies")
            #expect((anomalies.json["anomalies"] as? [[String: Any]] ?? []).isEmpty, "\(anomalies.json)")
            // A restore (no transactionId) still delivers every entry of the receipt: both are
            // someone's already, so nothing moves.
            let restore = try await API.call(
                client, .post, "/v1/purchases", body: try Self.json(["accountId": "alice", "receipt": receipt]))
            #expect(restore.status == .ok, "\(restore.json)")
            #expect(try await app.store.accounts.balances(of: "alice") == ["coins": 60])
        }
    }
}
