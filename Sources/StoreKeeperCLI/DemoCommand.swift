import AppStoreModels
import AppStoreSigning
import ArgumentParser
import AsyncHTTPClient
import Foundation
import LocalAppStore
import LocalGooglePlay
import NIOCore
import NIOHTTP1
import SQLKit
import StoreKeeperKitCore
import StoreKeeperServer
import StoreKeeperSimulator
import StoreKeeperStorage
import Synchronization

/// `storekeeper demo`: the story of the seed write-ups, run for real — the server on a
/// temporary SQLite database, the local App Store, and simulated devices running the real
/// StoreKeeperKit core — on the local App Store's accelerated clock. One line per step, a
/// summary table, exit status 1 when an invariant broke.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run the whole system through the failures it exists for, on a temporary database.",
        discussion: """
            A purchase; a double tap; the app killed between payment and upload; a merged 6 + 30 \
            payment; Apple down for a while (202, then delivered by the job queue); App Review's \
            sandbox purchase against a production configuration; a forged receipt and forged JWS; \
            one Apple ID shared by two app accounts; a subscription renewing, failing billing, \
            recovering, upgraded and refunded; then devices buying in bulk through crashes and \
            network failures. Every step checks its outcome; at the end every paid transaction must \
            be delivered exactly once and every balance must equal its ledger. Exit status: 0 every \
            invariant held, 1 one broke, 64 invalid options. With --keep the server keeps running \
            on the data (the dashboard URL and key are printed) until Ctrl-C.
            """)

    @Flag(name: .long, help: "Leave the server running on the demo's data afterwards (Ctrl-C stops it).")
    var keep = false
    @Option(name: .long, help: "Port for the server (default: a free one).") var port: Int?
    @Option(name: .long, help: "Purchases in the bulk part (default 120; 0 skips it).") var purchases: Int = 120
    @Option(name: .long, help: "Random seed of the bulk part and the history: the same seed, the same purchases.")
    var seed: UInt64 = 1
    @Option(
        name: .customLong("history-months"),
        help: "With --keep: months of history behind the story, for the dashboard's charts (default 6; 0 skips it).")
    var historyMonths: Int = 6
    @Flag(name: .long, help: "No spinner or progress bar (the default when output is not a terminal).")
    var plain = false

    func validate() throws {
        if let port, !(1...65_535).contains(port) { throw ValidationError("--port must be 1…65535") }
        guard (0...100_000).contains(purchases) else { throw ValidationError("--purchases must be 0…100000") }
        guard (0...24).contains(historyMonths) else { throw ValidationError("--history-months must be 0…24") }
    }

    func run() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "storekeeper-demo-\(UUID().uuidString.prefix(8).lowercased())")
        let port = try self.port ?? FreePort.pick()
        let server = try await PurchaseBench.Server.start(
            databaseURL: "sqlite:\(directory.path)/demo.sqlite", port: port, directory: directory
        ) { configuration in
            // Demo mode: the local App Store is open and trusted, a development key is made.
            configuration.mode = .demo
            configuration.secretKeys = []
            // The demo's storefronts sell in these currencies: analytics convert them into USD
            // (illustrative rates; a deployment configures its own).
            if configuration.analyticsRates.isEmpty {
                configuration.analyticsRates = ["EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "BRL": 0.18, "INR": 0.012]
            }
        }
        let key = try String(contentsOf: directory.appendingPathComponent("dev-secret-key"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let live = LiveView(animated: !plain && isatty(STDOUT_FILENO) != 0)
        let story = DemoStory(
            app: server.app, store: server.store, base: "http://127.0.0.1:\(server.port)", key: key,
            directory: directory.appendingPathComponent("devices"), live: live)
        live.say("StoreKeeper demo — server http://127.0.0.1:\(server.port), data \(directory.path)")
        await story.run(bulkPurchases: purchases, seed: seed, historyMonths: keep ? historyMonths : 0)
        let summary = try await story.summary()
        live.say(summary.table)
        if keep {
            live.say(
                """

                The server keeps running on the demo's data:
                  dashboard  http://127.0.0.1:\(server.port)/dashboard   (sign in with the key below)
                  API        http://127.0.0.1:\(server.port)/v1/…   (Authorization: Bearer <key>)
                  key        \(key)
                  data       \(directory.path)
                Ctrl-C stops it.
                """)
            await Self.waitForInterrupt()
            await server.group.triggerGracefulShutdown()
            _ = try? await server.running.value
            try? await server.app.database.close()
        } else {
            await server.stop()
        }
        if !summary.clean { throw ExitCode(1) }
    }

    static func waitForInterrupt() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let once = Mutex(false)
            var sources: [any DispatchSourceSignal] = []
            for signalNumber in [SIGINT, SIGTERM] {
                signal(signalNumber, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
                source.setEventHandler {
                    if once.withLock({ done in
                        defer { done = true }
                        return !done
                    }) {
                        continuation.resume()
                    }
                }
                source.resume()
                sources.append(source)
            }
            // Kept alive by the handlers' queue for the life of the process.
            _ = Unmanaged.passRetained(sources as NSArray)
        }
    }
}

