import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import ArgumentParser
import Crypto
import Foundation
import Synchronization

/// `storekeeper bench`: verification throughput as ratios to raw P-256 verification measured
/// in the same run, and app-receipt cost by size. Run it in release:
/// `swift run -c release storekeeper bench`.
struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Benchmark verification (JWS with and without the chain cache, app receipts) on this machine."
    )

    @Option(help: "Seconds per throughput measurement.")
    var seconds: Double = 3

    @Flag(help: "Measure end-to-end POST /v1/purchases (real server, HTTP, database) instead.")
    var purchases = false

    @Flag(
        help:
            "With --purchases: then nginx answering a fixed 503 on this machine, same load generator and requests: every answer's p50/p99 beside nginx's."
    )
    var besideNginx = false

    @Option(help: "With --purchases: app_store (default), google_play or stripe (beside the App Store, same run).")
    var store: String = "app_store"

    @Option(parsing: .upToNextOption, help: "With --purchases: concurrency levels.")
    var concurrency: [Int] = [1, 16, 64, 256]

    @Option(help: "With --purchases: requests per concurrency level.")
    var requests: Int = 3000

    @Option(name: .customLong("database-url"), help: "With --purchases: database (default: a temporary SQLite file).")
    var databaseURL: String?

    @Option(
        parsing: .upToNextOption,
        help: ArgumentHelp(
            "With --purchases: instead of one in-process server, N `storekeeper serve` processes behind nginx (scripts/cluster) on --database-url (PostgreSQL), for each N given; also measures account reads."
        ))
    var instances: [Int] = []

    @Option(help: "With --instances: the storekeeper binary the instances run. Default: this one.")
    var binary: String?

    @Option(
        name: .customLong("cluster-script"),
        help: "With --instances: scripts/cluster. Default: found beside the package.")
    var clusterScript: String?

    @Option(
        name: .customLong("load-generator"),
        help: "With --purchases: lean (raw keep-alive HTTP/1.1, default) or async-http-client.")
    var loadGenerator: PurchaseBench.LoadGeneratorKind = .lean

    @Option(
        name: .customLong("max-in-flight"),
        help: "With --purchases: the server's limits.maxInFlightRequests (requests above it are shed, 503 overloaded).")
    var maxInFlight: Int?

    @Option(
        name: .customLong("restart-command"),
        help: ArgumentHelp(
            "With --purchases: a shell command run 1 s into each level (say, a database restart); reports how long deliveries took to resume."
        ))
    var restartCommand: String?

    @Flag(
        help: ArgumentHelp(
            "Measure App Store Server Notifications end to end instead: --requests renewals at --senders, then --notification-rate a second for --steady-seconds."
        ))
    var notifications = false

    @Flag(
        help: ArgumentHelp(
            "Measure Apple's Get Retention Message (POST /v1/retention/apple) end to end instead, beside GET /healthz: --requests at --senders."
        ))
    var retention = false

    @Flag(
        help: ArgumentHelp(
            "Measure GET /v1/accounts/{id} and balance debits end to end instead, beside GET /healthz: --requests each at --senders."
        ))
    var accounts = false

    @Flag(
        help: ArgumentHelp(
            "Measure the dashboard's overview and every analytics metric over --transactions deliveries instead (each must answer in under a second)."
        ))
    var analytics = false

    @Option(help: "With --analytics or --replica-reads: how many deliveries to write first.")
    var transactions: Int = 1_000_000

    @Flag(
        name: .customLong("replica-reads"),
        help: ArgumentHelp(
            "Measure analytics and exports under write load without and with a read replica (--database-url, --replica-url; --requests purchases at the first --concurrency)."
        ))
    var replicaReads = false

    @Option(name: .customLong("replica-url"), help: "With --replica-reads: the streaming replica's URL.")
    var replicaURL: String?

    @Option(help: "With --notifications, --retention or --accounts: concurrent senders.")
    var senders: Int = 64

    @Option(name: .customLong("notification-rate"), help: "With --notifications: the steady rate (per second).")
    var notificationRate: Int = 1000

    @Option(name: .customLong("steady-seconds"), help: "With --notifications: how long the steady rate lasts.")
    var steadySeconds: Int = 10

    @Flag(
        name: .customLong("without-app-transaction-ids"),
        help:
            "With --purchases: sign transactions without appTransactionId (to measure what recording Apple Accounts costs)."
    )
    var withoutAppTransactionIds = false

    @Flag(help: "Only measure cached JWS verification (for profilers).")
    var onlyCached = false

    @Flag(help: "Also time the parts of a verification.")
    var breakdown = false

    @Option(parsing: .upToNextOption, help: "Receipt sizes (in-app purchases) to measure.")
    var receiptSizes: [Int] = [1, 100, 10_000]

    func run() async throws {
        if !instances.isEmpty, !purchases { throw ValidationError("--instances goes with --purchases") }
        if replicaReads {
            guard let databaseURL, databaseURL.hasPrefix("postgres"), let replicaURL else {
                throw ValidationError("--replica-reads needs --database-url postgres://… and --replica-url")
            }
            guard transactions >= 0, requests > 0, let first = concurrency.first, first > 0 else {
                throw ValidationError("--transactions, --requests and --concurrency must be positive")
            }
            try await ReplicaBench(
                databaseURL: databaseURL, replicaURL: replicaURL, transactions: transactions, concurrency: first,
                requests: requests
            ).run()
            return
        }
        if analytics {
            guard transactions > 0 else { throw ValidationError("--transactions must be positive") }
            try await AnalyticsBench(databaseURL: databaseURL, transactions: transactions).run()
            return
        }
        if accounts {
            guard requests > 0, senders > 0 else { throw ValidationError("--requests and --senders must be positive") }
            try await AccountBench(databaseURL: databaseURL, concurrency: senders, count: requests).run()
            return
        }
        if retention {
            guard requests > 0, senders > 0 else { throw ValidationError("--requests and --senders must be positive") }
            try await RetentionBench(databaseURL: databaseURL, concurrency: senders, count: requests).run()
            return
        }
        if notifications {
            guard requests > 0, senders > 0, notificationRate > 0, steadySeconds >= 0 else {
                throw ValidationError("--requests, --senders and --notification-rate must be positive")
            }
            try await NotificationBench(
                databaseURL: databaseURL, concurrency: senders, count: requests, rate: notificationRate,
                seconds: steadySeconds
            ).run()
            return
        }
        if purchases, store == "google_play" {
            guard requests > 0, concurrency.allSatisfy({ $0 > 0 }) else {
                throw ValidationError("--requests and --concurrency must be positive")
            }
            try await GooglePlayBench(databaseURL: databaseURL, concurrencies: concurrency, requestsPerLevel: requests)
                .run()
            return
        }
        if purchases, store == "stripe" {
            guard requests > 0, concurrency.allSatisfy({ $0 > 0 }) else {
                throw ValidationError("--requests and --concurrency must be positive")
            }
            try await StripeBench(databaseURL: databaseURL, concurrencies: concurrency, requestsPerLevel: requests)
                .run()
            return
        }
        if store != "app_store" { throw ValidationError("--store is app_store, google_play or stripe") }
        if purchases, !instances.isEmpty {
            guard requests > 0, concurrency.allSatisfy({ $0 > 0 }), instances.allSatisfy({ (1...16).contains($0) })
            else {
                throw ValidationError("--requests and --concurrency must be positive, --instances 1…16")
            }
            guard let databaseURL, databaseURL.hasPrefix("postgres://") || databaseURL.hasPrefix("postgresql://")
            else {
                throw ValidationError(
                    "--instances needs --database-url postgres://… (the instances share one database)")
            }
            guard let script = clusterScript ?? ChaosCommand.findClusterScript(),
                FileManager.default.isExecutableFile(atPath: script)
            else {
                FileHandle.standardError.write(Data("bench: scripts/cluster not found (give --cluster-script)\n".utf8))
                throw ExitCode(69)
            }
            guard Cluster.nginxInstalled else {
                FileHandle.standardError.write(Data("bench: nginx is not installed (apt-get install nginx)\n".utf8))
                throw ExitCode(69)
            }
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "storekeeper-cluster-bench-\(UUID().uuidString.prefix(8))")
            // Kept when the bench fails: the instances' and nginx's logs are in it.
            try await ClusterBench(
                databaseURL: databaseURL, instances: instances, concurrencies: concurrency, requestsPerLevel: requests,
                binary: binary ?? ChaosCommand.ownBinary(), script: script, directory: directory
            ).run()
            try? FileManager.default.removeItem(at: directory)
            return
        }
        if purchases {
            guard requests > 0, concurrency.allSatisfy({ $0 > 0 }) else {
                throw ValidationError("--requests and --concurrency must be positive")
            }
            guard maxInFlight.map({ $0 > 0 }) ?? true else { throw ValidationError("--max-in-flight must be positive") }
            try await PurchaseBench(
                databaseURL: databaseURL, concurrencies: concurrency, requestsPerLevel: requests,
                loadGenerator: loadGenerator, appTransactionIds: !withoutAppTransactionIds, maxInFlight: maxInFlight,
                besideNginx: besideNginx, restartCommand: restartCommand
            ).run()
            return
        }
        let pki = try ApplePKI.generate(name: "Bench")
        let signedDate: Int64 = 1_767_225_605_000
        let transaction = JWSTransactionDecodedPayload(
            transactionId: "2000000000000001", originalTransactionId: "2000000000000001",
            bundleId: "com.example.app", productId: "coins_60", purchaseDate: signedDate, quantity: 1,
            type: .consumable, inAppOwnershipType: .purchased, signedDate: signedDate, environment: .production,
            storefront: "USA", storefrontId: "143441", transactionReason: .purchase, currency: "USD", price: 990)
        // Distinct transactions, as a server sees them: nothing but the chain repeats.
        let pool = try (0..<256).map { index -> String in
            var payload = transaction
            payload.transactionId = String(2_000_000_000_000_000 + index)
            payload.originalTransactionId = payload.transactionId
            return try pki.jwsSigner.sign(payload)
        }
        let jws = pool[0]
        let configuration = VerificationConfiguration(
            trustedRoots: [pki.root.derBytes], bundleId: "com.example.app", environments: [.production])
        let cached = try SignedDataVerifier(configuration)
        var uncachedConfiguration = configuration
        uncachedConfiguration.chainCacheCapacity = 0
        let uncached = try SignedDataVerifier(uncachedConfiguration)

        // Baseline: one ES256 verification of the very bytes each JWS signs.
        let parts = jws.split(separator: ".")
        let signed = try pool.map { jws -> ([UInt8], P256.Signing.ECDSASignature) in
            let parts = jws.split(separator: ".")
            return (
                Array("\(parts[0]).\(parts[1])".utf8),
                try P256.Signing.ECDSASignature(rawRepresentation: Self.base64URLDecode(String(parts[2])))
            )
        }
        let publicKey = pki.leaf.privateKey.publicKey
        let cursor = Cursor(count: pool.count)

        print("# StoreKeeper verification benchmark")
        print("")
        print(
            "machine: \(Self.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores; \(seconds) s per figure"
        )
        print("")

        // Baseline and cached verification alternate in rounds (median of each), so drift in
        // the machine's speed affects both alike.
        let (raw, warm) = try await measurePair(
            {
                let (input, signature) = signed[cursor.next()]
                precondition(publicKey.isValidSignature(signature, for: input))
            },
            { _ = try await cached.verifyTransaction(pool[cursor.next()]) })
        let cold = try await measure { _ = try await uncached.verifyTransaction(pool[cursor.next()]) }
        let parallel = try await measureParallel(tasks: ProcessInfo.processInfo.activeProcessorCount) {
            _ = try await cached.verifyTransaction(pool[cursor.next()])
        }
        let rawParallel = try await measureParallel(tasks: ProcessInfo.processInfo.activeProcessorCount) {
            let (input, signature) = signed[cursor.next()]
            precondition(publicKey.isValidSignature(signature, for: input))
        }

        if onlyCached {
            let rate = try await measure { _ = try await cached.verifyTransaction(pool[cursor.next()]) }
            print("cached JWS verification: \(String(format: "%.1f", 1e6 / rate)) µs")
            return
        }
        if breakdown {
            let payloadBytes = Data(Self.base64URLDecode(String(parts[1])))
            let headerBytes = Data(Self.base64URLDecode(String(parts[0])))
            let payloadDecode = try await measure {
                _ = try JSONDecoder().decode(JWSTransactionDecodedPayload.self, from: payloadBytes)
            }
            let headerDecode = try await measure {
                _ = try JSONDecoder().decode(JWSDecodedHeader.self, from: headerBytes)
            }
            let serialization = try await measure { _ = try JSONSerialization.jsonObject(with: payloadBytes) }
            let payloadArray = [UInt8](payloadBytes)
            let fastParse = try await measure { _ = try FastJSON.parse(payloadArray) }
            let fastDecode = try await measure { _ = try JWSTransactionDecodedPayload.decode(json: payloadArray) }
            let copy = try await measure { _ = Array(jws.utf8) }
            print(
                "breakdown µs: FastJSON.parse \(1e6 / fastParse), fast decode \(1e6 / fastDecode), utf8 copy \(1e6 / copy)"
            )
            print(
                "breakdown µs: payload JSONDecoder \(1e6 / payloadDecode), header JSONDecoder \(1e6 / headerDecode), payload JSONSerialization \(1e6 / serialization)"
            )
        }
        print("| measurement (one core unless noted) | ops/s | µs/op | ratio |")
        print("|---|---:|---:|---:|")
        row("raw ES256 verify, swift-crypto (baseline)", raw, baseline: raw)
        row("JWS transaction, verified-chain cache (steady state)", warm, baseline: raw)
        row("JWS transaction, full chain every time (Apple's library offline)", cold, baseline: raw)
        row("raw ES256 verify, all cores", rawParallel, baseline: rawParallel)
        row("JWS transaction with cache, all cores", parallel, baseline: rawParallel)
        print("")
        print(String(format: "cache speed-up over full chain verification: %.1f×", warm / cold))
        print(String(format: "cached JWS verification per core vs raw ES256: %.2f (target ≥ 0.8)", warm / raw))
        print("")

        guard let receiptSigner = pki.receiptSigner, let receiptRoot = pki.receiptRoot else { return }
        let receiptVerifier = try AppReceiptVerifier(
            trustedRoots: [receiptRoot.derBytes], bundleId: "com.example.app", environments: [.production])
        print("| app receipt | bytes | parse + verify (median) | purchases/s | peak memory above baseline |")
        print("|---|---:|---:|---:|---:|")
        for size in receiptSizes {
            let receipt = Self.receipt(purchases: size)
            let bytes = try receiptSigner.sign(receipt)
            _ = try await receiptVerifier.verify(bytes)  // warm-up
            let runs = size >= 10_000 ? 5 : 25
            var timings: [Double] = []
            var peak = 0
            for _ in 0..<runs {
                let before = Memory.resetPeak()
                let start = ContinuousClock.now
                let parsed = try await receiptVerifier.verify(bytes)
                timings.append(Self.seconds(ContinuousClock.now - start))
                peak = max(peak, Memory.peak() - before)
                precondition(parsed.inAppPurchases.count == size)
            }
            let median = timings.sorted()[timings.count / 2]
            print(
                "| \(size) in-app | \(bytes.count) | \(String(format: "%.2f ms", median * 1000)) | "
                    + "\(String(format: "%.0f", Double(size) / median)) | \(Memory.format(peak)) |")
        }
    }

    private func row(_ name: String, _ opsPerSecond: Double, baseline: Double) {
        print(
            "| \(name) | \(String(format: "%.0f", opsPerSecond)) | \(String(format: "%.1f", 1e6 / opsPerSecond)) | "
                + "\(String(format: "%.2f", opsPerSecond / baseline)) |")
    }

    private func measurePair(
        _ first: () async throws -> Void, _ second: () async throws -> Void, rounds: Int = 7
    ) async throws -> (Double, Double) {
        var firsts: [Double] = []
        var seconds: [Double] = []
        for _ in 0..<rounds {
            firsts.append(try await measure(first, for: self.seconds / Double(rounds)))
            seconds.append(try await measure(second, for: self.seconds / Double(rounds)))
        }
        return (firsts.sorted()[rounds / 2], seconds.sorted()[rounds / 2])
    }

    private func measure(_ body: () async throws -> Void, for duration: Double? = nil) async throws -> Double {
        for _ in 0..<200 { try await body() }  // warm-up: caches, allocator
        let deadline = ContinuousClock.now + .milliseconds(Int64((duration ?? seconds) * 1000))
        let start = ContinuousClock.now
        var count = 0
        while ContinuousClock.now < deadline {
            for _ in 0..<64 { try await body() }
            count += 64
        }
        return Double(count) / Self.seconds(ContinuousClock.now - start)
    }

    private func measureParallel(tasks: Int, _ body: @escaping @Sendable () async throws -> Void) async throws -> Double
    {
        let duration = Duration.milliseconds(Int64(seconds * 1000))
        let start = ContinuousClock.now
        let total = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<tasks {
                group.addTask {
                    let deadline = ContinuousClock.now + duration
                    var count = 0
                    while ContinuousClock.now < deadline {
                        for _ in 0..<64 { try await body() }
                        count += 64
                    }
                    return count
                }
            }
            return try await group.reduce(0, +)
        }
        return Double(total) / Self.seconds(ContinuousClock.now - start)
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    static func base64URLDecode(_ text: String) -> Data {
        Data(Base64.decodeURL(text) ?? [])
    }

    static func receipt(purchases: Int) -> AppReceipt {
        let created = Date(timeIntervalSince1970: 1_767_225_600)
        var items: [AppReceiptInAppPurchase] = []
        items.reserveCapacity(purchases)
        for index in 0..<purchases {
            let id = String(2_000_000_000_000_000 + index)
            var item = AppReceiptInAppPurchase(quantity: 1, productId: "coins_60", transactionId: id)
            item.purchaseDate = created
            item.originalTransactionId = id
            item.originalPurchaseDate = created
            item.webOrderLineItemId = String(1_000_000 + index)
            item.isTrialPeriod = false
            item.isInIntroOfferPeriod = false
            items.append(item)
        }
        var receipt = AppReceipt(inAppPurchases: items)
        receipt.receiptType = "Production"
        receipt.bundleId = "com.example.app"
        receipt.applicationVersion = "1"
        receipt.opaqueValue = Array(repeating: 1, count: 16)
        receipt.sha1Hash = Array(repeating: 2, count: 20)
        receipt.creationDate = created
        receipt.originalApplicationVersion = "1.0"
        return receipt
    }

    static func machine() -> String {
        guard let cpuinfo = try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8),
            let line = cpuinfo.split(separator: "\n").first(where: { $0.hasPrefix("model name") }),
            let name = line.split(separator: ":", maxSplits: 1).last
        else { return "unknown CPU" }
        return name.trimmingCharacters(in: .whitespaces)
    }
}

/// Round-robin over the pool, shared by the parallel measurements.
final class Cursor: Sendable {
    private let position = Atomic<Int>(0)
    let count: Int
    init(count: Int) { self.count = count }
    func next() -> Int { position.wrappingAdd(1, ordering: .relaxed).newValue % count }
}

/// Peak resident memory on Linux: VmHWM, reset through /proc/self/clear_refs.
enum Memory {
    /// Resets the high-water mark and returns the current resident size.
    static func resetPeak() -> Int {
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
        return field("VmRSS")
    }

    static func peak() -> Int { field("VmHWM") }

    private static func field(_ name: String) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") })
        else { return 0 }
        let kilobytes = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
        return kilobytes * 1024
    }

    static func format(_ bytes: Int) -> String {
        bytes >= 1 << 20 ? String(format: "%.1f MiB", Double(bytes) / 1_048_576) : "\(bytes / 1024) KiB"
    }
}
