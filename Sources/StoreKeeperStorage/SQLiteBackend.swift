import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresKit
import PostgresNIO
import SQLKit
import Synchronization

protocol Backend: Sendable {
    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T
    func close() async throws
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

    func close() async throws {
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
