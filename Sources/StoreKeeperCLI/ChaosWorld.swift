import AppStoreModels
import AppStoreSigning
import AsyncHTTPClient
import Foundation
import Hummingbird
import LocalAppStore
import LocalGooglePlay
import NIOCore
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSimulator
import StoreKeeperStorage
import Synchronization

/// One chaos run's world: Apple (the local App Store, in this process), the app's backend
/// (a webhook receiver, in this process), its devices (the load) and two StoreKeeper instances
/// behind nginx. `run` breaks one thing and checks the books afterwards.
final class ChaosWorld: Sendable {
    let databaseURL: String
    let postgresCluster: String?
    let root: URL
    let binary: String
    let script: String
    let seconds: Double
    let quiet: Bool
    /// Apple's keys for every run (the instances trust its roots through their configuration),
    /// valid long before the store's clock starts.
    let pki: ApplePKI

    static let catalogYAML = """
        products:
          - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 }, prices: { USA: { currency: USD, price: 0.99 } } }
          - { id: pro_weekly, type: auto_renewable, group: pro, period: P1W, grants: { entitlement: pro }, prices: { USA: { currency: USD, price: 1.99 } } }

        """

    init(
        databaseURL: String, postgresCluster: String?, root: URL, binary: String, script: String, seconds: Double,
        quiet: Bool
    ) throws {
        self.pki = try ApplePKI.generate(name: "StoreKeeper Chaos App Store")
        self.databaseURL = databaseURL
        self.postgresCluster = postgresCluster
        self.root = root
        self.binary = binary
        self.script = script
        self.seconds = seconds
        self.quiet = quiet
    }

    func log(_ text: String) {
        if !quiet { FileHandle.standardError.write(Data("  \(text)\n".utf8)) }
    }

    func run(_ index: Int, fault: ChaosFault, at moment: Double, seed: UInt64) async -> ChaosRunResult {
        var result = ChaosRunResult(run: index, fault: fault, faultAtSeconds: (moment * seconds * 10).rounded() / 10)
        do {
            try await runChecked(index, fault: fault, at: moment, seed: seed, result: &result)
        } catch {
            result.problems.append("run aborted: \(error)")
        }
        // Whatever happened, nothing of the run keeps running.
        _ = try? await Cluster.runProcess(
            "/bin/bash", [script, "stop", "--dir", root.appendingPathComponent("run-\(index)").path])
        return result
    }

    // MARK: The run

    func runChecked(
        _ index: Int, fault: ChaosFault, at moment: Double, seed: UInt64, result: inout ChaosRunResult
    ) async throws {
        let directory = root.appendingPathComponent("run-\(index)")
        try? FileManager.default.removeItem(at: directory)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)

        let storeDirectory = root.appendingPathComponent("store")
        let apiKey = try ServerAPIKeyStore.loadOrCreate(dataDirectory: storeDirectory)
        let rootsFile = storeDirectory.appendingPathComponent("roots.pem")
        try PKIStore.rootsPEM(pki).write(to: rootsFile, atomically: true, encoding: .utf8)
        let catalogFile = root.appendingPathComponent("catalog.yaml")
        try Self.catalogYAML.write(to: catalogFile, atomically: true, encoding: .utf8)

        // A database of its own on the PostgreSQL server.
        let name = "sk_chaos_\(UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased())"
        let admin = try await Database.open(url: databaseURL)
        try await admin.read { sql in try await sql.raw("CREATE DATABASE \(ident: name)").run() }
        var components = URLComponents(string: databaseURL)!
        components.path = "/\(name)"
        let runDatabase = components.string!

