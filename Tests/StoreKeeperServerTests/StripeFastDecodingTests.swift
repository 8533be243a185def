import Foundation
import GooglePlay
import LocalAppStore
import LocalGooglePlay
import LocalStripe
import StoreKeeperCatalog
import StoreKeeperSupport
import Testing

@testable import Stripe

/// The webhook path's hand-written Stripe readers agree with `JSONDecoder` on every object the
/// local Stripe renders, and on each of them with any one field given a value of another type:
/// the same value, or a failure both ways.
@Suite struct StripeFastDecodingTests {
    static func objects() throws -> (sessions: [[UInt8]], events: [[UInt8]]) {
        let stripe = LocalStripe(configuration: .init(catalog: .demo))
        var sessions: [[UInt8]] = []
        for (price, outcome) in [
            ("price_coins_300", "paid"), ("price_coins_60", "async"), ("price_remove_ads", "dispute"),
            ("price_pro_monthly", "paid"), ("price_coins_60", "declined"),
        ] {
            let mode = price.contains("monthly") ? "subscription" : "payment"
            let (session, _) = try stripe.createCheckoutSession(
                [
                    ("mode", mode), ("line_items[0][price]", price), ("line_items[0][quantity]", "2"),
                    ("success_url", "https://x.example/ok"), ("client_reference_id", "order-1"),
                    ("metadata[storekeeper_token]", "tok"),
                ], idempotencyKey: nil, baseURL: "http://127.0.0.1:1")
            let id = try #require(session["id"] as? String)
            _ = try? stripe.pay(session: id, outcome: outcome)
            for expand: Set<String> in [
                [], ["line_items", "payment_intent.latest_charge.balance_transaction", "subscription"],
                ["line_items", "payment_intent"],
            ] {
                sessions.append(Array(try stripe.renderedSession(id, expand: expand)))
            }
        }
        let events = try stripe.eventSummaries().map {
            Array(try JSONSerialization.data(withJSONObject: try stripe.event($0.id)))
        }
        return (sessions, events)
    }

    /// Every way to give one field (at any depth) a value of another type.
    static func mutations(_ bytes: [UInt8]) throws -> [[UInt8]] {
        let root = try JSONSerialization.jsonObject(with: Data(bytes))
        var out: [[UInt8]] = []
        func replacements(_ value: Any) -> [Any] {
            switch value {
            case is String: [42, NSNull(), ["id": "x"]]
            case is NSNumber: ["7", NSNull(), 1.5]
            case is NSNull: ["s", 3]
            case is [Any]: ["s", [1]]
            default: ["obj_1", 3, [] as [Any]]
            }
        }
        func visit(_ value: Any, rebuild: @escaping (Any) -> Any) {
            if let object = value as? [String: Any] {
                for (key, child) in object {
                    let rebuildChild: (Any) -> Any = { new in
                        var copy = object
                        copy[key] = new
                        return rebuild(copy)
                    }
                    for replacement in replacements(child) { out.append(serialize(rebuildChild(replacement))) }
                    visit(child, rebuild: rebuildChild)
                }
            } else if let array = value as? [Any] {
                for (index, child) in array.enumerated() {
                    visit(child) { new in
                        var copy = array
                        copy[index] = new
                        return rebuild(copy)
                    }
                }
            }
        }
        func serialize(_ value: Any) -> [UInt8] {
            Array((try? JSONSerialization.data(withJSONObject: value)) ?? Data())
        }
        visit(root) { $0 }
        return out
    }

    static func agree<T: StripeFastDecodable & Equatable>(_ type: T.Type, _ bytes: [UInt8]) -> Bool {
        let fast = try? T.decode(json: bytes)
        let foundation = try? JSONDecoder().decode(T.self, from: Data(bytes))
        return fast == foundation
    }

    @Test func sessionsAndEventsReadAsJSONDecoderReadsThem() throws {
        let (sessions, events) = try Self.objects()
        #expect(sessions.count == 15 && events.count > 10)
        var fastCount = 0
        for session in sessions {
            #expect(Self.agree(StripeCheckoutSession.self, session))
            if case .object(let fields)? = try? FastJSON.parse(session),
                (try? StripeCheckoutSession(fast: FastJSON.Fields(fields))) != nil
            {
                fastCount += 1
            }
        }
        // The payment-mode sessions are read by hand (a subscription's expanded one is not).
        #expect(fastCount >= 10)
        for event in events {
            #expect(Self.agree(StripeEvent.self, event))
        }
    }

    @Test func everyMutatedFieldReadsTheSameOrFailsBothWays() throws {
        let (sessions, events) = try Self.objects()
        var checked = 0
        for session in [sessions[1], sessions[7]] {
            for mutated in try Self.mutations(session) {
                #expect(Self.agree(StripeCheckoutSession.self, mutated))
                checked += 1
            }
        }
        for event in events.prefix(3) {
            for mutated in try Self.mutations(event) {
                #expect(Self.agree(StripeEvent.self, mutated))
                checked += 1
            }
        }
        #expect(checked > 200)
    }
}

/// Google Play's one-time purchase resource, read on every Google delivery: the hand-written
/// reader agrees with `JSONDecoder` on every state the local Google Play renders, and on each
/// with any one field given a value of another type.
@Suite struct GoogleFastDecodingTests {
    @Test func productPurchasesReadAsJSONDecoderReadsThem() async throws {
        var configuration = LocalGooglePlay.Configuration(packageName: "com.example.android", catalog: .demo)
        configuration.testPurchases = true
        let play = LocalGooglePlay(configuration: configuration, clock: StoreClock(start: Date(), scale: 0))
        var tokens: [String] = []
        tokens.append(try await play.buy("coins_60", obfuscatedAccountId: "acct-1", quantity: 3))
        tokens.append(try await play.buy("coins_300", obfuscatedAccountId: nil, quantity: 1, pending: true))
        tokens.append(try await play.buy("remove_ads", obfuscatedAccountId: "acct-2", quantity: 1))
        try await play.acknowledge(productId: "remove_ads", token: tokens[2])
        let consumed = try await play.buy("coins_60", obfuscatedAccountId: "acct-3", quantity: 2)
        try await play.consume(productId: "coins_60", token: consumed)
        tokens.append(consumed)
        let refunded = try await play.buy("coins_60", obfuscatedAccountId: "acct-4", quantity: 5)
        try await play.refund(refunded, quantity: 4)
        tokens.append(refunded)
        var checked = 0
        for token in tokens {
            let resource = try #require(await play.productPurchaseV2(token))
            let bytes = Array(try JSONEncoder().encode(resource))
            #expect(try ProductPurchaseV2.decode(json: bytes) == resource)
            for mutated in try StripeFastDecodingTests.mutations(bytes) {
                let fast = try? ProductPurchaseV2.decode(json: mutated)
                let foundation = try? JSONDecoder().decode(ProductPurchaseV2.self, from: Data(mutated))
                #expect(fast == foundation)
                checked += 1
            }
        }
        #expect(checked > 100)
    }
}
