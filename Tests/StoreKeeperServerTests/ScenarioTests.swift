import AppStoreModels
import Foundation
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import Testing

@testable import StoreKeeperServer

/// docs/scenarios.md P10–P12 through the HTTP API, on SQLite and PostgreSQL, with the local App
/// Store doing what StoreKit does.
@Suite struct ScenarioTests {
    static func order(_ client: any TestClientProtocol, account: String, product: String) async throws -> (
        id: String, token: UUID
    ) {
        let created = try await ServerAPITests.call(
            client, .post, "/v1/orders", body: #"{"accountId":"\#(account)","productId":"\#(product)"}"#)
        #expect(created.status == .created)
        return (
            try #require(created.json["orderId"] as? String),
            try #require(UUID(uuidString: created.json["appAccountToken"] as? String ?? ""))
        )
    }

    static func status(_ client: any TestClientProtocol, order: String) async throws -> String? {
        try await ServerAPITests.call(client, .get, "/v1/orders/\(order)").json["status"] as? String
    }

    /// P10: Ask to Buy, approved long after the order (which expired meanwhile) and after a restart.
    @Test(arguments: ServerAPITests.databases)
    func askToBuyApprovedLaterIsDeliveredToItsOrder(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let store = try #require(app.localAppStore)
            let (orderId, token) = try await Self.order(client, account: "kid", product: "coins_300")
            let asked = try await store.buy(
                "kid-apple-id", items: [.init(productId: "coins_300")], appAccountToken: token, askToBuy: true)
            #expect(asked.signedTransactions.isEmpty)  // nothing charged yet, nothing to submit
            #expect(try await Self.status(client, order: orderId) == "created")
            // Hours pass: the order outlives its TTL and is cancelled.
            #expect(
                try await app.store.orders.cancelExpiredOrders(olderThan: 0, now: Date().addingTimeInterval(1)) == 1)
            #expect(try await Self.status(client, order: orderId) == "cancelled")
            let approved = try await store.approve(try #require(asked.pendingId))
            let reply = try await ServerAPITests.submit(
                client, account: "kid", signedTransaction: approved.signedTransactions[0])
            #expect(reply.status == .ok)
            let transaction = try #require((reply.json["transactions"] as? [[String: Any]])?.first)
            #expect(transaction["orderId"] as? String == orderId)
            #expect(transaction["outcome"] as? String == "delivered")
            #expect(try await Self.status(client, order: orderId) == "delivered")
            #expect(try await app.store.accounts.balances(of: "kid") == ["coins": 300])
        }
    }

    /// P11: StoreKit hands an old, unfinished consumable to a new purchase flow.
    @Test(arguments: ServerAPITests.databases)
    func anOldTransactionSubmittedForANewOrderPaysOnlyItsOwn(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let store = try #require(app.localAppStore)
            let old = try await Self.order(client, account: "p11", product: "coins_60")
            let paid = try await store.buy(
                "p11-apple-id", items: [.init(productId: "coins_60")], appAccountToken: old.token)
            // The app never delivered it; now the player starts a new order for the same product,
            // and the app submits the old transaction with the new order's id.
            let new = try await Self.order(client, account: "p11", product: "coins_60")
            let reply = try await ServerAPITests.submit(
                client, account: "p11", signedTransaction: paid.signedTransactions[0], orderId: new.id)
            #expect(reply.status == .ok)
            let transaction = try #require((reply.json["transactions"] as? [[String: Any]])?.first)
            #expect(transaction["orderId"] as? String == old.id)
            #expect(try await Self.status(client, order: old.id) == "delivered")
            #expect(try await Self.status(client, order: new.id) == "created")  // not paid by it
            #expect(try await app.store.accounts.balances(of: "p11") == ["coins": 60])
            // The new order's own payment then pays it.
            let second = try await store.buy(
                "p11-apple-id", items: [.init(productId: "coins_60")], appAccountToken: new.token)
            _ = try await ServerAPITests.submit(
                client, account: "p11", signedTransaction: second.signedTransactions[0], orderId: new.id)
            #expect(try await Self.status(client, order: new.id) == "delivered")
            #expect(try await app.store.accounts.balances(of: "p11") == ["coins": 120])
        }
    }

    /// P12: the client claims product A, but what was paid (and signed) is product B.
    @Test(arguments: ServerAPITests.databases)
    func deliveryFollowsWhatWasPaidNotWhatWasClaimed(kind: String) async throws {
        try await ServerAPITests.withServer(kind) { app, client in
            let store = try #require(app.localAppStore)
            let expensive = try await Self.order(client, account: "p12", product: "coins_300")
            let cheap = try await store.buy(
                "p12-apple-id", items: [.init(productId: "coins_60")], appAccountToken: expensive.token)
            let reply = try await ServerAPITests.submit(
                client, account: "p12", signedTransaction: cheap.signedTransactions[0], orderId: expensive.id)
            #expect(reply.status == .ok)
            let transaction = try #require((reply.json["transactions"] as? [[String: Any]])?.first)
            #expect(transaction["productId"] as? String == "coins_60")
            #expect(try await app.store.accounts.balances(of: "p12") == ["coins": 60])
            #expect(try await Self.status(client, order: expensive.id) == "created")  // stays unpaid
            let anomalies = try await ServerAPITests.call(client, .get, "/v1/anomalies?status=open")
            let kinds = (anomalies.json["anomalies"] as? [[String: Any]])?.compactMap { $0["kind"] as? String }
            #expect(kinds == ["product_mismatch"])
        }
    }
}
