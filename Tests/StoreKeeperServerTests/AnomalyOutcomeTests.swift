import AppStoreAdapter
import AppStoreModels
import Foundation
import HummingbirdTesting
import StoreKeeperCore
import Testing

@testable import StoreKeeperServer

/// Every answer about an anomaly is true: one whose purchase is delivered later closes itself
/// (`delivered_later`), and a manual delivery says exactly what it did — never "delivered" on a
/// no-op.
@Suite struct AnomalyOutcomeTests {
    typealias API = ServerAPITests

    static func openAnomalies(_ client: any TestClientProtocol) async throws -> [[String: Any]] {
        try await API.call(client, .get, "/v1/anomalies?status=open").json["anomalies"] as? [[String: Any]] ?? []
    }

    @Test(arguments: API.databases)
    func anUnattributedPurchaseDeliveredLaterClosesItsAnomaly(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            // Paid with no order and no account (reconciliation found it): unattributed.
            let bought = try await app.localAppStore!.buy("stranger", items: [.init(productId: "coins_60")])
            let orphan = try await app.store.deliver(
                StoreTransaction(apple: bought.transactions[0]), submittingAccount: nil, catalog: app.catalog,
                now: Date())
            #expect(orphan.plan.outcome == .unattributed)
            let open = try await Self.openAnomalies(client)
            #expect(open.count == 1 && open.first?["kind"] as? String == "unattributed_transaction")
            // Held by nobody, it still names its app, in the vocabulary orders use (`apps[].id`).
            let orderApp =
                try await API.call(
                    client, .post, "/v1/orders", body: #"{"accountId":"someone","productId":"coins_60"}"#
                ).json["appId"] as? String
            #expect(orderApp != nil && open.first?["appId"] as? String == orderApp, "\(open)")
            let id = try #require(open.first?["id"] as? String)
            // The player's device submits it later: delivered, and the anomaly is settled by it.
            let submitted = try await API.submit(
                client, account: "late", signedTransaction: bought.signedTransactions[0])
            #expect(submitted.status == .ok)
            #expect(try await Self.openAnomalies(client).isEmpty)
            let all = try await API.call(client, .get, "/v1/anomalies?status=all")
            let closed = try #require((all.json["anomalies"] as? [[String: Any]])?.first { $0["id"] as? String == id })
            #expect(closed["status"] as? String == "resolved")
            #expect(closed["resolution"] as? String == "delivered_later")
            let audit = try await app.store.anomalies.audit().filter { $0.action == "anomaly_delivered_later" }
            #expect(audit.count == 1 && audit.first?.detail.contains("late") == true)
            // An operator who still acts on it gets the anomaly as it is: nothing delivered again.
            let again = try await API.call(
                client, .post, "/v1/anomalies/\(id)/resolve", body: #"{"action":"deliver","accountId":"other"}"#)
            #expect(again.json["status"] as? String == "resolved")
            #expect(try await app.store.accounts.deliveries(of: "other").isEmpty)
        }
    }

    @Test(arguments: API.databases)
    func aManualDeliverySaysWhatHappened(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            // A non-consumable alice owns; bob's restore of it is refused with an anomaly.
            let bought = try await app.localAppStore!.buy("a", items: [.init(productId: "remove_ads")])
            #expect(
                try await API.submit(client, account: "alice", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let conflict = try await API.submit(client, account: "bob", signedTransaction: bought.signedTransactions[0])
            #expect(conflict.errorCode == "owned_by_other_account")
            let anomaly = try #require(try await Self.openAnomalies(client).first)
            #expect(anomaly["kind"] as? String == "ownership_conflict")
            let id = try #require(anomaly["id"] as? String)
            // "Deliver" to alice, who holds it: nothing given again, and the answer says so.
            let stale = try await API.call(
                client, .post, "/v1/anomalies/\(id)/resolve", body: #"{"action":"deliver","accountId":"alice"}"#)
            #expect(stale.status == .ok, "\(stale.json)")
            let outcome = stale.json["outcome"] as? [String: Any] ?? [:]
            #expect(outcome["outcome"] as? String == "already_delivered")
            #expect(outcome["accountId"] as? String == "alice")
            #expect(stale.json["resolution"] as? String == "already_delivered")
            let manual = try await app.store.anomalies.audit().filter { $0.action == "manual_delivery" }
            #expect(manual.first?.detail.contains("already_delivered") == true)
            #expect(manual.first?.detail.contains(": delivered") == false)
        }
    }

    @Test(arguments: API.databases)
    func aRefusedManualDeliveryLeavesTheAnomalyOpenAndSaysWhy(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let app = relay.app
            let bought = try await relay.store.buy("stranger", items: [.init(productId: "coins_60")])
            // Held as unattributed (no order, no account)…
            _ = try await app.store.deliver(
                StoreTransaction(apple: bought.transactions[0]), submittingAccount: nil, catalog: app.catalog,
                now: Date())
            let id = try #require(try await Self.openAnomalies(relay.client).first?["id"] as? String)
            // …then Apple refunds it before anyone has it.
            try await relay.store.refund(bought.transactions[0].transactionId!)
            _ = try await relay.deliver()
            let refused = try await API.call(
                relay.client, .post, "/v1/anomalies/\(id)/resolve", body: #"{"action":"deliver","accountId":"carol"}"#)
            #expect(refused.status == .ok, "\(refused.json)")
            let outcome = refused.json["outcome"] as? [String: Any] ?? [:]
            #expect(outcome["outcome"] as? String == "refused", "\(refused.json)")
            #expect(outcome["code"] as? String == "revoked", "\(refused.json)")
            #expect(refused.json["status"] as? String == "open")
            #expect(try await app.store.accounts.deliveries(of: "carol").isEmpty)
        }
    }
}
