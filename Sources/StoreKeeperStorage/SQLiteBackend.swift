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
    func close() async throws
}

/// One writing connection, work serialized: SQLite has one writer anyway, and a single
/// connection makes `BEGIN IMMEDIATE … COMMIT` the unit of atomicity. (An actor is not enough:
/// it is reentrant at every `await`, and a second BEGIN would land inside the first
/// transaction.) Every transaction runs on the backend's own thread, statement after statement
/// without a thread hop, and its commit's fsync blocks that thread only.
///
/// Reads do not queue behind it: in WAL mode each read runs on a connection of its own
/// (`SQLiteReaders`), on the caller's thread, in a read transaction that sees every commit
/// acknowledged before it began. A database that is not in WAL mode (`sqlite::memory:`) reads
/// through the writer.
final class SQLiteBackend: Backend {
    let handle: SQLiteHandle
    let database: SQLiteDirectDatabase
    let executor: ThreadExecutor
    let lock = AsyncLock()
    private let readers: SQLiteReaders?

    /// How long a statement waits for a lock another connection holds before it fails (503).
    static let busyTimeoutMilliseconds = 10_000
    /// The same for a read: in WAL mode a reader waits only while another process recovers the
    /// log, and it waits on a thread of the shared pool, so not for long.
    static let readerBusyTimeoutMilliseconds: Int32 = 2_000

    init(path: String, logger: Logger) async throws {
        self.path = path
        let handle = try SQLiteHandle(path: path)
        let executor = ThreadExecutor(name: "storekeeper-sqlite")
        let journal: String
        do {
            journal = try await Self.configure(handle, on: executor)
        } catch {
            executor.stop()
            throw error
        }
        self.handle = handle
        self.executor = executor
        let eventLoop = MultiThreadedEventLoopGroup.singleton.any()
        database = SQLiteDirectDatabase(handle: handle, logger: logger, eventLoop: eventLoop)
        readers = journal == "wal" ? SQLiteReaders(path: path, logger: logger, eventLoop: eventLoop) : nil
        // The log's checkpoints on a connection of their own (WAL, a file): without one,
        // SQLite's auto-checkpoint stays with the writer.
        if journal == "wal", let worker = try? WALCheckpointWorker(path: path) {
            checkpointer = worker
            handle.checkpointElsewhere(
                threshold: Self.checkpointPages, inlineLimit: Self.checkpointPages * 8,
                request: { [weak worker] in worker?.request() })
        } else {
            checkpointer = nil
        }
    }

    /// Pages in the log (4 KiB each) past which a commit asks for a checkpoint: SQLite's own
    /// auto-checkpoint threshold.
    static let checkpointPages: Int32 = 1_000
    private let checkpointer: WALCheckpointWorker?
    var checkpointsElsewhere: Int? { checkpointer?.completed }

    /// The writing connection's settings; returns the journal mode SQLite chose.
    private static func configure(_ handle: SQLiteHandle, on executor: ThreadExecutor) async throws -> String {
        try await withTaskExecutorPreference(executor) {
            // WAL for concurrent readers; FULL so a commit is on disk before it is acknowledged.
            var journal = ""
            try handle.execute("PRAGMA journal_mode=WAL", binds: []) { journal = $0.values.first?.string ?? "" }
            for pragma in [
                "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON",
                "PRAGMA busy_timeout=\(Self.busyTimeoutMilliseconds)",
                // A WAL left large after a burst (or failed checkpoints) is cut back to this.
                "PRAGMA journal_size_limit=67108864",
            ] {
                try handle.execute(pragma, binds: []) { _ in }
            }
            return journal.lowercased()
        }
    }

    let path: String

    var walBytes: Int64? {
        (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? NSNumber)?.int64Value ?? 0
    }

    /// Whether reads have connections of their own (WAL mode).
    var readsConcurrently: Bool { readers != nil }

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
        guard let readers else { return try await serialized(body) }
        return try await readers.read(body)
    }

    /// `body` on the writing connection, outside a transaction: that connection's settings.
    func onWriter<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await serialized(body)
    }

    private func serialized<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        try await withTaskExecutorPreference(executor) {
            try await lock.withLock { try await body(database) }
        }
    }

    func close() async throws {
        readers?.close()
        checkpointer?.stop()
        _ = try? await serialized { _ in handle.close() }
        executor.stop()
    }
}

