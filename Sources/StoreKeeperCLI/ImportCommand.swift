import ArgumentParser
import Foundation
import StoreKeeperServer

/// `storekeeper import`: backfill purchases made before StoreKeeper from the App Store Server
/// API (Transaction History v2), per account.
struct ImportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Backfill purchases from the App Store Server API for accounts of another system.",
        discussion: """
            Give a CSV of accountId,originalTransactionId (--csv, a header line is allowed), or \
            original transaction ids and one account (--account A --original-transaction-id ID …). \
            Every transaction of each original transaction's history is verified and delivered to \
            its account, exactly once: a rerun changes nothing, and a purchase another account owns \
            becomes an ownership_conflict anomaly. Resumable: the number of rows done is saved after \
            each row (--checkpoint, default FILE.checkpoint for a CSV), and a rerun continues after \
            it. Apple's 429 answers are waited out (Retry-After); 5xx answers are retried with backoff \
            up to --max-retries, then the import stops, to be resumed by running it again. Exit \
            status: 0 done, 1 done but some rows were invalid or unknown to Apple, 2 configuration \
            problem, 3 stopped early (Apple unavailable; run again to resume), 64 invalid options.
            """)

    @Option(help: "Configuration file (JSON or YAML), as given to serve.") var config: String?
    @Option(name: .customLong("data-dir"), help: "Where demo mode keeps the local App Store's keys.")
    var dataDirectory: String = "storekeeper-data"
    @Option(help: "CSV file: accountId,originalTransactionId per line.") var csv: String?
    @Option(
        help: ArgumentHelp(
            "A RevenueCat Transactions export (Scheduled Data Exports, CSV): its App Store rows are imported from Apple's history.",
            valueName: "file"))
    var revenuecat: String?
    @Option(
        name: .customLong("account-column"),
        help:
            "With --revenuecat: the column holding your account id (rc_last_seen_app_user_id_alias or rc_original_app_user_id)."
    )
    var accountColumn: String = "rc_last_seen_app_user_id_alias"
    @Option(help: "The account for --original-transaction-id.") var account: String?
    @Option(name: .customLong("original-transaction-id"), help: "An original transaction id (repeatable).")
    var originalTransactionIds: [String] = []
    @Option(help: "Checkpoint file (default: the CSV's path + .checkpoint).") var checkpoint: String?
    @Flag(help: "Ignore the checkpoint and start from the first row.") var restart = false
    @Option(name: .customLong("max-retries"), help: "Retries of a 5xx or timeout before stopping (default 5).")
    var maxRetries: Int = 5
    @Flag(help: "Print the report as JSON.") var json = false

    func validate() throws {
        guard [csv != nil, revenuecat != nil, !originalTransactionIds.isEmpty].filter({ $0 }).count == 1 else {
            throw ValidationError("give one of --csv, --revenuecat or --original-transaction-id (with --account)")
        }
        guard ["rc_last_seen_app_user_id_alias", "rc_original_app_user_id"].contains(accountColumn) else {
            throw ValidationError("--account-column must be rc_last_seen_app_user_id_alias or rc_original_app_user_id")
        }
        if !originalTransactionIds.isEmpty, account == nil {
            throw ValidationError("--original-transaction-id needs --account")
        }
        guard (0...100).contains(maxRetries) else { throw ValidationError("--max-retries must be 0…100") }
    }

    func run() async throws {
        var rows: [Importer.Row]
        var invalid: [String]
        var skipped: [String: Int] = [:]
        if let revenuecat {
            guard let data = FileManager.default.contents(atPath: revenuecat) else {
                throw ValidationError("cannot read \(revenuecat)")
            }
            let export = Importer.parseRevenueCat(String(decoding: data, as: UTF8.self), accountColumn: accountColumn)
            (rows, invalid, skipped) = (export.rows, export.invalid, export.skipped)
        } else if let csv {
            guard let data = FileManager.default.contents(atPath: csv) else {
                throw ValidationError("cannot read \(csv)")
            }
            (rows, invalid) = Importer.parseCSV(String(decoding: data, as: UTF8.self))
        } else {
            let lines = originalTransactionIds.map { "\(account ?? ""),\($0)" }.joined(separator: "\n")
            (rows, invalid) = Importer.parseCSV(lines)
        }
        let checkpointPath = checkpoint ?? (csv ?? revenuecat).map { $0 + ".checkpoint" }
        var start = 0
        if let checkpointPath, !restart, let saved = FileManager.default.contents(atPath: checkpointPath) {
            start = Int(String(decoding: saved, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        }
        let animated = isatty(STDERR_FILENO) != 0 && !json
        let maxRetries = self.maxRetries
        let report: Importer.Report
        do {
            report = try await ConfigurationErrors.withApp(config: config, dataDirectory: dataDirectory) { app in
                try await Importer(app: app, maxRetries: maxRetries).run(
                    rows, checkpoint: start,
                    saveCheckpoint: { done in
                        guard let checkpointPath else { return }
                        try Data("\(done)\n".utf8).write(to: URL(fileURLWithPath: checkpointPath), options: .atomic)
                    },
                    progress: { done, total in
                        let line = "import \(LiveView.bar(done, total))"
                        if animated {
                            FileHandle.standardError.write(Data("\r\u{1B}[2K\(line)".utf8))
                        } else if done == total || total < 20 || done % max(1, total / 10) == 0 {
                            FileHandle.standardError.write(Data("\(line)\n".utf8))
                        }
                    })
            }
        } catch let error as Importer.NotConfigured {
            FileHandle.standardError.write(Data("storekeeper: \(error)\n".utf8))
            throw ExitCode(2)
        }
        if animated { FileHandle.standardError.write(Data("\n".utf8)) }
        var shown = report
        shown.invalidRows = invalid + report.invalidRows
        shown.skippedRows = skipped
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
            print(String(decoding: try encoder.encode(shown), as: UTF8.self))
        } else {
            print(
                """
                rows \(shown.rows) (\(shown.rowsSkipped) done before, \(shown.rowsDone) now) · imported \(shown.transactionsImported) · already known \(shown.alreadyKnown) · conflicts → anomalies \(shown.conflicts) · revoked \(shown.revoked)
                invalid rows \(shown.invalidRows.count) · unknown to Apple \(shown.notFound.count) · rate-limited waits \(shown.rateLimitedWaits) · retries \(shown.retries)
                """)
            for (reason, count) in shown.skippedRows.sorted(by: { $0.key < $1.key }) {
                print("  left out: \(count) \(reason) row\(count == 1 ? "" : "s")")
            }
            for line in shown.invalidRows { print("  invalid: \(line)") }
            for id in shown.notFound { print("  unknown to Apple: \(id)") }
            if let line = shown.stoppedAtLine {
                print("stopped at line \(line): \(shown.error ?? "") — run the same command again to resume")
            }
        }
        if !shown.complete { throw ExitCode(3) }
        if !shown.invalidRows.isEmpty || !shown.notFound.isEmpty { throw ExitCode(1) }
    }
}
