import AppStoreModels
import ArgumentParser
import AsyncHTTPClient
import Foundation
import Hummingbird
import LocalAppStore
import NIOCore
import SQLKit
import StoreKeeperCatalog
import StoreKeeperSimulator
import StoreKeeperStorage
import Synchronization

/// `storekeeper chaos` (run by `scripts/chaos`): runs after runs of load against two
/// `storekeeper serve` instances on one PostgreSQL behind nginx (`scripts/cluster`), breaks one
/// thing at a random moment of each, lets the system settle, then checks Apple's record (the
/// local App Store's) against StoreKeeper's: 0 lost, 0 doubled, every balance equal to its ledger.
struct ChaosCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "chaos",
        abstract: "Load + one random fault per run against two instances; then check nothing was lost or doubled.",
        discussion: """
            Each run: a fresh database on the PostgreSQL server of --database-url, a local App Store in \
            this process (Apple: customers pay, subscriptions renew, refunds happen, notifications are \
            sent), a webhook receiver in this process, and two `storekeeper serve` instances behind \
            nginx (scripts/cluster). Load: purchases (order → pay → submit, retried as StoreKeeperKit \
            retries), subscriptions renewing, refunds, refund requests (Apple's CONSUMPTION_REQUEST, \
            answered from a job), debits. Faults, one per run: SIGKILL an instance \
            (restarted 2 s later), restart PostgreSQL (--postgres-cluster), take the local App Store \
            down (Server API 503 and notifications dropped), make the webhook receiver fail. Settling: \
            the app resubmits what it never saw acknowledged, `storekeeper reconcile` runs, queues drain. \
            Exit 0 when every run is clean, 1 when any check failed, 64 for bad options, 69 when nginx \
            or scripts/cluster is missing.
            """
    )

    @Option(
        name: .customLong("database-url"),
        help: "A PostgreSQL server (postgres://…); each run creates its own database on it.")
    var databaseURL: String

    @Option(
        name: .customLong("postgres-cluster"),
        help:
            "The Debian cluster behind --database-url (\"15 main\"), restarted by the PostgreSQL fault. Without it that fault is not drawn."
    )
    var postgresCluster: String?

    @Option(help: "How many runs.")
    var runs: Int = 20

    @Option(help: "Seconds of load per run.")
    var seconds: Double = 15

    @Option(help: "Random seed (faults, their moments): the same seed draws the same faults.")
    var seed: UInt64?

    @Option(help: "Only this fault, every run: kill, postgres, apple, webhooks.")
    var fault: String?

    @Flag(
        name: .customLong("each-fault"),
        help: "Take the faults in turn instead of drawing them (a short run covering each).")
    var eachFault = false

    @Option(name: .customLong("dir"), help: "Working directory (configuration, logs). Default: a temporary one.")
    var directory: String?

    @Option(help: "The storekeeper binary the instances run. Default: this one.")
    var binary: String?

    @Option(name: .customLong("cluster-script"), help: "scripts/cluster. Default: found beside the package.")
    var clusterScript: String?

    @Flag(help: "Print the results as JSON.")
    var json = false

    func validate() throws {
        guard databaseURL.hasPrefix("postgres://") || databaseURL.hasPrefix("postgresql://") else {
            throw ValidationError("--database-url must be a postgres:// URL (several instances share one database)")
        }
        guard (1...1000).contains(runs) else { throw ValidationError("--runs must be 1…1000") }
        guard seconds >= 3, seconds <= 600 else { throw ValidationError("--seconds must be 3…600") }
        if let fault, ChaosFault(rawValue: fault) == nil {
            throw ValidationError("--fault must be one of kill, postgres, apple, webhooks")
        }
        if fault == "postgres", postgresCluster == nil {
            throw ValidationError("--fault postgres needs --postgres-cluster")
        }
    }

    func run() async throws {
        let script = clusterScript ?? Self.findClusterScript()
        guard let script, FileManager.default.isExecutableFile(atPath: script) else {
            FileHandle.standardError.write(Data("chaos: scripts/cluster not found (give --cluster-script)\n".utf8))
            throw ExitCode(69)
        }
        guard Cluster.nginxInstalled else {
            FileHandle.standardError.write(Data("chaos: nginx is not installed (apt-get install nginx)\n".utf8))
            throw ExitCode(69)
        }
        let root =
            directory.map { URL(fileURLWithPath: $0) }
            ?? FileManager.default.temporaryDirectory.appendingPathComponent(
                "storekeeper-chaos-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        let seed = self.seed ?? UInt64.random(in: 1...UInt64(UInt32.max))
        var random = SeededRandom(seed: seed)
        let faults: [ChaosFault] =
            fault.flatMap(ChaosFault.init(rawValue:)).map { [$0] }
            ?? ChaosFault.allCases.filter { $0 != .postgres || postgresCluster != nil }
        let world = try ChaosWorld(
            databaseURL: databaseURL, postgresCluster: postgresCluster, root: root,
            binary: binary ?? Self.ownBinary(), script: script, seconds: seconds, quiet: json)
        var results: [ChaosRunResult] = []
        if !json {
            FileHandle.standardOutput.write(
                Data("chaos: \(runs) runs of \(Int(seconds)) s, seed \(seed), in \(root.path)\n".utf8))
        }
        for index in 1...runs {
            let draw = random.below(faults.count)
            let chosen = eachFault ? faults[(index - 1) % faults.count] : faults[draw]
            let moment = 0.2 + Double(random.next() % 1000) / 1000 * 0.5
            let result = await world.run(index, fault: chosen, at: moment, seed: random.next())
            results.append(result)
            // One line per run as it ends, unbuffered, even into a file or a pipe.
            if !json { FileHandle.standardOutput.write(Data((result.line + "\n").utf8)) }
        }
        let summary = ChaosSummary(seed: seed, runs: results)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(summary), as: UTF8.self))
        } else {
            print(summary.text)
        }
        if !summary.clean { throw ExitCode(1) }
    }

    static func ownBinary() -> String {
        URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL.resolvingSymlinksInPath().path
    }

    /// scripts/cluster of the checkout this binary was built in (.build/…/storekeeper), or of
    /// the current directory.
    static func findClusterScript() -> String? {
        var url = URL(fileURLWithPath: ownBinary()).deletingLastPathComponent()
        for _ in 0..<6 {
            let candidate = url.appendingPathComponent("scripts/cluster")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate.path }
            url = url.deletingLastPathComponent()
        }
        let local = FileManager.default.currentDirectoryPath + "/scripts/cluster"
        return FileManager.default.isExecutableFile(atPath: local) ? local : nil
    }
}

