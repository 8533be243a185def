import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// App Store Server Notifications on the database. Accepting one is a single insert, group
/// committed, before the 200 (unique by `notificationUUID`: Apple's retries change nothing),
/// plus a wake-up of the subject's `apply_notifications` job. Applying happens from the job
/// queue: every pending notification of one subject (its original transaction), in
/// `signedDate` order, in one database transaction that holds the subject's lock — so two
/// server instances never apply events of one subscription at the same time.
public struct NotificationStore: Sendable {
    public let database: Database
    let committer: GroupCommit<Accepted>

    public static let jobKind = "apply_notifications"

    /// JWS headers read back from `jws_headers`.
    let headers = JWSHeaderCache()

    struct Accepted: Sendable {
        var record: NotificationRecord
        /// The `signedPayload` as stored: its JWS headers by reference (StoredJWS).
        var stored: String
        var headers: [String: String]
        var now: Date
    }

    public init(database: Database) {
        self.database = database
        self.committer = GroupCommit(database: database) { items, sql in
            try await Self.insert(items, sql: sql)
        }
    }

    /// Records a verified notification durably; returns once it is committed.
    public func accept(_ record: NotificationRecord, signedPayload: String, now: Date) async throws {
        // Packed here, on the caller's task: the single writer only writes.
        let packed = StoredJWS.pack(signedPayload)
        // A compact JWS starts with its base64url header, never with the packed form's marker.
        if packed == nil, signedPayload.hasPrefix(StoredJWS.marker) {
            throw StoredJWS.Unstorable()
        }
        try await committer.commit(
            Accepted(
                record: record, stored: packed?.text ?? signedPayload, headers: packed?.headers ?? [:], now: now))
    }

    static func insert(_ items: [Accepted], sql: any SQLDatabase) async throws {
        var seen: Set<String> = []
        var headers: [String: String] = [:]
        for item in items { headers.merge(item.headers) { old, _ in old } }
        if !headers.isEmpty {
            var insert = sql.insert(into: "jws_headers").columns("id", "segment")
            for (id, segment) in headers.sorted(by: { $0.key < $1.key }) { insert = insert.values([id, segment]) }
            try await sql.execute(sql: insert.ignoringConflicts(with: ["id"]).insert) { _ in }
        }
        var insert = sql.insert(into: "notifications").columns(
            "notification_uuid", "notification_type", "subtype", "subject", "transaction_id", "signed_date",
            "environment", "signed_payload", "status", "outcome", "received_at")
        var subjects: [String] = []
        for item in items where seen.insert(item.record.notificationUUID).inserted {
            let record = item.record
            // Nothing to apply without a subject (TEST, a mass extension's summary…): recorded
            // as ignored at once, with why.
            var status = "pending"
            var outcome: String?
            if record.subject == nil {
                status = "ignored"
                if case .ignored(let reason) = NotificationPlanner.action(for: record) {
                    outcome = reason
                } else {
                    outcome = "\(record.type) without a signed transaction"
                }
            }
            if let subject = record.subject { subjects.append(subject) }
            insert = insert.values([
                record.notificationUUID, record.type, record.subtype, record.subject ?? "",
                record.transaction?.transactionId, record.signedDate, record.environment, item.stored,
                status, outcome, item.now.milliseconds,
            ])
        }
        guard !seen.isEmpty else { return }
        try await sql.execute(sql: insert.ignoringConflicts(with: ["notification_uuid"]).insert) { _ in }
        try await wake(Array(Set(subjects)), sql: sql, now: items[0].now)
    }

    /// Makes the `apply_notifications` job of each subject due now: created, woken after it
    /// finished, or — while it runs — marked to run again (its completion then leaves it
    /// pending: `JobStore.complete(_:ifLeasedUntil:)`).
    static func wake(_ subjects: [String], sql: any SQLDatabase, now: Date) async throws {
        guard !subjects.isEmpty else { return }
        var insert = sql.insert(into: "jobs").columns(
            "id", "kind", "dedupe_key", "payload", "status", "attempts", "run_at", "created_at", "stuck_reported")
        for subject in subjects.sorted() {
            insert = insert.values([
                RowIdentifiers.uuidString(), jobKind, "\(jobKind)|\(subject)", subject, "pending", 0,
                now.milliseconds, now.milliseconds, 0,
            ])
        }
        try await sql.raw(
            """
            \(insert.insert) ON CONFLICT (dedupe_key) DO UPDATE SET status = 'pending', run_at = excluded.run_at,
            attempts = 0, created_at = CASE WHEN jobs.status = 'pending' THEN jobs.created_at ELSE excluded.created_at END
            """
        ).run()
    }

    /// Notifications held for want of an account become pending again, and their subjects'
    /// jobs due (an account now owns the subscription).
    static func release(_ subjects: [String], sql: any SQLDatabase, now: Date) async throws {
        let held = try await sql.raw(
            """
            SELECT DISTINCT subject FROM notifications WHERE subject IN (\(binds: subjects)) AND status = 'unattributed'
            """
        ).all().map { try $0.decode(column: "subject", as: String.self) }
        guard !held.isEmpty else { return }
        try await sql.raw(
            "UPDATE notifications SET status = 'pending' WHERE subject IN (\(binds: held)) AND status = 'unattributed'"
        ).run()
        try await wake(held, sql: sql, now: now)
    }

