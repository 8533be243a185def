import AppStoreModels
import Foundation
import SQLKit
import StoreKeeperCore

/// External purchases: Apple's external purchase tokens (EXTERNAL_PURCHASE_TOKEN, or given by
/// the app or web checkout), the web checkout's purchases each token covers (delivered through
/// the one delivery path as `web:<paymentId>`), and the External Purchase Server API reports.
public struct ExternalPurchaseStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    public static let reportJobKind = "external_report"

    /// A token as recorded.
    public struct Token: Sendable, Hashable, Codable {
        public var externalPurchaseId: String
        public var accountId: String?
        public var tokenType: String?
        public var environment: String
        public var createdAt: Date?
        public var expiresAt: Date?
        public var lastNotice: String?
        public var unreportedNotices: Int
        public var reportedAt: Date?
        /// Web purchases (and refunds) attached and not reported yet.
        public var unreportedLineItems: Int
    }

    /// EXTERNAL_PURCHASE_TOKEN: the token recorded (or its notice counted); UNREPORTED queues
    /// its report now — with the line items of the purchases it covers, else as NO_LINE_ITEM
    /// (known to the app, nothing bought) or UNRECOGNIZED_TOKEN (never seen but in Apple's notice).
    static func record(_ record: NotificationRecord, sql: any SQLDatabase, now: Date) async throws -> (String, String) {
        guard let token = record.externalPurchaseToken, let id = token.externalPurchaseId else {
            return ("ignored", "EXTERNAL_PURCHASE_TOKEN without an externalPurchaseId")
        }
        let at = now.milliseconds
        let subtype = record.subtype ?? "(none)"
        let unreported = record.notificationSubtype == .unreported ? 1 : 0
        try await sql.raw(
            """
            INSERT INTO external_tokens (external_purchase_id, token_type, environment, bundle_id, created_at, expires_at,
                                         first_seen_at, last_notice, last_notice_at, unreported_notices)
            VALUES (\(bind: id), \(bind: token.tokenType), \(bind: token.environment.rawValue), \(bind: token.bundleId),
                    \(bind: token.tokenCreationDate), \(bind: token.tokenExpirationDate), \(bind: at), \(bind: subtype),
                    \(bind: at), \(bind: unreported))
            ON CONFLICT (external_purchase_id) DO UPDATE SET
                token_type = COALESCE(excluded.token_type, external_tokens.token_type),
                created_at = COALESCE(excluded.created_at, external_tokens.created_at),
                expires_at = COALESCE(excluded.expires_at, external_tokens.expires_at),
                bundle_id = COALESCE(excluded.bundle_id, external_tokens.bundle_id),
                last_notice = excluded.last_notice, last_notice_at = excluded.last_notice_at,
                unreported_notices = external_tokens.unreported_notices + excluded.unreported_notices
            """
        ).run()
        var detail = "external purchase token \(id) (\(token.environment.rawValue)): \(subtype) recorded"
        if unreported == 1 {
            try await JobStore.insert(
                kind: Self.reportJobKind, dedupeKey: "\(Self.reportJobKind)|\(id)|\(record.notificationUUID)",
                payload: id, sql: sql, now: now)
            detail += "; its report is queued"
        }
        try await PurchaseStore.audit(
            sql, actor: "apple", action: "external_purchase_token", subject: id, detail: detail, at: at)
        return ("applied", detail)
    }

    /// Records a token the app or web checkout received from StoreKit for `accountId`
    /// (idempotent; a token already tied to another account is refused).
    public func registerToken(_ id: String, accountId: String, tokenType: String?, now: Date) async throws -> Bool {
        try await database.transaction { sql in
            try await Self.register(id, accountId: accountId, tokenType: tokenType, sql: sql, at: now.milliseconds)
        }
    }

    static func register(_ id: String, accountId: String, tokenType: String?, sql: any SQLDatabase, at: Int64)
        async throws -> Bool
    {
        let environment = id.hasPrefix("SANDBOX") ? "Sandbox" : "Production"
        try await sql.raw(
            """
            INSERT INTO external_tokens (external_purchase_id, account_id, token_type, environment, first_seen_at)
            VALUES (\(bind: id), \(bind: accountId), \(bind: tokenType), \(bind: environment), \(bind: at))
            ON CONFLICT (external_purchase_id) DO UPDATE SET
                account_id = COALESCE(external_tokens.account_id, excluded.account_id),
                token_type = COALESCE(external_tokens.token_type, excluded.token_type)
            """
        ).run()
        let owner = try await sql.raw(
            "SELECT account_id FROM external_tokens WHERE external_purchase_id = \(bind: id)"
        ).first()?.decode(column: "account_id", as: String?.self)
        return owner == accountId
    }

    public func tokens(unreportedOnly: Bool = false, limit: Int = 200) async throws -> [Token] {
        try await database.read { sql in
            let filter: SQLQueryString =
                unreportedOnly
                ? "WHERE t.unreported_notices > 0 OR EXISTS (SELECT 1 FROM web_purchases w WHERE w.external_purchase_id = t.external_purchase_id AND (w.reported_buy = 0 OR (w.refunded_at IS NOT NULL AND w.reported_refund = 0)))"
                : ""
            return try await sql.raw(
                """
                SELECT t.*, (SELECT COUNT(*) FROM web_purchases w WHERE w.external_purchase_id = t.external_purchase_id
                             AND w.reported_buy = 0) +
                            (SELECT COUNT(*) FROM web_purchases w WHERE w.external_purchase_id = t.external_purchase_id
                             AND w.refunded_at IS NOT NULL AND w.reported_refund = 0) AS pending_items
                FROM external_tokens t \(filter)
                ORDER BY t.first_seen_at DESC LIMIT \(bind: max(1, min(limit, 1000)))
                """
            ).all().map { row in
                Token(
                    externalPurchaseId: try row.decode(column: "external_purchase_id", as: String.self),
                    accountId: try row.decode(column: "account_id", as: String?.self),
                    tokenType: try row.decode(column: "token_type", as: String?.self),
                    environment: try row.decode(column: "environment", as: String.self),
                    createdAt: try row.decode(column: "created_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    lastNotice: try row.decode(column: "last_notice", as: String?.self),
                    unreportedNotices: try row.decode(column: "unreported_notices", as: Int.self),
                    reportedAt: try row.decode(column: "reported_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    unreportedLineItems: try row.decode(column: "pending_items", as: Int.self))
            }
        }
    }
}