        let balancerPort = try FreePort.block(10)
        let balancer = "http://127.0.0.1:\(balancerPort)"
        let storePort = try FreePort.pick()
        let receiverPort = try FreePort.pick()
        // Store time starts in the past, so everything it signs during the run (a day per half
        // second) is dated before now: reconciliation's window ends now, as Apple's does.
        let days = seconds * 2 + 10
        let clock = StoreClock(start: Date().addingTimeInterval(-days * 86_400), scale: 0)
        let store = LocalAppStore(
            configuration: .init(
                catalog: try Catalog.parse(yaml: Self.catalogYAML),
                notificationURL: "\(balancer)/v1/notifications/apple",
                serverAPIKey: .init(
                    issuerId: apiKey.issuerId, keyId: apiKey.keyId,
                    publicKeyPEM: try ServerAPIKeyStore.publicKeyPEM(apiKey))),
            pki: pki, clock: clock)
        // Google Play: its own server (its service account's key file is the instances'), its
        // pushes to the balancer.
        let play = LocalGooglePlay(
            configuration: .init(
                packageName: "com.example.android", catalog: try Catalog.parse(yaml: Self.catalogYAML)),
            clock: StoreClock(start: Date(), scale: 0))
        let playServer = try await LocalGooglePlayServer(store: play)
        let playRunning = try await playServer.start()
        let playKeyFile = directory.appendingPathComponent("play-service-account.json")
        try playServer.writeServiceAccountKey(baseURL: playRunning.baseURL, to: playKeyFile.path)
        let pushes = playServer.pushSender(
            endpoint: "\(balancer)/v1/notifications/google", audience: "\(balancer)/v1/notifications/google",
            serviceAccount: LocalGooglePlayServer.pushServiceAccount)
        let pushTask = Task { try await pushes.run() }
        let storeServer = try await LocalAppStoreServer(store: store)
        let storeTask = Task { try await storeServer.application(port: storePort).runService() }
        let receiver = WebhookReceiver()
        let receiverTask = Task { try await receiver.application(port: receiverPort).runService() }

        let key = "sk_chaos_" + (0..<32).map { _ in String(Int.random(in: 0..<16), radix: 16) }.joined()
        let configFile = directory.appendingPathComponent("storekeeper.yaml")
        try """
        database: { url: "\(runDatabase)" }
        auth: { secretKeys: [\(key)] }
        apple:
          bundleId: com.example.app
          appAppleId: 1234567890
          environments: [Production]
          rootCertificates: ["\(rootsFile.path)"]
          serverAPI:
            issuerId: \(apiKey.issuerId)
            keyId: \(apiKey.keyId)
            privateKeyFile: "\(storeDirectory.appendingPathComponent("server-api-key.p8").path)"
            baseURL: "http://127.0.0.1:\(storePort)"
          consumption: { enabled: true }
        apps:
          - { id: ios, store: app_store, bundleId: com.example.app, appAppleId: 1234567890, environments: [Production] }
          - id: android
            store: google_play
            packageName: com.example.android
            serviceAccountKeyFile: "\(playKeyFile.path)"
            apiBaseURL: "\(playRunning.baseURL)"
            pushAudience: "\(balancer)/v1/notifications/google"
            pushServiceAccount: \(LocalGooglePlayServer.pushServiceAccount)
            pushCertificatesURL: "\(playRunning.baseURL)/oauth2/v3/certs"
        catalog: { file: "\(catalogFile.path)" }
        webhooks: { url: "http://127.0.0.1:\(receiverPort)/hooks", secret: "chaos-webhook-secret-0123456789" }

        """.write(to: configFile, atomically: true, encoding: .utf8)

        let cluster = Cluster(
            script: script, binary: binary, directory: directory, config: configFile.path, port: balancerPort)
        defer {
            storeTask.cancel()
            receiverTask.cancel()
            pushTask.cancel()
        }
        do {
            try await cluster.start(count: 2)
        } catch {
            await cluster.stop()
            throw error
        }
        let load = ChaosLoad(
            balancer: balancer, key: key, store: store, play: play, run: index, seconds: seconds, seed: seed)

