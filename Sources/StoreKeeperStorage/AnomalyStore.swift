import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Anomalies and the audit log: raised, resolved by an operator or by a later delivery,
/// and every operator action.
public struct AnomalyStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }
}

/// The anomaly queue and the audit trail.
extension AnomalyStore {
    public struct StoredAnomaly: Sendable, Hashable {
        public var id: String
        public var kind: String
        public var status: String
        public var transactionId: String?
        public var orderId: String?
        public var accountId: String?
        public var detail: String
        public var createdAt: Date
        public var resolvedAt: Date?
        public var resolution: String?
        /// The verified transaction the anomaly holds, for manual delivery.
        public var transaction: StoreTransaction?
        /// The app of its delivery or order, when one was recorded.
        public var appId: String? = nil
        /// The store of the purchase it is about, as recorded.
        public var store: String? = nil
    }

    /// Anomalies by status, a page at a time: at most `limit` (1…10,000), oldest first after
    /// `after` (the last page's last `(createdAt ms, id)`), or newest first before it.
    public func anomalies(
        status: String? = nil, limit: Int = 1_000, after: (Int64, String)? = nil, newestFirst: Bool = false
    ) async throws -> [StoredAnomaly] {
        let limit = max(1, min(limit, 10_000))
        return try await database.read { sql in
            var query = SQLQueryString("SELECT * FROM anomalies WHERE 1 = 1")
            if let status { query += " AND status = \(bind: status)" }
            if let (at, id) = after {
                query +=
                    newestFirst
                    ? " AND (created_at < \(bind: at) OR (created_at = \(bind: at) AND id < \(bind: id)))"
                    : " AND (created_at > \(bind: at) OR (created_at = \(bind: at) AND id > \(bind: id)))"
            }
            query +=
                newestFirst
                ? " ORDER BY created_at DESC, id DESC LIMIT \(unsafeRaw: String(limit))"
                : " ORDER BY created_at, id LIMIT \(unsafeRaw: String(limit))"
            return try await sql.raw(query).all().map(Self.decodeAnomaly)
        }
    }

