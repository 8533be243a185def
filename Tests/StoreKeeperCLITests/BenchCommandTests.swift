import Foundation
import Testing

/// `storekeeper bench --purchases` runs end to end (small numbers: this checks that it works and
/// refuses nonsense, not how fast it is — figures live in BENCHMARKS.md).
@Suite struct BenchCommandTests {
    static var databases: [String?] {
        [nil] + [ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"]].compactMap { $0 }
    }

    @Test(arguments: databases)
    func purchasesBenchDeliversEveryRequest(database: String?) throws {
        for generator in ["lean", "async-http-client"] {
            let run = try VerifyCommandTests.run(
                ["bench", "--purchases", "--concurrency", "1", "3", "--requests", "7", "--load-generator", generator]
                    + (database.map { ["--database-url", $0] } ?? []))
            #expect(run.status == 0, "\(run.stderr)")
            // Each level answered every request, and each answer was a new delivery (checked inside).
            #expect(run.stdout.contains("| 1 | 7 |"))
            #expect(run.stdout.contains("| 3 | 7 |"))
            #expect(run.stdout.contains(database == nil ? "end to end — sqlite" : "end to end — postgres"))
        }
    }

    @Test func nonsenseIsRefused() throws {
        for arguments in [["--requests", "0"], ["--concurrency", "0"], ["--load-generator", "curl"]] {
            let run = try VerifyCommandTests.run(["bench", "--purchases"] + arguments)
            #expect(run.status != 0)
            #expect(run.stderr.contains("Error"), "\(run.stderr)")
        }
    }
}
