import AppStoreClient
import AppStoreModels
import Foundation
import StoreKeeperCore

/// `storekeeper import`: backfills from the App Store Server API for a team moving from
/// another system. Each row names an account and an original transaction id; that original
/// transaction's whole history (Transaction History v2, every page) is verified and delivered
/// to the account through the one delivery path, so a row already imported changes nothing
/// and a purchase another account owns becomes an `ownership_conflict` anomaly.
///
/// Resumable: after each row the number of rows done is written to the checkpoint file, and a
/// rerun starts after it. Rate-limit aware: a 429 waits for Apple's Retry-After and asks again;
/// a 5xx or timeout is retried with backoff, and after `maxRetries` the import stops (the
/// checkpoint kept) to be resumed by running the same command again.
public struct Importer: Sendable {
    public struct Row: Sendable, Equatable {
        public var line: Int
        public var accountId: String
        public var originalTransactionId: String
    }

    public struct Report: Codable, Sendable, Equatable {
        public var rows = 0
        /// Rows done by an earlier run (the checkpoint), not asked again.
        public var rowsSkipped = 0
        public var rowsDone = 0
        /// Lines that are not `accountId,originalTransactionId` (line number and why).
        public var invalidRows: [String] = []
        /// Original transaction ids neither Production nor Sandbox knows.
        public var notFound: [String] = []
        public var transactionsImported = 0
        public var alreadyKnown = 0
        /// Owned by another account: each an `ownership_conflict` anomaly.
        public var conflicts = 0
        /// Refunded or revoked by Apple: recorded by Apple, nothing to deliver.
        public var revoked = 0
        public var rateLimitedWaits = 0
        public var retries = 0
        /// Set when the import stopped before the end (Apple unavailable): resume by running again.
        public var stoppedAtLine: Int?
        public var error: String?
        public var complete: Bool { stoppedAtLine == nil }
    }

    let app: StoreKeeperApp
    let maxRetries: Int
    let sleep: @Sendable (Double) async throws -> Void

    public init(
        app: StoreKeeperApp, maxRetries: Int = 5,
        sleep: @escaping @Sendable (Double) async throws -> Void = { try await Task.sleep(for: .seconds($0)) }
    ) {
        self.app = app
        self.maxRetries = maxRetries
        self.sleep = sleep
    }

    public struct NotConfigured: Error, CustomStringConvertible {
        public var description: String {
            "import needs the App Store Server API: apple.serverAPI.issuerId, keyId and privateKeyFile"
        }
    }

    /// `accountId,originalTransactionId` per line; a header line, blank lines and `#` comments
    /// are skipped; anything else malformed is reported, never fatal.
    public static func parseCSV(_ text: String) -> (rows: [Row], invalid: [String]) {
        var rows: [Row] = []
        var invalid: [String] = []
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map {
                $0.trimmingCharacters(in: CharacterSet.whitespaces.union(CharacterSet(charactersIn: "\"")))
            }
            if index == 0, fields.first?.lowercased() == "accountid" { continue }
            guard fields.count == 2 else {
                invalid.append("line \(index + 1): expected accountId,originalTransactionId")
                continue
            }
            let (account, original) = (fields[0], fields[1])
            guard !account.isEmpty, account.count <= 128,
                !account.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
            else {
                invalid.append("line \(index + 1): accountId must be 1…128 printable characters")
                continue
            }
            guard !original.isEmpty, original.count <= 64, original.allSatisfy(\.isNumber) else {
                invalid.append("line \(index + 1): originalTransactionId must be digits")
                continue
            }
            rows.append(Row(line: index + 1, accountId: account, originalTransactionId: original))
        }
        return (rows, invalid)
    }

    /// Imports `rows` after the first `checkpoint` of them; `saveCheckpoint` is called with the
    /// number of rows done after each row, `progress` with (done, total).
    public func run(
        _ rows: [Row], checkpoint: Int, saveCheckpoint: (Int) throws -> Void,
        progress: (Int, Int) -> Void = { _, _ in }
    ) async throws -> Report {
        guard let api = app.appleAPI else { throw NotConfigured() }
        var report = Report(rows: rows.count, rowsSkipped: min(max(checkpoint, 0), rows.count))
        progress(report.rowsSkipped, rows.count)
        for index in report.rowsSkipped..<rows.count {
            let row = rows[index]
            do {
                try await importRow(row, api: api, report: &report)
            } catch let error as AppStoreAPIError where error.errorCode == AppStoreAPIError.transactionIdNotFound {
                report.notFound.append(row.originalTransactionId)
            } catch {
                report.stoppedAtLine = row.line
                report.error = "\(error)"
                return report
            }
            report.rowsDone += 1
            try saveCheckpoint(index + 1)
            progress(index + 1, rows.count)
        }
        return report
    }

    func importRow(_ row: Row, api: EnvironmentFallback, report: inout Report) async throws {
        var revision: String?
        repeat {
            let page = try await withRetries(&report) { [revision] in
                try await Reconciler(app: app).withFallback(api) {
                    try await $0.getTransactionHistory(row.originalTransactionId, revision: revision)
                }
            }
            for jws in page.signedTransactions ?? [] {
                let transaction = try await app.verifier.verifyTransaction(jws)
                // Apple's history is the customer's; the row is about one original transaction.
                guard transaction.originalTransactionId == row.originalTransactionId else { continue }
                let result = try await app.store.deliver(
                    transaction, submittingAccount: row.accountId, catalog: app.catalog,
                    policy: app.configuration.ownershipPolicy, now: Date())
                switch (result.plan.refusal, result.plan.outcome) {
                case (.ownedByOtherAccount?, _): report.conflicts += 1
                case (.revoked?, _): report.revoked += 1
                case (_, .delivered): report.transactionsImported += 1
                case (_, .alreadyDelivered): report.alreadyKnown += 1
                case (_, .refunded): report.revoked += 1
                default: report.alreadyKnown += 1
                }
            }
            revision = page.hasMore == true ? page.revision : nil
        } while revision != nil
    }

    /// Apple's 429: wait for Retry-After (at most a minute each, 100 waits in all) and ask
    /// again. 5xx and timeouts: back off and retry up to `maxRetries` times.
    func withRetries<T: Sendable>(_ report: inout Report, _ body: () async throws -> T) async throws -> T {
        var failures = 0
        var waits = 0
        while true {
            do {
                return try await body()
            } catch let error as AppStoreAPIError where error.kind == .rateLimited && waits < 100 {
                waits += 1
                report.rateLimitedWaits += 1
                let seconds = error.retryAfter.map { $0.timeIntervalSinceNow } ?? 1
                try await sleep(min(60, max(0.2, seconds)))
            } catch let error as AppStoreAPIError where error.isRetryable && failures < maxRetries {
                failures += 1
                report.retries += 1
                try await sleep(min(30, 0.5 * pow(2, Double(failures - 1))))
            }
        }
    }
}
