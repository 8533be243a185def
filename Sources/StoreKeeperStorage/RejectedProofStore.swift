import AppStoreModels
import Crypto
import Foundation
import SQLKit

/// Proofs of purchase that failed verification, kept so that a misconfiguration (a wrong
/// bundle id, a missing environment, a wrong root) never loses what Apple signed: after the
/// fix, they are re-verified and delivered once. Deduplicated by SHA-256 of the proof and
/// capped per account per day, so forgeries cannot fill the disk.
public struct RejectedProofStore: Sendable {
    public let database: Database
    /// At most this many proofs, and this many bytes, are kept per account per UTC day.
    public var maxPerAccountPerDay = 100
    public var maxBytesPerAccountPerDay = 16 * 1_048_576

    public init(database: Database) {
        self.database = database
    }

    /// What was submitted: one of the three proof fields of `POST /v1/purchases`.
    public enum Kind: String, Sendable, CaseIterable {
        case signedTransaction
        case receipt
        case transactionId
    }

    public struct Proof: Sendable, Hashable {
        public var id: String
        public var sha256: String
        public var kind: Kind
        public var proof: String
        public var size: Int
        public var code: String
        public var reason: String
        public var accountId: String
        public var orderId: String?
        public var createdAt: Date
        public var serverVersion: String
        /// `rejected` until a re-verification succeeds, then `reverified`.
        public var status: String
        public var checkedAt: Date?
        /// After re-verification: the delivery outcome(s), e.g. `delivered`.
        public var outcome: String?
    }

    public enum KeepResult: Sendable, Hashable {
        case kept
        case duplicate
        /// The account's daily cap is reached: counted in metrics, not stored.
        case capped
    }

    public static func sha256(_ proof: String) -> String {
        SHA256.hash(data: Data(proof.utf8)).lowercaseHex
    }

    /// Keeps one rejected proof (once per SHA-256).
    public func keep(
        kind: Kind, proof: String, code: String, reason: String, accountId: String, orderId: String?,
        serverVersion: String, now: Date
    ) async throws -> KeepResult {
        let digest = Self.sha256(proof)
        let dayStart = Int64(now.timeIntervalSince1970 / 86_400) * 86_400_000
        let cap = maxPerAccountPerDay
        let byteCap = maxBytesPerAccountPerDay
        return try await database.transaction { sql in
            if try await sql.raw("SELECT id FROM rejected_proofs WHERE sha256 = \(bind: digest)").first() != nil {
                return .duplicate
            }
            let row = try await sql.raw(
                """
                SELECT COUNT(*) AS n, CAST(COALESCE(SUM(size), 0) AS BIGINT) AS bytes FROM rejected_proofs
                WHERE account_id = \(bind: accountId) AND created_at >= \(bind: dayStart)
                """
            ).first()
            let count = try row?.decode(column: "n", as: Int.self) ?? 0
            let bytes = try row?.decode(column: "bytes", as: Int.self) ?? 0
            guard count < cap, bytes + proof.utf8.count <= byteCap else { return .capped }
            try await sql.raw(
                """
                INSERT INTO rejected_proofs
                    (id, sha256, kind, proof, size, code, reason, account_id, order_id, created_at, server_version, status)
                VALUES (\(bind: RowIdentifiers.uuidString()), \(bind: digest), \(bind: kind.rawValue), \(bind: proof),
                        \(bind: proof.utf8.count), \(bind: code), \(bind: String(reason.prefix(300))), \(bind: accountId),
                        \(bind: orderId), \(bind: now.milliseconds), \(bind: serverVersion), 'rejected')
                ON CONFLICT (sha256) DO NOTHING
                """
            ).run()
            return .kept
        }
    }

