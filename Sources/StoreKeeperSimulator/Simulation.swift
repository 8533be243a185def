import Foundation
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper simulate`: N devices, each the real StoreKeeperKit core against a scripted
/// payment queue paid at the server's local App Store, through crashes, dropped, duplicated,
/// delayed and reordered callbacks, missing tokens, merged payments, Ask to Buy, double taps
/// and network failures; then a report of what was paid against what was delivered.
public struct Simulation: Sendable {
    public struct Options: Sendable {
        public var server: URL
        public var key: String
        public var devices = 10
        public var purchases = 100
        public var crashRate = 0.0
        public var networkFailureRate = 0.0
        public var seed: UInt64 = 1
        public var settleSeconds: TimeInterval = 300
        /// `1`, `2` or `mixed` (each device one or the other, by the seed).
        public var storeKit: StoreKitMode = .two
        /// App accounts that log in and out on each device.
        public var accountsPerDevice = 1
        public var middleboxErrorRate = 0.0
        public var clockJumpRate = 0.0
        /// Old transactions `Transaction.updates` replays at each launch (StoreKit 2 devices).
        public var replayFlood = 0
        /// Purchases made outside the app, arriving with no token.
        public var tokenlessRate = 0.0
        /// How long a purchase call waits for StoreKit before answering `.pending`.
        public var purchaseTimeout: TimeInterval = 1.5
        public var directory: URL?
        /// The app the devices are (`apps[].id`): a server with several apps needs it.
        public var appId: String?
        /// The answer-signing keys the devices were built with (empty: answers not checked).
        public var responseSigningKeys: [ResponseSigningKey] = []
        /// Run once, when half the purchases have started: the server switches its signing key
        /// (the CLI runs `--rotate-command`; tests rotate an in-process server).
        public var rotateSigningKey: (@Sendable () async throws -> Void)?
        /// fsync each device's pending-store writes (the SDK's default). Tests running beside
        /// other suites on a shared disk turn it off: the crashes are simulated in-process.
        public var fsync = true
        /// Runs once everything has settled, before the comparison, with each device's Apple
        /// ID and account id (tests use it to prove the report catches what it claims to).
        /// Called after each purchase of the plan (the demo's progress bar).
        public var onPurchase: (@Sendable () -> Void)?
        public var beforeReport: (@Sendable ([(appleId: String, accountId: String)]) async throws -> Void)?
        /// The other faults, each a probability per purchase.
        public var faults: DeviceFaults = {
            var faults = DeviceFaults()
            faults.dropToken = 0.15
            faults.duplicate = 0.15
            faults.dropCallback = 0.03
            faults.delay = 0.1
            faults.merge = 0.05
            faults.askToBuy = 0.05
            faults.doubleTap = 0.1
            faults.staleCallback = 0.03
            // StoreKit 1 only: late (out-of-order) callbacks and receipts read before they hold
            // the purchase.
            faults.lateCallback = 0.1
            faults.staleReceipt = 0.2
            return faults
        }()

        public init(server: URL, key: String) {
            self.server = server
            self.key = key
        }
    }

    public enum StoreKitMode: String, Sendable, CaseIterable {
        case one = "1"
        case two = "2"
        case mixed
    }

    public struct Report: Codable, Sendable, Equatable {
        /// One app account: what its own purchases paid for (currencies, `entitlements`) and
        /// what the server holds for it — comparable with `GET /v1/accounts/{accountId}`.
        public struct Account: Codable, Sendable, Equatable {
            public var accountId: String
            /// The simulated Apple ID it bought with (several accounts may share one).
            public var appleId: String
            public var paid: [String: LocalStoreControl.PaidValue]
            public var held: [String: LocalStoreControl.PaidValue]
        }
        public var purchases: Int
        public var paid: Int
        public var delivered: Int
        public var lost: Int
        public var doubled: Int
        public var misattributed: Int
        public var finishedBeforeAck: Int
        /// Purchase calls that did not return within their bound.
        public var stuckPurchases: Int
        /// The server's `product_mismatch` anomalies for this run's transactions.
        public var productMismatches: Int
        /// Transactions the devices still held when the run ended.
        public var held: Int
        public var secondsToSettle: Double
        public var accounts: [Account]
        // Beyond the contract: what the run went through.
        public var devices: Int
        public var seed: UInt64
        public var crashes: Int
        public var networkFailures: Int
        public var middleboxErrors: Int
        public var settled: Bool
        public var storeKit: String
        public var accountsPerDevice: Int
        /// Requests the devices sent to the server (through the proxy) per purchase started.
        public var requestsPerPurchase: Double
        /// The app id the devices sent (nil: none).
        public var appId: String?
        /// Whether the devices checked signed answers, and how many they refused.
        public var signedAnswers = false
        public var unverifiedAnswers = 0
        /// A rotation of the server's signing key was asked for, and whether it happened.
        public var keyRotation: KeyRotation?

        public struct KeyRotation: Codable, Sendable, Equatable {
            public var from: String?
            public var to: String?
            public var afterPurchases: Int
            public var rotated: Bool { from != nil && to != nil && from != to }
        }

        public var clean: Bool {
            lost == 0 && doubled == 0 && misattributed == 0 && finishedBeforeAck == 0 && stuckPurchases == 0
                && productMismatches == 0 && held == 0 && settled && (keyRotation?.rotated ?? true)
        }
    }

    public var options: Options
    public init(options: Options) { self.options = options }

    public func run(progress: @escaping @Sendable (String) -> Void = { _ in }) async throws -> Report {
        let control = LocalStoreControl(server: options.server, key: options.key)
        let catalog = try await control.catalog()
        let consumables = catalog.filter { $0.type == "consumable" }.map(\.id)
        let unlocks = catalog.filter { $0.type == "non_consumable" }.map(\.id)
        guard !consumables.isEmpty else {
            throw LocalStoreControl.Failure(description: "the catalog has no consumable to simulate with")
        }
        let directory =
            options.directory
            ?? FileManager.default.temporaryDirectory.appendingPathComponent(
                "storekeeper-simulate-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { if options.directory == nil { try? FileManager.default.removeItem(at: directory) } }

        // Each run its own customers and accounts: a rerun against the same server starts clean.
        let run = String(UUID().uuidString.prefix(8)).lowercased()
        var faults = options.faults
        faults.crash = options.crashRate
        faults.network = options.networkFailureRate
        faults.middlebox = options.middleboxErrorRate
        faults.clockJump = options.clockJumpRate
        faults.tokenless = options.tokenlessRate
        if options.accountsPerDevice > 1 { faults.switchAccount = max(faults.switchAccount, 0.25) }
        var seeds = SeededRandom(seed: options.seed)
        var kinds = SeededRandom(seed: options.seed ^ 0x5C1)
        let devices = (0..<max(1, options.devices)).map { index -> SimulatedDevice in
            let version: SimulatedDevice.StoreKitVersion
            switch options.storeKit {
            case .one: version = .one
            case .two: version = .two
            case .mixed: version = kinds.below(2) == 0 ? .one : .two
            }
            let others = (1..<max(1, options.accountsPerDevice)).map { "sim-\(run)-account-\(index)-\($0)" }
            return SimulatedDevice(
                appleId: "sim-\(run)-apple-\(index)", accountId: "sim-\(run)-account-\(index)", server: options.server,
                key: options.key, directory: directory, seed: seeds.next(), faults: faults, fsync: options.fsync,
                storeKit: version, otherAccounts: others, purchaseTimeout: options.purchaseTimeout,
                appId: options.appId, responseSigningKeys: options.responseSigningKeys)
        }
        if options.replayFlood > 0 {
            progress("paying \(options.replayFlood) purchases of history per StoreKit 2 device")
            try await withThrowingTaskGroup(of: Void.self) { group in
                for device in devices {
                    group.addTask { try await device.seedHistory(options.replayFlood, productId: consumables[0]) }
                }
                try await group.waitForAll()
            }
        }
        // Purchases spread over the devices; each device buys one unlock at most once.
        var plans: [[(String, Int)]] = Array(repeating: [], count: devices.count)
        var planner = SeededRandom(seed: options.seed ^ 0x5EED)
        for index in 0..<max(0, options.purchases) {
            let device = index % devices.count
            if !unlocks.isEmpty, plans[device].isEmpty, planner.chance(0.3) {
                plans[device].append((unlocks[planner.below(unlocks.count)], 1))
            } else {
                plans[device].append((consumables[planner.below(consumables.count)], 1 + planner.below(3)))
            }
        }

        progress("simulating \(options.purchases) purchases on \(devices.count) devices (seed \(options.seed))")
        let rotation = options.rotateSigningKey.map { _ in Rotation(at: max(1, options.purchases / 2)) }
        let keyBefore = rotation == nil ? nil : try await control.signingKeyId()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (device, plan) in zip(devices, plans) {
                group.addTask {
                    await device.setConsumables(consumables)
                    try await device.launch()
                    for (productId, quantity) in plan {
                        if let rotation, let rotate = options.rotateSigningKey, await rotation.due() {
                            progress("rotating the server's answer-signing key")
                            try await rotate()
                        }
                        try await device.buy(productId: productId, quantity: quantity)
                        options.onPurchase?()
                    }
                }
            }
            try await group.waitForAll()
        }
        let keyAfter = rotation == nil ? nil : try await control.signingKeyId()

        progress("settling")
        let start = Date()
        let deadline = start.addingTimeInterval(options.settleSeconds)
        let settledAll = try await withThrowingTaskGroup(of: Bool.self) { group in
            for device in devices { group.addTask { try await device.settle(deadline: deadline) } }
            var all = true
            for try await settled in group { all = all && settled }
            return all
        }
        let secondsToSettle = Date().timeIntervalSince(start)
        var held = 0
        for device in devices { held += await device.heldCount }
        for device in devices { await device.stop() }
        if let hook = options.beforeReport {
            try await hook(devices.map { ($0.appleId, $0.accountId) })
        }

        progress("comparing what was paid with what was delivered")
        var report = try await report(
            devices: devices, control: control, secondsToSettle: secondsToSettle, settled: settledAll,
            progress: progress)
        report.held = held
        report.appId = options.appId
        report.signedAnswers = !options.responseSigningKeys.isEmpty
        for device in devices { report.unverifiedAnswers += await device.unverifiedAnswers }
        if let rotation {
            report.keyRotation = Report.KeyRotation(
                from: keyBefore, to: keyAfter, afterPurchases: await rotation.at)
            if report.keyRotation?.rotated != true { progress("problem: the server's signing key did not change") }
        }
        return report
    }

    /// Fires once, when the purchase count reaches `at`.
    actor Rotation {
        let at: Int
        var started = 0
        var fired = false
        init(at: Int) { self.at = at }
        func due() -> Bool {
            started += 1
            guard !fired, started >= at else { return false }
            fired = true
            return true
        }
    }

    func report(
        devices: [SimulatedDevice], control: LocalStoreControl, secondsToSettle: Double, settled: Bool,
        progress: @escaping @Sendable (String) -> Void
    ) async throws -> Report {
        var report = Report(
            purchases: 0, paid: 0, delivered: 0, lost: 0, doubled: 0, misattributed: 0, finishedBeforeAck: 0,
            stuckPurchases: 0, productMismatches: 0, held: 0,
            secondsToSettle: (secondsToSettle * 1000).rounded() / 1000, accounts: [], devices: devices.count,
            seed: options.seed, crashes: 0, networkFailures: 0, middleboxErrors: 0, settled: settled,
            storeKit: options.storeKit.rawValue, accountsPerDevice: max(1, options.accountsPerDevice),
            requestsPerPurchase: 0)
        var runTransactions: Set<String> = []
        var requests = 0
        let catalog = Dictionary(
            try await control.catalog().map { ($0.id, $0.grants) }, uniquingKeysWith: { first, _ in first })
        var surplus: [String: Int] = [:]
        var deficit: [String: Int] = [:]
        for device in devices {
            let record = try await control.paid(appleId: device.appleId)
            let (_, deliveredTo, answers, paidBy) = await device.observations()
            report.purchases += await device.purchasesStarted
            report.finishedBeforeAck += await device.finishedBeforeAck
            report.doubled += await device.doubleCharges
            report.crashes += await device.crashes
            report.networkFailures += await device.networkFailures
            report.stuckPurchases += await device.stuckPurchases
            report.middleboxErrors += await device.middleboxErrors
            requests += await device.requests

            // Per transaction, as the device heard the server: delivered to the account that paid it.
            var lost = 0
            var misattributed = 0
            var problems: [String] = []
            var expected: [String: [String: Int64]] = [:]
            var expectedEntitlements: [String: Set<String>] = [:]
            for transaction in record.transactions where !transaction.revoked {
                report.paid += 1
                runTransactions.insert(transaction.transactionId)
                let payer = paidBy[transaction.transactionId] ?? device.accountId
                if let grants = catalog[transaction.productId] {
                    if let currency = grants.currency, let amount = grants.amount {
                        expected[payer, default: [:]][currency, default: 0] += amount * Int64(transaction.quantity)
                    }
                    if let entitlement = grants.entitlement {
                        expectedEntitlements[payer, default: []].insert(entitlement)
                    }
                }
                var accounts = deliveredTo[transaction.transactionId] ?? []
                if !accounts.contains(payer), let paid = await device.order(paidBy: transaction.transactionId),
                    try await orderPaid(paid.orderId, by: transaction.transactionId)
                {
                    // The answer that said so never reached the device (a crash, a proxy, the
                    // network): the server's order record is the truth.
                    accounts.insert(paid.accountId)
                }
                if accounts.contains(payer) { report.delivered += 1 } else { lost += 1 }
                if accounts.contains(where: { $0 != payer }) { misattributed += 1 }
                if !accounts.contains(payer) || accounts.contains(where: { $0 != payer }) {
                    problems.append(
                        "StoreKit \(device.storeKit.rawValue) transaction \(transaction.transactionId) \(transaction.productId) paid by \(payer), delivered to \(accounts.sorted())"
                    )
                }
                if (answers[transaction.transactionId] ?? 0) > 1 { report.doubled += 1 }
            }
            // The server's truth per account: each account of the device holds exactly what its
            // own purchases paid for. When it does, what the device did not hear (an answer a
            // cancelled request or a crash swallowed) is no loss; when it does not, it is one.
            var exact = true
            for accountId in device.accounts {
                let view = try await accountView(accountId)
                let held = view.balances.filter { $0.value != 0 }
                let owed = (expected[accountId] ?? [:]).filter { $0.value != 0 }
                let active = Set(view.entitlements.filter(\.active).map(\.id))
                var paidFigures = owed.mapValues { LocalStoreControl.PaidValue.amount($0) }
                var heldFigures = held.mapValues { LocalStoreControl.PaidValue.amount($0) }
                if let paidEntitlements = expectedEntitlements[accountId], !paidEntitlements.isEmpty {
                    paidFigures["entitlements"] = .list(paidEntitlements.sorted())
                }
                if !active.isEmpty { heldFigures["entitlements"] = .list(active.sorted()) }
                report.accounts.append(
                    Report.Account(accountId: accountId, appleId: device.appleId, paid: paidFigures, held: heldFigures))
                if held != owed || active != (expectedEntitlements[accountId] ?? []) {
                    exact = false
                    problems.append("account \(accountId) holds \(held) \(active.sorted()), paid for \(owed)")
                }
            }
            if exact {
                report.delivered += lost
            } else {
                report.lost += lost
                report.misattributed += misattributed
                for line in problems { progress("problem: \(line)") }
                // The server's record of each of the device's transactions whose account is not
                // the payer's: what a failing run needs to be understood without a rerun.
                for transaction in record.transactions where !transaction.revoked {
                    let payer = paidBy[transaction.transactionId] ?? device.accountId
                    let (account, raw) = try await serverRecord(transaction.transactionId)
                    if account != payer {
                        let heard = (deliveredTo[transaction.transactionId] ?? []).sorted()
                        progress(
                            "problem: transaction \(transaction.transactionId) \(transaction.productId) paid by \(payer), the device heard delivered to \(heard), the server holds: \(raw)"
                        )
                    }
                }
            }

            // Per Apple ID, as the server holds it: the device's accounts' balances and
            // entitlements together against what was paid.
            var account = CustomerInfo(accountId: device.accountId)
            for accountId in device.accounts {
                let view = try await accountView(accountId)
                for (currency, amount) in view.balances { account.balances[currency, default: 0] += amount }
                account.entitlements += view.entitlements
            }
            for (key, value) in record.paid {
                if case .amount(let amount) = value {
                    let held = account.balances[key] ?? 0
                    if held > amount { surplus[device.accountId, default: 0] += 1 }
                    if held < amount { deficit[device.accountId, default: 0] += 1 }
                }
            }
            for (currency, held) in account.balances where record.paid[currency] == nil && held != 0 {
                surplus[device.accountId, default: 0] += 1
            }
            var paidEntitlements: Set<String> = []
            if case .list(let list)? = record.paid["entitlements"] { paidEntitlements = Set(list) }
            let active = Set(account.entitlements.filter(\.active).map(\.id))
            if !active.subtracting(paidEntitlements).isEmpty { surplus[device.accountId, default: 0] += 1 }
            if !paidEntitlements.subtracting(active).isEmpty { deficit[device.accountId, default: 0] += 1 }
        }
        // What the per-transaction view missed: a surplus where another account lacks something
        // is misattribution; a surplus alone is a double delivery; a deficit alone a loss.
        let deficits = deficit.values.reduce(0, +)
        let surpluses = surplus.values.reduce(0, +)
        if report.misattributed == 0, surpluses > 0, deficits > 0 { report.misattributed += min(surpluses, deficits) }
        if report.doubled == 0, surpluses > deficits { report.doubled += surpluses - deficits }
        if report.lost == 0, deficits > surpluses { report.lost += deficits - surpluses }
        report.productMismatches = try await productMismatches(among: runTransactions)
        report.requestsPerPurchase =
            report.purchases == 0 ? 0 : (Double(requests) / Double(report.purchases) * 100).rounded() / 100
        return report
    }

    /// Whether the server's order was paid by this transaction (`GET /v1/orders/{id}`).
    func orderPaid(_ orderId: String, by transactionId: String) async throws -> Bool {
        var base = options.server.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base + "/v1/orders/" + LocalStoreControl.path(orderId)) else { return false }
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.setValue("Bearer \(options.key)", forHTTPHeaderField: "Authorization")
        let (data, response) = try await AsyncHTTPTransport().send(request)
        guard response.statusCode == 200,
            let order = try JSONSerialization.jsonObject(with: data) as? [String: Any]
        else { return false }
        let status = order["status"] as? String
        return order["transactionId"] as? String == transactionId && (status == "delivered" || status == "refunded")
    }

    /// The server's `product_mismatch` anomalies about these transactions (every page).
    func productMismatches(among transactions: Set<String>) async throws -> Int {
        struct Page: Decodable {
            struct Anomaly: Decodable {
                var kind: String
                var transactionId: String?
            }
            var anomalies: [Anomaly]
            var nextCursor: String?
        }
        var base = options.server.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        var count = 0
        var after: String?
        repeat {
            var components = URLComponents(string: base + "/v1/anomalies")!
            components.queryItems = [URLQueryItem(name: "limit", value: "1000")]
            if let after { components.queryItems?.append(URLQueryItem(name: "after", value: after)) }
            var request = URLRequest(url: components.url!, timeoutInterval: 30)
            request.setValue("Bearer \(options.key)", forHTTPHeaderField: "Authorization")
            let (data, response) = try await AsyncHTTPTransport().send(request)
            guard response.statusCode == 200 else {
                throw LocalStoreControl.Failure(description: "GET /v1/anomalies: \(response.statusCode)")
            }
            let page = try JSONDecoder().decode(Page.self, from: data)
            count +=
                page.anomalies.filter {
                    $0.kind == "product_mismatch" && $0.transactionId.map(transactions.contains) == true
                }.count
            after = page.nextCursor
        } while after != nil
        return count
    }

    /// `GET /v1/transactions/{id}`: the account the server delivered it to, and the answer's
    /// text (at most 1,500 characters) or its status.
    func serverRecord(_ transactionId: String) async throws -> (accountId: String?, raw: String) {
        var base = options.server.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base + "/v1/transactions/" + LocalStoreControl.path(transactionId)) else {
            return (nil, "bad id")
        }
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.setValue("Bearer \(options.key)", forHTTPHeaderField: "Authorization")
        let (data, response) = try await AsyncHTTPTransport().send(request)
        let raw = "\(response.statusCode) " + String(decoding: data.prefix(1500), as: UTF8.self)
        guard response.statusCode == 200, let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        else { return (nil, raw) }
        let account = (object["account"] as? [String: Any])?["accountId"] as? String ?? object["accountId"] as? String
        return (account, raw)
    }

    func accountView(_ accountId: String) async throws -> CustomerInfo {
        var base = options.server.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base + "/v1/accounts/" + LocalStoreControl.path(accountId)) else {
            throw LocalStoreControl.Failure(description: "bad account id \(accountId)")
        }
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.setValue("Bearer \(options.key)", forHTTPHeaderField: "Authorization")
        let (data, response) = try await AsyncHTTPTransport().send(request)
        guard response.statusCode == 200 else {
            throw LocalStoreControl.Failure(
                description: "GET /v1/accounts/\(accountId): \(String(decoding: data, as: UTF8.self))")
        }
        return try JSONDecoder().decode(CustomerInfo.self, from: data)
    }
}
