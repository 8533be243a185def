import Foundation
import Testing

/// `storekeeper chaos` refuses what it cannot do before it starts anything (exit 64, a message
/// naming the option). The runs themselves are `scripts/chaos`, which CI runs after the tests.
@Suite struct ChaosCommandTests {
    @Test func badOptionsAreUsageErrors() async throws {
        let postgres = "postgres://postgres:x@127.0.0.1:1/x"
        for (arguments, message) in [
            (["--database-url", "sqlite:/tmp/x.sqlite"], "--database-url"),
            (["--database-url", postgres, "--runs", "0"], "--runs"),
            (["--database-url", postgres, "--runs", "1001"], "--runs"),
            (["--database-url", postgres, "--seconds", "2"], "--seconds"),
            (["--database-url", postgres, "--fault", "meteor"], "--fault"),
            (["--database-url", postgres, "--fault", "postgres"], "--postgres-cluster"),
        ] {
            let run = try await VerifyCommandTests.run(["chaos"] + arguments)
            #expect(run.status == 64, "\(arguments): \(run.stderr)")
            #expect(run.stderr.contains(message), "\(arguments): \(run.stderr)")
        }
        let missing = try await VerifyCommandTests.run(["chaos"])
        #expect(missing.status == 64, "\(missing.stderr)")
    }
}
