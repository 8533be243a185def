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

        // The rest of the README's quick start, unchanged: pay at the open local App Store,
        // submit, read the account.
        let token = try #require(created?["appAccountToken"] as? String)
        let paid = try await CrashRecoveryTests.post(
            listening, "/local-app-store/control/purchases", key: nil,
            body: #"{"appleId":"player1","productId":"coins_60","appAccountToken":"\#(token)"}"#)
        let signed = try #require((paid["signedTransactions"] as? [String])?.first)
        let delivered = try await CrashRecoveryTests.post(
            listening, "/v1/purchases", key: key, body: #"{"accountId":"u42","signedTransaction":"\#(signed)"}"#)
        #expect(delivered["status"] as? String == "delivered")
        var account = URLRequest(url: URL(string: "http://127.0.0.1:\(listening)/v1/accounts/u42")!)
        account.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        let read =
            try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(account)) as? [String: Any]
        #expect((read?["balances"] as? [String: Int])?["coins"] == 60)
        // Demo mode says what it trusts.
        var status = URLRequest(url: URL(string: "http://127.0.0.1:\(listening)/v1/status")!)
        status.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        let shown =
            try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(status)) as? [String: Any]
        #expect(shown?["mode"] as? String == "demo")
        #expect(shown?["localAppStoreTrusted"] as? Bool == true)
    }
}