/// The read connections of a database in WAL mode, opened on first need, at most `limit`.
/// A read takes one, runs `BEGIN … COMMIT` around its statements on the caller's thread (no
/// thread hop: a read of one account is tens of microseconds of SQLite), and gives it back.
/// The connections are `query_only`: a write slipped into a read fails instead of bypassing
/// the writer's serialization.
final class SQLiteReaders: Sendable {
    static let limit = 8

    private struct State {
        var idle: [SQLiteHandle] = []
        var closed = false
    }

    private let path: String
    private let logger: Logger
    private let eventLoop: any EventLoop
    private let permits = AsyncLock(permits: SQLiteReaders.limit)
    private let state = Mutex(State())

    init(path: String, logger: Logger, eventLoop: any EventLoop) {
        self.path = path
        self.logger = logger
        self.eventLoop = eventLoop
    }

    /// A read runs on its caller's thread. On an event loop's thread (a connection's request,
    /// `EventLoopPinned`), it must never wait there for a lock — the loop's other connections
    /// would wait with it — so it tries without waiting, and if SQLite is busy (a checkpoint
    /// resetting the log, another process holding the database) it runs again on Swift's
    /// pool, where it waits up to the busy timeout.
    func read<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T) async throws -> T {
        guard MultiThreadedEventLoopGroup.currentEventLoop != nil else {
            return try await attempt(body, busyTimeout: SQLiteBackend.readerBusyTimeoutMilliseconds)
        }
        do {
            return try await attempt(body, busyTimeout: 0)
        } catch let failure as SQLiteHandle.Failure where [SQLITE_BUSY, SQLITE_LOCKED].contains(failure.code & 0xFF) {
            // The same task moves to the pool: still cancelled with the request.
            return try await withTaskExecutorPreference(globalConcurrentExecutor) {
                try await attempt(body, busyTimeout: SQLiteBackend.readerBusyTimeoutMilliseconds)
            }
        }
    }

    private func attempt<T: Sendable>(_ body: @Sendable (any SQLDatabase) async throws -> T, busyTimeout: Int32)
        async throws -> T
    {
        try await permits.withLock {
            let handle = try take()
            defer { give(handle) }
            handle.setBusyTimeout(milliseconds: busyTimeout)
            try handle.execute("BEGIN", binds: []) { _ in }
            do {
                let value = try await body(
                    SQLiteDirectDatabase(handle: handle, logger: logger, eventLoop: eventLoop))
                try handle.execute("COMMIT", binds: []) { _ in }
                return value
            } catch {
                if handle.inTransaction { try? handle.execute("ROLLBACK", binds: []) { _ in } }
                throw error
            }
        }
    }

    func close() {
        let idle = state.withLock { state in
            state.closed = true
            defer { state.idle = [] }
            return state.idle
        }
        for handle in idle { handle.close() }
    }

    private func take() throws -> SQLiteHandle {
        let idle = try state.withLock { state -> SQLiteHandle? in
            guard !state.closed else {
                throw SQLiteHandle.Failure(code: SQLITE_MISUSE, message: "the database is closed")
            }
            return state.idle.popLast()
        }
        if let idle { return idle }
        let handle = try SQLiteHandle(path: path, create: false)
        do {
            try handle.execute("PRAGMA query_only=1", binds: []) { _ in }
        } catch {
            handle.close()
            throw error
        }
        return handle
    }

    /// Back to the idle list, unless the database closed meanwhile or the connection is left
    /// inside a transaction (then it is closed, and the next read opens a fresh one).
    private func give(_ handle: SQLiteHandle) {
        let kept =
            !handle.inTransaction
            && state.withLock { state in
                guard !state.closed else { return false }
                state.idle.append(handle)
                return true
            }
        if !kept { handle.close() }
    }
}

/// A FIFO async semaphore: at most `permits` holders at a time (one: a mutex), waiters
/// resumed in arrival order.
final class AsyncLock: Sendable {
    private struct State {
        var available: Int
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Mutex<State>

    init(permits: Int = 1) {
        precondition(permits > 0)
        state = Mutex(State(available: permits))
    }

    func withLock<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let acquired = state.withLock { state -> Bool in
                if state.available == 0 {
                    state.waiters.append(continuation)
                    return false
                }
                state.available -= 1
                return true
            }
            if acquired { continuation.resume() }
        }
    }

    private func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.available += 1
                return nil
            }
            return state.waiters.removeFirst()  // the permit passes straight to the next waiter
        }
        next?.resume()
    }
}
