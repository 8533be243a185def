import Foundation
import StoreKeeperSimulator
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `storekeeper simulate` as a team runs it: the real binary against a real `storekeeper
/// serve` in demo mode; the JSON report's fields, checked against the server's accounts.
@Suite struct SimulateCommandTests {
    /// `storekeeper serve` in demo mode in a directory of its own, listening, and its secret key.
    /// `fixedPort`: on a port picked here (`HTTP_PORT`), picked again if another process took it
    /// between the pick and the bind.
    static func demoServer(_ name: String, environment: [String: String] = [:], fixedPort: Bool = false)
        async throws -> (directory: URL, server: ServerProcess, key: String)
    {
        guard fixedPort else { return try await demoServerOnce(name, environment: environment) }
        var attempt = 0
        while true {
            attempt += 1
            var environment = environment
            environment["HTTP_PORT"] = String(try FreePort.pick())
            do {
                return try await demoServerOnce(name, environment: environment)
            } catch let error as ServerDidNotStart where attempt < 5 && error.log.contains("already in use") {
                continue
            }
        }
    }

    static func demoServerOnce(_ name: String, environment: [String: String]) async throws -> (
        directory: URL, server: ServerProcess, key: String
    ) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let server = try ServerProcess(directory: directory, environment: environment)
        do {
            try await server.waitUntilListening()
            let key = try String(
                contentsOf: directory.appendingPathComponent("storekeeper-data/dev-secret-key"), encoding: .utf8
            ).trimmingCharacters(in: .whitespacesAndNewlines)
            return (directory, server, key)
        } catch {
            server.kill()
            try? FileManager.default.removeItem(at: directory)
            throw error
        }
    }

    @Test func reportsPaidAgainstDeliveredAndExitsZeroWhenClean() async throws {
        let (directory, server, key) = try await Self.demoServer("simulate")
        defer {
            server.kill()
            try? FileManager.default.removeItem(at: directory)
        }

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

    /// The same seed makes the same purchases and the same payments, whatever the run's timing:
    /// every choice of a purchase is drawn with its tap or its payment (always as many draws),
    /// relaunches draw from the noise stream, nothing unplanned strikes between tap and charge, a
    /// double tap's second tap lands on the first one's payment sheet, and a busy server's
    /// refused order is tapped again.
    @Test func theSameSeedPaysTheSame() async throws {
        let (directory, server, key) = try await Self.demoServer("simulate")
        defer {
            server.kill()
            try? FileManager.default.removeItem(at: directory)
        }
        // Two runs of one seed at once, against one server: each one's timing is disturbed by
        // the other's (crashes, retries and callbacks land differently), its payments must not be.
        @Sendable func simulate() async throws -> (paid: Int, accounts: [String]) {
            let run = try await VerifyCommandTests.run([
                "simulate", "--server", "http://127.0.0.1:\(server.port)", "--key", key, "--devices", "4",
                "--purchases", "40", "--crash-rate", "0.3", "--network-failure-rate", "0.3", "--seed", "5",
                "--storekit", "mixed", "--json",
            ])
            #expect(run.status == 0, "\(run.stderr)")
            let report = try #require(run.json, "\(run.stdout)")
            let accounts = try #require(report["accounts"] as? [[String: Any]])
            let paid = try accounts.map {
                String(
                    decoding: try JSONSerialization.data(withJSONObject: $0["paid"] ?? [:], options: .sortedKeys),
                    as: UTF8.self)
            }
            return (try #require(report["paid"] as? Int), paid)
        }
        async let first = simulate()
        async let second = simulate()
        let runs = try await [first, second]
        #expect(runs[0].paid == runs[1].paid && runs[0].accounts == runs[1].accounts, "\(runs)")
    }

    /// Android devices with Play Billing's behaviour against demo mode's local Google Play:
    /// killed before submitting, requests lost both ways, pending purchases paid later — then
    /// Google's clock past its 3-day refund. Nothing lost, doubled or refunded by Google.
    @Test func androidDevicesAgainstTheLocalGooglePlayLoseNothing() async throws {
        // A fixed port: the local Google Play is reached over HTTP like Google.
        let (directory, server, key) = try await Self.demoServer("simulate-gp", fixedPort: true)
        defer {
            server.kill()
            try? FileManager.default.removeItem(at: directory)
        }
        let run = try await VerifyCommandTests.run([
            "simulate", "--store", "google_play", "--server", "http://127.0.0.1:\(server.port)", "--key", key,
            "--devices", "3", "--purchases", "30", "--crash-rate", "0.3", "--network-failure-rate", "0.3",
            "--pending-rate", "0.2", "--seed", "5", "--json",
        ])
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(run.json, "\(run.stdout)")
        #expect(report["store"] as? String == "google_play")
        // 30 purchases, then 3 more paid just before the server went down for 48 hours of
        // Google's clock: all delivered once and acknowledged in time when it came back.
        #expect(report["purchases"] as? Int == 30 && report["paid"] as? Int == 33)
        #expect(report["delivered"] as? Int == 33)
        #expect(report["outagePurchases"] as? Int == 3 && report["outageHours"] as? Double == 48)
        #expect((report["waitingWhenBack"] as? Int ?? 0) >= 3, "\(report)")
        #expect(report["lost"] as? Int == 0 && report["doubled"] as? Int == 0)
        #expect(report["autoRefunded"] as? Int == 0 && report["unacknowledged"] as? Int == 0)
        #expect((report["crashes"] as? Int ?? 0) > 0 && (report["pending"] as? Int ?? 0) > 0)
        let bad = try await VerifyCommandTests.run([
            "simulate", "--store", "amazon", "--server", "http://127.0.0.1:1", "--key", "x",
        ])
        #expect(bad.status == 64)
        let tooLong = try await VerifyCommandTests.run([
            "simulate", "--store", "google_play", "--server", "http://127.0.0.1:1", "--key", "x", "--outage-hours",
            "61",
        ])
        #expect(tooLong.status == 64)
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
