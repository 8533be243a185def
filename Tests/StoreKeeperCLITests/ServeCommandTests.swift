import Foundation
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper serve` with no configuration: the README's quick start, as a process.
@Suite struct ServeCommandTests {
    @Test func zeroConfigServeUsesTheLocalAppStoreAndSaysSo() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("serve-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let process = Process()
        process.executableURL = VerifyCommandTests.binary
        process.arguments = ["serve"]
        process.currentDirectoryURL = directory
        var environment = ProcessInfo.processInfo.environment.filter {
            !$0.key.hasPrefix("APPLE_") && !$0.key.hasPrefix("AUTH_")
        }
        environment["HTTP_PORT"] = "0"
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        defer { if process.isRunning { process.terminate() } }

        var log = ""
        let deadline = Date().addingTimeInterval(60)
        var port: Int?
        while Date() < deadline, port == nil {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty {
                try await Task.sleep(for: .milliseconds(50))
                continue
            }
            log += String(decoding: chunk, as: UTF8.self)
            if let range = log.range(of: "StoreKeeper listening on http://127.0.0.1:") {
                port = Int(log[range.upperBound...].prefix(while: \.isNumber))
            }
        }
        let listening = try #require(port)
        #expect(log.contains("using the built-in local App Store"))
        // The development key is generated, stored beside the database and printed once.
        let key = try String(
            contentsOf: directory.appendingPathComponent("storekeeper-data/dev-secret-key"), encoding: .utf8)
        #expect(log.contains(key))
        #expect(FileManager.default.fileExists(atPath: directory.appendingPathComponent("storekeeper.sqlite").path))

        var health = URLRequest(url: URL(string: "http://127.0.0.1:\(listening)/healthz")!)
        health.httpMethod = "GET"
        let body = try await LocalStoreServeTests.fetch(health)
        #expect(String(decoding: body, as: UTF8.self).contains("\"ok\""))

        var order = URLRequest(url: URL(string: "http://127.0.0.1:\(listening)/v1/orders")!)
        order.httpMethod = "POST"
        order.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        order.setValue("application/json", forHTTPHeaderField: "Content-Type")
        order.httpBody = Data(#"{"accountId":"u42","productId":"coins_60"}"#.utf8)
        let created =
            try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(order)) as? [String: Any]
        #expect(created?["status"] as? String == "created")

        process.terminate()
        process.waitUntilExit()
    }
}
