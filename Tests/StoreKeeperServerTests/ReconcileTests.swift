import AppStoreModels
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// S8: the server is down while Apple sends renewals, a refund and a billing failure; after
/// the restart, reconciliation pulls them back through the App Store Server API and the state
/// is exactly what it would have been. Running it again changes nothing.
@Suite struct ReconcileTests {
    @Test func whatWasMissedWhileDownIsReconciledOnce() async throws {
        try await AppleLookupJobTests.withSetup { apple, app, _, client in
            func buy(_ account: String, _ product: String, appleId: String) async throws -> JWSTransactionDecodedPayload
            {
                let order = try await ScenarioTests.order(client, account: account, product: product)
                let bought = try await apple.buy(
                    appleId, items: [.init(productId: product)], appAccountToken: order.token)
                let reply = try await ServerAPITests.submit(
                    client, account: account, signedTransaction: bought.signedTransactions[0])
                #expect(reply.status == .ok, "\(reply.json)")
                return bought.transactions[0]
            }
            let start = apple.clock.now()
            let subscription = try await buy("sue", "pro_monthly", appleId: "apple-sue")
            let coins = try await buy("cat", "coins_300", appleId: "apple-cat")
            // No notification reaches the server from here on (it is "down"): Apple keeps them
            // in the history as failures.
            await apple.advance(by: 32 * 86_400)
            await apple.advance(by: 31 * 86_400)
            try await apple.refund(coins.transactionId!)
            await apple.setBillingFails("apple-sue", true)
            await apple.advance(by: 31 * 86_400)
            #expect(try await app.notifications.count() == 0)
            #expect(
                try await SubscriptionAccountTests.subscriptions(client, "sue").first?["status"] as? String == "active")

            let reconciler = Reconciler(app: app)
            let now = apple.clock.now()
            let report = try await reconciler.run(since: start.addingTimeInterval(-3600), now: now)
            #expect(report.errors.isEmpty, "\(report.errors)")
            // SUBSCRIBED, ONE_TIME_CHARGE, DID_RENEW ×2, REFUND, DID_FAIL_TO_RENEW.
            #expect(report.notificationsRecorded == 6, "\(report)")
            #expect(report.notificationsRefused == 0)

            let sue = try #require(try await SubscriptionAccountTests.subscriptions(client, "sue").first)
            #expect(sue["originalTransactionId"] as? String == subscription.originalTransactionId)
            #expect(sue["status"] as? String == "grace_period")
            #expect(try await app.store.accounts.deliveries(of: "sue").count == 3)
            #expect(try await app.store.accounts.entitlements(of: "sue").count == 1)
            #expect(try await AppleLookupJobTests.coins(client, "cat") == 0)
            let counts = try await app.notifications.counts()
            #expect(counts["pending"] == nil && counts["unattributed"] == nil, "\(counts)")

            // Idempotent: a second pass records and delivers nothing, and moves nothing.
            let outbox = try await OutboxStore(database: app.database).all().count
            let again = try await reconciler.run(since: start.addingTimeInterval(-3600), now: now)
            #expect(again.notificationsRecorded == 0)
            #expect(again.transactionsDelivered == 0)
            #expect(again.subscriptionsChanged == 0)
            #expect(try await OutboxStore(database: app.database).all().count == outbox)
            #expect(try await app.store.accounts.deliveries(of: "sue").count == 3)
            #expect(try await AppleLookupJobTests.coins(client, "cat") == 0)

            // Past the grace period with Apple silent: Get All Subscription Statuses says
            // billing retry.
            let later = now.addingTimeInterval(17 * 86_400)
            await apple.advance(by: 17 * 86_400)
            let statuses = try await reconciler.run(since: later.addingTimeInterval(-3600), now: later)
            #expect(statuses.subscriptionsChecked >= 1)
            #expect(
                try await SubscriptionAccountTests.subscriptions(client, "sue").first?["status"] as? String
                    == "billing_retry")
            #expect(try await app.store.accounts.entitlements(of: "sue").isEmpty)
        }
    }
}
