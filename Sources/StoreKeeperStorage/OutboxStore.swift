import Foundation
import SQLKit
import StoreKeeperSupport
import Synchronization

/// The outbox: events written in the same transaction as the state they describe (a
/// delivery), sent to the app's backend afterwards — at least once, in the order they were
/// written when they succeed the first time, retried with backoff when they do not.
public struct OutboxStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// A new event id: a UUID version 7 (RFC 9562) — the millisecond time, then a counter
    /// within the millisecond, then random bits — so ids sort in the order this process wrote
    /// them, and ties of `created_at` keep that order when the outbox is sent.
    public static func newEventId(now: Date = Date()) -> String {
        eventIds.withLock { $0.next(now: now) }
    }

    private static let eventIds = Mutex(EventIdGenerator())

    /// UUIDv7 with a 12-bit counter for ids made in the same millisecond (RFC 9562, method 1).
    struct EventIdGenerator {
        var milliseconds: UInt64 = 0
        var counter: UInt64 = 0

        mutating func next(now: Date) -> String {
            let current = UInt64(max(0, now.timeIntervalSince1970 * 1000))
            if current > milliseconds {
                (milliseconds, counter) = (current, 0)
            } else if counter < 0xFFF {
                counter += 1
            } else {
                (milliseconds, counter) = (milliseconds + 1, 0)  // 4,096 in one millisecond: borrow the next
            }
            var bytes = [UInt8](repeating: 0, count: 16)
            for index in 0..<6 { bytes[index] = UInt8(truncatingIfNeeded: milliseconds >> (40 - 8 * UInt64(index))) }
            bytes[6] = 0x70 | UInt8(truncatingIfNeeded: counter >> 8)
            bytes[7] = UInt8(truncatingIfNeeded: counter)
            let random = RowIdentifiers.nextWords().0
            for index in 8..<16 { bytes[index] = UInt8(truncatingIfNeeded: random >> (8 * UInt64(index - 8))) }
            bytes[8] = 0x80 | (bytes[8] & 0x3F)
            return bytes.uuidText
        }
    }

    public struct Event: Sendable, Hashable {
        public var id: String
        public var type: String
        /// The event's JSON object, as stored.
        public var payload: String
        public var createdAt: Date
        public var attempts: Int
        /// When the current attempt window began (a replay starts a new one); nil: `createdAt`.
        public var windowStart: Date? = nil
    }

    /// Unsent events that are due, oldest first, leased for `lease` seconds so another
    /// instance (PostgreSQL: `SKIP LOCKED`) or the next poll does not send them meanwhile.
    public func claimDue(now: Date, limit: Int = 64, lease: TimeInterval = 60) async throws -> [Event] {
        let kind = database.kind
        return try await database.transaction { sql in
            let due = now.milliseconds
            let lock = kind == .postgres ? " FOR UPDATE SKIP LOCKED" : ""
            let rows = try await sql.raw(
                """
                SELECT id, event, payload, created_at, attempts, window_start FROM outbox
                WHERE sent_at IS NULL AND dead_at IS NULL AND next_attempt_at <= \(bind: due)
                ORDER BY created_at, id LIMIT \(bind: limit)\(unsafeRaw: lock)
                """
            ).all()
            let events = try rows.map(Self.event)
            if !events.isEmpty {
                try await sql.raw(
                    """
                    UPDATE outbox SET next_attempt_at = \(bind: now.addingTimeInterval(lease).milliseconds)
                    WHERE id IN (\(binds: events.map(\.id)))
                    """
                ).run()
            }
            return events
        }
    }

    static func event(_ row: any SQLRow) throws -> Event {
        Event(
            id: try row.decode(column: "id", as: String.self),
            type: try row.decode(column: "event", as: String.self),
            payload: try row.decode(column: "payload", as: String.self),
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
            attempts: try row.decode(column: "attempts", as: Int.self),
            windowStart: try row.decode(column: "window_start", as: Int64?.self).map(Date.init(milliseconds:)))
    }

    /// Gives up on an event (refused for the whole attempt window): it leaves the queue for the
    /// dead letters, and no longer holds back the events behind it.
    public func markDead(_ id: String, now: Date, error: String) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE outbox SET attempts = attempts + 1, dead_at = \(bind: now.milliseconds),
                last_error = \(bind: String(error.prefix(500))) WHERE id = \(bind: id) AND sent_at IS NULL
                """
            ).run()
        }
    }

    public struct DeadLetter: Sendable, Hashable {
        public var event: Event
        public var deadAt: Date
        public var lastError: String?
    }

    public func deadLetters(limit: Int = 500) async throws -> [DeadLetter] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT id, event, payload, created_at, attempts, window_start, dead_at, last_error FROM outbox
                WHERE dead_at IS NOT NULL AND sent_at IS NULL ORDER BY dead_at, id LIMIT \(unsafeRaw: String(limit))
                """
            ).all().map {
                DeadLetter(
                    event: try Self.event($0),
                    deadAt: Date(milliseconds: try $0.decode(column: "dead_at", as: Int64.self)),
                    lastError: try $0.decode(column: "last_error", as: String?.self))
            }
        }
    }

    /// Puts a dead letter back in the queue, due now, with a new attempt window; false when
    /// there is no such dead letter.
    public func replay(_ id: String, now: Date) async throws -> Bool {
        try await database.transaction { sql in
            guard
                try await sql.raw(
                    "SELECT id FROM outbox WHERE id = \(bind: id) AND dead_at IS NOT NULL AND sent_at IS NULL"
                ).first() != nil
            else { return false }
            try await sql.raw(
                """
                UPDATE outbox SET dead_at = NULL, attempts = 0, next_attempt_at = \(bind: now.milliseconds),
                window_start = \(bind: now.milliseconds) WHERE id = \(bind: id)
                """
            ).run()
            return true
        }
    }

    public func markSent(_ ids: [String], now: Date) async throws {
        guard !ids.isEmpty else { return }
        try await database.transaction { sql in
            try await sql.raw("UPDATE outbox SET sent_at = \(bind: now.milliseconds) WHERE id IN (\(binds: ids))").run()
        }
    }

    public func reschedule(_ id: String, at: Date, error: String) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE outbox SET attempts = attempts + 1, next_attempt_at = \(bind: at.milliseconds),
                last_error = \(bind: String(error.prefix(500))) WHERE id = \(bind: id)
                """
            ).run()
        }
    }

    /// Deletes events sent before `cutoff` (a backend that needs them again replays from its own
    /// store); returns how many.
    public func pruneSent(before cutoff: Date) async throws -> Int {
        try await database.transaction { sql in
            let count =
                try await sql.raw(
                    "SELECT COUNT(*) AS n FROM outbox WHERE sent_at IS NOT NULL AND sent_at < \(bind: cutoff.milliseconds)"
                ).first()?.decode(column: "n", as: Int.self) ?? 0
            if count > 0 {
                try await sql.raw(
                    "DELETE FROM outbox WHERE sent_at IS NOT NULL AND sent_at < \(bind: cutoff.milliseconds)"
                ).run()
            }
            return count
        }
    }

    public func pendingCount() async throws -> Int {
        try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS pending FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL")
                .first()?
                .decode(column: "pending", as: Int.self) ?? 0
        }
    }

    /// Every event, oldest first (operators and tests).
    public func all() async throws -> [(event: Event, sentAt: Date?, lastError: String?)] {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM outbox ORDER BY created_at, id").all().map { row in
                (
                    try Self.event(row),
                    try row.decode(column: "sent_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    try row.decode(column: "last_error", as: String?.self)
                )
            }
        }
    }
}

extension OutboxStore {
    /// A value of an event's JSON object.
    enum Field {
        case string(String?)
        case number(Int64?)
        case strings([String])
    }

    /// Writes an event in the caller's transaction — the refunds, status changes and anomalies
    /// (deliveries, on the hot path, write theirs in bulk).
    static func append(_ event: String, _ fields: [String: Field], sql: any SQLDatabase, at: Int64) async throws {
        try await insert(event, [(json(fields), at)], sql: sql)
    }

    /// Events of one type, one multi-row insert.
    static func insert(_ event: String, _ payloads: [(String, Int64)], sql: any SQLDatabase) async throws {
        guard !payloads.isEmpty else { return }
        var insert = sql.insert(into: "outbox").columns("id", "event", "payload", "created_at")
        for (payload, at) in payloads { insert = insert.values([newEventId(), event, payload, at]) }
        try await sql.execute(sql: insert.insert) { _ in }
    }

    /// An event's JSON object: its keys sorted, an absent value `null`.
    static func json(_ fields: [String: Field]) -> String {
        var json = "{"
        for (index, key) in fields.keys.sorted().enumerated() {
            if index > 0 { json += "," }
            PurchaseStore.appendJSONString(key, to: &json)
            json += ":"
            switch fields[key]! {
            case .string(let value?): PurchaseStore.appendJSONString(value, to: &json)
            case .number(let value?): json += String(value)
            case .string(nil), .number(nil): json += "null"
            case .strings(let values):
                json += "["
                for (index, value) in values.enumerated() {
                    if index > 0 { json += "," }
                    PurchaseStore.appendJSONString(value, to: &json)
                }
                json += "]"
            }
        }
        return json + "}"
    }
}
