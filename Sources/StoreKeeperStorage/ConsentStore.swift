import Foundation
import SQLKit
import StoreKeeperCore

/// The customer's consent to share consumption data with Apple (Send Consumption Information
/// V2: only with "valid consent", opt-in and withdrawable), and parents' withdrawals of consent
/// for a minor's use of the app (RESCIND_CONSENT).
public struct Consent: Sendable, Hashable, Codable {
    public var accountId: String
    /// Whether the customer consented to share consumption data (nil: never asked).
    public var consumptionData: Bool?
    /// `app` (the SDK, with the account's client token), `backend` (a secret key), or
    /// `rescind_consent` (Apple's notification, a parent withdrew consent).
    public var source: String?
    public var changedAt: Date?
}

/// A RESCIND_CONSENT as recorded.
public struct ConsentRescission: Sendable, Hashable {
    public var notificationUUID: String
    public var appTransactionId: String?
    public var bundleId: String?
    public var environment: String?
    public var accountIds: [String]
    public var receivedAt: Date
}

extension PurchaseStore {
    public func consent(of accountId: String) async throws -> Consent {
        try await database.read { sql in try await Self.consent(of: accountId, sql: sql) }
    }

    static func consent(of accountId: String, sql: any SQLDatabase) async throws -> Consent {
        guard
            let row = try await sql.raw("SELECT * FROM consents WHERE account_id = \(bind: accountId)").first()
        else { return Consent(accountId: accountId) }
        return Consent(
            accountId: accountId, consumptionData: try row.decode(column: "consented", as: Int.self) == 1,
            source: try row.decode(column: "source", as: String.self),
            changedAt: Date(milliseconds: try row.decode(column: "changed_at", as: Int64.self)))
    }

    /// Records the customer's answer (audited; unchanged when the same answer is given again).
    public func setConsent(_ accountId: String, consumptionData: Bool, source: String, now: Date) async throws
        -> Consent
    {
        try await database.transaction { sql in
            let before = try await Self.consent(of: accountId, sql: sql)
            guard before.consumptionData != consumptionData else { return before }
            try await Self.writeConsent(
                accountId, consented: consumptionData, source: source, sql: sql, at: now.milliseconds)
            try await Self.audit(
                sql, actor: source, action: consumptionData ? "consent_given" : "consent_withdrawn",
                subject: accountId,
                detail:
                    "account \(Identifiers.quoted(accountId)) \(consumptionData ? "consents" : "does not consent") to sharing consumption data with Apple",
                at: now.milliseconds)
            return try await Self.consent(of: accountId, sql: sql)
        }
    }

    static func writeConsent(_ accountId: String, consented: Bool, source: String, sql: any SQLDatabase, at: Int64)
        async throws
    {
        try await sql.raw(
            """
            INSERT INTO consents (account_id, consented, source, changed_at)
            VALUES (\(bind: accountId), \(bind: consented ? 1 : 0), \(bind: source), \(bind: at))
            ON CONFLICT (account_id) DO UPDATE SET consented = excluded.consented, source = excluded.source,
            changed_at = excluded.changed_at
            """
        ).run()
    }

    /// The accounts an Apple Account (appTransactionId) bought or ordered with.
    static func accounts(ofAppTransaction id: String, sql: any SQLDatabase) async throws -> [String] {
        let rows = try await sql.raw(
            """
            SELECT account_id FROM deliveries WHERE app_transaction_id = \(bind: id)
            UNION SELECT account_id FROM orders WHERE app_transaction_id = \(bind: id)
            """
        ).all()
        return Set(try rows.map { try $0.decode(column: "account_id", as: String.self) }).sorted()
    }

    /// The app accounts one Apple Account (appTransactionId) bought or ordered with.
    public func accounts(ofAppTransaction id: String) async throws -> [String] {
        guard !id.isEmpty else { return [] }
        return try await database.read { sql in try await Self.accounts(ofAppTransaction: id, sql: sql) }
    }

