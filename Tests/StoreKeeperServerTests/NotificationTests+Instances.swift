import AppStoreModels
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// Two server instances on one PostgreSQL, both receiving every notification (Apple may
/// retry to either behind a load balancer) and both applying at once.
extension NotificationTests {
    static var postgresOnly: [String] { ServerAPITests.databases.filter { $0 == "postgres" } }

    @Test(arguments: postgresOnly)
    func twoInstancesApplyEachNotificationOnceInOrder(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let relay = Relay(app, client)
            let store = relay.store
            // The second instance: same database, trusting the same local App Store.
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("twin-\(UUID())")
            defer { try? FileManager.default.removeItem(at: directory) }
            try PKIStore.save(store.pki, to: directory.appendingPathComponent("local-store/pki"))
            let twin = try await StoreKeeperApp.make(app.configuration, dataDirectory: directory)
            try await API.drive(twin) { twin, twinClient in
                let (_, first) = try await relay.buy("twin", "pro_monthly")
                let original = try #require(first.originalTransactionId)
                for _ in 0..<3 { await store.advance(by: 32 * 86_400) }
                try await store.setAutoRenew(original, false)
                await store.advance(by: 32 * 86_400)
                let payloads = await relay.take().map(\.signedPayload)
                #expect(payloads.count == 6)  // SUBSCRIBED, DID_RENEW ×3, DID_CHANGE_RENEWAL_STATUS, EXPIRED

                // Every notification to both instances, in opposite orders, at once; then both
                // appliers run at once.
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for (target, order) in [(client, payloads), (twinClient, payloads.reversed())] {
                        group.addTask {
                            for payload in order {
                                let reply = try await API.call(
                                    target, .post, "/v1/notifications/apple", token: nil, body: Relay.body(payload))
                                #expect(reply.status == .ok)
                            }
                        }
                    }
                    try await group.waitForAll()
                }
                await withTaskGroup(of: Void.self) { group in
                    for instance in [app, twin] {
                        group.addTask {
                            let runner = JobRunner(app: instance)
                            for _ in 0..<20 { _ = await runner.runDueCounting(now: Date()) }
                        }
                    }
                }
                let recorded = try await app.notifications.notifications(subject: original)
                #expect(recorded.count == 6)
                #expect(recorded.allSatisfy { $0.status == "applied" }, "\(recorded.map { ($0.type, $0.status) })")
                #expect(try await relay.subscription("twin")?["status"] as? String == "expired")
                #expect(try await relay.entitlements("twin").isEmpty)
                #expect(try await app.store.accounts.deliveries(of: "twin").count == 4)
                // In order, once: active once, then expired once — no step back and forth.
                let changes = try await OutboxStore(database: app.database).all().map(\.event)
                    .filter { $0.type == "subscription_status_changed" }.map(\.payload)
                #expect(changes.count == 2, "\(changes)")
                #expect(changes.last?.contains(#""newStatus":"expired""#) == true)
            }
        }
    }
}
