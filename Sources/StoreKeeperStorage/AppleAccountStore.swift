import Foundation
import SQLKit
import StoreKeeperCore
import StoreKeeperSupport

/// Apple Accounts: the appAccountToken each account's purchases carry (Set App Account
/// Token claims), and Finish Transaction reports.
public struct AppleAccountStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }
}

/// Each account's own appAccountToken, for purchases made outside the app (Set App Account
/// Token): created once, random, stored — stable for the account's life.
extension AppleAccountStore {
    public static let setTokenJobKind = "set_app_account_token"

    /// The job's payload.
    public struct ClaimJob: Codable, Sendable, Hashable {
        public var originalTransactionId: String
        public var accountId: String
        public var environment: String
    }

    /// The Set App Account Token jobs of a batch's claims: one multi-row insert beside the
    /// batch's other writes (a claim already queued is left as it is).
    static func claimJobs(
        _ claims: [(originalId: String, account: String, environment: String, at: Date)]
    ) -> (any SQLExpression)? {
        guard !claims.isEmpty else { return nil }
        var insert = RowsInsert(
            into: "jobs",
            columns: [
                "id", "kind", "dedupe_key", "payload", "status", "attempts", "run_at", "created_at", "stuck_reported",
            ],
            suffix: "ON CONFLICT (dedupe_key) DO NOTHING")
        var seen = Set<String>()
        for claim in claims where seen.insert("\(claim.originalId)|\(claim.account)").inserted {
            // ClaimJob's JSON, written by hand (one per delivery of a purchase made outside the app).
            var payload = #"{"accountId":"#
            PurchaseStore.appendJSONString(claim.account, to: &payload)
            payload += #","environment":"#
            PurchaseStore.appendJSONString(claim.environment, to: &payload)
            payload += #","originalTransactionId":"#
            PurchaseStore.appendJSONString(claim.originalId, to: &payload)
            payload += "}"
            let at = claim.at.milliseconds
            insert.append([
                .text(RowIdentifiers.uuidString()), .text(setTokenJobKind),
                .text("\(setTokenJobKind)|\(claim.originalId)|\(claim.account)"), .text(payload), .text("pending"),
                .integer(0), .integer(at), .integer(at), .integer(0),
            ])
        }
        return insert
    }

    /// The claiming accounts' own tokens, created beside their claims when they have none yet
    /// (so the job only reads its token, and a batch of claims costs its writer one statement).
    static func claimTokens(
        _ claims: [(originalId: String, account: String, environment: String, at: Date)]
    ) -> (any SQLExpression)? {
        guard !claims.isEmpty else { return nil }
        var insert = RowsInsert(
            into: "account_tokens", columns: ["account_id", "app_account_token", "created_at"],
            suffix: "ON CONFLICT (account_id) DO NOTHING")
        var seen = Set<String>()
        for claim in claims where seen.insert(claim.account).inserted {
            insert.append([
                .text(claim.account), .text(RowIdentifiers.randomUUIDString()), .integer(claim.at.milliseconds),
            ])
        }
        return insert
    }

    /// The account's token, created on first use.
    public func accountToken(_ accountId: String, now: Date) async throws -> UUID {
        // Read first: once made it never changes, and a read takes no writer's turn.
        if let existing = try await database.read({ sql in
            try await sql.raw("SELECT app_account_token FROM account_tokens WHERE account_id = \(bind: accountId)")
                .first()?.decode(column: "app_account_token", as: String.self)
        }), let token = UUID(uuidString: existing) {
            return token
        }
        return try await database.transaction { sql in
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

extension AppleAccountStore {
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
                AND environment <> 'Xcode' AND transaction_id NOT LIKE '%:%'
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
