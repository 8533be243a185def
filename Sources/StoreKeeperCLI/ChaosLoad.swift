import AsyncHTTPClient
import Foundation
import LocalAppStore
import LocalGooglePlay
import NIOCore
import NIOHTTP1
import StoreKeeperSimulator
import Synchronization

/// A chaos run's traffic: customers paying for coins (order → pay at Apple → submit, retried
/// as StoreKeeperKit retries), Android customers paying at Google Play (order → buy with the
/// order's token → submit the purchase token, retried), subscribers renewing on Apple's clock
/// (a day per half second), one subscriber's billing failing, refunds, and the backend spending
/// coins.
final class ChaosLoad: Sendable {
    let balancer: String
    let key: String
    let store: LocalAppStore
    let play: LocalGooglePlay
    let run: Int
    let seconds: Double
    let seed: UInt64

    struct State {
        /// Apple ID → the app account it buys for.
        var owners: [String: String] = [:]
        /// Paid at Apple, with what the app needs to submit it again.
        var paid: [String: (account: String, orderId: String?, jws: String)] = [:]
        var acknowledged: Set<String> = []
        var acknowledgedDebits: Set<String> = []
        var creditedAccounts: [String] = []
        /// Transactions a customer asked Apple to refund (each once: a second request would be a
        /// second CONSUMPTION_REQUEST, rightly answered a second time).
        var refundRequested: Set<String> = []
        /// Accounts whose customer consented to sharing consumption data (recorded through
        /// `PUT /v1/accounts/{id}/consent` before the refund request): only their requests are
        /// answered — Apple's rule since Consumption Information V2.
        var consented: Set<String> = []
        /// Google Play purchase tokens paid, with the account their order is for.
        var googlePaid: [String: String] = [:]
        /// Accounts whose customer never consents.
        var declined: Set<String> = []
    }
    let state = Mutex(State())

    init(
        balancer: String, key: String, store: LocalAppStore, play: LocalGooglePlay, run: Int, seconds: Double,
        seed: UInt64
    ) {
        self.balancer = balancer
        self.key = key
        self.store = store
        self.play = play
        self.run = run
        self.seconds = seconds
        self.seed = seed
    }

    func appleIds() -> [String] { state.withLock { Array($0.owners.keys) } }
    func googlePaid() -> [String: String] { state.withLock { $0.googlePaid } }
    func account(ofAppleId appleId: String) -> String? { state.withLock { $0.owners[appleId] } }
    func acknowledgedDebits() -> [String] { state.withLock { Array($0.acknowledgedDebits) } }
    /// The account a paid transaction was bought for, and whether its customer consented.
    func consent(ofTransaction id: String) -> (account: String, consented: Bool)? {
        state.withLock { state in
            state.paid[id].map { ($0.account, state.consented.contains($0.account)) }
        }
    }

    // MARK: HTTP

    struct Reply {
        var status: Int
        var json: [String: Any]
    }