        // Load, with one fault at its moment.
        let loadTask = Task { await load.run() }
        try await Task.sleep(for: .seconds(moment * seconds))
        log("fault: \(fault.rawValue)")
        switch fault {
        case .kill:
            let instance = Int(seed % 2) + 1
            cluster.kill(instance)
            try await Task.sleep(for: .seconds(2))
            try await cluster.restart(instance)
        case .postgres:
            let parts = (postgresCluster ?? "").split(separator: " ").map(String.init)
            let status = try await Cluster.runProcess("/usr/bin/pg_ctlcluster", parts + ["restart"])
            if status != 0 { result.problems.append("pg_ctlcluster restart exited \(status)") }
        case .apple:
            var faults = Faults()
            faults.endpoints["*"] = .init(status: 503)
            faults.dropNotifications = 1_000_000
            await store.setFaults(faults)
            play.failNextAPICalls(1_000_000)
            try await Task.sleep(for: .seconds(3))
            await store.setFaults(Faults())
            play.failNextAPICalls(0)
        case .webhooks:
            receiver.failing.store(true, ordering: .relaxed)
            try await Task.sleep(for: .seconds(4))
            receiver.failing.store(false, ordering: .relaxed)
        }
        await loadTask.value

        // Settle: the app resubmits what it never saw acknowledged (StoreKeeperKit does, at the
        // next launch), the operator's reconciliation runs, the queues drain.
        let settleStart = ContinuousClock.now
        await load.resubmitUnacknowledged(deadline: .now + .seconds(120))
        let since = ISO8601DateFormatter().string(from: clock.start.addingTimeInterval(-86_400))
        let reconcile = try await Cluster.runProcess(
            binary, ["reconcile", "--config", configFile.path, "--since", since],
            log: directory.appendingPathComponent("reconcile.log"))
        if reconcile != 0 { result.problems.append("storekeeper reconcile exited \(reconcile)") }
        let database = try await Database.open(url: runDatabase)
        let settled = try await waitForQuiet(database, receiver: receiver, deadline: .now + .seconds(180))
        if !settled { result.problems.append("did not settle within 180 s (queues not empty)") }
        result.settleSeconds = ((ContinuousClock.now - settleStart) / .milliseconds(100)).rounded() / 10