    // MARK: Applying

    /// How one notification was applied.
    public struct Applied: Sendable, Hashable {
        public var notificationUUID: String
        public var status: String
        public var outcome: String
    }

    /// What applying needs from the configuration: the catalog, the ownership policy, and
    /// whether a CONSUMPTION_REQUEST gets a `send_consumption` job.
    public struct Settings: Sendable {
        public var catalog: Catalog
        public var policy: OwnershipPolicy
        public var consumptionEnabled: Bool
        /// Reads a stored `signedPayload` back (it was verified when it was accepted; the raw
        /// notification is what is kept, nothing decoded beside it).
        public var read: @Sendable (String) throws -> NotificationRecord
        /// More accounts than this on one Apple Account: `shared_apple_id`.
        public var sharedAppleIdLimit = OfferStore.defaultSharedAppleIdLimit
        /// The deployment's apps: what a notification delivers records its app.
        public var apps = AppDirectory()

        public init(
            catalog: Catalog, policy: OwnershipPolicy, consumptionEnabled: Bool,
            read: @escaping @Sendable (String) throws -> NotificationRecord
        ) {
            self.catalog = catalog
            self.policy = policy
            self.consumptionEnabled = consumptionEnabled
            self.read = read
        }
    }

    public static let consumptionJobKind = "send_consumption"

    /// The `apply_notifications` job a run completes: done with the notifications, unless it
    /// was woken meanwhile (`JobStore.complete(_:ifLeasedUntil:)`).
    public struct Claim: Sendable {
        public var jobId: String
        public var leasedUntil: Date

        public init(jobId: String, leasedUntil: Date) {
            self.jobId = jobId
            self.leasedUntil = leasedUntil
        }
    }

    /// Applies every pending notification of `subjects` — each subject's oldest `signedDate`
    /// first — in one transaction under the subjects' locks (taken in one order, so two
    /// instances never wait on each other in a circle), and completes their jobs in it: one
    /// commit for a whole claim of jobs.
    public func apply(subjects: [String], completing claims: [Claim] = [], settings: Settings, now: Date)
        async throws -> [Applied]
    {
        let kind = database.kind
        let subjects = Array(Set(subjects)).sorted()
        return try await database.transaction { sql in
            try await Self.lock(subjects, sql: sql, kind: kind)
            let rows = try await sql.raw(
                """
                SELECT notification_uuid, signed_payload FROM notifications WHERE subject IN (\(binds: subjects))
                AND status = 'pending' ORDER BY subject, signed_date, notification_uuid
                """
            ).all()
            // Deliveries (most notifications) go through the delivery path in runs, one batch
            // each; anything else (a refund, a consumption request…) ends a run, so every
            // subject's notifications still apply in order.
            var applied: [Applied] = []
            var run: [(String, NotificationRecord)] = []
            func flush() async throws {
                guard !run.isEmpty else { return }
                let results = try await NotificationApplier.deliver(
                    run.map(\.1), settings: settings, sql: sql, combineWrites: kind == .postgres, now: now)
                for ((uuid, _), (status, outcome)) in zip(run, results) {
                    applied.append(Applied(notificationUUID: uuid, status: status, outcome: outcome))
                }
                run = []
            }
            for row in rows {
                let uuid = try row.decode(column: "notification_uuid", as: String.self)
                let stored = try row.decode(column: "signed_payload", as: String.self)
                guard let signedPayload = try await original(stored, sql: sql),
                    let record = try? settings.read(signedPayload)
                else {
                    try await flush()
                    applied.append(
                        Applied(
                            notificationUUID: uuid, status: "ignored", outcome: "the stored notification cannot be read"
                        ))
                    continue
                }
                if NotificationPlanner.action(for: record) == .deliver {
                    run.append((uuid, record))
                    continue
                }
                try await flush()
                let (status, outcome) = try await NotificationApplier.apply(
                    record, settings: settings, sql: sql, now: now)
                applied.append(Applied(notificationUUID: uuid, status: status, outcome: outcome))
            }
            try await flush()
            if !applied.isEmpty {
                // One statement for every status (VALUES names its columns column1… on both
                // databases).
                let rows = applied.map { result in
                    SQLGroupExpression(
                        [
                            SQLBind(result.notificationUUID), SQLBind(result.status),
                            SQLBind(String(result.outcome.prefix(2000))),
                        ]
                            as [any SQLExpression])
                }
                try await sql.raw(
                    """
                    UPDATE notifications SET status = v.column2, outcome = v.column3, applied_at = \(bind: now.milliseconds)
                    FROM (VALUES \(SQLList(rows))) AS v WHERE notifications.notification_uuid = v.column1
                    """
                ).run()
            }
            if !claims.isEmpty {
                let rows = claims.map {
                    SQLGroupExpression(
                        [SQLBind($0.jobId), SQLBind($0.leasedUntil.milliseconds)] as [any SQLExpression])
                }
                try await sql.raw(
                    """
                    UPDATE jobs SET status = 'done' FROM (VALUES \(SQLList(rows))) AS v
                    WHERE jobs.id = v.column1 AND jobs.run_at = v.column2
                    """
                ).run()
            }
            return applied
        }
    }

