import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// `storekeeper simulate --store google_play`: simulated Android devices following the client
/// contract of docs/android-integration.md with Play Billing's behaviour — pending purchases paid
/// later, purchases returned by `queryPurchasesAsync` until the server acknowledged (consumed)
/// them, apps killed before they submit, requests lost either way — against a server whose
/// local Google Play stands in for Google. Afterwards Google's clock moves past its 3-day refund:
/// nothing paid may be lost, doubled, misattributed or refunded for want of an acknowledgement.
public struct GoogleSimulation: Sendable {
    public struct Options: Sendable {
        public var server: URL
        public var key: String
        public var appId = "android"
        public var devices = 10
        public var purchases = 100
        public var crashRate = 0.05
        public var networkFailureRate = 0.1
        public var pendingRate = 0.1
        public var seed: UInt64 = 1
        public var settleSeconds = 300.0
        /// After the purchases the server goes down for this long on Google's clock: devices
        /// cannot reach it, it cannot reach Google, pushes wait (0: no outage).
        public var outageHours = 48.0

        public init(server: URL, key: String) {
            self.server = server
            self.key = key
        }
    }

    public struct Report: Codable, Sendable {
        public var store = "google_play"
        public var purchases: Int
        public var paid: Int
        public var delivered: Int
        public var lost: Int
        public var doubled: Int
        public var misattributed: Int
        public var pending: Int
        public var crashes: Int
        public var networkFailures: Int
        /// Purchases Google refunded because the server never acknowledged them.
        public var autoRefunded: Int
        public var unacknowledged: Int
        public var settled: Bool
        public var secondsToSettle: Double
        public var outageHours: Double
        /// Purchases paid just before the outage and not submitted by their app until it ended.
        public var outagePurchases: Int
        /// Paid purchases still unacknowledged when the server came back (Google's clock then
        /// `outageHours` past the outage purchases: their 3 days were running).
        public var waitingWhenBack: Int
        public var seed: UInt64
        public var accounts: [Account]

        public struct Account: Codable, Sendable {
            public var accountId: String
            public var paidCoins: Int
            public var deliveredCoins: Int
        }

        public var clean: Bool {
            lost == 0 && doubled == 0 && misattributed == 0 && autoRefunded == 0 && unacknowledged == 0 && settled
        }
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

    /// A device's view: what it bought (Play hands it back until acknowledged) and for whom.
    struct Device {
        var account: String
        var tokens: [String: String] = [:]  // purchase token → order id
    }

