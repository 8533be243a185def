import Foundation
import Logging
import NIOCore
import NIOPosix
import SQLKit
import SQLiteKit
import Synchronization
import VaporCSQLite

/// A SQLite connection driven straight through SQLite's C API (the copy SQLiteNIO builds), so a
/// statement costs what SQLite costs: no thread-pool round trip per statement and per row as
/// in SQLiteNIO. Statements are prepared once and cached by their SQL text. Callers run it on
/// the backend's own thread (`ThreadExecutor`); the lock makes any other use safe too.
final class SQLiteHandle: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        var code: Int32
        var message: String
        var description: String { "SQLite error \(code): \(message)" }
    }

    private let lock = NSLock()
    // Guarded by `lock`.
    private var handle: OpaquePointer?
    private var statements: [String: OpaquePointer] = [:]
    private static let cachedStatementLimit = 512

    /// Opens (and with `create`, creates) the database at `path`.
    init(path: String, create: Bool = true) throws {
        let flags =
            (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_URI
        var handle: OpaquePointer?
        // A new database file is readable by its owner only (purchases, accounts, proofs);
        // SQLite gives its -wal and -shm files the same permissions.
        if create && !path.hasPrefix(":") && !path.hasPrefix("file:")
            && !FileManager.default.fileExists(atPath: path)
        {
            _ = FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600])
        }
        let status = sqlite_nio_sqlite3_open_v2(path, &handle, flags, nil)
        guard status == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite_nio_sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite_nio_sqlite3_close_v2(handle)
            throw Failure(code: status, message: message)
        }
        sqlite_nio_sqlite3_extended_result_codes(handle, 1)
        self.handle = handle
    }

    /// Runs one statement, handing each row to `onRow`.
    func execute(_ sql: String, binds: [SQLiteValue], onRow: (SQLiteResultRow) -> Void) throws {
        try execute(cacheKey: sql, sql: { sql }, binds: binds, onRow: onRow)
    }

    /// Runs one statement cached under `cacheKey` (which must name exactly one SQL text): `sql`
    /// is built only when the statement is not prepared yet. A multi-row insert's text is
    /// kilobytes of placeholders; its shape (table, columns, rows) is a key a tenth as long.
    func execute(cacheKey: String, sql: () -> String, binds: [SQLiteValue], onRow: (SQLiteResultRow) -> Void) throws {
        lock.lock()
        defer { lock.unlock() }
        guard let handle else { throw Failure(code: SQLITE_MISUSE, message: "the connection is closed") }
        let statement = try prepared(cacheKey, sql: sql, handle: handle)
        defer {
            sqlite_nio_sqlite3_reset(statement)
            sqlite_nio_sqlite3_clear_bindings(statement)
        }
        guard Int(sqlite_nio_sqlite3_bind_parameter_count(statement)) == binds.count else {
            throw Failure(
                code: SQLITE_RANGE,
                message:
                    "statement has \(sqlite_nio_sqlite3_bind_parameter_count(statement)) parameters, \(binds.count) given"
            )
        }
        for (offset, value) in binds.enumerated() {
            try check(bind(value, at: Int32(offset + 1), in: statement), handle: handle)
        }
        let count = sqlite_nio_sqlite3_column_count(statement)
        var columns: [String] = []
        while true {
            let status = sqlite_nio_sqlite3_step(statement)
            if status == SQLITE_DONE { return }
            guard status == SQLITE_ROW else {
                try check(status, handle: handle)
                return
            }
            if columns.isEmpty && count > 0 {
                columns = (0..<count).map { String(cString: sqlite_nio_sqlite3_column_name(statement, $0)) }
            }
            var values: [SQLiteValue] = []
            values.reserveCapacity(Int(count))
            for index in 0..<count { values.append(Self.column(index, of: statement)) }
            onRow(SQLiteResultRow(columns: columns, values: values))
        }
    }

    /// How long a statement waits for a lock before failing with SQLITE_BUSY (0: not at all).
    func setBusyTimeout(milliseconds: Int32) {
        lock.lock()
        defer { lock.unlock() }
        guard let handle, busyTimeout != milliseconds else { return }
        sqlite_nio_sqlite3_busy_timeout(handle, milliseconds)
        busyTimeout = milliseconds
    }
    // Guarded by `lock`; nil until set here.
    private var busyTimeout: Int32?

    /// Whether a transaction is open on the connection (SQLite is not in autocommit mode).
    var inTransaction: Bool {
        lock.lock()
        defer { lock.unlock() }
        guard let handle else { return false }
        return sqlite_nio_sqlite3_get_autocommit(handle) == 0
    }

    /// After each commit SQLite reports how many pages the write-ahead log holds: from
    /// `threshold` on, `request` asks another connection to checkpoint (`WALCheckpointWorker`),
    /// so copying the log into the database and its fsync no longer stall this connection's
    /// next transaction; from `inlineLimit` on (the other connection cannot keep up, or has
    /// failed) this connection checkpoints itself, as SQLite's own auto-checkpoint does at
    /// 1,000 pages. Replaces that auto-checkpoint.
    func checkpointElsewhere(threshold: Int32, inlineLimit: Int32, request: @escaping @Sendable () -> Void) {
        lock.lock()
        defer { lock.unlock() }
        guard let handle else { return }
        let hook = WALHook(threshold: threshold, inlineLimit: inlineLimit, request: request)
        walHook = hook
        sqlite_nio_sqlite3_wal_hook(
            handle,
            { context, database, name, pages in
                guard let context else { return SQLITE_OK }
                let hook = Unmanaged<WALHook>.fromOpaque(context).takeUnretainedValue()
                if pages >= hook.inlineLimit {
                    sqlite_nio_sqlite3_wal_checkpoint_v2(database, name, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
                } else if pages >= hook.threshold {
                    hook.request()
                }
                return SQLITE_OK
            }, Unmanaged.passUnretained(hook).toOpaque())
    }

    private final class WALHook: Sendable {
        let threshold: Int32
        let inlineLimit: Int32
        let request: @Sendable () -> Void

        init(threshold: Int32, inlineLimit: Int32, request: @escaping @Sendable () -> Void) {
            self.threshold = threshold
            self.inlineLimit = inlineLimit
            self.request = request
        }
    }
    // Guarded by `lock`; kept alive while SQLite holds its pointer.
    private var walHook: WALHook?

    func close() {
        lock.lock()
        defer { lock.unlock() }
        for statement in statements.values { sqlite_nio_sqlite3_finalize(statement) }
        statements = [:]
        sqlite_nio_sqlite3_close_v2(handle)
        handle = nil
    }

    deinit { close() }

    private func prepared(_ key: String, sql: () -> String, handle: OpaquePointer) throws -> OpaquePointer {
        if let statement = statements[key] { return statement }
        let sql = sql()
        var statement: OpaquePointer?
        var trailing = false
        let status = sql.withCString { text in
            var tail: UnsafePointer<CChar>?
            let status = sqlite_nio_sqlite3_prepare_v3(
                handle, text, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, &tail)
            trailing = tail.map { String(cString: $0).contains { !$0.isWhitespace && $0 != ";" } } ?? false
            return status
        }
        try check(status, handle: handle)
        guard let statement else { throw Failure(code: SQLITE_MISUSE, message: "empty SQL statement") }
        // One statement per call: SQL after the first would otherwise be dropped silently.
        guard !trailing else {
            sqlite_nio_sqlite3_finalize(statement)
            throw Failure(code: SQLITE_MISUSE, message: "one SQL statement per query")
        }
        if statements.count >= Self.cachedStatementLimit {
            for cached in statements.values { sqlite_nio_sqlite3_finalize(cached) }
            statements.removeAll(keepingCapacity: true)
        }
        statements[key] = statement
        return statement
    }

    private func bind(_ value: SQLiteValue, at index: Int32, in statement: OpaquePointer) -> Int32 {
        switch value {
        case .null: return sqlite_nio_sqlite3_bind_null(statement, index)
        case .integer(let integer): return sqlite_nio_sqlite3_bind_int64(statement, index, integer)
        case .float(let double): return sqlite_nio_sqlite3_bind_double(statement, index, double)
        case .text(let text):
            var text = text
            return text.withUTF8 { bytes in
                sqlite_nio_sqlite3_bind_text64(
                    statement, index, UnsafeRawPointer(bytes.baseAddress)?.assumingMemoryBound(to: CChar.self),
                    UInt64(bytes.count), transient, UInt8(SQLITE_UTF8))
            }
        case .blob(let bytes):
            return bytes.withUnsafeBytes { buffer in
                sqlite_nio_sqlite3_bind_blob64(statement, index, buffer.baseAddress, UInt64(buffer.count), transient)
            }
        }
    }

    private static func column(_ index: Int32, of statement: OpaquePointer) -> SQLiteValue {
        switch sqlite_nio_sqlite3_column_type(statement, index) {
        case SQLITE_INTEGER: return .integer(sqlite_nio_sqlite3_column_int64(statement, index))
        case SQLITE_FLOAT: return .float(sqlite_nio_sqlite3_column_double(statement, index))
        case SQLITE_TEXT:
            let count = Int(sqlite_nio_sqlite3_column_bytes(statement, index))
            guard let text = sqlite_nio_sqlite3_column_text(statement, index) else { return .text("") }
            return .text(String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self))
        case SQLITE_BLOB:
            let count = Int(sqlite_nio_sqlite3_column_bytes(statement, index))
            guard let blob = sqlite_nio_sqlite3_column_blob(statement, index) else { return .blob([]) }
            return .blob(Array(UnsafeRawBufferPointer(start: blob, count: count)))
        default: return .null
        }
    }

    private func check(_ status: Int32, handle: OpaquePointer) throws {
        guard status != SQLITE_OK && status != SQLITE_DONE && status != SQLITE_ROW else { return }
        throw Failure(code: status, message: String(cString: sqlite_nio_sqlite3_errmsg(handle)))
    }
}

