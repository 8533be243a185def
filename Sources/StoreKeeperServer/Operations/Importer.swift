import AppStoreAdapter
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
        /// A RevenueCat export's rows left out, by reason (play_store, stripe, sandbox, …).
        public var skippedRows: [String: Int] = [:]
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
    /// What a RevenueCat Transactions export (Scheduled Data Exports, CSV) gives an import:
    /// one row per App Store subscription or purchase (`original_store_transaction_id`, deduplicated),
    /// for the account in `accountColumn` (`rc_last_seen_app_user_id_alias` by default: your
    /// user id once the app called `logIn`). Left out, counted: Google Play rows (the export holds
    /// no purchase token; the app resubmits them from Play Billing), Stripe and promotional rows,
    /// Sandbox rows, and customers only known by an anonymous RevenueCat id.
    public struct RevenueCatExport: Sendable, Equatable {
        public var rows: [Row] = []
        public var invalid: [String] = []
        public var skipped: [String: Int] = [:]
    }

    public static func parseRevenueCat(_ text: String, accountColumn: String = "rc_last_seen_app_user_id_alias")
        -> RevenueCatExport
    {
        var export = RevenueCatExport()
        let records = CSVRecords.parse(text)
        guard let header = records.first?.fields.map({ $0.trimmingCharacters(in: .whitespaces) }) else {
            export.invalid.append("line 1: the file is empty")
            return export
        }
        func column(_ name: String) -> Int? { header.firstIndex(of: name) }
        let required = [accountColumn, "original_store_transaction_id", "store"]
        let missing = required.filter { column($0) == nil }
        guard missing.isEmpty else {
            export.invalid.append(
                "line 1: not a RevenueCat Transactions export: no column \(missing.joined(separator: ", "))")
            return export
        }
        let account = column(accountColumn)!
        let original = column("original_store_transaction_id")!
        let store = column("store")!
        let sandbox = column("is_sandbox")
        var seen: Set<String> = []
        for record in records.dropFirst() {
            let fields = record.fields
            if fields.count == 1 && fields[0].isEmpty { continue }
            guard fields.count == header.count else {
                export.invalid.append("line \(record.line): \(fields.count) fields, the header has \(header.count)")
                continue
            }
            let storeName = fields[store]
            guard storeName == "app_store" else {
                export.skipped[storeName.isEmpty ? "no store" : storeName, default: 0] += 1
                continue
            }
            if let sandbox, ["true", "t", "1"].contains(fields[sandbox].lowercased()) {
                export.skipped["sandbox", default: 0] += 1
                continue
            }
            let accountId = fields[account]
            if accountId.hasPrefix("$RCAnonymousID:") {
                export.skipped["anonymous customer", default: 0] += 1
                continue
            }
            let key = "\(accountId)\u{0}\(fields[original])"
            guard seen.insert(key).inserted else { continue }
            // The same checks as a StoreKeeper CSV row.
            switch row(line: record.line, account: accountId, original: fields[original]) {
            case .success(let row): export.rows.append(row)
            case .failure(let reason): export.invalid.append(reason.description)
            }
        }
        return export
    }

    struct InvalidRow: Error, CustomStringConvertible {
        var description: String
    }

    /// A row's checks: the server's own account id rules (what `POST /v1/orders` accepts: NFC,
    /// no control characters, 1…128 characters) and an original transaction id of ASCII digits.
    static func row(line: Int, account: String, original: String) -> Result<Row, InvalidRow> {
        do {
            try StoreKeeperApp.validateAccountId(account)
        } catch let error as APIError {
            return .failure(InvalidRow(description: "line \(line): \(error.message)"))
        } catch {
            return .failure(InvalidRow(description: "line \(line): accountId is not valid"))
        }
        guard StoreKeeperApp.isAppleNumericId(original) else {
            return .failure(InvalidRow(description: "line \(line): originalTransactionId must be 1…64 ASCII digits"))
        }
        return .success(Row(line: line, accountId: account, originalTransactionId: original))
    }

    /// `accountId,originalTransactionId` per record (RFC 4180: LF or CRLF line ends, quoted
    /// fields), read by scalars, never by `Character`s (`"\r\n"` is one).
    public static func parseCSV(_ text: String) -> (rows: [Row], invalid: [String]) {
        var rows: [Row] = []
        var invalid: [String] = []
        for (index, record) in CSVRecords.parse(text).enumerated() {
            let fields = record.fields.map { $0.trimmingCharacters(in: .whitespaces) }
            if fields.allSatisfy(\.isEmpty) || fields.first?.hasPrefix("#") == true { continue }
            if index == 0, fields.first?.lowercased() == "accountid" { continue }
            guard fields.count == 2 else {
                invalid.append("line \(record.line): expected accountId,originalTransactionId")
                continue
            }
            switch row(line: record.line, account: fields[0], original: fields[1]) {
            case .success(let row): rows.append(row)
            case .failure(let reason): invalid.append(reason.description)
            }
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
            } catch let error as AppStoreAPIError where Self.isPermanentForTheRow(error) {
                // Apple refuses this row for good (an id it calls invalid): the row is invalid,
                // the import goes on.
                report.invalidRows.append("line \(row.line): Apple refused it: \(error.message)")
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
                let transaction = StoreTransaction(apple: try await app.verifier.verifyTransaction(jws))
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

    /// A permanent 4xx about this row's id: not a rate limit, not the server's credentials.
    static func isPermanentForTheRow(_ error: AppStoreAPIError) -> Bool {
        guard !error.isRetryable, let status = error.httpStatus else { return false }
        return (400..<500).contains(status) && ![401, 403, 429].contains(status)
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

/// RFC 4180 records: quoted fields may hold commas, quotes (doubled) and line breaks.
enum CSVRecords {
    struct Record: Equatable {
        /// The line the record starts on (1-based).
        var line: Int
        var fields: [String]
    }

    static func parse(_ text: String) -> [Record] {
        var records: [Record] = []
        var fields: [String] = []
        var field = ""
        var quoted = false
        var line = 1
        var start = 1
        var scalars = text.unicodeScalars.makeIterator()
        var pending: Unicode.Scalar? = nil
        func next() -> Unicode.Scalar? {
            if let scalar = pending {
                pending = nil
                return scalar
            }
            return scalars.next()
        }
        while let scalar = next() {
            if quoted {
                if scalar == "\"" {
                    if let after = next() {
                        if after == "\"" {
                            field.unicodeScalars.append("\"")
                        } else {
                            quoted = false
                            pending = after
                        }
                    } else {
                        quoted = false
                    }
                } else {
                    if scalar == "\n" { line += 1 }
                    field.unicodeScalars.append(scalar)
                }
                continue
            }
            switch scalar {
            case "\"" where field.isEmpty: quoted = true
            case ",":
                fields.append(field)
                field = ""
            case "\r": continue
            case "\n":
                fields.append(field)
                records.append(Record(line: start, fields: fields))
                fields = []
                field = ""
                line += 1
                start = line
            default: field.unicodeScalars.append(scalar)
            }
        }
        if !field.isEmpty || !fields.isEmpty {
            fields.append(field)
            records.append(Record(line: start, fields: fields))
        }
        return records
    }
}
