import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresKit
import PostgresNIO
import SQLKit
import Synchronization
import VaporCSQLite

protocol Backend: Sendable {
    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    /// A read of a few indexed rows on a request's path (see `Database.pointRead`).
    func pointRead<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func close() async throws
}

extension Backend {
    func pointRead<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await read(body)
    }
}

/// One connection, work serialized: SQLite has one writer anyway, and a single connection
/// makes `BEGIN IMMEDIATE … COMMIT` the unit of atomicity. (An actor is not enough: it is
/// reentrant at every `await`, and a second BEGIN would land inside the first transaction.)
/// Every transaction runs on the backend's own thread, statement after statement without a
/// thread hop, and its commit's fsync blocks that thread only.
final class SQLiteBackend: Backend {
    let handle: SQLiteHandle
    let database: SQLiteDirectDatabase
    let executor = ThreadExecutor(name: "storekeeper-sqlite")
    let lock = AsyncLock()

    init(path: String, logger: Logger) async throws {
        self.path = path
        handle = try SQLiteHandle(path: path)
        database = SQLiteDirectDatabase(
            handle: handle, logger: logger, eventLoop: MultiThreadedEventLoopGroup.singleton.any())
        try await serialized { sql in
            // WAL for concurrent readers; FULL so a commit is on disk before it is acknowledged.
            try await sql.raw("PRAGMA journal_mode=WAL").run()
            try await sql.raw("PRAGMA synchronous=FULL").run()
            try await sql.raw("PRAGMA foreign_keys=ON").run()
            try await sql.raw("PRAGMA busy_timeout=10000").run()
            // A WAL left large after a burst (or failed checkpoints) is cut back to this.
            try await sql.raw("PRAGMA journal_size_limit=67108864").run()
        }
    }

    let path: String

    var walBytes: Int64? {
        (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? NSNumber)?.int64Value ?? 0
    }

    func checkpoint() async throws -> Bool {
        try await serialized { sql in
            let row = try await sql.raw("PRAGMA wal_checkpoint(TRUNCATE)").first()
            return try row?.decode(column: "busy", as: Int.self) == 0
        }
    }

    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await serialized { sql in try await inTransaction(sql, begin: "BEGIN IMMEDIATE", body) }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await serialized(body)
    }

    private func serialized<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await withTaskExecutorPreference(executor) {
            try await lock.withLock { try await body(database) }
        }
    }

    /// Point reads run on the caller's thread on a connection of their own: in WAL mode a reader
    /// sees every commit made before it began and never waits for the writer (not even for a
    /// commit's fsync), and a read of a few indexed rows costs less than the two thread hops to
    /// the writer's thread and back. In-memory databases (one per connection) read on the
    /// writer's connection; so does a read that finds the database busy, or when every reader
    /// is taken.
    func pointRead<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        guard let reader = takeReader() else { return try await read(body) }
        do {
            let result = try await body(reader)
            putBack(reader)
            return result
        } catch let failure as SQLiteHandle.Failure where failure.code & 0xFF == SQLITE_BUSY {
            putBack(reader)
            return try await read(body)
        } catch {
            putBack(reader)
            throw error
        }
    }

    /// Reader connections not in use, how many are open, and whether the backend is closed.
    private let readers = Mutex<(idle: [SQLiteDirectDatabase], open: Int, closed: Bool)>(([], 0, false))
    static let maximumReaders = 8

    private func takeReader() -> SQLiteDirectDatabase? {
        guard !path.hasPrefix(":"), !path.hasPrefix("file:") else { return nil }
        let (idle, mayOpen) = readers.withLock { readers -> (SQLiteDirectDatabase?, Bool) in
            guard !readers.closed else { return (nil, false) }
            if let idle = readers.idle.popLast() { return (idle, false) }
            guard readers.open < Self.maximumReaders else { return (nil, false) }
            readers.open += 1
            return (nil, true)
        }
        if let idle { return idle }
        guard mayOpen else { return nil }
        do {
            let handle = try SQLiteHandle(path: path)
            // A reader never writes; it gives up on a lock at once (and the read goes to the
            // writer's connection) rather than holding a thread of the shared pool.
            try handle.execute("PRAGMA query_only=1", binds: []) { _ in }
            try handle.execute("PRAGMA busy_timeout=0", binds: []) { _ in }
            return SQLiteDirectDatabase(handle: handle, logger: database.logger, eventLoop: database.eventLoop)
        } catch {
            readers.withLock { $0.open -= 1 }
            return nil
        }
    }

    private func putBack(_ reader: SQLiteDirectDatabase) {
        let keep = readers.withLock { readers in
            guard !readers.closed else {
                readers.open -= 1
                return false
            }
            readers.idle.append(reader)
            return true
        }
        if !keep { reader.handle.close() }
    }

    func close() async throws {
        let idle = readers.withLock { readers in
            readers.closed = true
            readers.open -= readers.idle.count
            defer { readers.idle = [] }
            return readers.idle
        }
        for reader in idle { reader.handle.close() }
        _ = try? await serialized { _ in handle.close() }
        executor.stop()
    }
}

/// A FIFO async mutex: one holder at a time, waiters resumed in arrival order.
final class AsyncLock: Sendable {
    private struct State {
        var locked = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    func withLock<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let acquired = state.withLock { state -> Bool in
                if state.locked {
                    state.waiters.append(continuation)
                    return false
                }
                state.locked = true
                return true
            }
            if acquired { continuation.resume() }
        }
    }

    private func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.locked = false
                return nil
            }
            return state.waiters.removeFirst()  // ownership passes straight to the next waiter
        }
        next?.resume()
    }
}
