import Crypto
import Foundation
import SQLKit
import StoreKeeperSupport

/// Proofs of purchase that failed verification, kept so that a misconfiguration (a wrong
/// bundle id, a missing environment, a wrong root) never loses what Apple signed: after the
/// fix, they are re-verified and delivered once.
///
/// Bounded, so that nobody can fill the disk with them (docs/security.md):
/// - the text of a proof is kept only when its chain reaches a trusted or Apple root (the caller
///   says so: `keepText`) and it is at most `maxKeptProofBytes`; anything else — random bytes, a
///   self-signed forgery — is kept as its SHA-256, code, reason and account (~0.5 KB);
/// - deduplicated by SHA-256, at most `maxPerAccountPerDay` rows and `maxBytesPerAccountPerDay`
///   bytes per account per UTC day;
/// - at most `maxBytesPerDay` bytes per UTC day and `maxBytesTotal` in all, counted in
///   `rejected_proofs_budget`; when a proof does not fit, the oldest rows whose text was not kept
///   (nothing can re-verify them) are dropped first, and if that is not enough it is not kept.
public struct RejectedProofStore: Sendable {
    public let database: Database
    /// At most this many proofs, and this many bytes, are kept per account per UTC day.
    public var maxPerAccountPerDay = 100
    public var maxBytesPerAccountPerDay = 16 * 1_048_576
    /// The whole table's budget.
    public var maxBytesPerDay: Int
    public var maxBytesTotal: Int
    /// The largest proof whose text is kept: a real JWS is ~5 KB and a receipt rarely passes
    /// 100 KB.
    public static let maxKeptProofBytes = 512 * 1024
    /// What a row costs beyond the proof's text: id, digest, code, reason, account, times.
    static let rowOverhead = 256

    public init(database: Database, maxBytesPerDay: Int = 64 * 1_048_576, maxBytesTotal: Int = 1_024 * 1_048_576) {
        self.database = database
        self.maxBytesPerDay = maxBytesPerDay
        self.maxBytesTotal = maxBytesTotal
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
        /// Whether the proof's text is kept (re-verifiable), or only its hash, code and account.
        public var proofKept = true
    }

    public enum KeepResult: Sendable, Hashable {
        /// Kept with its text (re-verifiable).
        case kept
        /// Kept as its hash, code and account only.
        case keptDigest
        case duplicate
        /// The account's daily cap or the table's budget is reached: counted in metrics, not stored.
        case capped
    }

    public static func sha256(_ proof: String) -> String {
        SHA256.hash(data: Data(proof.utf8)).lowercaseHex
    }

    /// Keeps one rejected proof (once per SHA-256); its text only when `keepText` (its chain
    /// reaches a trusted or Apple root) and it is at most `maxKeptProofBytes`.
    public func keep(
        kind: Kind, proof: String, keepText: Bool, code: String, reason: String, accountId: String, orderId: String?,
        serverVersion: String, now: Date
    ) async throws -> KeepResult {
        let digest = Self.sha256(proof)
        let day = Int64(now.timeIntervalSince1970 / 86_400)
        let dayStart = day * 86_400_000
        let text = keepText && proof.utf8.count <= Self.maxKeptProofBytes ? proof : ""
        let reason = String(reason.prefix(300))
        let cost =
            text.utf8.count + Self.rowOverhead + reason.utf8.count + accountId.utf8.count
            + (orderId?.utf8.count ?? 0)
        let (cap, byteCap, perDay, total) = (
            maxPerAccountPerDay, maxBytesPerAccountPerDay, maxBytesPerDay, maxBytesTotal
        )
        return try await database.transaction { sql in
            if try await sql.raw("SELECT id FROM rejected_proofs WHERE sha256 = \(bind: digest)").first() != nil {
                return .duplicate
            }
            let row = try await sql.raw(
                """
                SELECT COUNT(*) AS n, CAST(COALESCE(SUM(COALESCE(stored_bytes, size + 256)), 0) AS BIGINT) AS bytes
                FROM rejected_proofs WHERE account_id = \(bind: accountId) AND created_at >= \(bind: dayStart)
                """
            ).first()
            let count = try row?.decode(column: "n", as: Int.self) ?? 0
            let bytes = try row?.decode(column: "bytes", as: Int.self) ?? 0
            guard count < cap, bytes + cost <= byteCap else { return .capped }
            guard try await Self.makeRoom(cost, day: day, perDay: perDay, total: total, sql: sql) else {
                return .capped
            }
            // Another instance may keep the same proof at the same moment: the second is a duplicate.
            let inserted = try await sql.raw(
                """
                INSERT INTO rejected_proofs
                    (id, sha256, kind, proof, size, code, reason, account_id, order_id, created_at, server_version, status,
                     stored_bytes, proof_kept)
                VALUES (\(bind: RowIdentifiers.uuidString()), \(bind: digest), \(bind: kind.rawValue), \(bind: text),
                        \(bind: proof.utf8.count), \(bind: code), \(bind: reason), \(bind: accountId),
                        \(bind: orderId), \(bind: now.milliseconds), \(bind: serverVersion), 'rejected', \(bind: cost),
                        \(bind: text.isEmpty ? 0 : 1))
                ON CONFLICT (sha256) DO NOTHING RETURNING id
                """
            ).first()
            guard inserted != nil else { return .duplicate }
            try await Self.addToBudget(cost, day: day, sql: sql)
            return text.isEmpty ? .keptDigest : .kept
        }
    }