    func call(_ method: HTTPMethod, _ path: String, _ body: [String: Any]) async -> Reply {
        var request = HTTPClientRequest(url: balancer + path)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(key)")
        request.headers.add(name: "Content-Type", value: "application/json")
        guard let data = try? JSONSerialization.data(withJSONObject: body) else { return Reply(status: 0, json: [:]) }
        request.body = .bytes(ByteBuffer(bytes: data))
        do {
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(15))
            let bytes = try await response.body.collect(upTo: 1 << 20)
            let json = (try? JSONSerialization.jsonObject(with: Data(buffer: bytes))) as? [String: Any] ?? [:]
            return Reply(status: Int(response.status.code), json: json)
        } catch {
            return Reply(status: 0, json: [:])
        }
    }

    /// Retries what an unavailable server (503, a dropped connection, a 502 from nginx while an
    /// instance restarts) did not answer, until `deadline`.
    func retrying(
        _ method: HTTPMethod, _ path: String, _ body: [String: Any], deadline: ContinuousClock.Instant
    ) async -> Reply {
        var reply = Reply(status: 0, json: [:])
        repeat {
            reply = await call(method, path, body)
            if reply.status != 0 && reply.status < 500 && reply.status != 429 { return reply }
            try? await Task.sleep(for: .milliseconds(200))
        } while ContinuousClock.now < deadline
        return reply
    }

    // MARK: Load

    func run() async {
        let end = ContinuousClock.now + .seconds(seconds)
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<4 { group.addTask { await self.buyCoins(worker: worker, until: end) } }
            for worker in 0..<2 { group.addTask { await self.buyOnAndroid(worker: worker, until: end) } }
            group.addTask { await self.subscribe(until: end) }
            group.addTask { await self.driveClock(until: end) }
            for worker in 0..<2 { group.addTask { await self.spend(worker: worker, until: end) } }
        }
    }

    func buyCoins(worker: Int, until end: ContinuousClock.Instant) async {
        var count = 0
        while ContinuousClock.now < end {
            count += 1
            let account = "r\(run)-player-\((worker * 7 + count) % 12)"
            await purchase(
                appleId: "r\(run)-buyer-\(worker)-\(count)", account: account, product: "coins_60", until: end)
        }
    }

    /// Order, pay, submit: what StoreKeeperKit does for one purchase. A submission not
    /// acknowledged by `end` is left for `resubmitUnacknowledged` (the next launch).
    func purchase(appleId: String, account: String, product: String, until end: ContinuousClock.Instant) async {
        let order = await retrying(
            .POST, "/v1/orders", ["accountId": account, "productId": product, "appId": "ios"], deadline: end)
        guard order.status == 201, let orderId = order.json["orderId"] as? String,
            let token = (order.json["appAccountToken"] as? String).flatMap(UUID.init(uuidString:))
        else { return }
        state.withLock { $0.owners[appleId] = account }
        guard
            let paid = try? await store.buy(
                appleId, items: [.init(productId: product)], appAccountToken: token),
            let jws = paid.signedTransactions.first, let id = paid.transactions.first?.transactionId
        else { return }
        state.withLock { $0.paid[id] = (account, orderId, jws) }
        await submit(id, deadline: end)
    }

    /// Android: an order for the app `android`, bought at Google Play with the order's token as
    /// the obfuscated account id, its purchase token submitted (what docs/android-integration.md
    /// tells a Kotlin app to do).
    func buyOnAndroid(worker: Int, until end: ContinuousClock.Instant) async {
        var count = 0
        while ContinuousClock.now < end {
            count += 1
            let account = "r\(run)-player-\((worker * 5 + count) % 12)"
            let order = await retrying(
                .POST, "/v1/orders", ["accountId": account, "productId": "coins_60", "appId": "android"], deadline: end)
            guard order.status == 201, let orderId = order.json["orderId"] as? String,
                let token = order.json["appAccountToken"] as? String,
                let purchaseToken = try? await play.buy("coins_60", obfuscatedAccountId: token)
            else {
                try? await Task.sleep(for: .milliseconds(100))
                continue
            }
            state.withLock { $0.googlePaid[purchaseToken] = account }
            await submitGoogle(purchaseToken, orderId: orderId, deadline: end)
        }
    }

    func submitGoogle(_ purchaseToken: String, orderId: String?, deadline: ContinuousClock.Instant) async {
        guard let account = state.withLock({ $0.googlePaid[purchaseToken] }) else { return }
        var body: [String: Any] = [
            "store": "google_play", "appId": "android", "accountId": account, "productId": "coins_60",
            "purchaseToken": purchaseToken,
        ]
        if let orderId { body["orderId"] = orderId }
        let reply = await retrying(.POST, "/v1/purchases", body, deadline: deadline)
        if reply.status == 200 { state.withLock { $0.creditedAccounts.append(account) } }
    }

    func submit(_ transactionId: String, deadline: ContinuousClock.Instant) async {
        guard let record = state.withLock({ $0.paid[transactionId] }) else { return }
        var body: [String: Any] = ["accountId": record.account, "signedTransaction": record.jws]
        if let orderId = record.orderId { body["orderId"] = orderId }
        let reply = await retrying(.POST, "/v1/purchases", body, deadline: deadline)
        if reply.status == 200 {
            state.withLock {
                $0.acknowledged.insert(transactionId)
                $0.creditedAccounts.append(record.account)
            }
        }
    }

    func resubmitUnacknowledged(deadline: ContinuousClock.Instant) async {
        let pending = state.withLock { state in state.paid.keys.filter { !state.acknowledged.contains($0) } }
        // Android apps submit what `queryPurchasesAsync` still returns at launch: every token.
        let google = Array(state.withLock { $0.googlePaid.keys })
        await withTaskGroup(of: Void.self) { group in
            for id in pending { group.addTask { await self.submit(id, deadline: deadline) } }
            for token in google { group.addTask { await self.submitGoogle(token, orderId: nil, deadline: deadline) } }
        }
    }

    /// Four subscribers at the start; one's card fails after a while, another turns auto-renew off.
    func subscribe(until end: ContinuousClock.Instant) async {
        for index in 0..<4 {
            await purchase(
                appleId: "r\(run)-subscriber-\(index)", account: "r\(run)-member-\(index)", product: "pro_weekly",
                until: end)
        }
        try? await Task.sleep(for: .seconds(seconds * 0.3))
        await store.setBillingFails("r\(run)-subscriber-0", true)
        try? await Task.sleep(for: .seconds(seconds * 0.2))
        let history = await store.history(of: "r\(run)-subscriber-1")
        if let original = history.first?.payload.originalTransactionId {
            try? await store.setAutoRenew(original, false)
        }
    }

    /// A day of Apple's time per half second (renewals, billing retries, notification retries);
    /// every 2.5 s a customer is refunded.
    func driveClock(until end: ContinuousClock.Instant) async {
        var tick = 0
        var random = SeededRandom(seed: seed)
        while ContinuousClock.now < end {
            try? await Task.sleep(for: .milliseconds(500))
            tick += 1
            await store.advance(by: 86_400)
            if tick % 5 == 0 {
                let candidates = state.withLock { Array($0.acknowledged).sorted() }
                if !candidates.isEmpty {
                    let id = candidates[random.below(candidates.count)]
                    try? await store.refund(id)
                }
            }
            // Every 1.5 s a customer asks Apple for a refund: Apple's CONSUMPTION_REQUEST, which
            // StoreKeeper answers from a job (Send Consumption Information).
            if tick % 3 == 1 {
                let candidates = state.withLock { state in
                    state.acknowledged.subtracting(state.refundRequested).sorted()
                }
                if !candidates.isEmpty {
                    let id = candidates[random.below(candidates.count)]
                    // Half the customers consented in the app, decided once per account before
                    // its first request (recorded before they ask Apple; a consent the server
                    // did not confirm is not asked with).
                    let consents = random.below(2) == 0
                    if let account = state.withLock({ $0.paid[id]?.account }),
                        state.withLock({ !$0.consented.contains(account) && !$0.declined.contains(account) })
                    {
                        if consents {
                            let reply = await retrying(
                                .PUT, "/v1/accounts/\(account)/consent", ["consumptionData": true], deadline: end)
                            guard reply.status == 200 else { continue }
                            state.withLock { _ = $0.consented.insert(account) }
                        } else {
                            state.withLock { _ = $0.declined.insert(account) }
                        }
                    }
                    state.withLock { _ = $0.refundRequested.insert(id) }
                    try? await store.requestRefund(id)
                }
            }
        }
    }

    /// The backend spends coins an account has been credited, retrying with the same
    /// idempotency key until it gets an answer.
    func spend(worker: Int, until end: ContinuousClock.Instant) async {
        var count = 0
        while ContinuousClock.now < end {
            try? await Task.sleep(for: .milliseconds(150))
            guard let account = state.withLock({ $0.creditedAccounts.randomElement() }) else { continue }
            count += 1
            let key = "r\(run)-debit-\(worker)-\(count)"
            let reply = await retrying(
                .POST, "/v1/accounts/\(account)/balances/coins/debit", ["amount": 10, "idempotencyKey": key],
                deadline: end + .seconds(60))
            if reply.status == 200 { state.withLock { _ = $0.acknowledgedDebits.insert(key) } }
        }
    }
}
