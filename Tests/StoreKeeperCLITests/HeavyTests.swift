/// The tests that start whole systems (a browser, several servers and nginx, the demo's devices,
/// a local App Store and an importer) take turns: run together at the suite's start, on two
/// cores, they starved the rest of the suite past its clients' timeouts.
actor HeavyTests {
    static let shared = HeavyTests()
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    private var started = false

    func run<T: Sendable>(_ body: @Sendable () async throws -> T) async rethrows -> T {
        if busy {
            await withCheckedContinuation { waiting.append($0) }
        } else {
            busy = true
        }
        if !started {
            // The first one lets the other suites' start (hundreds of light tests at once) pass.
            started = true
            try? await Task.sleep(for: .seconds(45))
        }
        defer {
            if waiting.isEmpty { busy = false } else { waiting.removeFirst().resume() }
        }
        return try await body()
    }
}
