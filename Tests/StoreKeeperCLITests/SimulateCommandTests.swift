import Foundation
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper simulate` as a team runs it: the real binary against a real `storekeeper
/// serve` in demo mode; the JSON report's fields, checked against the server's accounts.
@Suite struct SimulateCommandTests {
    @Test func reportsPaidAgainstDeliveredAndExitsZeroWhenClean() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("simulate-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(directory: directory)
        defer { server.kill() }
        try await server.waitUntilListening()
        let key = try String(
            contentsOf: directory.appendingPathComponent("storekeeper-data/dev-secret-key"), encoding: .utf8
        ).trimmingCharacters(in: .whitespacesAndNewlines)

        let run = try await VerifyCommandTests.run([
            "simulate", "--server", "http://127.0.0.1:\(server.port)", "--key", key, "--devices", "4", "--purchases",
            "40", "--crash-rate", "0.3", "--network-failure-rate", "0.3", "--seed", "11", "--json",
        ])
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(run.json, "\(run.stdout)")
        for field in [
            "purchases", "paid", "delivered", "lost", "doubled", "misattributed", "finishedBeforeAck",
            "secondsToSettle",
            "accounts",
        ] {
            #expect(report[field] != nil, "missing \(field)")
        }
        #expect(report["purchases"] as? Int == 40)
        #expect(report["lost"] as? Int == 0 && report["doubled"] as? Int == 0)
        #expect(report["misattributed"] as? Int == 0 && report["finishedBeforeAck"] as? Int == 0)
        #expect(report["paid"] as? Int == report["delivered"] as? Int)
        // What a third party does: each account's `paid` against the server's view of it.
        let accounts = try #require(report["accounts"] as? [[String: Any]])
        #expect(accounts.count == 4)
        for account in accounts {
            let id = try #require(account["accountId"] as? String)
            let paid = try #require(account["paid"] as? [String: Any])
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(server.port)/v1/accounts/\(id)")!)
            request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
            let view = try #require(
                try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(request)) as? [String: Any])
            let balances = view["balances"] as? [String: Int] ?? [:]
            #expect(balances["coins"] ?? 0 == paid["coins"] as? Int ?? 0, "\(id)")
            let entitlements = (view["entitlements"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
            #expect(Set(entitlements) == Set(paid["entitlements"] as? [String] ?? []), "\(id)")
        }
    }

    @Test func unreachableServerIsExitTwoAndBadOptionsAreUsageErrors() async throws {
        let unreachable = try await VerifyCommandTests.run(["simulate", "--server", "http://127.0.0.1:1", "--key", "x"])
        #expect(unreachable.status == 2)
        #expect(unreachable.stderr.contains("simulate:"))
        let badURL = try await VerifyCommandTests.run(["simulate", "--server", "ftp://x", "--key", "x"])
        #expect(badURL.status == 64)
        let badRate = try await VerifyCommandTests.run([
            "simulate", "--server", "http://127.0.0.1:1", "--key", "x", "--crash-rate", "2",
        ])
        #expect(badRate.status == 64)
    }
}
