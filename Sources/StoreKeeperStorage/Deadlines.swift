import Foundation
import Synchronization

/// The deadlines of requests in flight, all watched by one thread of their own that wakes
/// every `tick` while any is pending (and sleeps until the next `add` when none is). A timer
/// per request — a sleeping task each — cost a quarter of a cheap request's time; adding and
/// removing an entry here is a lock and a dictionary operation. The thread is not one of
/// Swift's shared pool: a deadline is met even when that pool is saturated, which is when
/// deadlines matter most.
public final class Deadlines: @unchecked Sendable {
    /// The process's watcher: deadlines are met within `tick` of passing.
    public static let shared = Deadlines(tick: .milliseconds(50))

    let tick: Duration
    // `condition` guards the rest.
    private let condition = NSCondition()
    private var next: UInt64 = 0
    private var entries: [UInt64: (at: ContinuousClock.Instant, expire: @Sendable () -> Void)] = [:]
    private var started = false

    public init(tick: Duration) {
        self.tick = tick
    }

    /// Calls `expire` once `at` has passed, unless `remove`d first. Returns the entry's key.
    func add(at: ContinuousClock.Instant, expire: @escaping @Sendable () -> Void) -> UInt64 {
        condition.lock()
        defer { condition.unlock() }
        let key = next
        next += 1
        entries[key] = (at, expire)
        if !started {
            started = true
            let thread = Thread { [self] in watch() }
            thread.name = "storekeeper-deadlines"
            thread.start()
        }
        if entries.count == 1 { condition.signal() }
        return key
    }

    /// Stops watching `key`.
    func remove(_ key: UInt64) {
        condition.lock()
        entries.removeValue(forKey: key)
        condition.unlock()
    }

    /// Entries being watched.
    public var pending: Int {
        condition.lock()
        defer { condition.unlock() }
        return entries.count
    }

    private func watch() {
        let seconds = Double(tick.components.seconds) + Double(tick.components.attoseconds) / 1e18
        while true {
            condition.lock()
            while entries.isEmpty { condition.wait() }
            condition.unlock()
            Thread.sleep(forTimeInterval: seconds)
            let now = ContinuousClock.now
            var expired: [@Sendable () -> Void] = []
            condition.lock()
            for (key, entry) in entries where entry.at <= now {
                expired.append(entry.expire)
                entries.removeValue(forKey: key)
            }
            condition.unlock()
            for expire in expired { expire() }
        }
    }
}

/// `body` in a task of its own (preferring `executor`, when given), raced against `deadline`
/// on `deadlines`: its result, or `timedOut()` as soon as the deadline passes — without
/// waiting for `body` any longer (it is cancelled). Cancelling the caller cancels `body`, whose
/// answer (often `CancellationError`) is then the result.
public func race<T: Sendable>(
    deadline: Duration, on deadlines: Deadlines = .shared, executor: (any TaskExecutor)? = nil,
    timedOut: @escaping @Sendable () -> Result<T, any Error>, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let race = Race()
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let key = deadlines.add(at: .now + deadline) {
                guard race.finish() else { return }
                race.cancelWork()
                continuation.resume(with: timedOut())
            }
            race.setWork(
                Task(executorPreference: executor) {
                    let result: Result<T, any Error>
                    do {
                        result = .success(try await body())
                    } catch {
                        result = .failure(error)
                    }
                    guard race.finish() else { return }
                    deadlines.remove(key)
                    continuation.resume(with: result)
                })
        }
    } onCancel: {
        race.cancelWork()
    }
}

/// Who answered first, the work or its deadline; and the work's task, to cancel.
private final class Race: Sendable {
    private let state = Mutex<(finished: Bool, cancelled: Bool, work: Task<Void, Never>?)>((false, false, nil))

    /// True for the first caller only.
    func finish() -> Bool {
        state.withLock { state in
            defer { state.finished = true }
            return !state.finished
        }
    }

    /// Records the work's task; cancels it if the deadline has already answered or the caller
    /// was cancelled before the task existed.
    func setWork(_ task: Task<Void, Never>) {
        let cancel = state.withLock { state in
            state.work = task
            return state.finished || state.cancelled
        }
        if cancel { task.cancel() }
    }

    func cancelWork() {
        state.withLock { state in
            state.cancelled = true
            return state.work
        }?.cancel()
    }
}