private let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

/// One SQLite value, as stored.
enum SQLiteValue: Sendable, Hashable {
    case null
    case integer(Int64)
    case float(Double)
    case text(String)
    case blob([UInt8])

    /// The value SQLKit hands over as a bind.
    init(bind: any Encodable) throws {
        switch bind {
        case let value as String: self = .text(value)
        case let value as Substring: self = .text(String(value))
        case let value as Int: self = .integer(Int64(value))
        case let value as Int64: self = .integer(value)
        case let value as Int32: self = .integer(Int64(value))
        case let value as Int16: self = .integer(Int64(value))
        case let value as Int8: self = .integer(Int64(value))
        case let value as UInt32: self = .integer(Int64(value))
        case let value as UInt16: self = .integer(Int64(value))
        case let value as UInt8: self = .integer(Int64(value))
        case let value as UInt:
            guard let integer = Int64(exactly: value) else { throw SQLiteValueError.unsupported("UInt \(value)") }
            self = .integer(integer)
        case let value as UInt64:
            guard let integer = Int64(exactly: value) else { throw SQLiteValueError.unsupported("UInt64 \(value)") }
            self = .integer(integer)
        case let value as Double: self = .float(value)
        case let value as Float: self = .float(Double(value))
        case let value as Bool: self = .integer(value ? 1 : 0)
        case let value as [UInt8]: self = .blob(value)
        case let value as Data: self = .blob(Array(value))
        case let value as SQLiteValue: self = value
        case let value as any OptionalBind where value.isNone: self = .null
        default:
            // Wrappers (enums with raw values and the like) encode to one of the above.
            let encoder = SingleValueCapture()
            try bind.encode(to: encoder)
            guard let captured = encoder.value else { throw SQLiteValueError.unsupported("\(type(of: bind))") }
            self = captured
        }
    }

