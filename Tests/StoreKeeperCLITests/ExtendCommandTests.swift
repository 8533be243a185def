import Foundation
import Testing

/// `storekeeper extend`: a goodwill extension from the command line, through the local App
/// Store standing in for Apple (`localAppStore.enabled`), with its exit codes.
@Suite struct ExtendCommandTests {
    static func config(_ directory: URL) throws -> String {
        try ConfigCommandTests.write(
            """
            database: { url: "sqlite:\(directory.path)/storekeeper.sqlite" }
            localAppStore: { enabled: true }
            apple: { bundleId: com.example.app, appAppleId: 1234567890 }
            auth: { secretKeys: ["\(ConfigCommandTests.secret)"] }
            catalog:
              products:
                - { id: pro_monthly, type: auto_renewable, group: pro, grants: { entitlement: pro } }
                - { id: coins, type: consumable, grants: { currency: coins, amount: 5 } }
            """, "storekeeper.yaml", in: directory)
    }

    @Test func massExtensionSucceedsAndBadOptionsAreRefused() async throws {
        let directory = try ConfigCommandTests.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = try Self.config(directory)
        let common = ["--config", file, "--data-dir", directory.appendingPathComponent("data").path]
        let ok = try await VerifyCommandTests.run(
            ["extend", "--product", "pro_monthly", "--days", "3", "--reason", "service_issue", "--note", "outage"]
                + common)
        #expect(ok.status == 0, "\(ok.stderr)")
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(ok.stdout.utf8)) as? [String: Any], "\(ok.stdout)")
        #expect(json["status"] as? String == "succeeded")
        #expect(json["productId"] as? String == "pro_monthly")
        #expect(json["succeededCount"] as? Int == 0)
        #expect(json["requestId"] as? String != nil)

        for (arguments, status) in [
            (["--product", "pro_monthly", "--days", "0", "--reason", "other"], Int32(64)),
            (["--product", "pro_monthly", "--days", "91", "--reason", "other"], 64),
            (["--product", "pro_monthly", "--days", "5", "--reason", "sorry"], 64),
            (["--days", "5", "--reason", "other"], 64),
            (["--product", "pro_monthly", "--subscription", "1", "--days", "5", "--reason", "other"], 64),
            (["--product", "coins", "--days", "5", "--reason", "other"], 1),
            (["--subscription", "424242", "--days", "5", "--reason", "other"], 1),
        ] {
            let run = try await VerifyCommandTests.run(["extend"] + arguments + common)
            #expect(run.status == status, "\(arguments): \(run.stderr)")
            #expect(!run.stderr.isEmpty)
        }
    }
}