/// A step's expectation that did not hold.
struct DemoFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The story, step by step, against the running server (HTTP, as an app and its back end
/// would) and its in-process local App Store (as Apple, its customers and its clock).
final class DemoStory: @unchecked Sendable {  // run by one task at a time
    let app: StoreKeeperApp
    let store: LocalAppStore
    let base: String
    let key: String
    let directory: URL
    let live: LiveView
    let control: LocalStoreControl
    var failures: [String] = []
    var duplicatesSuppressed = 0
    var forgeriesRejected = 0
    /// Apple IDs whose every paid transaction must end up delivered exactly once.
    var appleIds: [String] = []
    var sandboxTransactions: [String] = []
    /// The subscription scenes' App Store: the same keys and notification URL, its clock starting
    /// 65 days ago and moved on by the scenes (a renewal a month later, billing a month after
    /// that), so they end a day ago, and the server's own local App Store stays on today's date
    /// for every other purchase of the story.
    let past: LocalAppStore
    let pastSender: NotificationSender
    var bulk: Simulation.Report?
    /// The local Google Play's purchase token of the two-store steps.
    var androidToken: String?

    init(app: StoreKeeperApp, store: LocalAppStore, base: String, key: String, directory: URL, live: LiveView) {
        self.app = app
        self.store = store
        self.base = base
        self.key = key
        self.directory = directory
        self.live = live
        self.control = LocalStoreControl(server: URL(string: base)!, key: key)
        self.past = LocalAppStore(
            configuration: store.configuration, pki: store.pki,
            clock: StoreClock(start: Date().addingTimeInterval(-65 * 86_400), scale: 0))
        self.pastSender = NotificationSender(store: past)
    }

    /// Moves the subscription scenes' store on and sends what its clock made due, as Apple would.
    func pastAdvance(days: Double) async {
        await past.advance(by: days * 86_400)
        await pastSender.deliverDue()
    }

    // MARK: HTTP as the app's back end

    struct Reply {
        var status: Int
        var json: [String: Any]
        var code: String? { (json["error"] as? [String: Any])?["code"] as? String }
    }

    func call(_ method: HTTPMethod, _ path: String, _ body: [String: Any]? = nil) async throws -> Reply {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(key)")
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: body)))
        }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let data = try await response.body.collect(upTo: 4 << 20)
        let json = (try? JSONSerialization.jsonObject(with: Data(buffer: data))) as? [String: Any] ?? [:]
        return Reply(status: Int(response.status.code), json: json)
    }

    func order(_ account: String, _ product: String) async throws -> (orderId: String, token: UUID) {
        let reply = try await call(.POST, "/v1/orders", ["accountId": account, "productId": product])
        guard reply.status == 201, let orderId = reply.json["orderId"] as? String,
            let token = (reply.json["appAccountToken"] as? String).flatMap(UUID.init(uuidString:))
        else { throw DemoFailure("POST /v1/orders answered \(reply.status) \(reply.json)") }
        return (orderId, token)
    }

    func account(_ id: String) async throws -> [String: Any] {
        let path = id.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? id
        return try await call(.GET, "/v1/accounts/\(path)").json
    }

    func balance(_ id: String) async throws -> Int {
        (try await account(id)["balances"] as? [String: Int])?["coins"] ?? 0
    }

    func expectBalance(_ id: String, _ amount: Int) async throws {
        let shown = try await balance(id)
        guard shown == amount else { throw DemoFailure("\(id) holds \(shown) coins, expected \(amount)") }
    }

    /// Polls `condition` every 200 ms for up to `seconds`.
    func eventually(_ what: String, seconds: Double = 60, _ condition: () async throws -> Bool) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(200))
        }
        throw DemoFailure("\(what) did not happen within \(Int(seconds)) s")
    }

    func subscription(_ account: String) async throws -> [String: Any]? {
        (try await self.account(account)["subscriptions"] as? [[String: Any]])?.first
    }

    /// The iOS app's id on the server (`apps[].id`): the demo serves an Android app too, so the
    /// devices name theirs, as a production app must.
    var appStoreAppId: String { app.configuration.appStoreAppId ?? app.configuration.bundleId ?? "app_store" }

    /// The server's answer-signing keys (the demo generates one): the devices check every answer.
    var signingKeys: [ResponseSigningKey] {
        app.responseSigningPublicKeys.compactMap { try? ResponseSigningKey($0) }
    }

    func device(_ appleId: String, _ account: String, faults: DeviceFaults = .none) -> SimulatedDevice {
        appleIds.append(appleId)
        return SimulatedDevice(
            appleId: appleId, accountId: account, server: URL(string: base)!, key: key, directory: directory,
            seed: UInt64(appleIds.count), faults: faults, appId: appStoreAppId, responseSigningKeys: signingKeys)
    }

    // MARK: The story

    func run(bulkPurchases: Int, seed: UInt64, historyMonths: Int = 0) async {
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let steps: [(String, () async throws -> String)] = [
            ("A purchase", purchase), ("A double tap", doubleTap),
            ("The app killed between payment and upload", killedBeforeUpload),
            ("A merged 6 + 30 payment", mergedPayment), ("Apple down for a while", appleDown),
            ("App Review's sandbox purchase, production configuration", appReview),
            ("A forged receipt and forged JWS", forgeries), ("One Apple ID, two app accounts", sharedAppleId),
            ("Subscription: bought, then renewed a month later", subscribe),
            ("Subscription: billing fails (grace period)", billingFails),
            ("Subscription: billing recovers", billingRecovers), ("Subscription: upgraded", upgrade),
            ("Subscription: refunded", refund),
            ("A partial refund: Apple gives back 50 % of 60 coins", partialRefund),
            ("An offer code redeemed on the App Store, claimed later", offerCodeClaimedLater),
            ("Coins bought on Android, spent on iOS", androidCoinsSpentOnIOS),
            ("The iOS subscription, seen by the Android app", subscriptionSeenOnAndroid),
            ("Google refunds the Android coins", googleRefund),
            ("Google down when the server acknowledges: the sweeper saves the purchase", acknowledgementSweeper),
            // The coins first: the paywall's renewal moves Stripe's test clock a month on.
            ("Coins bought on the web, refunded from Stripe", webCoinsRefunded),
            ("A web paywall paid through Stripe, redeemed in the app, renewed", webPaywallRedeemedInTheApp),
            (
                "\(bulkPurchases) purchases on 6 StoreKit 1 and 2 devices, through crashes and network failures",
                {
                    try await self.bulk(purchases: bulkPurchases, seed: seed)
                }
            ),
        ]
        var shown = bulkPurchases > 0 ? steps : Array(steps.dropLast())
        if historyMonths > 0 {
            shown.append(
                (
                    "\(historyMonths) months of history for the dashboard's charts (--keep)",
                    { try await self.history(months: historyMonths, seed: seed) }
                ))
        }
        for (index, (title, body)) in shown.enumerated() {
            if let failure = await live.step(index + 1, shown.count, title, body) { failures.append(failure) }
        }
    }

    func purchase() async throws -> String {
        let phone = device("demo-apple-1", "player-1")
        try await phone.launch()
        guard case .success = try await phone.purchase(productId: "coins_60") else {
            throw DemoFailure("the purchase did not complete")
        }
        await phone.stop()
        try await expectBalance("player-1", 60)
        return "order → paid at the App Store → proof verified → 60 coins delivered"
    }

    func doubleTap() async throws -> String {
        var faults = DeviceFaults.none
        faults.doubleTap = 1
        let phone = device("demo-apple-2", "player-2", faults: faults)
        try await phone.launch()
        try await phone.buy(productId: "coins_60", quantity: 1)
        guard try await phone.settle(deadline: Date().addingTimeInterval(60)) else { throw DemoFailure("not settled") }
        await phone.stop()
        let paid = await store.paidRecord(for: "demo-apple-2").transactions.count
        guard paid == 1, await phone.doubleCharges == 0 else { throw DemoFailure("\(paid) payments for two taps") }
        try await expectBalance("player-2", 60)
        duplicatesSuppressed += 1
        return "two taps, one payment, 60 coins once"
    }

    func killedBeforeUpload() async throws -> String {
        let phone = device("demo-apple-3", "player-3")
        try await phone.launch()
        // The app made the order and the payment went through; it was killed before the upload.
        let (orderId, token) = try await order("player-3", "coins_300")
        let payment = try await control.pay(
            appleId: "demo-apple-3", items: [("coins_300", 1)], appAccountToken: token, askToBuy: false)
        await phone.adoptUnfinished(payment)
        try await expectBalance("player-3", 0)
        try await phone.restart()
        guard try await phone.settle(deadline: Date().addingTimeInterval(60)) else { throw DemoFailure("not settled") }
        await phone.stop()
        try await expectBalance("player-3", 300)
        let status = try await call(.GET, "/v1/orders/\(orderId)").json["status"] as? String
        guard status == "delivered" else { throw DemoFailure("order \(orderId) is \(status ?? "?")") }
        return "relaunched, StoreKit's unfinished transaction swept up: 300 coins, order delivered"
    }

    func mergedPayment() async throws -> String {
        appleIds.append("demo-apple-4")
        let (orderId, token) = try await order("player-4", "coins_60")
        let payment = try await control.pay(
            appleId: "demo-apple-4", items: [("coins_60", 1), ("coins_300", 1)], appAccountToken: token,
            askToBuy: false)
        let body: [String: Any] = ["accountId": "player-4", "orderId": orderId, "receipt": payment.receipt]
        let first = try await call(.POST, "/v1/purchases", body)
        guard first.status == 200 else { throw DemoFailure("receipt answered \(first.status) \(first.json)") }
        let again = try await call(.POST, "/v1/purchases", body)
        guard again.json["status"] as? String == "already_delivered" else {
            throw DemoFailure("the same receipt again answered \(again.json["status"] ?? again.status)")
        }
        duplicatesSuppressed += 1
        try await expectBalance("player-4", 360)
        return "one payment, one receipt, two transactions: 360 coins; the receipt again → already_delivered"
    }

    func appleDown() async throws -> String {
        appleIds.append("demo-apple-5")
        // Apple is down: its Server API answers 503 and the payment's notification does not
        // arrive (Apple retries it later), so only the app's submission can deliver it.
        var faults = Faults()
        faults.endpoints["transactionInfo"] = .init(status: 503)
        faults.dropNotifications = 1
        await store.setFaults(faults)
        let (orderId, token) = try await order("player-5", "coins_60")
        let payment = try await control.pay(
            appleId: "demo-apple-5", items: [("coins_60", 1)], appAccountToken: token, askToBuy: false)
        let reply = try await call(
            .POST, "/v1/purchases",
            ["accountId": "player-5", "orderId": orderId, "transactionId": payment.transactions[0].transactionId])
        guard reply.status == 202 else {
            await store.setFaults(Faults())
            throw DemoFailure("with Apple down the submission answered \(reply.status), expected 202")
        }
        try await Task.sleep(for: .seconds(3))
        await store.setFaults(Faults())
        try await eventually("the job queue's delivery") { try await self.balance("player-5") == 60 }
        return "202 while Apple answered 503; Apple back → the job queue delivered 60 coins"
    }

    func appReview() async throws -> String {
        var configuration = store.configuration
        configuration.environment = .sandbox
        configuration.notificationURL = nil
        let sandbox = LocalAppStore(configuration: configuration, pki: store.pki)
        let bought = try await sandbox.buy("app-review", items: [.init(productId: "remove_ads")])
        let reply = try await call(
            .POST, "/v1/purchases", ["accountId": "reviewer", "signedTransaction": bought.signedTransactions[0]])
        let environment = ((reply.json["transactions"] as? [[String: Any]])?.first)?["environment"] as? String
        guard reply.status == 200, environment == "Sandbox" else {
            throw DemoFailure("the Sandbox purchase answered \(reply.status) \(reply.json)")
        }
        sandboxTransactions.append(bought.transactions[0].transactionId ?? "")
        let revenue = try await call(.GET, "/v1/revenue").json
        guard (revenue["sandboxTransactions"] as? Int ?? 0) >= 1 else {
            throw DemoFailure("revenue does not set the Sandbox purchase apart: \(revenue)")
        }
        return
            "delivered (environment Sandbox): the default apple.environments of a production configuration take App Review's Sandbox purchases; kept out of revenue"
    }

    func forgeries() async throws -> String {
        // A jailbreak tool's own "Apple": a certificate chain nobody trusts.
        var configuration = store.configuration
        configuration.notificationURL = nil
        let fake = LocalAppStore(
            configuration: configuration, pki: try ApplePKI.generate(name: "Totally Apple Root CA"))
        let forged = try await fake.buy("cheater", items: [.init(productId: "coins_300")])
        var rejected: [String] = []
        let jws = try await call(
            .POST, "/v1/purchases", ["accountId": "cheater", "signedTransaction": forged.signedTransactions[0]])
        rejected.append("\(jws.status) \(jws.code ?? "?")")
        let receipt = try await call(
            .POST, "/v1/purchases", ["accountId": "cheater", "receipt": Data(forged.receipt).base64EncodedString()])
        rejected.append("\(receipt.status) \(receipt.code ?? "?")")
        // A genuine JWS with its payload edited (60 coins → 300), the signature kept.
        let genuine = try await store.buy("demo-apple-6", items: [.init(productId: "coins_60")])
        var payload = genuine.transactions[0]
        payload.productId = "coins_300"
        let edited = try JSONEncoder().encode(payload).base64URLEncoded()
        let parts = genuine.signedTransactions[0].split(separator: ".")
        let tampered = try await call(
            .POST, "/v1/purchases", ["accountId": "cheater", "signedTransaction": "\(parts[0]).\(edited).\(parts[2])"])
        rejected.append("\(tampered.status) \(tampered.code ?? "?")")
        guard [jws.status, receipt.status, tampered.status].allSatisfy({ $0 == 422 }) else {
            throw DemoFailure("not every forgery was refused: \(rejected)")
        }
        try await expectBalance("cheater", 0)
        forgeriesRejected += 3
        // The genuine one, delivered to its rightful buyer.
        let rightful = try await call(
            .POST, "/v1/purchases", ["accountId": "player-6", "signedTransaction": genuine.signedTransactions[0]])
        guard rightful.status == 200 else { throw DemoFailure("the genuine JWS answered \(rightful.status)") }
        appleIds.append("demo-apple-6")
        return "fake chain → \(rejected[0]), fake receipt → \(rejected[1]), edited JWS → \(rejected[2]); cheater has 0"
    }

    func sharedAppleId() async throws -> String {
        appleIds.append("family-ipad")
        let (orderId, token) = try await order("mom", "remove_ads")
        let payment = try await control.pay(
            appleId: "family-ipad", items: [("remove_ads", 1)], appAccountToken: token, askToBuy: false)
        let mom = try await call(
            .POST, "/v1/purchases",
            ["accountId": "mom", "orderId": orderId, "signedTransaction": payment.signedTransactions[0]])
        guard mom.status == 200 else { throw DemoFailure("mom's purchase answered \(mom.status)") }
        // The kid logs into their own app account on the same iPad and taps Restore.
        let kid = try await call(
            .POST, "/v1/purchases", ["accountId": "kid", "signedTransaction": payment.signedTransactions[0]])
        guard kid.status == 409, kid.code == "owned_by_other_account" else {
            throw DemoFailure("the restore on another account answered \(kid.status) \(kid.code ?? "")")
        }
        let open = try await call(.GET, "/v1/anomalies?status=open").json["anomalies"] as? [[String: Any]] ?? []
        guard let anomaly = open.first(where: { $0["kind"] as? String == "ownership_conflict" }),
            let id = anomaly["id"] as? String
        else { throw DemoFailure("no ownership_conflict anomaly") }
        let resolved = try await call(
            .POST, "/v1/anomalies/\(id)/resolve", ["action": "dismiss", "note": "same family, mom keeps it"])
        guard resolved.json["status"] as? String == "resolved" else { throw DemoFailure("not resolved") }
        return "mom keeps remove_ads; kid's restore → 409 + ownership_conflict anomaly, resolved by an operator"
    }

    var original = ""

    func partialRefund() async throws -> String {
        let phone = device("demo-apple-half", "half")
        try await phone.launch()
        guard case .success = try await phone.purchase(productId: "coins_60") else {
            throw DemoFailure("the purchase did not complete")
        }
        await phone.stop()
        try await expectBalance("half", 60)
        guard let id = await store.paidRecord(for: "demo-apple-half").transactions.last?.transactionId else {
            throw DemoFailure("no payment at the App Store")
        }
        try await store.refund(id, percentage: 50_000)
        try await eventually("the prorated REFUND applied") { try await self.balance("half") == 30 }
        // Apple retries: nothing more is taken.
        try await store.refund(id, percentage: 50_000)
        try await Task.sleep(for: .seconds(2))
        try await expectBalance("half", 30)
        return "REFUND_PRORATED 50 % → 30 coins taken back, once; the order is partially_refunded"
    }

    func offerCodeClaimedLater() async throws -> String {
        // Redeemed in the App Store app: no order, no token — held as unattributed.
        let redeemed = try await store.buy(
            "demo-apple-olive", items: [.init(productId: "coins_60")],
            offers: .init(offerCode: .init(code: "SPRING_COINS", price: 0.49)))
        guard let transaction = redeemed.transactions.first, let id = transaction.transactionId else {
            throw DemoFailure("no redemption")
        }
        try await Task.sleep(for: .seconds(1))
        // Later the app forwards the transaction for the signed-in account.
        let reply = try await call(
            .POST, "/v1/purchases", ["accountId": "olive", "signedTransaction": redeemed.signedTransactions[0]])
        guard reply.status == 200 else {
            throw DemoFailure("POST /v1/purchases answered \(reply.status) \(reply.json)")
        }
        try await expectBalance("olive", 60)
        try await eventually("Set App Account Token") {
            await self.store.transaction(id)?.payload.appAccountToken != nil
        }
        return "offer code SPRING_COINS (ONE_TIME, 0.49) → claimed by olive → 60 coins; Apple now holds olive's token"
    }

    func bulk(purchases: Int, seed: UInt64) async throws -> String {
        var options = Simulation.Options(server: URL(string: base)!, key: key)
        options.appId = appStoreAppId
        options.responseSigningKeys = signingKeys
        options.devices = 6
        options.purchases = purchases
        options.crashRate = 0.1
        options.networkFailureRate = 0.1
        options.seed = seed
        options.settleSeconds = 180
        // StoreKit 1 devices (receipts, callbacks out of order, usernames dropped) beside StoreKit 2.
        options.storeKit = .mixed
        options.directory = directory.appendingPathComponent("bulk")
        let done = Mutex(0)
        let live = self.live
        live.setProgress(done: 0, total: purchases)
        options.onPurchase = {
            let count = done.withLock { value in
                value += 1
                return value
            }
            live.setProgress(done: count, total: purchases)
        }
        let report = try await Simulation(options: options).run()
        bulk = report
        guard report.clean else {
            throw DemoFailure(
                "lost \(report.lost), doubled \(report.doubled), misattributed \(report.misattributed), finished before ack \(report.finishedBeforeAck), stuck \(report.stuckPurchases), product mismatches \(report.productMismatches), held \(report.held), settled \(report.settled)"
            )
        }
        return
            "\(report.paid) paid, \(report.delivered) delivered; \(report.crashes) crashes, \(report.networkFailures) network failures; 0 lost, 0 doubled, 0 product mismatches"
    }

    // MARK: The end

    struct Summary {
        var table: String
        var clean: Bool
    }

    /// Every paid transaction of the story delivered exactly once; every balance equal to its
    /// ledger; then the figures.
    func summary() async throws -> Summary {
        var broken = failures
        // The figures once the server is still: a notification received moments ago is applied
        // before they are read (up to 30 s), so two runs of one seed print the same summary.
        let still = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < still, (try await app.notifications.counts()["pending"] ?? 0) > 0 {
            try await Task.sleep(for: .milliseconds(100))
        }
        var paidIds: Set<String> = Set(sandboxTransactions)
        for transaction in await past.paidRecord(for: "apple-sam").transactions {
            paidIds.insert(transaction.transactionId)
        }
        for appleId in Set(appleIds) {
            for transaction in await store.paidRecord(for: appleId).transactions {
                paidIds.insert(transaction.transactionId)
            }
        }
        let ids = paidIds.sorted()
        let delivered: Set<String> = try await app.database.read { sql in
            var found: Set<String> = []
            for chunk in stride(from: 0, to: ids.count, by: 200) {
                let part = Array(ids[chunk..<min(ids.count, chunk + 200)])
                let rows = try await sql.select().column("transaction_id").from("deliveries")
                    .where(SQLColumn("transaction_id"), .in, SQLBind.group(part)).all()
                for row in rows { found.insert(try row.decode(column: "transaction_id", as: String.self)) }
            }
            return found
        }
        let lost = paidIds.subtracting(delivered)
        if !lost.isEmpty { broken.append("paid but not delivered: \(lost.sorted())") }
        let mismatched: Int = try await app.database.read { sql in
            try await sql.raw(
                """
                SELECT COUNT(*) AS n FROM balances b
                WHERE b.amount <> COALESCE((SELECT SUM(l.amount) FROM ledger l
                                            WHERE l.account_id = b.account_id AND l.currency = b.currency), 0)
                """
            ).first()?.decode(column: "n", as: Int.self) ?? 0
        }
        if mismatched > 0 { broken.append("\(mismatched) balances differ from their ledger") }
        // One calendar: nothing the App Store or Google Play sold is dated after the server
        // delivered it, nor before the order it paid was made (a minute's leeway for clocks).
        let misdated: [String] = try await app.database.read { sql in
            try await sql.raw(
                """
                SELECT d.transaction_id FROM deliveries d LEFT JOIN orders o ON o.order_id = d.order_id
                WHERE d.store IN ('app_store', 'google_play') AND d.purchased_at IS NOT NULL
                  AND (d.purchased_at > d.delivered_at + 60000 OR d.purchased_at < o.created_at - 60000)
                ORDER BY d.transaction_id LIMIT 5
                """
            ).all().map { try $0.decode(column: "transaction_id", as: String.self) }
        }
        if !misdated.isEmpty { broken.append("purchases dated off the server's calendar: \(misdated)") }
        let kinds: String = try await app.database.read { sql in
            try await sql.raw(
                "SELECT kind, status, COUNT(*) AS n FROM anomalies GROUP BY kind, status ORDER BY kind, status"
            )
            .all().map {
                "\(try $0.decode(column: "n", as: Int.self)) \(try $0.decode(column: "kind", as: String.self)) \(try $0.decode(column: "status", as: String.self))"
            }.joined(separator: ", ")
        }
        let counts: (deliveries: Int, raised: Int, resolved: Int) = try await app.database.read { sql in
            let row = try await sql.raw(
                """
                SELECT (SELECT COUNT(*) FROM deliveries) AS deliveries,
                       (SELECT COUNT(*) FROM anomalies) AS raised,
                       (SELECT COUNT(*) FROM anomalies WHERE status = 'resolved') AS resolved
                """
            ).first()
            return (
                try row?.decode(column: "deliveries", as: Int.self) ?? 0,
                try row?.decode(column: "raised", as: Int.self) ?? 0,
                try row?.decode(column: "resolved", as: Int.self) ?? 0
            )
        }
        let notifications = try await app.notifications.counts()
        let received = notifications.values.reduce(0, +)
        let rows: [(String, String)] = [
            ("delivered (transactions)", "\(counts.deliveries)"),
            ("duplicates suppressed", "\(duplicatesSuppressed)"),
            ("forgeries rejected", "\(forgeriesRejected)"),
            (
                "anomalies raised / resolved",
                "\(counts.raised) / \(counts.resolved)\(kinds.isEmpty ? "" : " (\(kinds))")"
            ),
            (
                "notifications applied / received",
                "\(notifications["applied"] ?? 0) / \(received) ("
                    + notifications.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
                    + ")"
            ),
            ("paid transactions checked", "\(paidIds.count + (bulk?.paid ?? 0)), \(lost.count) lost"),
            ("balances equal to their ledger", mismatched == 0 ? "all" : "\(mismatched) differ"),
            ("invariants", broken.isEmpty ? "all held" : "\(broken.count) broken"),
        ]
        let width = rows.map(\.0.count).max() ?? 0
        var table = "\nSummary\n"
        for (name, value) in rows {
            table += "  " + name + String(repeating: " ", count: width - name.count) + "  " + value + "\n"
        }
        for failure in broken { table += "  ✘ \(failure)\n" }
        return Summary(table: table, clean: broken.isEmpty)
    }
}

extension Data {
    func base64URLEncoded() -> String {
        Base64.encodeURL(self)
    }
}
