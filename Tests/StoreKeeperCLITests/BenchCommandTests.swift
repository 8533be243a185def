import Foundation
import Testing

/// `storekeeper bench --purchases` runs end to end (small numbers: this checks that it works and
/// refuses nonsense, not how fast it is — figures live in BENCHMARKS.md).
@Suite struct BenchCommandTests {
    static var databases: [String?] {
        [nil] + [ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"]].compactMap { $0 }
    }

    @Test(arguments: databases)
    func purchasesBenchDeliversEveryRequest(database: String?) async throws {
        for generator in ["lean", "async-http-client"] {
            let run = try await VerifyCommandTests.run(
                ["bench", "--purchases", "--concurrency", "1", "3", "--requests", "7", "--load-generator", generator]
                    + (database.map { ["--database-url", $0] } ?? []))
            #expect(run.status == 0, "\(run.stderr)")
            // Each level answered every request, and each answer was a new delivery (checked inside).
            #expect(run.stdout.contains("| 1 | 7 |"))
            #expect(run.stdout.contains("| 3 | 7 |"))
            #expect(run.stdout.contains(database == nil ? "end to end — sqlite" : "end to end — postgres"))
            #expect(run.stdout.contains("acknowledged deliveries: 14; in the database: 14 (lost: 0)"))
        }
    }

    /// `bench --purchases --store google_play`: each level is rounds of an App Store window and a
    /// Google Play window in turn (a ratio per round), and every Google purchase was delivered
    /// once (checked inside against the database).
    @Test func googlePlayBenchAlternatesTheStoresInRounds() async throws {
        let run = try await VerifyCommandTests.run(
            ["bench", "--purchases", "--store", "google_play", "--concurrency", "2", "--requests", "200"])
        #expect(run.status == 0, "\(run.stderr)")
        let row = try #require(run.stdout.split(separator: "\n").first { $0.hasPrefix("| 2 | 200 |") }, "\(run.stdout)")
        let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
        #expect(cells.count == 9, "\(row)")
        // 200 purchases a store: two rounds of 100 (a round is at least 100), a ratio each.
        #expect(cells[7].split(separator: " ").compactMap { Double($0) }.count == 2, "\(row)")
        // Each store's CPU per delivery ("google / apple"), both measured.
        let cpu = cells[8].split(separator: "/").compactMap { Double($0.trimmingCharacters(in: .whitespaces)) }
        #expect(cpu.count == 2 && cpu.allSatisfy { $0 > 0 }, "\(row)")
        #expect(run.stdout.contains("Google Play deliveries acknowledged: 200; rows in the database: 200"))
    }

    /// Above --max-in-flight the server sheds: the bench counts those answers instead of failing,
    /// and reports delivered throughput, the shed rate and peak memory per level; a restart
    /// command runs during each level and its recovery is reported.
    @Test func overloadAndRestartAreReported() async throws {
        let run = try await VerifyCommandTests.run([
            "bench", "--purchases", "--concurrency", "64", "--requests", "256", "--max-in-flight", "2",
            "--restart-command", "true",
        ])
        #expect(run.status == 0, "\(run.stderr)")
        let row = try #require(run.stdout.split(separator: "\n").first { $0.hasPrefix("| 64 | 256 |") })
        let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
        let shed = try #require(Double(cells[6].dropLast(2)))
        #expect(shed > 0 && shed < 100, "\(row)")
        #expect(cells[8].hasSuffix("MiB"))
        #expect(run.stdout.contains("restart at concurrency 64 (command exited 0"))
        #expect(run.stdout.contains("(lost: 0)"))
    }

    /// `bench --accounts`: every read and every debit answered (checked inside), beside /healthz.
    @Test(arguments: databases)
    func accountsBenchAnswersEveryReadAndDebit(database: String?) async throws {
        let run = try await VerifyCommandTests.run(
            ["bench", "--accounts", "--senders", "4", "--requests", "40"]
                + (database.map { ["--database-url", $0] } ?? []))
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout.contains("| `GET /v1/accounts/{id}` (balances, entitlements, subscriptions) | 40 |"))
        #expect(run.stdout.contains("| `POST /v1/accounts/{id}/balances/coins/debit` (durable ledger write) | 40 |"))
        let refused = try await VerifyCommandTests.run(["bench", "--accounts", "--requests", "0"])
        #expect(refused.status != 0)
        let alone = try await VerifyCommandTests.run(["bench", "--accounts", "--instances", "2"])
        #expect(alone.status == 64, "--instances goes with --purchases: \(alone.stderr)")
    }

    /// `bench --purchases --instances`: 1 and 2 `storekeeper serve` processes behind nginx on
    /// PostgreSQL (scripts/cluster), every purchase, read and /healthz answered at each level
    /// (a failed request shows in the table's last column), every acknowledged delivery in the
    /// database, and the processes gone afterwards.
    @Test func severalInstancesBehindNginx() async throws {
        try await HeavyTests.shared.run {
            guard let database = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] else { return }
            let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"].contains {
                FileManager.default.isExecutableFile(atPath: $0)
            }
            guard nginx else {
                if ProcessInfo.processInfo.environment["CI"] != nil { Issue.record("nginx is not installed") }
                return
            }
            let run = try await VerifyCommandTests.run([
                "bench", "--purchases", "--instances", "1", "2", "--concurrency", "2", "8", "--requests", "30",
                "--database-url", database,
            ])
            #expect(run.status == 0, "\(run.stderr)")
            let lines = run.stdout.split(separator: "\n")
            let rows = lines.filter { $0.hasPrefix("| 1 |") || $0.hasPrefix("| 2 |") }
            // Two tables; in each, 1 instance direct and through nginx, 2 through nginx, at two
            // client counts.
            #expect(rows.count == 12, "\(run.stdout)")
            let second = try #require(lines.firstIndex { $0.contains("debits/s") })
            for row in lines[second...].filter({ $0.hasPrefix("| 1 |") || $0.hasPrefix("| 2 |") }) {
                let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
                #expect(cells.last == "0", "no request failed: \(row)")
                #expect(!row.contains("not within"), "every notification applied: \(row)")
            }
            #expect(rows.contains { $0.hasPrefix("| 2 | nginx | 8 |") })
            // 6 levels of 30: purchases, debits, and subscriptions (first period + renewal each).
            #expect(run.stdout.contains("acknowledged deliveries: 180; in the database: 180 (lost: 0)"))
            #expect(run.stdout.contains("debits acknowledged 180, stored 180"))
            #expect(run.stdout.contains("notifications acknowledged 180, renewals delivered 360"))
            #expect(run.stdout.contains("pending 0"))
            // Nothing left running: the cluster's directory named its processes.
            #expect(!run.stderr.contains("exited"), "\(run.stderr)")
        }
    }

    @Test func nonsenseIsRefused() async throws {
        for arguments in [
            ["--requests", "0"], ["--concurrency", "0"], ["--load-generator", "curl"], ["--max-in-flight", "0"],
            ["--instances", "0", "--database-url", "postgres://x@127.0.0.1/x"], ["--instances", "2"],
            ["--instances", "2", "--database-url", "sqlite:/tmp/x.sqlite"],
        ] {
            let run = try await VerifyCommandTests.run(["bench", "--purchases"] + arguments)
            #expect(run.status != 0)
            #expect(run.stderr.contains("Error"), "\(run.stderr)")
        }
    }
}
