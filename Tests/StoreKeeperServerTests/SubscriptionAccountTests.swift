import Foundation
import HummingbirdTesting
import Testing

@testable import StoreKeeperServer

/// Auto-renewable subscriptions submitted by an app show in `GET /v1/accounts/{id}` as docs/api.md
/// lists them, moved forward by each newer period and never back by an older one (first
/// slice of issue 9: the submitted-transaction path through SubscriptionMachine).
@Suite struct SubscriptionAccountTests {
    typealias API = ServerAPITests

    static func subscriptions(_ client: any TestClientProtocol, _ account: String) async throws -> [[String: Any]] {
        try await API.call(client, .get, "/v1/accounts/\(account)").json["subscriptions"] as? [[String: Any]] ?? []
    }

    @Test(arguments: ServerAPITests.databases)
    func submittedPeriodsMoveTheSubscriptionForward(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let store = app.localAppStore!
            let bought = try await store.buy("sub-fan", items: [.init(productId: "pro_monthly")])
            let first = try #require(bought.transactions.first)
            let reply = try await API.submit(client, account: "fan", signedTransaction: bought.signedTransactions[0])
            #expect(reply.status == .ok, "\(reply.json)")
            var listed = try await Self.subscriptions(client, "fan")
            #expect(listed.count == 1)
            #expect(listed.first?["originalTransactionId"] as? String == first.originalTransactionId)
            #expect(listed.first?["productId"] as? String == "pro_monthly")
            #expect(listed.first?["status"] as? String == "active")
            #expect(listed.first?["autoRenew"] as? Bool == true)
            let firstExpiry = try #require(listed.first?["expiresAt"] as? String)

            // A month and more later the store renewed it: the app submits the new period.
            await store.advance(by: 32 * 86_400)
            let renewal = try #require(
                await store.history(of: "sub-fan").map(\.payload)
                    .filter { $0.originalTransactionId == first.originalTransactionId }
                    .max { ($0.expiresDate ?? 0) < ($1.expiresDate ?? 0) })
            #expect(renewal.transactionId != first.transactionId)
            let signed = try await store.signTransaction(renewal.transactionId!)
            #expect(try await API.submit(client, account: "fan", signedTransaction: signed).status == .ok)
            listed = try await Self.subscriptions(client, "fan")
            let renewedExpiry = try #require(listed.first?["expiresAt"] as? String)
            #expect(renewedExpiry > firstExpiry)

            // The first period again (a restored purchase, say): nothing moves back.
            let again = try await API.submit(client, account: "fan", signedTransaction: bought.signedTransactions[0])
            #expect(again.status == .ok)
            listed = try await Self.subscriptions(client, "fan")
            #expect(listed.first?["expiresAt"] as? String == renewedExpiry)
            #expect(listed.count == 1)
            // Nobody else sees it.
            #expect(try await Self.subscriptions(client, "someone-else").isEmpty)
        }
    }
}
