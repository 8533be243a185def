import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresKit
import PostgresNIO
import SQLKit
import Synchronization

/// The database cannot answer now — down, restarting, unreachable, disk full, read-only,
/// locked past the busy timeout, a connection lost or a deadline passed. Retryable: the
/// request is answered 503 `storage_unavailable`, the job retried, and the server recovers by
/// itself when the database does.
public struct StorageUnavailable: Error, CustomStringConvertible, Sendable {
    public var reason: String

    public init(_ reason: String) {
        self.reason = reason
    }

    public var description: String { "storage unavailable: \(reason)" }

    /// `error` as a storage outage, or nil when it is something else (a constraint, a bug).
    public static func classify(_ error: any Error) -> StorageUnavailable? {
        switch error {
        case let unavailable as StorageUnavailable:
            return unavailable
        case let failure as SQLiteHandle.Failure:
            // BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL: the file or the
            // machine, not the statement.
            let primary = failure.code & 0xFF
            return [5, 6, 7, 8, 10, 13, 14, 15].contains(primary)
                ? StorageUnavailable("SQLite: \(failure.message)") : nil
        case let error as PSQLError:
            if error.code == .server {
                let state = error.serverInfo?[.sqlState] ?? ""
                // 08 connection, 53 resources (disk full), 57 operator intervention (shutdown,
                // crash recovery, cannot connect now), 58 system, 25006 read-only (deadlocks are conflicts: retried one by one).
                let unavailable =
                    ["08", "53", "57", "58"].contains(String(state.prefix(2)))
                    || state == "25006"
                return unavailable ? StorageUnavailable("PostgreSQL \(state)") : nil
            }
            if [
                .clientClosedConnection, .serverClosedConnection, .connectionError, .uncleanShutdown, .poolClosed,
                .queryCancelled, .sslUnsupported, .failedToAddSSLHandler,
            ].contains(error.code) {
                return StorageUnavailable("PostgreSQL connection: \(error.code)")
            }
            return nil
        case is CancellationError:
            return StorageUnavailable("cancelled")
        default:
            // The connection pool's own errors (a lease that timed out or was cancelled).
            let type = String(describing: Swift.type(of: error))
            return type.contains("ConnectionPoolError") || type.contains("ChannelError")
                ? StorageUnavailable(type) : nil
        }
    }
}

/// True for the first caller of `claim()` only.
final class FirstClaim: Sendable {
    private let claimed = Mutex(false)

    func claim() -> Bool {
        claimed.withLock { claimed in
            defer { claimed = true }
            return !claimed
        }
    }
}

/// A check part-way to a deadline: from `after` on (every second), give up already when
/// `stillWaiting()` answers why (say, no database connection and the database refusing
/// connections) instead of waiting for the whole deadline; nil goes on waiting.
public struct EarlyDeadline: Sendable {
    public var after: Duration
    public var what: String
    public var stillWaiting: @Sendable () -> String?

    public init(after: Duration, what: String, stillWaiting: @escaping @Sendable () -> String?) {
        self.after = after
        self.what = what
        self.stillWaiting = stillWaiting
    }
}

/// A way to end a `raceDeadline` early from outside, as if its deadline had passed.
public final class DeadlineHandle: Sendable {
    private let expiry = Mutex<(@Sendable (String) -> Void)?>(nil)

    public init() {}

    func arm(_ expire: @escaping @Sendable (String) -> Void) { expiry.withLock { $0 = expire } }

    /// Fails the race now with `StorageUnavailable(reason)` (nothing when it has ended).
    public func expire(_ reason: String) { expiry.withLock { $0 }?(reason) }
}

/// `body`'s result, or `StorageUnavailable` at `deadline` (or at `early`, when its check says
/// so, or when `handle` is expired) without waiting for `body` any longer (it is cancelled,
/// and `onTimeout` runs in the background).
public func raceDeadline<T: Sendable>(
    _ deadline: Duration, what: String, early: EarlyDeadline? = nil, handle: DeadlineHandle? = nil,
    onTimeout: @escaping @Sendable () async -> Void = {},
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let once = FirstClaim()
    let work = Task { try await body() }
    do {
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let giveUp: @Sendable (String) -> Bool = { reason in
                    guard once.claim() else { return false }
                    work.cancel()
                    Task { await onTimeout() }
                    continuation.resume(throwing: StorageUnavailable(reason))
                    return true
                }
                handle?.arm { reason in _ = giveUp(reason) }
                let timer = Task {
                    var failure = "\(what) took longer than \(deadline)"
                    if let early, early.after < deadline {
                        // From `after` on, checked every second until the deadline.
                        let start = ContinuousClock.now
                        try? await Task.sleep(for: early.after)
                        while !Task.isCancelled, ContinuousClock.now - start < deadline {
                            if let why = early.stillWaiting() {
                                failure = "\(early.what) within \(ContinuousClock.now - start) (\(why))"
                                break
                            }
                            try? await Task.sleep(for: min(.seconds(1), deadline - (ContinuousClock.now - start)))
                        }
                    } else {
                        try? await Task.sleep(for: deadline)
                    }
                    guard !Task.isCancelled else { return }
                    _ = giveUp(failure)
                }
                Task {
                    let result = await work.result
                    timer.cancel()
                    guard once.claim() else { return }
                    continuation.resume(with: result)
                }
            }
        } onCancel: {
            work.cancel()
        }
    } catch {
        throw StorageUnavailable.classify(error) ?? error
    }
}

/// `begin` … `COMMIT`, or `ROLLBACK` when `body` throws.
func inTransaction<T: Sendable>(
    _ sql: any SQLDatabase, begin: String, _ body: @Sendable (any SQLDatabase) async throws -> T
) async throws -> T {
    try await sql.raw(SQLQueryString(begin)).run()
    do {
        let result = try await body(sql)
        try await sql.raw("COMMIT").run()
        return result
    } catch {
        try? await sql.raw("ROLLBACK").run()
        throw error
    }
}