        do {
            try await check(database, store: store, load: load, receiver: receiver, result: &result)
            try await checkGoogle(database, play: play, load: load, result: &result)
        } catch {
            result.problems.append("check failed: \(String(reflecting: error))")
        }
        try? await database.close()
        await cluster.stop()
        if result.clean {
            try? await admin.read { sql in
                try await sql.raw("DROP DATABASE IF EXISTS \(ident: name) WITH (FORCE)").run()
            }
        } else {
            result.problems.append("database \(name) kept for inspection")
        }
        try? await admin.close()
        await playRunning.stop()
    }

    /// Google Play's books: every paid token delivered exactly once to its order's account, and
    /// acknowledged (consumed) at Google — none refunded for want of it.
    func checkGoogle(_ database: Database, play: LocalGooglePlay, load: ChaosLoad, result: inout ChaosRunResult)
        async throws
    {
        let paid = load.googlePaid()
        result.googlePaid = paid.count
        struct Row: Decodable {
            var transactionId: String
            var accountId: String
        }
        let rows = try await database.read { sql in
            try await sql.raw("SELECT transaction_id, account_id FROM deliveries WHERE transaction_id LIKE 'gp:%'")
                .all(decoding: Row.self, keyDecodingStrategy: .convertFromSnakeCase)
        }
        var delivered: [String: [String]] = [:]
        for row in rows { delivered[row.transactionId, default: []].append(row.accountId) }
        for (token, account) in paid {
            guard let purchase = await play.purchase(token), let order = purchase.orders.last else { continue }
            let accounts = delivered["gp:" + order] ?? []
            if accounts.isEmpty {
                result.lost += 1
                result.problems.append("Google purchase \(order) never delivered")
            } else if accounts.count > 1 {
                result.doubled += 1
            } else if accounts[0] != account {
                result.problems.append("Google purchase \(order) credited to \(accounts[0]), not \(account)")
            }
            if !purchase.consumed { result.problems.append("Google purchase \(order) never consumed by the server") }
            if purchase.voided { result.problems.append("Google refunded \(order) for want of acknowledgement") }
        }
    }

    /// No pending notification, job or webhook event, twice in a row half a second apart.
    func waitForQuiet(_ database: Database, receiver: WebhookReceiver, deadline: ContinuousClock.Instant) async throws
        -> Bool
    {
        var quietOnce = false
        while ContinuousClock.now < deadline {
            let busy: Int = try await database.read { sql in
                let notifications =
                    try await sql.raw("SELECT COUNT(*) AS n FROM notifications WHERE status = 'pending'").first()?
                    .decode(column: "n", as: Int.self) ?? 0
                let jobs =
                    try await sql.raw("SELECT COUNT(*) AS n FROM jobs WHERE status = 'pending'").first()?
                    .decode(column: "n", as: Int.self) ?? 0
                let outbox =
                    try await sql.raw("SELECT COUNT(*) AS n FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL")
                    .first()?.decode(column: "n", as: Int.self) ?? 0
                return notifications + jobs + outbox
            }
            if busy == 0 {
                if quietOnce { return true }
                quietOnce = true
            } else {
                quietOnce = false
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        return false
    }

    // MARK: The books

    func check(
        _ database: Database, store: LocalAppStore, load: ChaosLoad, receiver: WebhookReceiver,
        result: inout ChaosRunResult
    ) async throws {
        // Apple's record: every transaction of every customer of the run.
        var paid: [String: (appleId: String, productId: String, revoked: Bool, original: String)] = [:]
        for appleId in load.appleIds() {
            for stored in await store.history(of: appleId) {
                guard let id = stored.payload.transactionId else { continue }
                paid[id] = (
                    appleId, stored.payload.productId ?? "", stored.payload.revocationDate != nil,
                    stored.payload.originalTransactionId ?? id
                )
            }
        }
        result.paid = paid.count
        result.renewals = paid.filter { $0.key != $0.value.original }.count
        result.refunds = paid.values.filter(\.revoked).count

        struct Delivery: Decodable {
            var transactionId: String
            var accountId: String
            var productId: String
            var refundedAt: Int64?
            var store: String
        }
        // Every store's deliveries make the balances (checked below); Apple's alone are counted
        // against Apple's books here (Google Play's in `checkGoogle`).
        let deliveries = try await database.read { sql in
            try await sql.raw("SELECT transaction_id, account_id, product_id, refunded_at, store FROM deliveries").all(
                decoding: Delivery.self, keyDecodingStrategy: .convertFromSnakeCase)
        }
        var deliveredCount: [String: Int] = [:]
        for delivery in deliveries where delivery.store == Store.appStore.rawValue {
            deliveredCount[delivery.transactionId, default: 0] += 1
        }
        result.delivered = deliveredCount.count
        let lost = paid.keys.filter { deliveredCount[$0] == nil }.sorted()
        result.lost = lost.count
        if !lost.isEmpty { result.problems.append("lost: \(lost.prefix(5).joined(separator: ", "))") }
        let phantom = deliveredCount.keys.filter { paid[$0] == nil }
        let doubled = deliveredCount.filter { $0.value > 1 }.count + phantom.count
        result.doubled = doubled
        if !phantom.isEmpty { result.problems.append("delivered but never paid: \(phantom.prefix(5))") }
        for delivery in deliveries {
            if let owner = load.account(ofAppleId: paid[delivery.transactionId]?.appleId ?? ""),
                owner != delivery.accountId
            {
                result.problems.append("\(delivery.transactionId) credited to \(delivery.accountId), not \(owner)")
            }
            if let record = paid[delivery.transactionId], record.revoked != (delivery.refundedAt != nil) {
                result.problems.append(
                    "\(delivery.transactionId): refunded at Apple \(record.revoked), in StoreKeeper \(delivery.refundedAt != nil)"
                )
            }
        }

        // Balances: equal to their ledger, and to what Apple's record and the debits say.
        struct Balance: Decodable {
            var accountId: String
            var amount: Int64
            var ledger: Int64
        }
        let balances = try await database.read { sql in
            try await sql.raw(
                """
                SELECT b.account_id, b.amount, CAST(COALESCE((SELECT SUM(l.amount) FROM ledger l
                  WHERE l.account_id = b.account_id AND l.currency = b.currency), 0) AS BIGINT) AS ledger
                FROM balances b WHERE b.currency = 'coins'
                """
            ).all(decoding: Balance.self, keyDecodingStrategy: .convertFromSnakeCase)
        }
        struct Debit: Decodable {
            var idempotencyKey: String
            var accountId: String
            var amount: Int64
        }
        let debits = try await database.read { sql in
            try await sql.raw("SELECT idempotency_key, account_id, amount FROM debit_requests").all(
                decoding: Debit.self, keyDecodingStrategy: .convertFromSnakeCase)
        }
        result.debits = debits.count
        let storedDebits = Set(debits.map(\.idempotencyKey))
        let missingDebits = load.acknowledgedDebits().filter { !storedDebits.contains($0) }
        if !missingDebits.isEmpty { result.problems.append("acknowledged debits missing: \(missingDebits.prefix(5))") }
        var expected: [String: Int64] = [:]
        for delivery in deliveries where delivery.productId == "coins_60" && delivery.refundedAt == nil {
            expected[delivery.accountId, default: 0] += 60
        }
        for debit in debits { expected[debit.accountId, default: 0] -= debit.amount }
        for balance in balances {
            if balance.amount != balance.ledger || balance.amount != expected[balance.accountId, default: 0] {
                result.balanceMismatches += 1
                result.problems.append(
                    "\(balance.accountId): balance \(balance.amount), ledger \(balance.ledger), expected \(expected[balance.accountId, default: 0])"
                )
            }
        }

        // Subscriptions: the state StoreKeeper holds is Apple's.
        struct Subscription: Decodable {
            var originalTransactionId: String
            var status: String
            var expiresAt: Int64?
        }
        let subscriptions = try await database.read { sql in
            try await sql.raw("SELECT original_transaction_id, status, expires_at FROM subscriptions").all(
                decoding: Subscription.self, keyDecodingStrategy: .convertFromSnakeCase)
        }
        let held = Dictionary(subscriptions.map { ($0.originalTransactionId, $0) }, uniquingKeysWith: { a, _ in a })
        for original in Set(paid.values.filter { $0.productId == "pro_weekly" }.map(\.original)) {
            result.subscriptions += 1
            guard let apple = await store.subscription(original) else { continue }
            let status: String =
                switch apple.status {
                case .active: "active"
                case .billingGracePeriod: "grace_period"
                case .billingRetry: "billing_retry"
                case .revoked: "revoked"
                default: "expired"
                }
            let expires = Int64((apple.expires.timeIntervalSince1970 * 1000).rounded())
            guard let mine = held[original] else {
                result.subscriptionMismatches += 1
                result.problems.append("subscription \(original) unknown to StoreKeeper")
                continue
            }
            if mine.status != status || mine.expiresAt != expires {
                result.subscriptionMismatches += 1
                result.problems.append(
                    "subscription \(original): Apple \(status) until \(expires), StoreKeeper \(mine.status) until \(mine.expiresAt ?? 0)"
                )
            }
        }

        // Notifications: every one Apple sent is recorded and applied, pushed or reconciled.
        let sent = await store.notifications.compactMap(\.payload.notificationUUID)
        result.notificationsSent = sent.count
        struct Recorded: Decodable {
            var notificationUuid: String
            var status: String
        }
        let recorded = try await database.read { sql in
            try await sql.raw("SELECT notification_uuid, status FROM notifications").all(
                decoding: Recorded.self, keyDecodingStrategy: .convertFromSnakeCase)
        }
        let recordedIds = Set(recorded.map(\.notificationUuid))
        result.notificationsApplied = recorded.filter { $0.status != "pending" }.count
        let missingNotifications = sent.filter { !recordedIds.contains($0) }
        if !missingNotifications.isEmpty {
            result.problems.append("notifications never recorded: \(missingNotifications.count)")
        }

        // Jobs: every CONSUMPTION_REQUEST of a customer who consented answered (Send
        // Consumption Information, from a job whichever instance claims it) — once, as Apple
        // records it, unless an instance or the database was lost between Apple's answer and the
        // job marked done (then at least once); one without consent never answered.
        for appleId in load.appleIds() {
            for stored in await store.history(of: appleId) where stored.consumptionRequested {
                result.consumptionRequests += 1
                let answers = stored.consumptionReceived.count
                let id = stored.payload.transactionId ?? "?"
                let consented = load.consent(ofTransaction: id)?.consented ?? false
                if !consented {
                    result.consumptionWithheld += 1
                    if answers > 0 {
                        result.problems.append("consumption request for \(id) answered without the customer's consent")
                    }
                } else if answers == 0 {
                    result.problems.append("consumption request for \(id) never answered")
                } else if answers > 1 {
                    result.consumptionAnsweredAgain += 1
                    if result.fault == .apple || result.fault == .webhooks {
                        result.problems.append("consumption request for \(id) answered \(answers) times")
                    }
                }
            }
        }

        // Webhooks: every event in the outbox reached the receiver, at least once; no effect
        // was written twice (one delivery event and at most one refund event per transaction,
        // whichever instance or job applied it); and an event the receiver accepted went again
        // only where at-least-once allows it: an instance killed, or the database gone, between
        // the receiver's 2xx and the event marked sent.
        struct Event: Decodable {
            var id: String
            var event: String
            var payload: String
        }
        let events = try await database.read { sql in
            try await sql.raw("SELECT id, event, payload FROM outbox").all(decoding: Event.self)
        }
        let received = receiver.received()
        result.webhookEvents = events.count
        result.webhookEventsMissing = events.filter { received[$0.id] == nil }.count
        result.webhookRedeliveries = received.values.reduce(0) { $0 + $1 } - received.count
        if result.webhookEventsMissing > 0 {
            result.problems.append("webhook events never received: \(result.webhookEventsMissing)")
        }
        if result.webhookRedeliveries > 0, result.fault == .apple || result.fault == .webhooks {
            result.problems.append(
                "\(result.webhookRedeliveries) webhook events accepted and sent again with no instance or database lost"
            )
        }
        var effects: [String: Int] = [:]
        for event in events where event.event == "delivery" || event.event == "refund" {
            struct Subject: Decodable { var transactionId: String? }
            let subject = try? JSONDecoder().decode(Subject.self, from: Data(event.payload.utf8))
            effects["\(event.event) \(subject?.transactionId ?? event.id)", default: 0] += 1
        }
        let repeated = effects.filter { $0.value > 1 }.keys.sorted()
        result.doubled += repeated.count
        if !repeated.isEmpty { result.problems.append("effects written twice: \(repeated.prefix(5))") }
    }
}

/// The app's backend, as far as webhooks go: records every event id it is sent; while
/// `failing`, answers 500 (and records nothing).
final class WebhookReceiver: Sendable {
    let failing = Atomic<Bool>(false)
    let events = Mutex<[String: Int]>([:])

    func received() -> [String: Int] { events.withLock { $0 } }

    func application(port: Int) -> some ApplicationProtocol {
        let router = Router()
        router.post("hooks") { request, _ -> Response in
            if self.failing.load(ordering: .relaxed) { return Response(status: .internalServerError) }
            if let id = request.headers[.init("StoreKeeper-Event-Id")!] {
                self.events.withLock { $0[id, default: 0] += 1 }
            }
            return Response(status: .ok)
        }
        return Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: port)))
    }
}

