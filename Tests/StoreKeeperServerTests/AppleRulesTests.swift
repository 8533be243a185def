import AppStoreModels
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// Apple's 2025–2026 rules on the real server (SQLite and PostgreSQL), driven by the local App
/// Store as Apple sends them — SCENARIOS.md A1–A5.
@Suite struct AppleRulesTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static func outbox(_ relay: Relay, _ type: String) async throws -> [[String: Any]] {
        try await OutboxStore(database: relay.app.database).all().map(\.event).filter { $0.type == type }.compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
    }

    static func balance(_ relay: Relay, _ account: String) async throws -> Int? {
        (try await relay.account(account)["balances"] as? [String: Int])?["coins"]
    }

    // MARK: A2: prorated refunds

    @Test(arguments: ServerAPITests.databases)
    func aProratedRefundTakesBackItsShareOnce(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            let (order, coins) = try await relay.buy("halver", "coins_60")
            _ = try await relay.deliver()
            try await store.refund(coins.transactionId!, percentage: 50_000)
            // Apple retries (the same notification three times): taken back once.
            #expect(try await relay.deliver(times: 3) == ["REFUND"])
            #expect(try await Self.balance(relay, "halver") == 30)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "partially_refunded")
            // A second REFUND of the same share (a new notification) takes nothing more.
            try await store.refund(coins.transactionId!, percentage: 50_000)
            _ = try await relay.deliver()
            #expect(try await Self.balance(relay, "halver") == 30)
            // Rounded down: 33.333 % of 300 coins is 99.
            let (_, more) = try await relay.buy("halver", "coins_300")
            _ = try await relay.deliver()
            try await store.refund(more.transactionId!, percentage: 33_333)
            _ = try await relay.deliver()
            #expect(try await Self.balance(relay, "halver") == 30 + 300 - 99)
            // Then a full refund of the first takes the other 30; its reversal gives back 60.
            try await store.refund(coins.transactionId!)
            _ = try await relay.deliver()
            #expect(try await Self.balance(relay, "halver") == 231 - 30)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "refunded")
            try await store.reverseRefund(coins.transactionId!)
            _ = try await relay.deliver(times: 2)
            #expect(try await Self.balance(relay, "halver") == 261)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "delivered")

            let refunds = try await Self.outbox(relay, "refund")
            #expect(refunds.map { $0["amount"] as? Int } == [-30, -99, -30])
            #expect(refunds.first?["revocationType"] as? String == "REFUND_PRORATED")
            #expect(refunds.first?["refundedShare"] as? Int == 50_000)
            #expect(refunds.first?["orderStatus"] as? String == "partially_refunded")
            #expect(try await Self.outbox(relay, "refund_reversed").first?["amount"] as? Int == 60)

            // Revenue counts what Apple kept: coins_60 (USD 0.99) whole again, coins_300 (USD 4.99) less 33.333 %.
            let revenue = try await API.call(relay.client, .get, "/v1/revenue?since=2000-01-01").json
            #expect(revenue["partiallyRefundedTransactions"] as? Int == 1)
            let usd = (revenue["currencies"] as? [[String: Any]])?.first { $0["currency"] as? String == "USD" }
            #expect(usd?["grossMilli"] as? Int == 990 + (4990 - 4990 * 33_333 / 100_000))
            #expect(usd?["transactions"] as? Int == 2)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aProratedRefundKeepsANonConsumableBelowThePolicyAndShortensAPass(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            let (adsOrder, ads) = try await relay.buy("keeper", "remove_ads")
            let (_, pass) = try await relay.buy("keeper", "season_pass")
            _ = try await relay.deliver()
            func expiry(_ id: String) async throws -> String? {
                try await relay.entitlements("keeper").first { $0["id"] as? String == id }?["expiresAt"] as? String
            }
            let fullWindow = try #require(try await expiry("season"))
            try await store.refund(ads.transactionId!, percentage: 30_000)
            try await store.refund(pass.transactionId!, percentage: 50_000)
            _ = try await relay.deliver()
            // 30 % < the default 50 %: the unlock stays; the order says partially refunded.
            #expect(try await relay.entitlements("keeper").contains { $0["id"] as? String == "no_ads" })
            #expect(try await ScenarioTests.status(relay.client, order: adsOrder) == "partially_refunded")
            // The 30-day pass keeps 15 days.
            let shortened = try #require(try await expiry("season"))
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            func date(_ text: String) -> Date? { formatter.date(from: text) ?? ISO8601DateFormatter().date(from: text) }
            let purchased = Date(milliseconds: pass.purchaseDate!)
            let kept = try #require(date(shortened)).timeIntervalSince(purchased)
            #expect(abs(kept - 15 * 86_400) < 2, "\(shortened) from \(purchased)")
            // The reversal restores the whole window; a full refund of the unlock removes it.
            try await store.reverseRefund(pass.transactionId!)
            try await store.refund(ads.transactionId!)
            _ = try await relay.deliver()
            #expect(try await expiry("season") == fullWindow)
            #expect(try await relay.entitlements("keeper").contains { $0["id"] as? String == "no_ads" } == false)
        }
    }
}

extension Date {
    fileprivate init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
