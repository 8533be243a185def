import Foundation
import StoreKeeperSimulator
import StoreKeeperSupport
import Testing

/// The operator dashboard in a real headless browser: `Tests/Browser/dashboard_test.py`
/// (Selenium driving Debian's chromium) against `storekeeper serve` in demo mode. The
/// screenshots of every page land in `test-artefacts/dashboard/`. In CI (`CI` set) a missing
/// browser is a failure; elsewhere the test says what to install and passes.
@Suite struct DashboardBrowserTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func operatorDeliversAnUnattributedPurchaseInARealBrowser() async throws {
        try await HeavyTests.shared.run { try await self.operatorDeliversAnUnattributedPurchaseInARealBrowserAlone() }
    }

    func operatorDeliversAnUnattributedPurchaseInARealBrowserAlone() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dashboard-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        // A fixed port: the local App Store sends its notifications to it (port 0 would leave it
        // no address to send to).
        let port = try FreePort.pick()
        let idle = 30
        let server = try ServerProcess(
            directory: directory,
            environment: ["HTTP_PORT": String(port), "DASHBOARD_SESSION_IDLE_SECONDS": String(idle)])
        defer { server.kill() }
        try await server.waitUntilListening()
        let key = try String(
            contentsOf: directory.appendingPathComponent("storekeeper-data/dev-secret-key"), encoding: .utf8
        ).trimmingCharacters(in: .whitespacesAndNewlines)
        let artefacts = Self.root.appendingPathComponent("test-artefacts/dashboard")

        let python = ChildProcess()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        python.arguments = [
            "python3", Self.root.appendingPathComponent("Tests/Browser/dashboard_test.py").path,
            "--server", "http://127.0.0.1:\(server.port)", "--key", key, "--out", artefacts.path,
            "--idle", String(idle),
        ]
        let output = Pipe()
        python.standardOutput = output
        python.standardError = output
        try python.run()
        // Read while it runs (a full pipe would stop it), on the drain's own thread.
        let drain = PipeDrain(output.fileHandleForReading)
        let deadline = Date().addingTimeInterval(300)
        while python.isRunning, Date() < deadline {
            try await Task.sleep(for: .milliseconds(200))
        }
        if python.isRunning {
            python.terminate()
            Issue.record("the browser test did not finish within 300 s")
        }
        while python.isRunning { try await Task.sleep(for: .milliseconds(50)) }
        let text = try await drain.all()
        if python.terminationStatus == 77 {
            let message = "the browser test needs chromium, chromium-driver and selenium: \(text)"
            if ProcessInfo.processInfo.environment["CI"] != nil { Issue.record(Comment(rawValue: message)) }
            return
        }
        #expect(python.terminationStatus == 0, Comment(rawValue: text))
        #expect(text.contains("all dashboard browser checks passed"), Comment(rawValue: text))
        for page in ["login", "overview", "anomalies", "account", "webhooks", "forged-post", "hostile-text", "expired"]
        {
            #expect(FileManager.default.fileExists(atPath: artefacts.appendingPathComponent("\(page).png").path))
        }
    }
}