    var string: String? {
        switch self {
        case .text(let text): text
        case .integer(let integer): String(integer)
        case .float(let double): String(double)
        case .blob, .null: nil
        }
    }

    var integer: Int64? {
        switch self {
        case .integer(let integer): integer
        case .float(let double): Int64(exactly: double)
        case .text(let text): Int64(text)
        case .blob, .null: nil
        }
    }

    var double: Double? {
        switch self {
        case .integer(let integer): Double(integer)
        case .float(let double): double
        case .text(let text): Double(text)
        case .blob, .null: nil
        }
    }
}

enum SQLiteValueError: Error, CustomStringConvertible {
    case unsupported(String)
    var description: String {
        switch self {
        case .unsupported(let type): "cannot store a value of type \(type) in SQLite"
        }
    }
}

private protocol OptionalBind { var isNone: Bool { get } }
extension Optional: OptionalBind {
    fileprivate var isNone: Bool { self == nil }
}

/// Captures the one primitive an `Encodable` wrapper encodes itself as.
private final class SingleValueCapture: Encoder, SingleValueEncodingContainer {
    var value: SQLiteValue?
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(Unsupported<Key>())
    }
    func unkeyedContainer() -> any UnkeyedEncodingContainer { Unsupported<SQLiteValueDecoder.Key>() }
    func singleValueContainer() -> any SingleValueEncodingContainer { self }

    func encodeNil() throws { value = .null }
    func encode(_ value: Bool) throws { self.value = .integer(value ? 1 : 0) }
    func encode(_ value: String) throws { self.value = .text(value) }
    func encode(_ value: Double) throws { self.value = .float(value) }
    func encode(_ value: Float) throws { self.value = .float(Double(value)) }
    func encode(_ value: Int) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: Int8) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: Int16) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: Int32) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: Int64) throws { self.value = .integer(value) }
    func encode(_ value: UInt) throws { self.value = try SQLiteValue(bind: value) }
    func encode(_ value: UInt8) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: UInt16) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: UInt32) throws { self.value = .integer(Int64(value)) }
    func encode(_ value: UInt64) throws { self.value = try SQLiteValue(bind: value) }
    func encode<T: Encodable>(_ value: T) throws { self.value = try SQLiteValue(bind: value) }

    /// Structured values have no SQLite column type here: refused, never guessed.
    private struct Unsupported<Key: CodingKey>: KeyedEncodingContainerProtocol, UnkeyedEncodingContainer {
        var codingPath: [any CodingKey] { [] }
        var count: Int { 0 }
        private func refuse() throws -> Never { throw SQLiteValueError.unsupported("a structured value") }
        mutating func encodeNil(forKey key: Key) throws { try refuse() }
        mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws { try refuse() }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key)
            -> KeyedEncodingContainer<NestedKey>
        { KeyedEncodingContainer(Unsupported<NestedKey>()) }
        mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer { self }
        mutating func superEncoder() -> any Encoder { SingleValueCapture() }
        mutating func superEncoder(forKey key: Key) -> any Encoder { SingleValueCapture() }
        mutating func encodeNil() throws { try refuse() }
        mutating func encode<T: Encodable>(_ value: T) throws { try refuse() }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type)
            -> KeyedEncodingContainer<NestedKey>
        { KeyedEncodingContainer(Unsupported<NestedKey>()) }
        mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer { self }
    }
}