    /// How many anomalies are open, counted by the database (for `/metrics`).
    public func openAnomalyCount() async throws -> Int {
        try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM anomalies WHERE status = 'open'").first()?
                .decode(column: "n", as: Int.self) ?? 0
        }
    }

    public func anomaly(_ id: String) async throws -> StoredAnomaly? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM anomalies WHERE id = \(bind: id)").first().map(Self.decodeAnomaly)
        }
    }

    static func decodeAnomaly(_ row: any SQLRow) throws -> StoredAnomaly {
        let store = (try? row.decode(column: "store", as: String?.self)) ?? nil
        return StoredAnomaly(
            id: try row.decode(column: "id", as: String.self), kind: try row.decode(column: "kind", as: String.self),
            status: try row.decode(column: "status", as: String.self),
            transactionId: try row.decode(column: "transaction_id", as: String?.self),
            orderId: try row.decode(column: "order_id", as: String?.self),
            accountId: try row.decode(column: "account_id", as: String?.self),
            detail: try row.decode(column: "detail", as: String.self),
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
            resolvedAt: try row.decode(column: "resolved_at", as: Int64?.self).map(Date.init(milliseconds:)),
            resolution: try row.decode(column: "resolution", as: String?.self),
            transaction: try row.decode(column: "payload", as: String?.self).flatMap {
                // A payload held before the transaction recorded its store takes the row's.
                guard var held = try? JSONDecoder().decode(StoreTransaction.self, from: Data($0.utf8)) else {
                    return nil
                }
                if held.storeCode == nil, let store = store.flatMap(Store.init(rawValue:)) { held.store = store }
                return held
            },
            appId: (try? row.decode(column: "app_id", as: String?.self)) ?? nil,
            store: store)
    }

    /// Marks an anomaly resolved with an audit entry; idempotent (resolving twice changes nothing).
    public func resolveAnomaly(_ id: String, resolution: String, actor: String, note: String, now: Date) async throws
        -> StoredAnomaly?
    {
        try await database.transaction { sql in
            guard
                let current = try await sql.raw("SELECT * FROM anomalies WHERE id = \(bind: id)").first().map(
                    Self.decodeAnomaly)
            else { return nil }
            guard current.status == "open" else { return current }
            try await Self.resolve(current, resolution: resolution, actor: actor, note: note, sql: sql, now: now)
            return try await sql.raw("SELECT * FROM anomalies WHERE id = \(bind: id)").first().map(Self.decodeAnomaly)
        }
    }

    /// Closes an open anomaly: its resolution, the audit entry, the `anomaly_resolved` event —
    /// the one way an anomaly is resolved, by an operator or by the server.
    static func resolve(
        _ current: StoredAnomaly, resolution: String, actor: String, note: String, sql: any SQLDatabase, now: Date
    ) async throws {
        try await sql.raw(
            """
            UPDATE anomalies SET status = 'resolved', resolved_at = \(bind: now.milliseconds), resolution = \(bind: resolution)
            WHERE id = \(bind: current.id) AND status = 'open'
            """
        ).run()
        try await PurchaseStore.audit(
            sql, actor: actor, action: "anomaly_\(resolution)", subject: current.id, detail: note, at: now.milliseconds)
        var draft = AnomalyDraft(
            kind: AnomalyDraft.Kind(rawValue: current.kind) ?? .verificationStuck,
            transactionId: current.transactionId, orderId: current.orderId, accountId: current.accountId,
            detail: current.detail)
        draft.store = current.store.flatMap(Store.init(rawValue:))
        try await Self.anomalyEvent(
            "anomaly_resolved", id: current.id, kind: current.kind, resolution: resolution, anomaly: draft,
            appId: current.appId, sql: sql, at: now.milliseconds)
    }

    /// The kinds of anomaly a later delivery of their purchase settles: a payment nobody could
    /// be given, one waiting on verification, one of a product the catalog lacked.
    static let settledByDelivery = [
        AnomalyDraft.Kind.unattributedTransaction.rawValue, AnomalyDraft.Kind.verificationStuck.rawValue,
        AnomalyDraft.Kind.unknownProduct.rawValue,
    ]

    /// Open anomalies about purchases just delivered (by any path: a later submission, a lookup,
    /// reconciliation, an operator) close themselves: `delivered_later`, naming the account.
    static func resolveDeliveredLater(
        _ delivered: [(transactionId: String, accountId: String)], sql: any SQLDatabase, now: Date
    ) async throws {
        guard !delivered.isEmpty else { return }
        let open = try await sql.raw(
            """
            SELECT * FROM anomalies WHERE status = 'open' AND transaction_id IN (\(binds: delivered.map(\.transactionId)))
            """
        ).all().map(Self.decodeAnomaly)
        let recipients = Dictionary(delivered.map { ($0.transactionId, $0.accountId) }, uniquingKeysWith: { a, _ in a })
        for anomaly in open where settledByDelivery.contains(anomaly.kind) {
            guard let transactionId = anomaly.transactionId, let account = recipients[transactionId] else { continue }
            try await resolve(
                anomaly, resolution: "delivered_later", actor: "storekeeper",
                note: "transaction \(transactionId) was delivered to account \(Identifiers.quoted(account))", sql: sql,
                now: now)
        }
    }

    public struct AuditEntry: Sendable, Hashable {
        public var id: String
        public var actor: String
        public var action: String
        public var subject: String?
        public var detail: String
        public var createdAt: Date
    }

    public func audit(limit: Int = 500) async throws -> [AuditEntry] {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM audit ORDER BY created_at DESC, id LIMIT \(bind: limit)").all().map(
                Self.decodeAudit)
        }
    }

    static func decodeAudit(_ row: any SQLRow) throws -> AuditEntry {
        AuditEntry(
            id: try row.decode(column: "id", as: String.self),
            actor: try row.decode(column: "actor", as: String.self),
            action: try row.decode(column: "action", as: String.self),
            subject: try row.decode(column: "subject", as: String?.self),
            detail: try row.decode(column: "detail", as: String.self),
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)))
    }

    /// Records an anomaly outside a delivery (e.g. `verification_stuck` from the job runner);
    /// the same dedupe key is recorded once.
    public func raiseAnomaly(_ anomaly: AnomalyDraft, dedupeKey: String, now: Date) async throws {
        try await database.transaction { sql in
            try await Self.insertAnomaly(anomaly, dedupeKey: dedupeKey, payload: nil, sql: sql, at: now.milliseconds)
        }
    }

    /// A dedupe key (anomalies, jobs) built from its parts as a JSON array: `["kind","123",null]`.
    /// Parts are free text (account ids may hold `|`), so joining them with a separator would let
    /// two different anomalies share a key and one of them never be recorded.
    public static func dedupeKey(_ parts: String?...) -> String {
        var json = JSONOutput(capacity: 64)
        json.beginArray()
        for part in parts {
            if let part { json.string(part) } else { json.null() }
        }
        json.endArray()
        return String(decoding: json.bytes, as: UTF8.self)
    }

    /// The one way an anomaly is recorded: once per dedupe key, and an `anomaly_opened`
    /// webhook event in the same transaction when it is new.
    static func insertAnomaly(
        _ anomaly: AnomalyDraft, dedupeKey: String, payload: String?, sql: any SQLDatabase, at: Int64
    ) async throws {
        let id = RowIdentifiers.uuidString()
        let inserted = try await sql.raw(
            """
            INSERT INTO anomalies (id, dedupe_key, kind, status, transaction_id, order_id, account_id, detail, created_at,
                                   payload, app_id, store)
            VALUES (\(bind: id), \(bind: dedupeKey), \(bind: anomaly.kind.rawValue), 'open',
                    \(bind: anomaly.transactionId), \(bind: anomaly.orderId), \(bind: anomaly.accountId),
                    \(bind: anomaly.detail), \(bind: at), \(bind: payload),
                    COALESCE((SELECT app_id FROM deliveries WHERE transaction_id = \(bind: anomaly.transactionId)),
                             (SELECT app_id FROM orders WHERE order_id = \(bind: anomaly.orderId)),
                             \(bind: anomaly.appId)),
                    COALESCE(\(bind: anomaly.store?.rawValue),
                             (SELECT store FROM deliveries WHERE transaction_id = \(bind: anomaly.transactionId))))
            ON CONFLICT (dedupe_key) DO NOTHING RETURNING id, app_id, store
            """
        ).first()
        guard let inserted else { return }
        var anomaly = anomaly
        anomaly.store = try inserted.decode(column: "store", as: String?.self).flatMap(Store.init(rawValue:))
        try await anomalyEvent(
            "anomaly_opened", id: id, kind: anomaly.kind.rawValue, resolution: nil, anomaly: anomaly,
            appId: try inserted.decode(column: "app_id", as: String?.self), sql: sql, at: at)
    }

    /// An anomaly's webhook event (`anomaly_opened`, `anomaly_resolved`).
    static func anomalyEvent(
        _ event: String, id: String, kind: String, resolution: String?, anomaly: AnomalyDraft, appId: String?,
        sql: any SQLDatabase, at: Int64
    ) async throws {
        try await OutboxStore.append(
            event,
            [
                "id": .string(id), "kind": .string(kind), "status": .string(resolution == nil ? "open" : "resolved"),
                "resolution": .string(resolution), "accountId": .string(anomaly.accountId),
                "orderId": .string(anomaly.orderId), "transactionId": .string(anomaly.transactionId),
                "detail": .string(anomaly.detail), "store": .string(anomaly.store?.rawValue),
                "appId": .string(appId),
            ], sql: sql, at: at)
    }

    public func recordAudit(actor: String, action: String, subject: String?, detail: String, now: Date) async throws {
        try await database.transaction { sql in
            try await PurchaseStore.audit(
                sql, actor: actor, action: action, subject: subject, detail: detail, at: now.milliseconds)
        }
    }
}
