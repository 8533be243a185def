import ArgumentParser
import Foundation
import Logging
import StoreKeeperServer

/// `storekeeper reverify [--since DATE] [--code CODE]`: re-verifies the kept rejected proofs
/// under the current configuration and delivers each one that now verifies, exactly once.
struct ReverifyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reverify",
        abstract: "Re-verify rejected proofs under the current configuration; deliver those that now verify.",
        discussion: """
            After fixing a misconfiguration (a burst of invalid_chain, wrong_bundle or wrong_environment): \
            the same as POST /v1/rejected-proofs/reverify. Prints {"checked", "delivered", "stillRejected"} \
            as JSON. Safe to run again and beside running servers: each transaction is delivered once.
            """
    )

    @Option(help: "Configuration file (JSON or YAML), as given to serve.")
    var config: String?

    @Option(help: "Only proofs rejected at or after this ISO 8601 date or date-time.")
    var since: String?

    @Option(help: "Only proofs rejected with this code (invalid_chain, wrong_bundle, wrong_environment, …).")
    var code: String?

    @Option(name: .customLong("data-dir"), help: "Where demo mode keeps the local App Store's keys.")
    var dataDirectory: String = "storekeeper-data"

    func run() async throws {
        let filters: (code: String?, since: Date?)
        do {
            filters = try StoreKeeperApp.rejectedProofFilters(code: code, since: since)
        } catch let error as APIError {
            throw ValidationError(error.message)
        }
        let summary = try await ConfigurationErrors.withApp(config: config, dataDirectory: dataDirectory) { app in
            try await app.reverify(since: filters.since, code: filters.code, actor: "cli")
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        print(String(decoding: try encoder.encode(summary), as: UTF8.self))
    }
}