/// Two instances behind nginx, through scripts/cluster; an instance killed is restarted with
/// the same command line.
struct Cluster: Sendable {
    let script: String
    let binary: String
    let directory: URL
    let config: String
    let port: Int

    /// Debian's nginx, which scripts/cluster runs.
    static var nginxInstalled: Bool {
        ["/usr/sbin/nginx", "/usr/bin/nginx"].contains { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// `count` instances on `config`; or, given `databaseURL`, on scripts/cluster's own
    /// configuration (the local App Store's keys in DIR/data, a secret key in DIR/secret-key).
    func start(count: Int, databaseURL: String? = nil) async throws {
        let configuration = databaseURL.map { ["--database-url", $0] } ?? ["--config", config]
        let status = try await Self.runProcess(
            "/bin/bash",
            [script, "start", String(count)] + configuration + [
                "--port", String(port), "--dir", directory.path, "--binary", binary,
            ], log: directory.appendingPathComponent("cluster.log"))
        guard status == 0 else {
            let output =
                (try? String(contentsOf: directory.appendingPathComponent("cluster.log"), encoding: .utf8)) ?? ""
            throw ChaosError("scripts/cluster start exited \(status): \(output.suffix(500))")
        }
    }

    func stop() async {
        _ = try? await Self.runProcess("/bin/bash", [script, "stop", "--dir", directory.path])
    }

    func pid(_ instance: Int) -> pid_t? {
        (try? String(contentsOf: directory.appendingPathComponent("instance-\(instance).pid"), encoding: .utf8))
            .flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    func kill(_ instance: Int) {
        if let pid = pid(instance) { Foundation.kill(pid, SIGKILL) }
    }

    func restart(_ instance: Int) async throws {
        var environment = ProcessInfo.processInfo.environment
        environment["HTTP_PORT"] = String(port + instance)
        environment["HTTP_HOST"] = "127.0.0.1"
        let pid = try Self.spawn(
            [binary, "serve", "--config", config, "--data-dir", directory.appendingPathComponent("data").path],
            environment: environment, log: directory.appendingPathComponent("instance-\(instance).log"), append: true)
        try "\(pid)\n".write(
            to: directory.appendingPathComponent("instance-\(instance).pid"), atomically: true, encoding: .utf8)
        // Reaped when it exits (scripts/cluster stop kills it by its pid file).
        Thread.detachNewThread {
            var status: Int32 = 0
            while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        }
    }

    /// Starts a program with its output going to `log` (a file, never a pipe: scripts/cluster
    /// leaves daemons running that would hold a pipe open) or nowhere. posix_spawn rather than
    /// Foundation's Process, whose reaping was seen to hang on pg_ctlcluster.
    static func spawn(_ arguments: [String], environment: [String: String]? = nil, log: URL?, append: Bool = false)
        throws -> pid_t
    {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        let flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC)
        posix_spawn_file_actions_addopen(&actions, 1, log?.path ?? "/dev/null", flags, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        let argv = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        let variables = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { for pointer in variables ?? [] { free(pointer) } }
        var pid = pid_t()
        let status =
            variables.map { variables in posix_spawn(&pid, arguments[0], &actions, nil, argv, variables) }
            ?? posix_spawn(&pid, arguments[0], &actions, nil, argv, environ)
        guard status == 0 else { throw ChaosError("cannot start \(arguments[0]): error \(status)") }
        return pid
    }

    /// Runs a program to its end, or kills it after `timeout`; its exit status (-1 when killed
    /// by a signal, including the timeout's).
    static func runProcess(_ path: String, _ arguments: [String], log: URL? = nil, timeout: Duration = .seconds(300))
        async throws -> Int32
    {
        let pid = try spawn([path] + arguments, log: log)
        let watchdog = Task {
            try await Task.sleep(for: timeout)
            Foundation.kill(pid, SIGKILL)
        }
        defer { watchdog.cancel() }
        return await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                var status: Int32 = 0
                while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                let exited = status & 0x7f == 0
                continuation.resume(returning: exited ? (status >> 8) & 0xff : -1)
            }
        }
    }
}

struct ChaosError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