    /// The Apple Accounts (appTransactionId) an app account bought or ordered with.
    public func appTransactionIds(of accountId: String) async throws -> [String] {
        try await database.read { sql in
            let rows = try await sql.raw(
                """
                SELECT app_transaction_id FROM deliveries WHERE account_id = \(bind: accountId) AND app_transaction_id IS NOT NULL
                UNION SELECT app_transaction_id FROM orders WHERE account_id = \(bind: accountId) AND app_transaction_id IS NOT NULL
                """
            ).all()
            return Set(try rows.map { try $0.decode(column: "app_transaction_id", as: String.self) }).sorted()
        }
    }

    /// The latest withdrawals of consent, newest first.
    public func consentRescissions(limit: Int = 100) async throws -> [ConsentRescission] {
        try await database.read { sql in
            try await sql.raw(
                "SELECT * FROM consent_rescissions ORDER BY received_at DESC LIMIT \(bind: max(1, min(limit, 1000)))"
            ).all().map { row in
                ConsentRescission(
                    notificationUUID: try row.decode(column: "notification_uuid", as: String.self),
                    appTransactionId: try row.decode(column: "app_transaction_id", as: String?.self),
                    bundleId: try row.decode(column: "bundle_id", as: String?.self),
                    environment: try row.decode(column: "environment", as: String?.self),
                    accountIds: try row.decode(column: "account_ids", as: String.self).split(separator: "\n").map(
                        String.init),
                    receivedAt: Date(milliseconds: try row.decode(column: "received_at", as: Int64.self)))
            }
        }
    }
}

extension NotificationApplier {
    /// RESCIND_CONSENT: a parent withdrew consent for a minor's use of the app. Recorded with the
    /// accounts its Apple Account (appTransactionId) bought with, their consent to share data
    /// withdrawn, a `consent.rescinded` webhook for the app's backend to apply its policy.
    /// Purchases are left alone: Apple says nothing about refunding them.
    static func rescindConsent(_ record: NotificationRecord, sql: any SQLDatabase, now: Date) async throws -> (
        String, String
    ) {
        let at = now.milliseconds
        let accounts =
            if let id = record.appTransactionId {
                try await PurchaseStore.accounts(ofAppTransaction: id, sql: sql)
            } else { [String]() }
        try await sql.raw(
            """
            INSERT INTO consent_rescissions (notification_uuid, app_transaction_id, bundle_id, environment, account_ids,
                                             received_at)
            VALUES (\(bind: record.notificationUUID), \(bind: record.appTransactionId), \(bind: record.appBundleId),
                    \(bind: record.environment), \(bind: accounts.joined(separator: "\n")), \(bind: at))
            ON CONFLICT (notification_uuid) DO NOTHING
            """
        ).run()
        for account in accounts {
            try await PurchaseStore.writeConsent(account, consented: false, source: "rescind_consent", sql: sql, at: at)
        }
        let who =
            accounts.isEmpty
            ? "no account known" : "accounts " + accounts.map(Identifiers.quoted).joined(separator: ", ")
        let detail =
            "RESCIND_CONSENT for Apple Account \(record.appTransactionId ?? "(none)") (\(record.environment ?? "?")): \(who); consent to share data withdrawn, purchases unchanged"
        try await PurchaseStore.audit(
            sql, actor: "apple", action: "consent_rescinded", subject: record.appTransactionId, detail: detail, at: at)
        try await OutboxStore.append(
            "consent.rescinded",
            [
                "appTransactionId": .string(record.appTransactionId), "accountIds": .strings(accounts),
                "bundleId": .string(record.appBundleId), "environment": .string(record.environment),
                "notificationUUID": .string(record.notificationUUID),
            ], sql: sql, at: at)
        return ("applied", detail)
    }
}

/// Each account's own appAccountToken, for purchases made outside the app (Set App Account
/// Token): created once, random, stored — stable for the account's life.
extension PurchaseStore {
    public static let setTokenJobKind = "set_app_account_token"

