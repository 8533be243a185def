import Crypto
import Foundation
import SQLKit
import StoreKeeperCore
import StoreKeeperSupport

/// Google Play's external transactions (its US external-content-link and alternative-billing
/// programs): every payment taken outside Google Play for a user who came from the Android app
/// is reported to Google (`externaltransactions.create`), renewals under the first report's
/// id, refunds by `:refund`. This is the report journal: one row per payment, written in the
/// payment's own delivery transaction, sent by a job until Google accepts it.
public struct ExternalTransactionStore: Sendable {
    public let database: Database
    public static let jobKind = "google_external_transaction"

    public init(database: Database) { self.database = database }

    /// A payment to report.
    public struct Transaction: Sendable, Hashable {
        /// Google's `externalTransactionId`: 1…63 of `[a-zA-Z0-9_-]`, unique per app.
        public var id: String
        /// The Google Play app (`apps[].id`) it is reported under.
        public var googleAppId: String
        /// What was paid: the payment's own id (`stripe:pi_…`, `stripe:in_…`).
        public var sourceId: String
        public var accountId: String?
        /// Renewals: the first payment's `externalTransactionId`.
        public var initialId: String?
        /// The first payment: the app's external transaction token.
        public var token: String?
        public var recurring: Bool
        public var preTaxMicros: Int64
        public var taxMicros: Int64
        public var currency: String
        /// Milliseconds since 1970.
        public var transactionTime: Int64
        /// The buyer's country (alpha-2) and state.
        public var regionCode: String
        public var administrativeArea: String?
        public var state = "pending"
        public var attempts = 0
        public var lastError: String?
        public var reportedAt: Int64?

        public init(
            id: String, googleAppId: String, sourceId: String, accountId: String?, initialId: String?, token: String?,
            recurring: Bool, preTaxMicros: Int64, taxMicros: Int64, currency: String, transactionTime: Int64,
            regionCode: String, administrativeArea: String?
        ) {
            self.id = id
            self.googleAppId = googleAppId
            self.sourceId = sourceId
            self.accountId = accountId
            self.initialId = initialId
            self.token = token
            self.recurring = recurring
            self.preTaxMicros = preTaxMicros
            self.taxMicros = taxMicros
            self.currency = currency
            self.transactionTime = transactionTime
            self.regionCode = regionCode
            self.administrativeArea = administrativeArea
        }

        init(row: some SQLRow) throws {
            self.init(
                id: try row.decode(column: "external_transaction_id", as: String.self),
                googleAppId: try row.decode(column: "google_app_id", as: String.self),
                sourceId: try row.decode(column: "source_id", as: String.self),
                accountId: try row.decode(column: "account_id", as: String?.self),
                initialId: try row.decode(column: "initial_id", as: String?.self),
                token: try row.decode(column: "token", as: String?.self),
                recurring: try row.decode(column: "recurring", as: Int.self) != 0,
                preTaxMicros: try row.decode(column: "pre_tax_micros", as: Int64.self),
                taxMicros: try row.decode(column: "tax_micros", as: Int64.self),
                currency: try row.decode(column: "currency", as: String.self),
                transactionTime: try row.decode(column: "transaction_time", as: Int64.self),
                regionCode: try row.decode(column: "region_code", as: String.self),
                administrativeArea: try row.decode(column: "administrative_area", as: String?.self))
            state = try row.decode(column: "state", as: String.self)
            attempts = try row.decode(column: "attempts", as: Int.self)
            lastError = try row.decode(column: "last_error", as: String?.self)
            reportedAt = try row.decode(column: "reported_at", as: Int64?.self)
        }
    }

    /// A refund of a reported payment.
    public struct Refund: Sendable, Hashable {
        /// The provider's refund id, as Google's `partialRefund.refundId` (same alphabet).
        public var refundId: String
        public var transactionId: String
        public var preTaxMicros: Int64
        public var full: Bool
        public var refundTime: Int64
        public var state = "pending"
        public var attempts = 0
        public var lastError: String?

        public init(refundId: String, transactionId: String, preTaxMicros: Int64, full: Bool, refundTime: Int64) {
            self.refundId = refundId
            self.transactionId = transactionId
            self.preTaxMicros = preTaxMicros
            self.full = full
            self.refundTime = refundTime
        }

