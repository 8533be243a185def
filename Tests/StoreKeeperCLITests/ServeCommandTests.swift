import Foundation
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper serve` with no configuration: the README's quick start, as a process.
@Suite struct ServeCommandTests {
    @Test func demoModeServeUsesTheLocalAppStoreAndSaysSo() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("serve-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(directory: directory)
        defer { server.kill() }
        let log = try await server.waitUntilListening()
        let listening = server.port
        #expect(log.contains("demo mode"))
        // The development key is generated and stored beside the database; the log names the
        // file, never the key.
        let key = try String(
            contentsOf: directory.appendingPathComponent("storekeeper-data/dev-secret-key"), encoding: .utf8)
        #expect(log.contains("storekeeper-data/dev-secret-key"))
        #expect(!log.contains(key))
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

    }
}
