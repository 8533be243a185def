import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Foundation
import StoreKeeperSupport
import Synchronization
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper local-store serve` as a separate process: the standalone way to run it.
@Suite struct LocalStoreServeTests {
    @Test func servesTheControlAndServerAPIsAndStopsOnSIGTERM() async throws {
        let data = LocalStoreCommandTests.dataDirectory()
        defer { try? FileManager.default.removeItem(atPath: data) }
        let process = ChildProcess()
        process.executableURL = VerifyCommandTests.binary
        process.arguments = ["local-store", "serve", "--data-dir", data, "--port", "0", "--clock-scale", "0"]
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        defer { if process.isRunning { process.terminate() } }

        // The port is announced on standard error.
        let port = try await Self.announcedPort(errors.fileHandleForReading)
        let base = "http://127.0.0.1:\(port)"

        var purchase = URLRequest(url: URL(string: "\(base)/control/purchases")!)
        purchase.httpMethod = "POST"
        purchase.setValue("application/json", forHTTPHeaderField: "Content-Type")
        purchase.httpBody = Data(#"{"appleId":"amy","productId":"coins_60","quantity":2}"#.utf8)
        let bought = try await Self.fetch(purchase)
        let reply = try JSONSerialization.jsonObject(with: bought) as! [String: Any]
        let signed = try #require((reply["signedTransactions"] as? [String])?.first)

        let roots = CertificateFile.certificates(
            in: Array(try await Self.fetch(URLRequest(url: URL(string: "\(base)/control/root-certificate")!))))
        #expect(roots.count == 2)
        let transaction = try await SignedDataVerifier(.init(trustedRoots: roots, bundleId: "com.example.app"))
            .verifyTransaction(signed)
        #expect(transaction.quantity == 2)

        // The Server API with the key the store generated in its data directory.
        let identity =
            try JSONSerialization.jsonObject(
                with: Data(contentsOf: URL(fileURLWithPath: data).appendingPathComponent("server-api-key.json")))
            as! [String: String]
        let client = try await AppStoreServerAPIClient(
            configuration: .init(
                credentials: .init(
                    issuerId: identity["issuerId"]!, keyId: identity["keyId"]!,
                    privateKeyPEM: try String(contentsOfFile: data + "/server-api-key.p8", encoding: .utf8),
                    bundleId: "com.example.app"),
                baseURL: base, retryPolicy: .none))
        let info = try await client.getTransactionInfo(transaction.transactionId!)
        #expect(info.signedTransactionInfo != nil)

        process.terminate()  // SIGTERM: graceful shutdown
        process.waitUntilExit()
        #expect(process.terminationReason == .exit || process.terminationStatus == 15)
    }

    static func announcedPort(_ handle: FileHandle) async throws -> Int {
        let started = Date()
        let deadline = started.addingTimeInterval(180)
        let drain = PipeDrain(handle)
        while Date() < deadline {
            try await Task.sleep(for: .milliseconds(50))
            let text = drain.text
            if let range = text.range(of: "listening on http://127.0.0.1:") {
                let digits = text[range.upperBound...].prefix(while: \.isNumber)
                if let port = Int(digits), !digits.isEmpty,
                    text[range.upperBound...].dropFirst(digits.count).first == " "
                {
                    return port
                }
            }
        }
        throw ServerDidNotStart(seconds: Date().timeIntervalSince(started), log: drain.text)
    }

    static func fetch(_ request: URLRequest) async throws -> Data {
        try await withCheckedThrowingContinuation { continuation in
            URLSession.shared.dataTask(with: request) { data, _, error in
                if let error {
                    continuation.resume(throwing: error)
                } else {
                    continuation.resume(returning: data ?? Data())
                }
            }.resume()
        }
    }
}
