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
    /// When a parent's RESCIND_CONSENT withdrew it, until the operator's backend restores it:
    /// meanwhile the app (a client token) cannot consent again.
    public var rescindedAt: Date? = nil
}

/// The app tried to consent again after a parent's RESCIND_CONSENT (only the backend may).
public struct ConsentRescinded: Error, Sendable {
    public var at: Date
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

extension AccountStore {
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
            changedAt: Date(milliseconds: try row.decode(column: "changed_at", as: Int64.self)),
            rescindedAt: try row.decode(column: "rescinded_at", as: Int64?.self).map(Date.init(milliseconds:)))
    }

    /// Records the customer's answer (audited; unchanged when the same answer is given again).
    /// After a parent's RESCIND_CONSENT only `backend` (the operator's secret key) may give
    /// consent again, which ends the rescission; `app` is refused with `ConsentRescinded`.
    public func setConsent(_ accountId: String, consumptionData: Bool, source: String, now: Date) async throws
        -> Consent
    {
        try await database.transaction { sql in
            let before = try await Self.consent(of: accountId, sql: sql)
            if consumptionData, let rescinded = before.rescindedAt {
                guard source == "backend" else { throw ConsentRescinded(at: rescinded) }
                try await sql.raw(
                    "UPDATE consents SET rescinded_at = NULL WHERE account_id = \(bind: accountId)"
                ).run()
            }
            guard before.consumptionData != consumptionData else {
                return try await Self.consent(of: accountId, sql: sql)
            }
            try await Self.writeConsent(
                accountId, consented: consumptionData, source: source, sql: sql, at: now.milliseconds)
            try await PurchaseStore.audit(
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
    /// `appTransactionIds`: only those of these Apple Accounts (an account page's), by index.
    public func consentRescissions(appTransactionIds: [String]? = nil, limit: Int = 100) async throws
        -> [ConsentRescission]
    {
        if let ids = appTransactionIds, ids.isEmpty { return [] }
        return try await database.read { sql in
            let filter: SQLQueryString =
                appTransactionIds.map { "WHERE app_transaction_id IN (\(binds: $0))" } ?? ""
            return try await sql.raw(
                """
                SELECT * FROM consent_rescissions \(filter)
                ORDER BY received_at DESC LIMIT \(bind: max(1, min(limit, 1000)))
                """
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
                try await AccountStore.accounts(ofAppTransaction: id, sql: sql)
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
            try await AccountStore.writeConsent(account, consented: false, source: "rescind_consent", sql: sql, at: at)
            try await sql.raw("UPDATE consents SET rescinded_at = \(bind: at) WHERE account_id = \(bind: account)")
                .run()
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
