import Foundation
import StoreKeeperSupport
import Testing

/// The README's first screen, as a newcomer follows it: `storekeeper serve` in an empty
/// directory, then the quick start's shell block exactly as written (only its port changed, the
/// server listening on a free one), then the dashboard with the key — the purchase is on the
/// account's page.
@Suite struct ReadmeQuickStartTests {
    static func quickStart() throws -> String {
        let readme = try String(
            contentsOf: DashboardBrowserTests.root.appendingPathComponent("README.md"), encoding: .utf8)
        guard let section = readme.range(of: "\n## Quick start\n"),
            let open = readme.range(of: "```sh\n", range: section.upperBound..<readme.endIndex),
            let close = readme.range(of: "\n```", range: open.upperBound..<readme.endIndex)
        else { throw CocoaError(.fileReadCorruptFile) }
        return String(readme[open.upperBound..<close.lowerBound])
    }

    static func shell(_ script: String, in directory: URL) async throws -> (status: Int32, output: String) {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", script]
        process.runIn(directory)
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let drain = PipeDrain(pipe.fileHandleForReading)
        while process.isRunning { try await Task.sleep(for: .milliseconds(50)) }
        return (process.terminationStatus, try await drain.all())
    }

    @Test func theQuickStartAsWrittenDeliversAPurchaseThatTheDashboardShows() async throws {
        let block = try Self.quickStart()
        #expect(block.contains("curl") && block.contains("localhost:8080") && !block.contains("<"))
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("readme-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(directory: directory)
        defer { server.kill() }
        try await server.waitUntilListening()
        let base = "localhost:\(server.port)"
        let run = try await Self.shell(block.replacingOccurrences(of: "localhost:8080", with: base), in: directory)
        #expect(run.status == 0, Comment(rawValue: run.output))
        #expect(run.output.contains(#""status":"delivered""#), Comment(rawValue: run.output))
        #expect(run.output.contains(#""balances":{"coins":60}"#), Comment(rawValue: run.output))

        // "Then open the dashboard and sign in with the key: the purchase is on u42's page."
        let dashboard = try await Self.shell(
            """
            KEY=$(cat storekeeper-data/dev-secret-key)
            curl -s -c jar -o /dev/null -H 'Origin: http://\(base)' --data-urlencode "key=$KEY" http://\(base)/dashboard/login
            curl -s -b jar http://\(base)/dashboard/accounts/u42
            """, in: directory)
        #expect(dashboard.output.contains("u42"), Comment(rawValue: dashboard.output))
        #expect(dashboard.output.contains("coins_60"), Comment(rawValue: String(dashboard.output.prefix(3000))))
    }
}