    /// Kept proofs, newest first, filtered by code, time and status; without their bytes
    /// unless `withProof`.
    public func list(
        code: String? = nil, since: Date? = nil, status: String? = nil, limit: Int = 100, withProof: Bool = false
    ) async throws -> [Proof] {
        try await database.read { sql in
            var query = SQLQueryString(
                "SELECT id, sha256, kind, \(unsafeRaw: withProof ? "proof" : "'' AS proof"), size, code, reason, account_id, order_id, created_at, server_version, status, checked_at, outcome FROM rejected_proofs WHERE 1 = 1"
            )
            if let code { query += " AND code = \(bind: code)" }
            if let since { query += " AND created_at >= \(bind: since.milliseconds)" }
            if let status { query += " AND status = \(bind: status)" }
            query += " ORDER BY created_at DESC, id LIMIT \(unsafeRaw: String(max(1, min(limit, 10_000))))"
            return try await sql.raw(query).all().map(Self.decode)
        }
    }

    /// Proofs still rejected, oldest first, after `cursor` (created_at, id) — pages for reverify.
    public func stillRejected(code: String?, since: Date?, after cursor: (Int64, String)?, limit: Int) async throws
        -> [Proof]
    {
        try await database.read { sql in
            var query = SQLQueryString(
                "SELECT id, sha256, kind, proof, size, code, reason, account_id, order_id, created_at, server_version, status, checked_at, outcome FROM rejected_proofs WHERE status = 'rejected'"
            )
            if let code { query += " AND code = \(bind: code)" }
            if let since { query += " AND created_at >= \(bind: since.milliseconds)" }
            if let cursor {
                query +=
                    " AND (created_at > \(bind: cursor.0) OR (created_at = \(bind: cursor.0) AND id > \(bind: cursor.1)))"
            }
            query += " ORDER BY created_at, id LIMIT \(unsafeRaw: String(limit))"
            return try await sql.raw(query).all().map(Self.decode)
        }
    }

    /// Records the outcome of a re-verification: `reverified` with its delivery outcome, or
    /// still rejected with the (possibly new) failure.
    public func recordCheck(_ id: String, verified: Bool, code: String, reason: String, outcome: String?, now: Date)
        async throws
    {
        try await database.transaction { sql in
            if verified {
                try await sql.raw(
                    """
                    UPDATE rejected_proofs SET status = 'reverified', checked_at = \(bind: now.milliseconds),
                        outcome = \(bind: outcome) WHERE id = \(bind: id)
                    """
                ).run()
            } else {
                try await sql.raw(
                    """
                    UPDATE rejected_proofs SET code = \(bind: code), reason = \(bind: String(reason.prefix(300))),
                        checked_at = \(bind: now.milliseconds) WHERE id = \(bind: id)
                    """
                ).run()
            }
        }
    }

    /// Deletes proofs older than the retention period; returns how many.
    public func prune(olderThan days: Int, now: Date) async throws -> Int {
        let cutoff = now.addingTimeInterval(-Double(days) * 86_400).milliseconds
        return try await database.transaction { sql in
            let count =
                try await sql.raw("SELECT COUNT(*) AS n FROM rejected_proofs WHERE created_at < \(bind: cutoff)")
                .first()?.decode(column: "n", as: Int.self) ?? 0
            if count > 0 {
                try await sql.raw("DELETE FROM rejected_proofs WHERE created_at < \(bind: cutoff)").run()
            }
            return count
        }
    }

    static func decode(_ row: any SQLRow) throws -> Proof {
        Proof(
            id: try row.decode(column: "id", as: String.self),
            sha256: try row.decode(column: "sha256", as: String.self),
            kind: Kind(rawValue: try row.decode(column: "kind", as: String.self)) ?? .signedTransaction,
            proof: try row.decode(column: "proof", as: String.self), size: try row.decode(column: "size", as: Int.self),
            code: try row.decode(column: "code", as: String.self),
            reason: try row.decode(column: "reason", as: String.self),
            accountId: try row.decode(column: "account_id", as: String.self),
            orderId: try row.decode(column: "order_id", as: String?.self),
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
            serverVersion: try row.decode(column: "server_version", as: String.self),
            status: try row.decode(column: "status", as: String.self),
            checkedAt: try row.decode(column: "checked_at", as: Int64?.self).map(Date.init(milliseconds:)),
            outcome: try row.decode(column: "outcome", as: String?.self))
    }
}
