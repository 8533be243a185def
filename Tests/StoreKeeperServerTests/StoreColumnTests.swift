import Foundation
import HTTPTypes
import LocalAppStore
import SQLKit
import StoreKeeperStorage
import Synchronization
import Testing

@testable import StoreKeeperServer

/// "One core for every store", finding 6: a web payment was `app_store` in the exports, the SQL
/// views and analytics, and `?store=web` was refused. The store is now a stored column.
@Suite struct StoreColumnTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func aWebPaymentIsWebEverywhere(kind: String) async throws {
        try await NotificationTests.withRelay(kind, prepare: { $0.exportSettleSeconds = 0 }) { relay in
            let paid = try await AppleRulesTests.web(
                relay,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"pay_w1","price":"1.19","currency":"EUR"}"#
            )
            #expect(paid.status == .ok, "\(paid.json)")
            _ = try await relay.buy("iphone", "coins_60")
            let export = try await ExportTests.text(relay.client, "/v1/export/transactions?format=ndjson")
            var stores: [String: String] = [:]
            for line in export.body.split(separator: "\n") {
                let row = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                stores[row["transaction_id"] as? String ?? ""] = row["store"] as? String
            }
            #expect(stores["web:pay_w1"] == "web", "\(stores)")
            #expect(stores.filter { $0.key != "web:pay_w1" }.values.allSatisfy { $0 == "app_store" })
            let view = try await relay.app.database.read { sql in
                try await sql.raw(
                    "SELECT store FROM storekeeper_transactions WHERE transaction_id = 'web:pay_w1'"
                ).first()?.decode(column: "store", as: String.self)
            }
            #expect(view == "web")
            let today = String(ISO8601DateFormatter().string(from: Date()).prefix(10))
            let web = try await API.call(
                relay.client, .get, "/v1/analytics/proceeds?from=\(today)&to=\(today)&store=web")
            #expect(web.status == .ok, "\(web.json)")
            #expect(
                ((web.json["points"] as? [[String: Any]])?.last?["byCurrency"] as? [String: Double])?["EUR"] != nil,
                "\(web.json)")
            let apple = try await API.call(
                relay.client, .get, "/v1/analytics/proceeds?from=\(today)&to=\(today)&store=app_store")
            #expect(
                ((apple.json["points"] as? [[String: Any]])?.last?["byCurrency"] as? [String: Double])?["EUR"] == nil)
            let bad = try await API.call(relay.client, .get, "/v1/analytics/proceeds?store=play_store")
            #expect(bad.status == .badRequest)
        }
    }
}

/// "One core for every store", finding 8: a subscription whose last word from the store is
/// months old (auto-renew on, no EXPIRED received) read `active` in the account view. Past its
/// paid period plus the store's longest retry window it reads `expired`.
@Suite struct SilentStoreTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func aSubscriptionTheStoreWentSilentAboutReadsExpired(kind: String) async throws {
        let offset = Mutex(0.0)
        try await NotificationTests.withRelay(
            kind, prepare: { app in app.readClock = { Date().addingTimeInterval(offset.withLock { $0 }) } }
        ) { relay in
            // Renewed for eight months, auto-renew on; then nothing more reached the server.
            _ = try await relay.buy("quiet", "pro_monthly")
            for _ in 0..<8 { await relay.store.advance(by: 31 * 86_400) }
            _ = try await relay.deliver()
            offset.withLock { $0 = 8 * 31 * 86_400 }
            var subscription = try #require(try await relay.subscription("quiet"))
            #expect(subscription["status"] as? String == "active", "\(subscription)")
            // A hundred days later still no word (the EXPIRED notification lost): past the
            // period and Apple's 60-day billing retry, it reads expired.
            offset.withLock { $0 = (8 * 31 + 100) * 86_400 }
            subscription = try #require(try await relay.subscription("quiet"))
            #expect(subscription["status"] as? String == "expired", "\(subscription)")
            #expect(try await relay.entitlements("quiet").allSatisfy { $0["active"] as? Bool == false })
            // The minute's pass writes it: the stored state and the views say the same.
            let later = Date().addingTimeInterval(offset.withLock { $0 })
            let store = relay.app.store
            #expect(
                try await store.reconciliation.expireSilentSubscriptions(catalog: relay.app.catalog, now: later) == 1)
            #expect(
                try await store.reconciliation.expireSilentSubscriptions(catalog: relay.app.catalog, now: later) == 0)
            let stored = try await relay.app.database.read { sql in
                try await sql.raw("SELECT status FROM storekeeper_subscriptions").first()?.decode(
                    column: "status", as: String.self)
            }
            #expect(stored == "expired")
            offset.withLock { $0 = 0 }
            #expect(try await relay.subscription("quiet")?["status"] as? String == "expired")
        }
    }
}