    /// The `signedPayload` Apple sent, from its stored form; nil when a header it refers to
    /// is not recorded.
    func original(_ stored: String, sql: any SQLDatabase) async throws -> String? {
        // Headers read for this text are kept here too, so each is read once even if the
        // shared cache drops it meanwhile: every round adds one, so the loop ends.
        var read: [String: String] = [:]
        while true {
            do {
                return try StoredJWS.unpack(stored) { read[$0] ?? headers.get($0) }
            } catch let unknown as StoredJWS.UnknownHeader {
                guard read[unknown.id] == nil else { return nil }
                let row = try await sql.raw("SELECT segment FROM jws_headers WHERE id = \(bind: unknown.id)").first()
                guard let segment = try row?.decode(column: "segment", as: String.self),
                    StoredJWS.id(segment.utf8) == unknown.id
                else { return nil }
                read[unknown.id] = segment
                headers.put([unknown.id: segment])
            }
        }
    }

    /// Holds `subject`'s lock to the end of the transaction (PostgreSQL; SQLite has one
    /// writer): another instance applying the same subject waits here, then finds nothing
    /// pending.
    static func lock(_ subjects: [String], sql: any SQLDatabase, kind: Database.Kind) async throws {
        guard kind == .postgres, !subjects.isEmpty else { return }
        // One statement, the locks taken in one order (sorted), so two instances locking
        // overlapping sets never wait on each other in a circle.
        let keys = subjects.sorted().map { SQLGroupExpression([SQLBind("notifications|" + $0)] as [any SQLExpression]) }
        try await sql.raw(
            """
            SELECT pg_advisory_xact_lock(hashtext(k)) FROM (SELECT column1 AS k FROM (VALUES \(SQLList(keys))) AS v
            ORDER BY column1) AS ordered
            """
        ).run()
    }

    // MARK: Reads

    public struct Stored: Sendable, Hashable {
        public var notificationUUID: String
        public var type: String
        public var subtype: String?
        public var subject: String
        public var signedDate: Date
        public var status: String
        public var outcome: String?
        public var receivedAt: Date
    }

    public func notification(_ uuid: String) async throws -> Stored? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM notifications WHERE notification_uuid = \(bind: uuid)").first().map(
                Self.decode)
        }
    }

    public func notifications(subject: String? = nil) async throws -> [Stored] {
        try await database.read { sql in
            if let subject {
                return try await sql.raw(
                    "SELECT * FROM notifications WHERE subject = \(bind: subject) ORDER BY signed_date, notification_uuid"
                ).all().map(Self.decode)
            }
            return try await sql.raw("SELECT * FROM notifications ORDER BY received_at, notification_uuid").all().map(
                Self.decode)
        }
    }

    /// Notifications recorded and not yet applied (the applier's backlog), by index.
    public func pendingCount() async throws -> Int {
        try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM notifications WHERE status = 'pending'").first()?.decode(
                column: "n", as: Int.self) ?? 0
        }
    }

    /// Every notification recorded.
    public func count() async throws -> Int {
        try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM notifications").first()?.decode(column: "n", as: Int.self) ?? 0
        }
    }

    /// Notifications by status (`pending` is the applier's backlog).
    public func counts() async throws -> [String: Int] {
        try await database.read { sql in
            var counts: [String: Int] = [:]
            for row in try await sql.raw("SELECT status, COUNT(*) AS n FROM notifications GROUP BY status").all() {
                counts[try row.decode(column: "status", as: String.self)] = try row.decode(column: "n", as: Int.self)
            }
            return counts
        }
    }

    /// Subjects with notifications still pending (a job lost with its lease is found again).
    public func pendingSubjects(limit: Int = 1000) async throws -> [String] {
        try await database.read { sql in
            try await sql.raw(
                "SELECT DISTINCT subject FROM notifications WHERE status = 'pending' LIMIT \(unsafeRaw: String(limit))"
            ).all().map { try $0.decode(column: "subject", as: String.self) }
        }
    }

    static func decode(_ row: any SQLRow) throws -> Stored {
        Stored(
            notificationUUID: try row.decode(column: "notification_uuid", as: String.self),
            type: try row.decode(column: "notification_type", as: String.self),
            subtype: try row.decode(column: "subtype", as: String?.self),
            subject: try row.decode(column: "subject", as: String.self),
            signedDate: Date(milliseconds: try row.decode(column: "signed_date", as: Int64.self)),
            status: try row.decode(column: "status", as: String.self),
            outcome: try row.decode(column: "outcome", as: String?.self),
            receivedAt: Date(milliseconds: try row.decode(column: "received_at", as: Int64.self)))
    }
}
