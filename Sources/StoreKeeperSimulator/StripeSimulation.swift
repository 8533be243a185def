import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// `storekeeper simulate --store stripe`: web checkouts against a server whose local Stripe
/// stands in for Stripe — buyers paying by card, by a delayed method that settles (or fails)
/// later, declined and paying again, closing the tab before the success page; Stripe's
/// webhooks duplicated and reordered, its API failing while the server reads it, and the server
/// unreachable for hours of Stripe's clock while subscriptions renew. Afterwards every paid
/// checkout must be delivered exactly once, to its buyer.
public struct StripeSimulation: Sendable {
    public struct Options: Sendable {
        public var server: URL
        public var key: String
        public var appId = "stripe"
        public var buyers = 10
        public var purchases = 100
        public var asyncRate = 0.1
        public var declineRate = 0.1
        /// Share of the server's reads of Stripe that fail (Stripe's API down).
        public var apiFailureRate = 0.1
        public var seed: UInt64 = 1
        public var settleSeconds = 300.0
        /// Hours of Stripe's clock the server is unreachable after the purchases (webhooks
        /// held; subscriptions renew meanwhile); 0: none.
        public var outageHours = 6.0

        public init(server: URL, key: String) {
            self.server = server
            self.key = key
        }
    }

    public struct Report: Codable, Sendable {
        public var store = "stripe"
        public var purchases: Int
        public var paid: Int
        public var declined: Int
        public var asyncFailed: Int
        public var delivered: Int
        public var lost: Int
        public var doubled: Int
        public var webhooksDuplicated: Bool
        public var webhooksReversed: Bool
        public var apiFailures: Int
        public var outageHours: Double
        public var settled: Bool
        public var secondsToSettle: Double
        public var seed: UInt64

        public var clean: Bool { lost == 0 && doubled == 0 && settled }
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    let options: Options
    let http = HTTPClient.shared

    public init(options: Options) { self.options = options }

    struct Reply {
        var status: Int
        var json: [String: Any]
    }

    func call(_ method: HTTPMethod, _ path: String, _ body: [String: Any]? = nil) async throws -> Reply {
        var request = HTTPClientRequest(url: options.server.absoluteString + path)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(options.key)")
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: body)))
        }
        let response = try await http.execute(request, timeout: .seconds(30))
        let data = try await response.body.collect(upTo: 16 << 20)
        let json = (try? JSONSerialization.jsonObject(with: Data(buffer: data))) as? [String: Any] ?? [:]
        return Reply(status: Int(response.status.code), json: json)
    }

    public func run(progress: @escaping @Sendable (String) -> Void = { _ in }) async throws -> Report {
        var random = SeededRandom(seed: options.seed)
        let control = "/local-stripe/control"
        guard (try? await call(.GET, "\(control)/events"))?.status == 200 else {
            throw Failure(
                description: "no local Stripe at \(options.server)\(control) (demo mode or localStripe.enabled)")
        }
        let run = "ssim\(options.seed)-\(UInt32.random(in: 0..<UInt32.max))"
        let buyers = (0..<options.buyers).map { "\(run)-\($0)" }
        // Stripe at its worst: every event twice, each pass newest first.
        _ = try await call(.POST, "\(control)/webhooks", ["duplicate": true, "reverse": true, "hold": false])
        var expected: [String: Int] = [:]
        var subscribers: Set<String> = []
        var paid = 0
        var declined = 0
        var asyncFailed = 0
        var apiFailures = 0
        var settleLater: [(session: String, succeeds: Bool, account: String, coins: Int)] = []
        for index in 0..<options.purchases {
            let account = buyers[random.below(buyers.count)]
            let subscription = index % 10 == 9
            let product = subscription ? "pro_monthly" : "coins_60"
            let opened = try await call(
                .POST, "/v1/orders", ["accountId": account, "productId": product, "appId": options.appId])
            guard opened.status == 201,
                let session = (opened.json["checkout"] as? [String: Any])?["sessionId"] as? String
            else { throw Failure(description: "POST /v1/orders answered \(opened.status) \(opened.json)") }
            // Stripe's API fails for some of the server's reads of this purchase's events.
            if random.unit() < options.apiFailureRate {
                apiFailures += 1
                _ = try await call(.POST, "\(control)/faults", ["count": 2, "status": 503])
            }
            if random.unit() < options.declineRate {
                declined += 1
                let refused = try await call(.POST, "\(control)/sessions/\(session)/pay", ["outcome": "declined"])
                guard refused.status == 402 else {
                    throw Failure(description: "a declined card answered \(refused.status)")
                }
                // The buyer tries another card on the same page.
            }
            let delayed = !subscription && random.unit() < options.asyncRate
            let outcome = delayed ? "async" : "paid"
            let pay = try await call(.POST, "\(control)/sessions/\(session)/pay", ["outcome": outcome])
            guard pay.status == 200 else { throw Failure(description: "paying answered \(pay.status) \(pay.json)") }
            if delayed {
                let succeeds = random.unit() < 0.7
                settleLater.append((session, succeeds, account, 60))
                if !succeeds { asyncFailed += 1 }
            } else {
                paid += 1
                if subscription { subscribers.insert(account) } else { expected[account, default: 0] += 60 }
            }
            if index % 25 == 24 { progress("\(index + 1) checkouts paid") }
        }
        for later in settleLater {
            _ = try await call(
                .POST, "\(control)/sessions/\(later.session)/settle",
                ["succeeds": later.succeeds, "succeeded": later.succeeds])
            if later.succeeds {
                paid += 1
                expected[later.account, default: 0] += later.coins
            }
        }
        if options.outageHours > 0 {
            // The server unreachable: Stripe holds its webhooks while its clock runs (renewals).
            _ = try await call(.POST, "\(control)/webhooks", ["hold": true])
            _ = try await call(.POST, "\(control)/advance", ["seconds": Int(options.outageHours * 3600)])
            progress("server unreachable for \(options.outageHours) h of Stripe's clock")
            _ = try await call(.POST, "\(control)/webhooks", ["hold": false])
        }
        _ = try await call(.POST, "\(control)/faults", ["count": 0])
        let started = Date()
        var delivered = 0
        var lost = 0
        var doubled = 0
        var settled = false
        while Date().timeIntervalSince(started) < options.settleSeconds {
            delivered = 0
            lost = 0
            doubled = 0
            for account in buyers {
                let view = try await call(.GET, "/v1/accounts/\(account)").json
                let coins = (view["balances"] as? [String: Int])?["coins"] ?? 0
                let want = expected[account] ?? 0
                delivered += min(coins, want) / 60
                if coins < want { lost += (want - coins) / 60 }
                if coins > want { doubled += (coins - want) / 60 }
                let entitled = (view["entitlements"] as? [[String: Any]] ?? []).contains {
                    $0["id"] as? String == "pro"
                }
                if subscribers.contains(account) {
                    if entitled { delivered += 1 } else { lost += 1 }
                }
            }
            if lost == 0 && doubled == 0 {
                settled = true
                break
            }
            try await Task.sleep(for: .seconds(1))
        }
        return Report(
            purchases: options.purchases, paid: paid, declined: declined, asyncFailed: asyncFailed,
            delivered: delivered, lost: lost, doubled: doubled, webhooksDuplicated: true, webhooksReversed: true,
            apiFailures: apiFailures, outageHours: options.outageHours, settled: settled,
            secondsToSettle: settled ? Date().timeIntervalSince(started).rounded() : options.settleSeconds,
            seed: options.seed)
    }
}
