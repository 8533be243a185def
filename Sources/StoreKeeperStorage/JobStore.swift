import Foundation
import SQLKit
import StoreKeeperSupport

/// A durable job queue on the database: jobs survive restarts, and several server instances
/// share it safely (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite: one writer).
public struct JobStore: Sendable {
    public let database: Database

    public init(database: Database) { self.database = database }

    public struct Job: Sendable, Hashable {
        public var id: String
        public var kind: String
        public var payload: String
        public var attempts: Int
        public var createdAt: Date
        public var stuckReported: Bool
        /// The end of the lease this claim took: `complete(_:ifLeasedUntil:)` leaves a job
        /// woken meanwhile pending.
        public var leasedUntil: Date
    }

    /// Enqueues a job unless one with the same `dedupeKey` exists; returns the job's id.
    @discardableResult
    public func enqueue(kind: String, dedupeKey: String, payload: String, runAt: Date, now: Date) async throws -> String
    {
        try await database.transaction { sql in
            try await Self.insert(kind: kind, dedupeKey: dedupeKey, payload: payload, sql: sql, now: now, runAt: runAt)
        }
    }

    /// Enqueues in the caller's transaction (a job decided together with other writes).
    @discardableResult
    static func insert(
        kind: String, dedupeKey: String, payload: String, sql: any SQLDatabase, now: Date, runAt: Date? = nil
    ) async throws -> String {
        let id = RowIdentifiers.uuidString()
        try await sql.raw(
            """
            INSERT INTO jobs (id, kind, dedupe_key, payload, status, attempts, run_at, created_at, stuck_reported)
            VALUES (\(bind: id), \(bind: kind), \(bind: dedupeKey), \(bind: payload), 'pending', 0,
                    \(bind: (runAt ?? now).milliseconds), \(bind: now.milliseconds), 0)
            ON CONFLICT (dedupe_key) DO NOTHING
            """
        ).run()
        return try await sql.raw("SELECT id FROM jobs WHERE dedupe_key = \(bind: dedupeKey)").first()?
            .decode(column: "id", as: String.self) ?? id
    }

    /// Jobs as one multi-row insert (a job already queued under the same key is left as it
    /// is): a batch's duties in one round trip.
    static func insertMany(
        _ jobs: [(kind: String, dedupeKey: String, payload: String, runAt: Date?)], sql: any SQLDatabase, now: Date
    ) async throws {
        guard !jobs.isEmpty else { return }
        var insert = RowsInsert(
            into: "jobs",
            columns: [
                "id", "kind", "dedupe_key", "payload", "status", "attempts", "run_at", "created_at", "stuck_reported",
            ],
            suffix: "ON CONFLICT (dedupe_key) DO NOTHING")
        var seen = Set<String>()
        for job in jobs where seen.insert(job.dedupeKey).inserted {
            insert.append([
                .text(RowIdentifiers.uuidString()), .text(job.kind), .text(job.dedupeKey), .text(job.payload),
                .text("pending"), .integer(0), .integer((job.runAt ?? now).milliseconds), .integer(now.milliseconds),
                .integer(0),
            ])
        }
        try await sql.execute(sql: insert) { _ in }
    }

    /// Claims up to `limit` due jobs for `lease`: they are not due again until the lease runs
    /// out, so a runner that dies mid-job only delays it.
    /// `excluding`: kinds left pending for now (a store's call rate is spent).
    public func claimDue(now: Date, limit: Int = 64, lease: TimeInterval = 60, excluding: [String] = []) async throws
        -> [Job]
    {
        let kind = database.kind
        return try await database.transaction { sql in
            let due = now.milliseconds
            let skip: SQLQueryString = excluding.isEmpty ? "" : " AND kind NOT IN (\(binds: excluding))"
            let rows =
                if kind == .postgres {
                    try await sql.raw(
                        """
                        SELECT * FROM jobs WHERE status = 'pending' AND run_at <= \(bind: due)\(skip)
                        ORDER BY run_at LIMIT \(bind: limit) FOR UPDATE SKIP LOCKED
                        """
                    ).all()
                } else {
                    try await sql.raw(
                        "SELECT * FROM jobs WHERE status = 'pending' AND run_at <= \(bind: due)\(skip) ORDER BY run_at LIMIT \(bind: limit)"
                    ).all()
                }
            var jobs: [Job] = []
            for row in rows {
                let job = Job(
                    id: try row.decode(column: "id", as: String.self),
                    kind: try row.decode(column: "kind", as: String.self),
                    payload: try row.decode(column: "payload", as: String.self),
                    attempts: try row.decode(column: "attempts", as: Int.self),
                    createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
                    stuckReported: try row.decode(column: "stuck_reported", as: Int.self) != 0,
                    leasedUntil: Date(milliseconds: now.addingTimeInterval(lease).milliseconds))
                jobs.append(job)
            }
            if !jobs.isEmpty {
                try await sql.raw(
                    """
                    UPDATE jobs SET run_at = \(bind: now.addingTimeInterval(lease).milliseconds)
                    WHERE id IN (\(binds: jobs.map(\.id)))
                    """
                ).run()
            }
            return jobs
        }
    }

    public func complete(_ id: String) async throws {
        try await database.transaction { sql in
            try await sql.raw("UPDATE jobs SET status = 'done' WHERE id = \(bind: id)").run()
        }
    }