        init(row: some SQLRow) throws {
            self.init(
                refundId: try row.decode(column: "refund_id", as: String.self),
                transactionId: try row.decode(column: "external_transaction_id", as: String.self),
                preTaxMicros: try row.decode(column: "pre_tax_micros", as: Int64.self),
                full: try row.decode(column: "full_refund", as: Int.self) != 0,
                refundTime: try row.decode(column: "refund_time", as: Int64.self))
            state = try row.decode(column: "state", as: String.self)
            attempts = try row.decode(column: "attempts", as: Int.self)
            lastError = try row.decode(column: "last_error", as: String?.self)
        }
    }

    /// Google's id for a payment: the payment's own id when it fits Google's alphabet and 63
    /// characters (`stripe:pi_3N…` → `stripe-pi_3N…`), else a digest of it — the same payment
    /// always gets the same id, so a report sent twice is Google's duplicate, not a second sale.
    public static func externalId(_ source: String) -> String {
        let mapped = String(source.map { $0 == ":" ? "-" : $0 })
        if (1...63).contains(mapped.utf8.count), mapped.utf8.allSatisfy(Self.allowed) { return mapped }
        return "sk-" + SHA256.hash(data: Data(source.utf8)).lowercaseHex.prefix(56)
    }

    static func allowed(_ byte: UInt8) -> Bool {
        (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
            || byte == 0x2D || byte == 0x5F
    }

    /// Records the payment's report (once per source) and queues its job, in the caller's
    /// database transaction. A renewal whose first payment was never reported is reported as
    /// nothing (Google needs the initial id): false.
    @discardableResult
    public static func record(_ transaction: Transaction, sql: any SQLDatabase, now: Date) async throws -> Bool {
        var transaction = transaction
        if transaction.recurring, transaction.token == nil {
            guard let initial = transaction.initialId,
                let first = try await sql.raw(
                    "SELECT * FROM google_external_transactions WHERE external_transaction_id = \(bind: initial)"
                ).first().map({ try Transaction(row: $0) })
            else { return false }
            // A renewal's buyer is the first payment's, wherever Stripe no longer says.
            if transaction.regionCode.isEmpty {
                transaction.regionCode = first.regionCode
                transaction.administrativeArea = first.administrativeArea
            }
        } else {
            transaction.initialId = nil
        }
        // Google's programs are the United States': a buyer whose country was not collected is
        // taken to be there.
        if transaction.regionCode.isEmpty { transaction.regionCode = "US" }
        let inserted =
            try await sql.raw(
                """
                INSERT INTO google_external_transactions (external_transaction_id, google_app_id, source_id, account_id,
                    initial_id, token, recurring, pre_tax_micros, tax_micros, currency, transaction_time, region_code,
                    administrative_area, state, created_at)
                VALUES (\(bind: transaction.id), \(bind: transaction.googleAppId), \(bind: transaction.sourceId),
                        \(bind: transaction.accountId), \(bind: transaction.initialId), \(bind: transaction.token),
                        \(bind: transaction.recurring ? 1 : 0), \(bind: transaction.preTaxMicros),
                        \(bind: transaction.taxMicros), \(bind: transaction.currency),
                        \(bind: transaction.transactionTime), \(bind: transaction.regionCode),
                        \(bind: transaction.administrativeArea), 'pending', \(bind: now.milliseconds))
                ON CONFLICT DO NOTHING
                RETURNING external_transaction_id
                """
            ).first() != nil
        if inserted {
            try await JobStore.insert(
                kind: jobKind, dedupeKey: "\(jobKind)|tx:\(transaction.id)", payload: "tx:\(transaction.id)", sql: sql,
                now: now)
        }
        return true
    }

    /// The first payment's id of a payment source (a subscription's first invoice), if reported.
    public static func transaction(source: String, sql: any SQLDatabase) async throws -> Transaction? {
        try await sql.raw("SELECT * FROM google_external_transactions WHERE source_id = \(bind: source)").first().map {
            try Transaction(row: $0)
        }
    }

    /// Records a refund of the payment `source` (once per refund id) and queues its job. False
    /// when the payment was never reported.
    @discardableResult
    public static func recordRefund(
        source: String, refundId: String, refundedMicros: Int64, grossMicros: Int64, sql: any SQLDatabase, now: Date
    ) async throws -> Bool {
        guard let transaction = try await transaction(source: source, sql: sql) else { return false }
        let previous =
            try await sql.raw(
                """
                SELECT CAST(COALESCE(SUM(pre_tax_micros), 0) AS BIGINT) AS total FROM google_external_refunds
                WHERE external_transaction_id = \(bind: transaction.id)
                """
            ).first()?.decode(column: "total", as: Int64.self) ?? 0
        // Pre-tax share of what was refunded, never beyond what is left.
        let share =
            grossMicros > 0
            ? Int64((Double(transaction.preTaxMicros) * Double(refundedMicros) / Double(grossMicros)).rounded())
            : transaction.preTaxMicros
        let left = max(0, transaction.preTaxMicros - previous)
        let amount = min(share, left)
        guard amount > 0 else { return true }
        let full = previous == 0 && amount >= transaction.preTaxMicros
        let id = externalId(refundId)
        let inserted =
            try await sql.raw(
                """
                INSERT INTO google_external_refunds (refund_id, external_transaction_id, pre_tax_micros, full_refund,
                    refund_time, state, created_at)
                VALUES (\(bind: id), \(bind: transaction.id), \(bind: amount), \(bind: full ? 1 : 0),
                        \(bind: now.milliseconds), 'pending', \(bind: now.milliseconds))
                ON CONFLICT DO NOTHING
                RETURNING refund_id
                """
            ).first() != nil
        if inserted {
            try await JobStore.insert(
                kind: jobKind, dedupeKey: "\(jobKind)|refund:\(id)", payload: "refund:\(id)", sql: sql, now: now)
        }
        return true
    }

    public func transaction(_ id: String) async throws -> Transaction? {
        try await database.read { sql in
            try await sql.raw(
                "SELECT * FROM google_external_transactions WHERE external_transaction_id = \(bind: id)"
            ).first().map { try Transaction(row: $0) }
        }
    }

    public func refund(_ id: String) async throws -> Refund? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM google_external_refunds WHERE refund_id = \(bind: id)").first().map {
                try Refund(row: $0)
            }
        }
    }

    /// Every report, newest first (the operator's journal).
    public func transactions(limit: Int = 200) async throws -> [Transaction] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM google_external_transactions ORDER BY created_at DESC, external_transaction_id
                LIMIT \(bind: max(1, min(limit, 1000)))
                """
            ).all().map { try Transaction(row: $0) }
        }
    }

    public func refunds(of transactionId: String) async throws -> [Refund] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM google_external_refunds WHERE external_transaction_id = \(bind: transactionId)
                ORDER BY refund_time, refund_id
                """
            ).all().map { try Refund(row: $0) }
        }
    }

    /// Google accepted it (or already had it): reported. `table`: the transaction or the refund.
    public func markReported(transaction id: String, now: Date) async throws {
        try await mark(
            "google_external_transactions", key: "external_transaction_id", id: id, state: "reported", error: nil,
            now: now)
    }

    public func markReported(refund id: String, now: Date) async throws {
        try await mark("google_external_refunds", key: "refund_id", id: id, state: "reported", error: nil, now: now)
    }

    /// A failed attempt: `final` when Google refused it for good (it stays in the journal).
    public func markFailed(transaction id: String, error: String, final: Bool, now: Date) async throws {
        try await mark(
            "google_external_transactions", key: "external_transaction_id", id: id, state: final ? "failed" : "pending",
            error: error, now: now)
    }

    public func markFailed(refund id: String, error: String, final: Bool, now: Date) async throws {
        try await mark(
            "google_external_refunds", key: "refund_id", id: id, state: final ? "failed" : "pending", error: error,
            now: now)
    }

    func mark(_ table: String, key: String, id: String, state: String, error: String?, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE \(ident: table) SET state = \(bind: state), attempts = attempts + 1,
                    last_error = \(bind: error.map { String($0.prefix(500)) }),
                    reported_at = \(bind: state == "reported" ? now.milliseconds : nil)
                WHERE \(ident: key) = \(bind: id)
                """
            ).run()
            try await PurchaseStore.audit(
                sql, actor: "storekeeper",
                action: state == "reported"
                    ? "google_external_reported"
                    : state == "failed" ? "google_external_refused" : "google_external_retry",
                subject: id,
                detail: state == "reported"
                    ? "reported to Google Play's externalTransactions"
                    : "Google Play's externalTransactions: \(error?.prefix(300) ?? "")",
                at: now.milliseconds)
        }
    }
}