/// A row read by `SQLiteHandle`.
struct SQLiteResultRow: SQLRow {
    let columns: [String]
    let values: [SQLiteValue]

    var allColumns: [String] { columns }

    func contains(column: String) -> Bool { columns.contains(column) }

    func decodeNil(column: String) throws -> Bool {
        try value(column) == .null
    }

    func decode<D: Decodable>(column: String, as type: D.Type) throws -> D {
        try D(from: SQLiteValueDecoder(value: value(column), column: column))
    }

    private func value(_ column: String) throws -> SQLiteValue {
        guard let index = columns.firstIndex(of: column) else {
            throw DecodingError.keyNotFound(
                SQLiteValueDecoder.Key(column),
                .init(codingPath: [], debugDescription: "no column '\(column)' in \(columns)"))
        }
        return values[index]
    }
}

/// Decodes one column's value into a primitive (or an optional, or a raw-value wrapper of one).
private struct SQLiteValueDecoder: Decoder, SingleValueDecodingContainer {
    struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(_ string: String) { stringValue = string }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    let value: SQLiteValue
    let column: String
    var codingPath: [any CodingKey] { [Key(column)] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<K: CodingKey>(keyedBy type: K.Type) throws -> KeyedDecodingContainer<K> {
        throw mismatch("a structured value")
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer { throw mismatch("a list") }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    func decodeNil() -> Bool { value == .null }
    func decode(_ type: Bool.Type) throws -> Bool {
        switch value.integer {
        case 0: false
        case 1: true
        default: throw mismatch("Bool")
        }
    }
    func decode(_ type: String.Type) throws -> String {
        guard let string = value.string else { throw mismatch("String") }
        return string
    }
    func decode(_ type: Double.Type) throws -> Double {
        guard let double = value.double else { throw mismatch("Double") }
        return double
    }
    func decode(_ type: Float.Type) throws -> Float { Float(try decode(Double.self)) }
    func decode(_ type: Int.Type) throws -> Int { try integer() }
    func decode(_ type: Int8.Type) throws -> Int8 { try integer() }
    func decode(_ type: Int16.Type) throws -> Int16 { try integer() }
    func decode(_ type: Int32.Type) throws -> Int32 { try integer() }
    func decode(_ type: Int64.Type) throws -> Int64 { try integer() }
    func decode(_ type: UInt.Type) throws -> UInt { try integer() }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try integer() }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try integer() }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try integer() }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try integer() }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try T(from: self) }

    private func integer<T: FixedWidthInteger>() throws -> T {
        guard let integer = value.integer, let exact = T(exactly: integer) else { throw mismatch("\(T.self)") }
        return exact
    }

    private func mismatch(_ expected: String) -> DecodingError {
        .typeMismatch(
            Any.self,
            .init(codingPath: codingPath, debugDescription: "column '\(column)' holds \(value), not \(expected)"))
    }
}