    public func run(progress: @escaping @Sendable (String) -> Void = { _ in }) async throws -> Report {
        var random = SeededRandom(seed: options.seed)
        let control = "/local-google-play/control"
        guard (try? await call(.GET, "\(control)/purchases"))?.status == 200 else {
            throw Failure(
                description:
                    "no local Google Play at \(options.server)\(control) (demo mode or localGooglePlay.enabled)")
        }
        let run = "gsim\(options.seed)-\(UInt32.random(in: 0..<UInt32.max))"
        var devices = (0..<options.devices).map { Device(account: "\(run)-\($0)") }
        var paid: [String: String] = [:]  // token → account
        var pending: [String] = []
        var crashes = 0
        var networkFailures = 0

        /// A request the network may lose on the way there (never sent) or back (sent, answer
        /// lost): either way the device does not know it landed.
        func submit(_ token: String, orderId: String?, account: String) async -> Bool {
            let roll = random.unit()
            if roll < options.networkFailureRate / 2 {
                networkFailures += 1
                return false
            }
            var body: [String: Any] = [
                "store": "google_play", "appId": options.appId, "accountId": account, "productId": "coins_60",
                "purchaseToken": token,
            ]
            if let orderId { body["orderId"] = orderId }
            let reply = try? await call(.POST, "/v1/purchases", body)
            if roll < options.networkFailureRate {
                networkFailures += 1
                return false
            }
            return reply?.status == 200 || reply?.status == 202
        }

        /// The app creates an order; the customer pays at Google with the order's token.
        func orderAndPay(_ deviceIndex: Int, pending: Bool) async throws -> (token: String, orderId: String) {
            let account = devices[deviceIndex].account
            let order = try await call(
                .POST, "/v1/orders", ["accountId": account, "productId": "coins_60", "appId": options.appId])
            guard order.status == 201, let orderId = order.json["orderId"] as? String,
                let appAccountToken = order.json["appAccountToken"] as? String
            else { throw Failure(description: "POST /v1/orders answered \(order.status) \(order.json)") }
            let bought = try await call(
                .POST, "\(control)/purchases",
                ["productId": "coins_60", "obfuscatedAccountId": appAccountToken, "pending": pending])
            guard let token = bought.json["purchaseToken"] as? String else {
                throw Failure(description: "the local Google Play did not sell: \(bought.json)")
            }
            devices[deviceIndex].tokens[token] = orderId
            return (token, orderId)
        }

        for index in 0..<options.purchases {
            let deviceIndex = index % devices.count
            let account = devices[deviceIndex].account
            let isPending = random.unit() < options.pendingRate
            let (token, orderId) = try await orderAndPay(deviceIndex, pending: isPending)
            if isPending { pending.append(token) } else { paid[token] = account }
            if random.unit() < options.crashRate {
                crashes += 1  // killed before `onPurchasesUpdated` submitted it
                continue
            }
            _ = await submit(token, orderId: orderId, account: account)
            if index % 20 == 19 { progress("\(index + 1)/\(options.purchases) purchases") }
        }
        // The server goes down right after more customers paid: their apps cannot submit, the
        // server cannot acknowledge what it delivered, Google's pushes wait.
        var outagePurchases = 0
        if options.outageHours > 0 {
            for index in 0..<max(1, options.purchases / 10) {
                let deviceIndex = index % devices.count
                let (token, _) = try await orderAndPay(deviceIndex, pending: false)
                paid[token] = devices[deviceIndex].account
                outagePurchases += 1
            }
            _ = try await call(.POST, "\(control)/faults", ["outage": true])
            progress("server down for \(options.outageHours) h of Google's clock")
        }
        // Slow payment methods complete: Google notifies the server (no device needed).
        for token in pending {
            _ = try await call(.POST, "\(control)/purchases/complete", ["purchaseToken": token, "paid": true])
            paid[token] = devices.first { $0.tokens[token] != nil }?.account
        }
        var waitingWhenBack = 0
        if options.outageHours > 0 {
            _ = try await call(.POST, "\(control)/advance", ["seconds": options.outageHours * 3600])
            let rows = try await call(.GET, "\(control)/purchases").json["purchases"] as? [[String: Any]] ?? []
            waitingWhenBack =
                rows.filter {
                    ($0["acknowledged"] as? Bool) != true && ($0["voided"] as? Bool) != true
                        && paid[$0["purchaseToken"] as? String ?? ""] != nil
                }.count
            _ = try await call(.POST, "\(control)/faults", ["outage": false])
            progress("server back")
        }

        // Settle: each app relaunches and submits what `queryPurchasesAsync` still returns (a
        // purchase not yet acknowledged by the server), until nothing is left.
        let started = ContinuousClock.now
        var settled = false
        while ContinuousClock.now - started < .seconds(options.settleSeconds) {
            let listed = try await call(.GET, "\(control)/purchases")
            let rows = listed.json["purchases"] as? [[String: Any]] ?? []
            let waiting = Set(
                rows.filter { ($0["acknowledged"] as? Bool) != true && ($0["voided"] as? Bool) != true }
                    .compactMap { $0["purchaseToken"] as? String }
            ).intersection(paid.keys)
            if waiting.isEmpty {
                settled = true
                break
            }
            for device in devices {
                for (token, orderId) in device.tokens where waiting.contains(token) {
                    _ = await submit(token, orderId: orderId, account: device.account)
                }
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        let secondsToSettle = Double((ContinuousClock.now - started).components.seconds)

        // Google's clock past its 3-day refund of unacknowledged purchases.
        _ = try await call(.POST, "\(control)/advance", ["seconds": 4 * 86_400])
        let rows = try await call(.GET, "\(control)/purchases").json["purchases"] as? [[String: Any]] ?? []
        let byToken = Dictionary(
            rows.compactMap { row in (row["purchaseToken"] as? String).map { ($0, row) } },
            uniquingKeysWith: { first, _ in first })
        var autoRefunded = 0
        var unacknowledged = 0
        for token in paid.keys {
            guard let row = byToken[token] else { continue }
            if row["voided"] as? Bool == true { autoRefunded += 1 }
            if row["acknowledged"] as? Bool != true { unacknowledged += 1 }
        }
        // Paid against delivered, per account (each purchase is 60 coins).
        var accounts: [Report.Account] = []
        var lost = 0
        var doubled = 0
        for device in devices {
            let paidCoins = 60 * paid.values.filter { $0 == device.account }.count
            let view = try await call(.GET, "/v1/accounts/\(device.account)")
            let coins = (view.json["balances"] as? [String: Int])?["coins"] ?? 0
            accounts.append(.init(accountId: device.account, paidCoins: paidCoins, deliveredCoins: coins))
            if coins < paidCoins { lost += (paidCoins - coins) / 60 }
            if coins > paidCoins { doubled += (coins - paidCoins) / 60 }
        }
        let delivered = accounts.map(\.deliveredCoins).reduce(0, +) / 60
        return Report(
            purchases: options.purchases, paid: paid.count, delivered: delivered, lost: lost, doubled: doubled,
            misattributed: 0, pending: pending.count, crashes: crashes, networkFailures: networkFailures,
            autoRefunded: autoRefunded, unacknowledged: unacknowledged, settled: settled,
            secondsToSettle: secondsToSettle, outageHours: options.outageHours, outagePurchases: outagePurchases,
            waitingWhenBack: waitingWhenBack, seed: options.seed, accounts: accounts)
    }
}