enum ChaosFault: String, CaseIterable, Codable, Sendable {
    /// SIGKILL one instance mid-load; restarted 2 s later.
    case kill
    /// `pg_ctlcluster … restart` under load.
    case postgres
    /// The local App Store down for 3 s: Server API 503, notifications dropped.
    case apple
    /// The webhook receiver answers 500 for 4 s.
    case webhooks
}

struct ChaosRunResult: Codable, Sendable {
    var run: Int
    var fault: ChaosFault
    var faultAtSeconds: Double
    var paid: Int = 0
    var delivered: Int = 0
    var lost: Int = 0
    var doubled: Int = 0
    var renewals: Int = 0
    var refunds: Int = 0
    var debits: Int = 0
    var notificationsSent: Int = 0
    var notificationsApplied: Int = 0
    var subscriptions: Int = 0
    var subscriptionMismatches: Int = 0
    var balanceMismatches: Int = 0
    var webhookEvents: Int = 0
    var webhookEventsMissing: Int = 0
    var webhookRedeliveries: Int = 0
    /// Apple's CONSUMPTION_REQUESTs in the run, and how many were answered more than once.
    var consumptionRequests: Int = 0
    var consumptionAnsweredAgain: Int = 0
    /// Requests whose customer had not consented: rightly never answered.
    var consumptionWithheld: Int = 0
    /// Google Play purchases paid during the run (each checked delivered once and consumed).
    var googlePaid: Int = 0
    var settleSeconds: Double = 0
    var problems: [String] = []

    var clean: Bool {
        lost == 0 && doubled == 0 && subscriptionMismatches == 0 && balanceMismatches == 0
            && webhookEventsMissing == 0 && problems.isEmpty
    }

    var line: String {
        let verdict = clean ? "clean" : "FAILED: \(problems.prefix(3).joined(separator: "; "))"
        return String(
            format:
                "run %2d  %-9@ at %4.1f s  paid %4d (renewals %3d, Google Play %3d)  refunds %2d  debits %3d  notifications %3d  lost %d  doubled %d  subscriptions %d/%d  balances≠ledger %d  webhooks %d (+%d retried)  consumption %d (+%d again, %d withheld)  settled %.1f s  %@",
            run, fault.rawValue, faultAtSeconds, paid, renewals, googlePaid, refunds, debits, notificationsSent, lost,
            doubled,
            subscriptions - subscriptionMismatches, subscriptions, balanceMismatches, webhookEvents,
            webhookRedeliveries, consumptionRequests, consumptionAnsweredAgain, consumptionWithheld, settleSeconds,
            verdict)
    }
}

struct ChaosSummary: Codable, Sendable {
    var seed: UInt64
    var runs: [ChaosRunResult]
    var clean: Bool { runs.allSatisfy(\.clean) }

    var text: String {
        let faults = Dictionary(grouping: runs, by: \.fault).map { "\($0.key.rawValue) \($0.value.count)" }.sorted()
        let settle = runs.map(\.settleSeconds).sorted()
        let paid = runs.reduce(0) { $0 + $1.paid }
        let lost = runs.reduce(0) { $0 + $1.lost }
        let doubled = runs.reduce(0) { $0 + $1.doubled }
        return """
            \(runs.count) runs (\(faults.joined(separator: ", "))): \(paid) paid transactions, \(lost) lost, \(doubled) doubled, \
            \(runs.filter { !$0.clean }.count) runs failed; settle median \(String(format: "%.1f", settle[settle.count / 2])) s, \
            max \(String(format: "%.1f", settle.last ?? 0)) s — \(clean ? "CLEAN" : "FAILED")
            """
    }
}
