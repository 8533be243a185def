import Synchronization
import Testing

@testable import StoreKeeperStorage

/// `race`: the work's answer, or the deadline's, whichever comes first — and nothing left
/// behind either way (every entry leaves the watcher, the losing work is cancelled).
@Suite struct DeadlinesTests {
    struct Late: Error {}

    // Deadlines here are an hour wherever the work must win: in a full test run Swift's pool
    // can be saturated for tens of seconds, while the watcher, on its own thread, is not.

    @Test func theWorksAnswerWinsBeforeItsDeadline() async throws {
        let value = try await race(deadline: .seconds(3600), timedOut: { .failure(Late()) }) { 42 }
        #expect(value == 42)
        await #expect(throws: CancellationError.self) {
            try await race(deadline: .seconds(3600), timedOut: { .success(0) }) { throw CancellationError() }
        }
    }

    @Test func theDeadlineAnswersWithoutWaitingAndCancelsTheWork() async throws {
        let release = Mutex<CheckedContinuation<Void, Never>?>(nil)
        let finished = Mutex(false)
        let cancelled = Mutex<Bool?>(nil)
        await #expect(throws: Late.self) {
            try await race(deadline: .milliseconds(200), timedOut: { .failure(Late()) }) {
                // Not cancellable: it ends only when the test lets it.
                await withCheckedContinuation { continuation in release.withLock { $0 = continuation } }
                cancelled.withLock { $0 = Task.isCancelled }
                finished.withLock { $0 = true }
            }
        }
        // Answered while the work was still running…
        #expect(finished.withLock { $0 } == false)
        for _ in 0..<12_000 where release.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(10)) }
        release.withLock { $0?.resume() }
        // …and the work was cancelled.
        for _ in 0..<12_000 where cancelled.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(10)) }
        #expect(cancelled.withLock { $0 } == true)
    }

    @Test func cancellingTheCallerCancelsTheWork() async throws {
        let caller = Task {
            try await race(deadline: .seconds(3600), timedOut: { .success("late") }) {
                try await Task.sleep(for: .seconds(30))
                return "slept"
            }
        }
        try await Task.sleep(for: .milliseconds(50))
        caller.cancel()
        await #expect(throws: CancellationError.self) { try await caller.value }
    }

    /// Many at once, half answered by their deadline: each answered exactly once, and the
    /// watcher holds no entry afterwards.
    @Test func manyRacesLeaveNothingBehind() async throws {
        let deadlines = Deadlines(tick: .milliseconds(20))
        let outcomes = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<200 {
                // Even: answered at once, long before a generous deadline. Odd: still sleeping
                // at a short one.
                let fast = index.isMultiple(of: 2)
                group.addTask {
                    try await race(
                        deadline: fast ? .seconds(3600) : .milliseconds(200), on: deadlines,
                        timedOut: { .success("deadline") }
                    ) {
                        if fast { return "work" }
                        try? await Task.sleep(for: .seconds(30))
                        return "work-late"
                    }
                }
            }
            return try await group.reduce(into: [String: Int]()) { $0[$1, default: 0] += 1 }
        }
        #expect(outcomes == ["work": 100, "deadline": 100])
        #expect(deadlines.pending == 0)
    }
}