    /// Done, with its audit entry, in one database transaction (one write where two were: a
    /// job per purchase — Set App Account Token — keeps the writer free for deliveries).
    public func complete(
        _ id: String, audit: (actor: String, action: String, subject: String?, detail: String), now: Date
    ) async throws {
        try await database.transaction { sql in
            try await PurchaseStore.audit(
                sql, actor: audit.actor, action: audit.action, subject: audit.subject, detail: audit.detail,
                at: now.milliseconds)
            try await sql.raw("UPDATE jobs SET status = 'done' WHERE id = \(bind: id)").run()
        }
    }

    /// Several jobs done, each with its audit entry, and several refused for good, each with its
    /// audit entry and error, in one database transaction (a batch of Set App Account Token calls
    /// costs the writer one turn, not one or two per purchase).
    public func complete(
        _ done: [(id: String, audit: (actor: String, action: String, subject: String?, detail: String)?)], now: Date,
        failed: [(
            id: String, audit: (actor: String, action: String, subject: String?, detail: String), error: String
        )] =
            []
    ) async throws {
        guard !done.isEmpty || !failed.isEmpty else { return }
        try await database.transaction { sql in
            for audit in done.compactMap(\.audit) + failed.map(\.audit) {
                try await PurchaseStore.audit(
                    sql, actor: audit.actor, action: audit.action, subject: audit.subject, detail: audit.detail,
                    at: now.milliseconds)
            }
            if !done.isEmpty {
                try await sql.raw("UPDATE jobs SET status = 'done' WHERE id IN (\(binds: done.map(\.id)))").run()
            }
            // Refused for good (Apple's final answer), each with its own error.
            for failure in failed {
                try await sql.raw(
                    "UPDATE jobs SET status = 'failed', last_error = \(bind: failure.error) WHERE id = \(bind: failure.id)"
                ).run()
            }
        }
    }

    /// Done — unless it was woken while it ran (its `run_at` is no longer the lease this run
    /// took): then it stays pending and runs again.
    public func complete(_ id: String, ifLeasedUntil lease: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                "UPDATE jobs SET status = 'done' WHERE id = \(bind: id) AND run_at = \(bind: lease.milliseconds)"
            ).run()
        }
    }

    public func fail(_ id: String, error: String) async throws {
        try await database.transaction { sql in
            try await sql.raw("UPDATE jobs SET status = 'failed', last_error = \(bind: error) WHERE id = \(bind: id)")
                .run()
        }
    }

    /// Due again at `runAt`, without counting an attempt (nothing was tried: a call rate spent).
    public func postpone(_ ids: [String], until runAt: Date) async throws {
        guard !ids.isEmpty else { return }
        try await database.transaction { sql in
            try await sql.raw("UPDATE jobs SET run_at = \(bind: runAt.milliseconds) WHERE id IN (\(binds: ids))").run()
        }
    }

    public func reschedule(_ id: String, runAt: Date, error: String) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE jobs SET attempts = attempts + 1, run_at = \(bind: runAt.milliseconds), last_error = \(bind: error)
                WHERE id = \(bind: id)
                """
            ).run()
        }
    }

    public func markStuckReported(_ id: String) async throws {
        try await database.transaction { sql in
            try await sql.raw("UPDATE jobs SET stuck_reported = 1 WHERE id = \(bind: id)").run()
        }
    }

    public func pendingCount() async throws -> Int {
        try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS pending FROM jobs WHERE status = 'pending'").first()?
                .decode(column: "pending", as: Int.self) ?? 0
        }
    }

    /// Writes `count` pending jobs of `kind`, not due before `runAt`, straight into the queue:
    /// a backlog for `bench --accounts` and the tests to measure `/healthz` behind.
    public func queueBacklog(_ count: Int, kind: String, runAt: Date, now: Date = Date()) async throws {
        let run = UInt64.random(in: 0..<1_000_000_000)
        try await database.transaction(deadline: .seconds(600)) { sql in
            for chunk in stride(from: 0, to: count, by: 1_000) {
                var insert = sql.insert(into: "jobs").columns(
                    "id", "kind", "dedupe_key", "payload", "status", "attempts", "run_at", "created_at",
                    "stuck_reported")
                for index in chunk..<min(count, chunk + 1_000) {
                    let id = "\(kind)|\(run)|\(index)"
                    insert = insert.values(
                        [
                            id, kind, id, "", "pending", 0, runAt.milliseconds, now.milliseconds + Int64(index), 0,
                        ] as [any Encodable & Sendable])
                }
                try await insert.run()
            }
        }
    }

    /// The query `oldestPending` runs, for a test to read its plan.
    public static let oldestPendingQuery =
        "SELECT created_at AS oldest FROM jobs WHERE status = 'pending' ORDER BY created_at LIMIT 1"

    /// When the oldest pending job was created, if any (`/healthz`).
    public func oldestPending() async throws -> Date? {
        try await database.read { sql in
            // The first entry of `jobs_pending_age`: the same cost with no backlog and with 100,000.
            try await sql.raw(SQLQueryString(Self.oldestPendingQuery)).first()?.decode(
                column: "oldest", as: Int64?.self
            ).map(Date.init(milliseconds:))
        }
    }

    /// The pending jobs of a kind (a short list: support actions waiting on a store), oldest first.
    public func pending(kind: String, limit: Int = 500) async throws -> [(id: String, payload: String)] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT id, payload FROM jobs WHERE kind = \(bind: kind) AND status = 'pending'
                ORDER BY created_at, id LIMIT \(bind: limit)
                """
            ).all().map {
                (try $0.decode(column: "id", as: String.self), try $0.decode(column: "payload", as: String.self))
            }
        }
    }

    public func status(_ id: String) async throws -> String? {
        try await database.read { sql in
            try await sql.raw("SELECT status FROM jobs WHERE id = \(bind: id)").first()?.decode(
                column: "status", as: String.self)
        }
    }
}
