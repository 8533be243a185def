import Foundation
import StoreKeeperStorage
import StoreKeeperSupport
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper import` against the local App Store served as Apple (`local-store serve`),
/// with its faults on: Apple's 429s are waited out, its 503s stop the import with the
/// checkpoint kept, a rerun resumes, and nothing is ever delivered twice.
@Suite struct ImportCommandTests {
    @Test func backfillsPerAccountThroughRateLimitsAndOutagesAndResumes() async throws {
        try await HeavyTests.shared.run {
            try await self.backfillsPerAccountThroughRateLimitsAndOutagesAndResumesAlone()
        }
    }

    func backfillsPerAccountThroughRateLimitsAndOutagesAndResumesAlone() async throws {
        let data = LocalStoreCommandTests.dataDirectory()
        defer { try? FileManager.default.removeItem(atPath: data) }
        let store = ChildProcess()
        store.executableURL = VerifyCommandTests.binary
        store.arguments = ["local-store", "serve", "--data-dir", data, "--port", "0", "--clock-scale", "0"]
        let errors = Pipe()
        store.standardError = errors
        store.standardOutput = FileHandle.nullDevice
        try store.run()
        defer { if store.isRunning { store.terminate() } }
        let base = "http://127.0.0.1:\(try await LocalStoreServeTests.announcedPort(errors.fileHandleForReading))"

        func control(_ method: String, _ path: String, _ body: String) async throws -> [String: Any] {
            var request = URLRequest(url: URL(string: "\(base)/control\(path)")!)
            request.httpMethod = method
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(body.utf8)
            return try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(request))
                as? [String: Any]
                ?? [:]
        }
        func bought(_ appleId: String, _ product: String) async throws -> String {
            let reply = try await control("POST", "/purchases", #"{"appleId":"\#(appleId)","productId":"\#(product)"}"#)
            let first = try #require((reply["transactions"] as? [[String: Any]])?.first)
            return try #require((first["originalTransactionId"] ?? first["transactionId"]) as? String)
        }
        // Bought before StoreKeeper: alice's coins and no-ads unlock, bob's subscription.
        let coins = try await bought("apple-alice", "coins_300")
        let ads = try await bought("apple-alice", "remove_ads")
        let pro = try await bought("apple-bob", "pro_monthly")

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("import-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let root = try await LocalStoreServeTests.fetch(
            URLRequest(url: URL(string: "\(base)/control/root-certificate")!))
        try root.write(to: directory.appendingPathComponent("root.pem"))
        let identity =
            try JSONSerialization.jsonObject(
                with: Data(contentsOf: URL(fileURLWithPath: data).appendingPathComponent("server-api-key.json")))
            as? [String: String] ?? [:]
        let config = directory.appendingPathComponent("storekeeper.yaml")
        try """
        database: { url: "sqlite:\(directory.path)/import.sqlite" }
        auth: { secretKeys: [sk_import_test_0123456789abcdef_0123] }
        apple:
          bundleId: com.example.app
          appAppleId: 1234567890
          environments: [Production]
          rootCertificates: [\(directory.appendingPathComponent("root.pem").path)]
          serverAPI:
            issuerId: \(identity["issuerId"] ?? "")
            keyId: \(identity["keyId"] ?? "")
            privateKeyFile: \(data)/server-api-key.p8
            baseURL: \(base)
        """.write(to: config, atomically: true, encoding: .utf8)
        let csv = directory.appendingPathComponent("accounts.csv")
        try """
        accountId,originalTransactionId
        alice,\(coins)
        alice,\(ads)
        bob,\(pro)
        not a row
        mallory,\(ads)
        carol,99999999999
        """.write(to: csv, atomically: true, encoding: .utf8)
        func importing(_ extra: [String] = []) async throws -> (status: Int32, report: [String: Any], output: String) {
            let run = try await DemoCommandTests.run(
                ["import", "--config", config.path, "--csv", csv.path, "--json", "--max-retries", "1"] + extra)
            let json = run.output.firstIndex(of: "{").map { String(run.output[$0...]) } ?? ""
            let report = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String: Any] ?? [:]
            return (run.status, report, run.output)
        }

        // Apple is down (503 on every history call): the import stops at the first row,
        // nothing is marked done.
        _ = try await control("PUT", "/faults", #"{"endpoints":{"history":{"status":503}}}"#)
        let down = try await importing()
        #expect(down.status == 3, Comment(rawValue: down.output))
        #expect(down.report["stoppedAtLine"] as? Int == 2)
        #expect(down.report["rowsDone"] as? Int == 0)
        #expect(down.report["retries"] as? Int == 1)
        #expect(!FileManager.default.fileExists(atPath: csv.path + ".checkpoint"))

        // Apple is back but rate limiting (two 429s): waited out, every row done.
        _ = try await control(
            "PUT", "/faults", #"{"endpoints":{"history":{"status":429,"retryAfterSeconds":1,"count":2}}}"#)
        let done = try await importing()
        #expect(done.status == 1, Comment(rawValue: done.output))  // an invalid row and an unknown id
        #expect(done.report["rowsDone"] as? Int == 5, Comment(rawValue: done.output))
        #expect(done.report["transactionsImported"] as? Int == 3)
        #expect(done.report["conflicts"] as? Int == 1)
        #expect(done.report["rateLimitedWaits"] as? Int == 2)
        #expect((done.report["invalidRows"] as? [String])?.first?.hasPrefix("line 5") == true)
        #expect(done.report["notFound"] as? [String] == ["99999999999"])
        let saved = try String(contentsOfFile: csv.path + ".checkpoint", encoding: .utf8)
        #expect(saved.trimmingCharacters(in: .whitespacesAndNewlines) == "5")

        // The checkpoint: a rerun asks nothing again. From the start (--restart): already known.
        let again = try await importing()
        #expect(again.report["rowsSkipped"] as? Int == 5 && again.report["transactionsImported"] as? Int == 0)
        let restarted = try await importing(["--restart"])
        #expect(restarted.report["transactionsImported"] as? Int == 0, Comment(rawValue: restarted.output))
        #expect(restarted.report["alreadyKnown"] as? Int == 3)

        // What the accounts hold now, read from the database: alice 300 coins and no_ads, bob
        // his subscription, mallory nothing, and an ownership_conflict anomaly naming mallory.
        let database = try await Database.open(url: "sqlite:\(directory.path)/import.sqlite")
        let purchases = PurchaseStore(database: database)
        let alice = try await purchases.accounts.account("alice")
        #expect(alice.balances == ["coins": 300])
        #expect(alice.entitlements.map(\.entitlementId) == ["no_ads"])
        #expect(try await purchases.accounts.account("bob").subscriptions.map(\.productId) == ["pro_monthly"])
        #expect(try await purchases.accounts.account("mallory").entitlements.isEmpty)
        let anomalies = try await purchases.anomalies.anomalies(status: "open")
        #expect(anomalies.map(\.kind) == ["ownership_conflict"] && anomalies.first?.accountId == "mallory")
        try await database.close()

        // Ids given on the command line, with one account.
        let report = try await DemoCommandTests.run([
            "import", "--config", config.path, "--account", "alice",
            "--original-transaction-id", coins, "--json",
        ])
        #expect(report.status == 0, Comment(rawValue: report.output))
        #expect(report.output.contains(#""alreadyKnown" : 1"#), Comment(rawValue: report.output))

        // A RevenueCat Transactions export (its columns, quoting and JSON columns as RevenueCat
        // writes them): dave's App Store purchase is imported for the id the app logged in
        // with; bob's two rows (a purchase and its renewal) are one subscription, already
        // known; Google, Stripe, Sandbox and anonymous rows are left out and counted.
        let dave = try await bought("apple-dave", "coins_60")
        let export = directory.appendingPathComponent("revenuecat.csv")
        let header =
            "rc_original_app_user_id,rc_last_seen_app_user_id_alias,country,product_identifier,start_time,store,"
            + "is_sandbox,store_transaction_id,original_store_transaction_id,entitlement_identifiers,custom_subscriber_attributes"
        try """
        \(header)
        $RCAnonymousID:aa,dave,US,coins_60,2026-11-01 10:00:00,app_store,false,\(dave),\(dave),[],"{""note"": ""a, b""}"
        $RCAnonymousID:bb,bob,US,pro_monthly,2026-10-01 10:00:00,app_store,false,\(pro),\(pro),"[""pro""]",{}
        $RCAnonymousID:bb,bob,US,pro_monthly,2026-11-01 10:00:00,app_store,false,\(pro)1,\(pro),"[""pro""]","{""line"": ""one
        two""}"
        $RCAnonymousID:cc,erin,DE,coins_60,2026-11-02 10:00:00,play_store,false,GPA.1234-5678,GPA.1234-5678,[],{}
        $RCAnonymousID:dd,frank,US,pro_monthly,2026-11-03 10:00:00,stripe,false,sub_1,sub_1,[],{}
        $RCAnonymousID:ee,grace,US,coins_60,2026-11-04 10:00:00,app_store,true,2000000001,2000000001,[],{}
        $RCAnonymousID:ff,$RCAnonymousID:ff,US,coins_60,2026-11-05 10:00:00,app_store,false,2000000002,2000000002,[],{}
        """.write(to: export, atomically: true, encoding: .utf8)
        let fromRevenueCat = try await DemoCommandTests.run([
            "import", "--config", config.path, "--revenuecat", export.path, "--json",
        ])
        #expect(fromRevenueCat.status == 0, Comment(rawValue: fromRevenueCat.output))
        let json = fromRevenueCat.output.firstIndex(of: "{").map { String(fromRevenueCat.output[$0...]) } ?? ""
        let imported = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String: Any] ?? [:]
        #expect(imported["rows"] as? Int == 2, Comment(rawValue: fromRevenueCat.output))
        #expect(imported["transactionsImported"] as? Int == 1)
        #expect(imported["alreadyKnown"] as? Int == 1)
        #expect(
            imported["skippedRows"] as? [String: Int]
                == ["play_store": 1, "stripe": 1, "sandbox": 1, "anonymous customer": 1])
        let reopened = try await Database.open(url: "sqlite:\(directory.path)/import.sqlite")
        #expect(try await PurchaseStore(database: reopened).accounts.account("dave").balances == ["coins": 60])
        try await reopened.close()

        // Not a RevenueCat export: said, exit 1, nothing imported.
        let wrong = directory.appendingPathComponent("wrong.csv")
        try "accountId,originalTransactionId\nalice,1\n".write(to: wrong, atomically: true, encoding: .utf8)
        let refused = try await DemoCommandTests.run(["import", "--config", config.path, "--revenuecat", wrong.path])
        #expect(refused.status == 1 && refused.output.contains("not a RevenueCat Transactions export"))
    }

    @Test func optionsAreChecked() async throws {
        #expect(try await DemoCommandTests.run(["import"]).status == 64)
        #expect(try await DemoCommandTests.run(["import", "--csv", "a.csv", "--revenuecat", "b.csv"]).status == 64)
        #expect(
            try await DemoCommandTests.run(["import", "--revenuecat", "b.csv", "--account-column", "email"]).status
                == 64)
        #expect(try await DemoCommandTests.run(["import", "--original-transaction-id", "1"]).status == 64)
        #expect(
            try await DemoCommandTests.run([
                "import", "--csv", "a.csv", "--account", "x",
                "--original-transaction-id", "1",
            ]).status == 64)
    }
}
