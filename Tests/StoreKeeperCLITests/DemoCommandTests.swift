import Foundation
import Testing

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

    @Test func invalidOptionsExit64() async throws {
        #expect(try await Self.run(["demo", "--port", "0"]).status == 64)
        #expect(try await Self.run(["demo", "--purchases", "-1"]).status == 64)
    }

    static func run(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = VerifyCommandTests.binary
        process.arguments = arguments
        process.currentDirectoryURL = FileManager.default.temporaryDirectory
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
