import Synchronization
import Testing

@testable import StoreKeeperStorage

/// `race`: the work's answer, or the deadline's, whichever comes first — and nothing left
/// behind either way (every entry leaves the watcher, the losing work is cancelled).
@Suite struct DeadlinesTests {
    struct Late: Error {}

    @Test func theWorksAnswerWinsBeforeItsDeadline() async throws {
        let value = try await race(deadline: .seconds(30), timedOut: { .failure(Late()) }) { 42 }
        #expect(value == 42)
        await #expect(throws: CancellationError.self) {
            try await race(deadline: .seconds(30), timedOut: { .success(0) }) { throw CancellationError() }
        }
    }

    @Test func theDeadlineAnswersWithoutWaitingAndCancelsTheWork() async throws {
        let cancelled = Mutex(false)
        let started = ContinuousClock.now
        await #expect(throws: Late.self) {
            try await race(deadline: .milliseconds(200), timedOut: { .failure(Late()) }) {
                // Cancellable sleep: ends early only when cancelled.
                try? await Task.sleep(for: .seconds(30))
                cancelled.withLock { $0 = Task.isCancelled }
            }
        }
        #expect(ContinuousClock.now - started < .seconds(10))
        for _ in 0..<200 where !cancelled.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
        #expect(cancelled.withLock { $0 })
    }

    @Test func cancellingTheCallerCancelsTheWork() async throws {
        let caller = Task {
            try await race(deadline: .seconds(30), timedOut: { .success("late") }) {
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
                        deadline: fast ? .seconds(60) : .milliseconds(200), on: deadlines,
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
