import Foundation
import Testing

/// `storekeeper local-store root-certificate | sign-transaction`, end to end with `verify`.
@Suite struct LocalStoreCommandTests {
    static func dataDirectory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("cli-local-store-\(UUID().uuidString)").path
    }

    @Test func signedTransactionsVerifyWithThePrintedRoot() async throws {
        let data = Self.dataDirectory()
        defer { try? FileManager.default.removeItem(atPath: data) }
        let root = try await VerifyCommandTests.run(["local-store", "root-certificate", "--data-dir", data])
        #expect(root.status == 0, "\(root.stderr)")
        #expect(root.stdout.components(separatedBy: "-----BEGIN CERTIFICATE-----").count == 3)
        let again = try await VerifyCommandTests.run(["local-store", "root-certificate", "--data-dir", data])
        #expect(again.stdout == root.stdout)  // same keys across invocations
        let rootFile = try VerifyCommandTests.temporaryFile(Data(root.stdout.utf8))

        let signed = try await VerifyCommandTests.run([
            "local-store", "sign-transaction", "--data-dir", data, "--bundle-id", "com.example.app", "--product",
            "pro_monthly", "--app-account-token", "7e3fb20b-4cdb-47cc-936d-99d65f608138", "--environment", "Sandbox",
            "--type", "Auto-Renewable Subscription",
        ])
        #expect(signed.status == 0, "\(signed.stderr)")
        let jws = signed.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(jws.split(separator: ".").count == 3)
        let verified = try await VerifyCommandTests.run([
            "verify", "--root", rootFile, "--bundle-id", "com.example.app", "--environment", "Sandbox",
            try VerifyCommandTests.temporaryFile(Data(jws.utf8)),
        ])
        #expect(verified.status == 0, "\(verified.stderr)")
        #expect(verified.json?["productId"] as? String == "pro_monthly")
        #expect(verified.json?["type"] as? String == "Auto-Renewable Subscription")
        #expect(verified.json?["appAccountToken"] as? String == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
        #expect(verified.json?["expiresDate"] != nil)
        let apple = try await VerifyCommandTests.run(["verify", try VerifyCommandTests.temporaryFile(Data(jws.utf8))])
        #expect(apple.status == 1)
        #expect(apple.stderr.hasPrefix("invalid_chain: "))

        let two = try await VerifyCommandTests.run([
            "local-store", "sign-transaction", "--data-dir", data, "--bundle-id", "b", "--product", "coins",
            "--quantity", "4",
        ])
        let second = try await VerifyCommandTests.run([
            "verify", "--root", rootFile, try VerifyCommandTests.temporaryFile(Data(two.stdout.utf8)),
        ])
        #expect(second.json?["quantity"] as? Int == 4)
        #expect(second.json?["environment"] as? String == "Production")
        #expect(second.json?["transactionId"] as? String != verified.json?["transactionId"] as? String)
    }

    @Test(arguments: [
        ["--quantity", "0"], ["--quantity", "11"], ["--environment", "Xcode"], ["--type", "Gift"],
        ["--app-account-token", "not-a-uuid"],
    ])
    func badArgumentsAreRefused(extra: [String]) async throws {
        let data = Self.dataDirectory()
        defer { try? FileManager.default.removeItem(atPath: data) }
        let result = try await VerifyCommandTests.run(
            ["local-store", "sign-transaction", "--data-dir", data, "--bundle-id", "b", "--product", "p"] + extra)
        #expect(result.status != 0)
        #expect(result.stdout.isEmpty)
        #expect(!result.stderr.isEmpty)
    }
}