    /// Frees `cost` bytes of the budget (today's and the total) by dropping the oldest rows whose
    /// text was not kept; false when even that is not enough.
    static func makeRoom(_ cost: Int, day: Int64, perDay: Int, total: Int, sql: any SQLDatabase) async throws -> Bool {
        guard cost <= perDay, cost <= total else { return false }
        for scope in [true, false] {
            // First today's budget (only today's rows free it), then the total.
            while true {
                let used: Int
                if scope {
                    used =
                        try await sql.raw("SELECT bytes FROM rejected_proofs_budget WHERE day = \(bind: day)").first()?
                        .decode(column: "bytes", as: Int.self) ?? 0
                } else {
                    used =
                        try await sql.raw(
                            "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) AS bytes FROM rejected_proofs_budget"
                        ).first()?.decode(column: "bytes", as: Int.self) ?? 0
                }
                let limit = scope ? perDay : total
                if used + cost <= limit { break }
                let since = scope ? day * 86_400_000 : Int64.min
                let victims = try await sql.raw(
                    """
                    SELECT id, created_at, COALESCE(stored_bytes, size + 256) AS bytes FROM rejected_proofs
                    WHERE proof_kept = 0 AND created_at >= \(bind: since) ORDER BY created_at, id LIMIT 256
                    """
                ).all()
                guard !victims.isEmpty else { return false }
                var freed: [Int64: Int] = [:]
                var ids: [String] = []
                for victim in victims {
                    ids.append(try victim.decode(column: "id", as: String.self))
                    let victimDay = try victim.decode(column: "created_at", as: Int64.self) / 86_400_000
                    freed[victimDay, default: 0] += try victim.decode(column: "bytes", as: Int.self)
                }
                try await sql.raw("DELETE FROM rejected_proofs WHERE id IN (\(binds: ids))").run()
                for (victimDay, bytes) in freed { try await addToBudget(-bytes, day: victimDay, sql: sql) }
            }
        }
        return true
    }

    static func addToBudget(_ bytes: Int, day: Int64, sql: any SQLDatabase) async throws {
        try await sql.raw(
            """
            INSERT INTO rejected_proofs_budget (day, bytes) VALUES (\(bind: day), \(bind: bytes))
            ON CONFLICT (day) DO UPDATE SET bytes = rejected_proofs_budget.bytes + excluded.bytes
            """
        ).run()
    }

    /// Bytes the table holds by the budget's count (today's and in all).
    public func budgetUsed(now: Date) async throws -> (today: Int, total: Int) {
        let day = Int64(now.timeIntervalSince1970 / 86_400)
        return try await database.read { sql in
            let today =
                try await sql.raw("SELECT bytes FROM rejected_proofs_budget WHERE day = \(bind: day)").first()?
                .decode(column: "bytes", as: Int.self) ?? 0
            let total =
                try await sql.raw("SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) AS bytes FROM rejected_proofs_budget")
                .first()?.decode(column: "bytes", as: Int.self) ?? 0
            return (today, total)
        }
    }

    /// Kept proofs, newest first, filtered by code, time and status; without their bytes
    /// unless `withProof`.
    public func list(
        code: String? = nil, since: Date? = nil, status: String? = nil, limit: Int = 100, withProof: Bool = false
    ) async throws -> [Proof] {
        try await database.read { sql in
            var query = SQLQueryString(
                "SELECT id, sha256, kind, \(unsafeRaw: withProof ? "proof" : "'' AS proof"), size, code, reason, account_id, order_id, created_at, server_version, status, checked_at, outcome, proof_kept FROM rejected_proofs WHERE 1 = 1"
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
                "SELECT id, sha256, kind, proof, size, code, reason, account_id, order_id, created_at, server_version, status, checked_at, outcome, proof_kept FROM rejected_proofs WHERE status = 'rejected' AND proof_kept = 1"
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
                // The budget follows: days wholly before the cutoff go, the cutoff's day is recounted.
                let cutoffDay = cutoff / 86_400_000
                try await sql.raw("DELETE FROM rejected_proofs_budget WHERE day < \(bind: cutoffDay)").run()
                try await sql.raw(
                    """
                    UPDATE rejected_proofs_budget SET bytes = (
                        SELECT CAST(COALESCE(SUM(COALESCE(stored_bytes, size + 256)), 0) AS BIGINT) FROM rejected_proofs
                        WHERE created_at >= \(bind: cutoffDay * 86_400_000) AND created_at < \(bind: (cutoffDay + 1) * 86_400_000))
                    WHERE day = \(bind: cutoffDay)
                    """
                ).run()
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
            outcome: try row.decode(column: "outcome", as: String?.self),
            proofKept: (try? row.decode(column: "proof_kept", as: Int.self)).map { $0 != 0 } ?? true)
    }
}
