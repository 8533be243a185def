import Foundation
import StoreKeeperSimulator
import StoreKeeperSupport
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper demo` as a newcomer runs it: every step of the story passes, the summary
/// says every invariant held, exit status 0; bad options are 64.
@Suite struct DemoCommandTests {
    @Test func theWholeStoryRunsAndEveryInvariantHolds() async throws {
        try await HeavyTests.shared.run { try await self.theWholeStoryRunsAndEveryInvariantHoldsAlone() }
    }

    func theWholeStoryRunsAndEveryInvariantHoldsAlone() async throws {
        let (status, output) = try await Self.run(["demo", "--purchases", "24", "--plain"])
        #expect(status == 0, Comment(rawValue: output))
        for step in [
            "A purchase", "A double tap", "killed between payment and upload", "merged 6 + 30", "Apple down",
            "App Review", "forged receipt", "One Apple ID, two app accounts", "renewed", "billing fails",
            "billing recovers", "upgraded", "refunded", "50 % of 60 coins", "claimed later",
            "24 purchases on 6 StoreKit 1 and 2 devices",
        ] {
            #expect(
                output.contains("✔")
                    && output.split(separator: "\n").contains { $0.hasPrefix("✔") && $0.contains(step) },
                "step '\(step)' did not pass:\n\(output)")
        }
        #expect(!output.contains("✘"), Comment(rawValue: output))
        #expect(output.contains("invariants                        all held"), Comment(rawValue: output))
        #expect(output.contains("forgeries rejected                3"))
        // Plain output: no terminal control sequences.
        #expect(!output.contains("\u{1B}["))
    }

    /// `demo --keep`: months of history behind the story, seen through the analytics API while
    /// the server keeps running — subscriptions active in every month, churn, refunds, several
    /// currencies, both stores — then Ctrl-C stops it cleanly.
    @Test func keepLeavesMonthsOfHistoryForTheCharts() async throws {
        try await HeavyTests.shared.run { try await self.keepLeavesMonthsOfHistoryAlone() }
    }

    func keepLeavesMonthsOfHistoryAlone() async throws {
        let port = try FreePort.pick()
        let process = ChildProcess()
        process.executableURL = VerifyCommandTests.binary
        process.arguments = [
            "demo", "--keep", "--plain", "--purchases", "0", "--history-months", "3", "--port", "\(port)",
        ]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        defer { if process.isRunning { process.terminate() } }
        let drain = PipeDrain(pipe.fileHandleForReading)
        let deadline = ContinuousClock.now + .seconds(600)
        while process.isRunning, !drain.text.contains("Ctrl-C stops it."), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(200))
        }
        let output = drain.text
        #expect(output.contains("3 months of history") && !output.contains("✘"), Comment(rawValue: output))
        // Among them: every App Store and Google Play purchase dated before its delivery and after
        // its order — the story's time travel on a store of its own, the history with no order
        // made today for a purchase of months ago.
        #expect(output.contains("invariants                        all held"), Comment(rawValue: output))
        let key = try #require(
            output.split(separator: "\n").first { $0.hasPrefix("  key") }?.split(separator: " ").last.map(String.init),
            Comment(rawValue: output))

        func points(_ metric: String, _ query: String = "") async throws -> [[String: Any]] {
            let from = Calendar(identifier: .gregorian).date(byAdding: .month, value: -3, to: Date())!
            let day = String(ISO8601DateFormatter().string(from: from).prefix(10))
            var request = URLRequest(
                url: URL(string: "http://127.0.0.1:\(port)/v1/analytics/\(metric)?interval=month&from=\(day)\(query)")!)
            request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
            let body = try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(request))
            return (body as? [String: Any])?["points"] as? [[String: Any]] ?? []
        }
        func values(_ points: [[String: Any]]) -> [Double] {
            points.map { ($0["value"] as? Double) ?? Double($0["value"] as? Int ?? 0) }
        }
        // Subscribers in each of the last three months (the first month clipped to `from`).
        let active = values(try await points("active_subscriptions"))
        #expect(active.count >= 3 && active.suffix(3).allSatisfy { $0 > 0 }, "\(active)")
        #expect(values(try await points("churned_subscriptions")).reduce(0, +) > 0)
        let refunds = try await points("refund_rate").map { ($0["numerator"] as? Int) ?? 0 }
        #expect(refunds.reduce(0, +) > 0, "\(refunds)")
        // Several currencies, converted (none left unconverted).
        let proceeds = try await points("proceeds")
        let currencies = Set(proceeds.flatMap { (($0["byCurrency"] as? [String: Any]) ?? [:]).keys })
        #expect(currencies.count >= 3, "\(currencies)")
        // Both stores.
        #expect(values(try await points("new_subscriptions", "&store=google_play")).reduce(0, +) > 0)
        #expect(values(try await points("new_subscriptions", "&store=app_store")).reduce(0, +) > 0)

        process.interrupt()
        while process.isRunning { try await Task.sleep(for: .milliseconds(100)) }
        #expect(process.terminationStatus == 0, Comment(rawValue: drain.text))
    }

    @Test func invalidOptionsExit64() async throws {
        #expect(try await Self.run(["demo", "--port", "0"]).status == 64)
        #expect(try await Self.run(["demo", "--purchases", "-1"]).status == 64)
        #expect(try await Self.run(["demo", "--history-months", "25"]).status == 64)
    }

    static func run(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let process = ChildProcess()
        process.executableURL = VerifyCommandTests.binary
        process.arguments = arguments
        process.runIn(FileManager.default.temporaryDirectory)
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        // Read while it runs: the output may be larger than a pipe's buffer.
        let drain = PipeDrain(pipe.fileHandleForReading)
        while process.isRunning { try await Task.sleep(for: .milliseconds(100)) }
        return (process.terminationStatus, try await drain.all())
    }
}