/// SQLKit over `SQLiteHandle`; the SQL dialect is SQLiteKit's.
struct SQLiteDirectDatabase: SQLDatabase {
    let handle: SQLiteHandle
    let logger: Logger
    let eventLoop: any EventLoop
    var dialect: any SQLDialect { SQLiteDialect() }
    var queryLogLevel: Logger.Level? { nil }

    func execute(sql query: any SQLExpression, _ onRow: @escaping @Sendable (any SQLRow) -> Void) async throws {
        if let rows = query as? RowsInsert {
            // Written straight: no SQLKit serialization, no existential per value.
            try handle.execute(
                cacheKey: rows.shapeKey, sql: { rows.sqliteText }, binds: rows.values.map(\.sqlite),
                onRow: { onRow($0) })
            return
        }
        let (sql, binds) = serialize(query)
        try handle.execute(sql, binds: try binds.map(SQLiteValue.init(bind:))) { onRow($0) }
    }

    func execute(sql query: any SQLExpression, _ onRow: @escaping @Sendable (any SQLRow) -> Void)
        -> EventLoopFuture<Void>
    {
        eventLoop.makeFutureWithTask { try await self.execute(sql: query, onRow) }
    }
}

/// Checkpoints the write-ahead log on a connection and a thread of its own, when the writing
/// connection asks (`SQLiteHandle.checkpointElsewhere`): a passive checkpoint, which never
/// waits for and never blocks the writer or the readers. A checkpoint that fails (a full disk,
/// a read-only file) is tried again at the next request; the writer's own checkpoint past its
/// limit, and the periodic truncating one, remain.
final class WALCheckpointWorker: @unchecked Sendable {
    private let handle: SQLiteHandle
    // `condition` guards `requested` and `stopped`.
    private let condition = NSCondition()
    private var requested = false
    private var stopped = false
    private let finished = DispatchSemaphore(value: 0)
    private let checkpoints = Atomic<Int>(0)
    /// Checkpoints run so far.
    var completed: Int { checkpoints.load(ordering: .relaxed) }

    init(path: String) throws {
        handle = try SQLiteHandle(path: path, create: false)
        // The database file is fsynced as the writer's commits are.
        try handle.execute("PRAGMA synchronous=FULL", binds: []) { _ in }
        let thread = Thread { [self] in run() }
        thread.name = "storekeeper-sqlite-checkpoint"
        thread.start()
    }

    /// Asks for a checkpoint (called on the writer's thread, inside its commit: only a flag).
    func request() {
        condition.lock()
        requested = true
        condition.signal()
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while !requested && !stopped { condition.wait() }
            if stopped {
                condition.unlock()
                break
            }
            requested = false
            condition.unlock()
            if (try? handle.execute("PRAGMA wal_checkpoint(PASSIVE)", binds: []) { _ in }) != nil {
                checkpoints.add(1, ordering: .relaxed)
            }
        }
        finished.signal()
    }

    /// Ends the thread (after a checkpoint under way) and closes its connection.
    func stop() {
        condition.lock()
        let running = !stopped
        stopped = true
        condition.signal()
        condition.unlock()
        if running { finished.wait() }
        handle.close()
    }
}
