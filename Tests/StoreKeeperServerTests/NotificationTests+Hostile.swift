import AppStoreModels
import AppStoreSigning
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// What anyone on the internet can POST to the open notification endpoint: nothing that does
/// not verify is recorded or applied, every answer is a clean 4xx, the server stays up.
extension NotificationTests {
    @Test(arguments: ServerAPITests.databases)
    func hostileNotificationsAreRefusedAndNothingIsApplied(kind: String) async throws {
        try await API.withServer(kind, environments: [.production]) { app, client in
            let relay = Relay(app, client)
            let store = relay.store
            func refused(_ body: String, _ status: HTTPResponse.Status, _ code: String) async throws {
                let reply = try await API.call(client, .post, "/v1/notifications/apple", token: nil, body: body)
                #expect(reply.status == status, "\(body.prefix(80)): \(reply.json)")
                #expect(reply.errorCode == code, "\(body.prefix(80)): \(reply.json)")
            }
            // A genuine one to tamper with.
            let order = try await ScenarioTests.order(client, account: "victim", product: "coins_300")
            _ = try await store.buy(
                "apple-victim", items: [.init(productId: "coins_300")], appAccountToken: order.token)
            let genuine = try #require(await relay.take().first?.signedPayload)

            try await refused(
                Relay.body("eyJhbGciOiJub25lIn0.eyJub3RpZmljYXRpb25UeXBlIjoiUkVGVU5EIn0."), .badRequest,
                "invalid_signature")
            try await refused(Relay.body(String(genuine.dropLast(12))), .badRequest, "invalid_signature")
            try await refused(Relay.body(String(genuine.prefix(genuine.count / 2))), .badRequest, "invalid_signature")
            var flipped = Array(genuine)
            let middle = flipped.count / 2
            flipped[middle] = flipped[middle] == "A" ? "B" : "A"
            try await refused(Relay.body(String(flipped)), .badRequest, "invalid_signature")
            try await refused(#"{"signedPayload":""}"#, .badRequest, "bad_request")
            try await refused(#"{"signedPayload":42}"#, .badRequest, "bad_request")
            try await refused(#"{}"#, .badRequest, "bad_request")
            try await refused(#"{"signedPayload":"#, .badRequest, "bad_request")
            try await refused(String(repeating: "x", count: 10 * 1024 * 1024), .contentTooLarge, "payload_too_large")

            // Forged: a store of its own making, a chain to a root nobody trusts.
            let forger = LocalAppStore(
                configuration: .init(bundleId: "com.example.app", appAppleId: 1_234_567_890, catalog: app.catalog),
                pki: try ApplePKI.generate(name: "Forged"))
            _ = try await forger.buy(
                "apple-victim", items: [.init(productId: "coins_300")], appAccountToken: order.token)
            try await refused(Relay.body(await forger.notifications[0].signedPayload), .badRequest, "invalid_chain")
            // Another app, signed by the trusted chain; and the right app in an environment
            // this server does not accept.
            let otherApp = LocalAppStore(
                configuration: .init(bundleId: "com.other.app", appAppleId: 1_234_567_890, catalog: app.catalog),
                pki: store.pki)
            _ = try await otherApp.buy("apple-victim", items: [.init(productId: "coins_300")])
            try await refused(Relay.body(await otherApp.notifications[0].signedPayload), .badRequest, "wrong_bundle")
            let otherAppId = LocalAppStore(
                configuration: .init(bundleId: "com.example.app", appAppleId: 42, catalog: app.catalog), pki: store.pki)
            _ = try await otherAppId.buy("apple-victim", items: [.init(productId: "coins_300")])
            try await refused(Relay.body(await otherAppId.notifications[0].signedPayload), .badRequest, "wrong_app")
            let sandbox = LocalAppStore(
                configuration: .init(
                    bundleId: "com.example.app", appAppleId: 1_234_567_890, environment: .sandbox, catalog: app.catalog),
                pki: store.pki)
            _ = try await sandbox.buy(
                "apple-victim", items: [.init(productId: "coins_300")], appAccountToken: order.token)
            try await refused(
                Relay.body(await sandbox.notifications[0].signedPayload), .badRequest, "wrong_environment")

            await relay.apply()
            #expect(try await app.notifications.counts().isEmpty)
            #expect((try await relay.account("victim")["balances"] as? [String: Int])?["coins"] == nil)
            #expect(try await ScenarioTests.status(client, order: order.id) == "created")
            #expect(try await API.becomesHealthy(client))

            // And the genuine one still goes through, once.
            #expect(try await relay.post(genuine).status == .ok)
            await relay.apply()
            #expect((try await relay.account("victim")["balances"] as? [String: Int])?["coins"] == 300)
        }
    }
}