    /// The job's payload.
    public struct ClaimJob: Codable, Sendable, Hashable {
        public var originalTransactionId: String
        public var accountId: String
        public var environment: String
    }

    static func claimJob(_ originalId: String, account: String, environment: String, sql: any SQLDatabase, now: Date)
        async throws
    {
        let payload = String(
            decoding: try JSONEncoder().encode(
                ClaimJob(originalTransactionId: originalId, accountId: account, environment: environment)),
            as: UTF8.self)
        try await JobStore.insert(
            kind: setTokenJobKind, dedupeKey: "\(setTokenJobKind)|\(originalId)|\(account)", payload: payload, sql: sql,
            now: now)
    }

    /// The account's token, created on first use.
    public func accountToken(_ accountId: String, now: Date) async throws -> UUID {
        try await database.transaction { sql in
            if let existing = try await sql.raw(
                "SELECT app_account_token FROM account_tokens WHERE account_id = \(bind: accountId)"
            ).first()?.decode(column: "app_account_token", as: String.self), let token = UUID(uuidString: existing) {
                return token
            }
            let token = UUID()
            try await sql.raw(
                """
                INSERT INTO account_tokens (account_id, app_account_token, created_at)
                VALUES (\(bind: accountId), \(bind: token.uuidString.lowercased()), \(bind: now.milliseconds))
                ON CONFLICT (account_id) DO NOTHING
                """
            ).run()
            let stored = try await sql.raw(
                "SELECT app_account_token FROM account_tokens WHERE account_id = \(bind: accountId)"
            ).first()?.decode(column: "app_account_token", as: String.self)
            return stored.flatMap(UUID.init(uuidString:)) ?? token
        }
    }

    /// Whether the subscription (or purchase) is still the account's (a transfer since means
    /// the job's token is no longer wanted).
    public func owns(_ accountId: String, originalTransactionId: String) async throws -> Bool {
        try await database.read { sql in
            let bound = try await sql.raw(
                "SELECT account_id FROM ownership WHERE original_transaction_id = \(bind: originalTransactionId)"
            ).first()?.decode(column: "account_id", as: String.self)
            if let bound { return bound == accountId }
            let delivered = try await sql.raw(
                "SELECT account_id FROM deliveries WHERE transaction_id = \(bind: originalTransactionId)"
            ).first()?.decode(column: "account_id", as: String.self)
            return delivered == accountId
        }
    }
}

extension PurchaseStore {
    public static let finishJobKind = "finish_transaction"

    /// Queues Finish Transaction for deliveries made at least `delay` ago (and at most a week
    /// ago) that were never finished by this server; returns how many.
    public func queueFinishes(delay: TimeInterval, now: Date, limit: Int = 200) async throws -> Int {
        try await database.transaction { sql in
            let rows = try await sql.raw(
                """
                SELECT transaction_id, environment FROM deliveries
                WHERE finished_at IS NULL AND quantity > 0 AND refunded_at IS NULL
                AND delivered_at < \(bind: now.addingTimeInterval(-delay).milliseconds)
                AND delivered_at > \(bind: now.addingTimeInterval(-7 * 86_400).milliseconds)
                AND environment <> 'Xcode' AND transaction_id NOT LIKE 'web:%'
                ORDER BY delivered_at LIMIT \(bind: limit)
                """
            ).all()
            for row in rows {
                let id = try row.decode(column: "transaction_id", as: String.self)
                let environment = try row.decode(column: "environment", as: String.self)
                try await JobStore.insert(
                    kind: Self.finishJobKind, dedupeKey: "\(Self.finishJobKind)|\(id)", payload: "\(environment)|\(id)",
                    sql: sql, now: now)
                try await sql.raw("UPDATE deliveries SET finished_at = -1 WHERE transaction_id = \(bind: id)").run()
            }
            return rows.count
        }
    }

    public func markFinished(_ transactionId: String, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                "UPDATE deliveries SET finished_at = \(bind: now.milliseconds) WHERE transaction_id = \(bind: transactionId)"
            ).run()
        }
    }
}
