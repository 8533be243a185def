import ArgumentParser
import Foundation
import StoreKeeperServer

/// `storekeeper extend --product P --days N --reason R`: extends the renewal date of every
/// active subscriber of a product through Apple's mass endpoint (or one subscription with
/// `--subscription`), recorded and audited like the API's, then waits for Apple's answer.
struct ExtendCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "extend",
        abstract: "Extend subscription renewal dates through Apple (goodwill after an outage).",
        discussion: """
            With --product: Apple's Extend Subscription Renewal Dates for All Active Subscribers, its status \
            polled until complete (POST /v1/extensions/mass does the same). With --subscription: one \
            subscription (POST /v1/subscriptions/{id}/extend; at most two per 365 days). Prints the \
            extension as JSON. Exit 0 when Apple extended, 1 when it refused or did not finish within \
            --wait seconds (the request stays queued for the server's job runner), 64 on bad options.
            """
    )

    @Option(help: "The auto-renewable product whose active subscribers are extended.")
    var product: String?

    @Option(help: "One subscription, by original transaction id, instead of a whole product.")
    var subscription: String?

    @Option(help: "Days to add, 1…90.")
    var days: Int

    @Option(help: "undeclared, customer_satisfaction, other or service_issue.")
    var reason: String

    @Option(help: "Why, for the audit log.")
    var note: String = ""

    @Option(help: "Seconds to wait for Apple's answer.")
    var wait: Int = 120

    @Option(help: "Configuration file (JSON or YAML), as given to serve.")
    var config: String?

    @Option(name: .customLong("data-dir"), help: "Where demo mode keeps the local App Store's keys.")
    var dataDirectory: String = "storekeeper-data"

    func validate() throws {
        guard (product == nil) != (subscription == nil) else {
            throw ValidationError("give exactly one of --product and --subscription")
        }
        guard (1...90).contains(days) else { throw ValidationError("--days must be 1…90 (Apple's limit)") }
        guard StoreKeeperApp.extendReasons.contains(reason) else {
            throw ValidationError("--reason must be one of \(StoreKeeperApp.extendReasons.joined(separator: ", "))")
        }
        guard wait >= 0 else { throw ValidationError("--wait must be ≥ 0") }
    }

    func run() async throws {
        let outcome = try await ConfigurationErrors.withApp(config: config, dataDirectory: dataDirectory) {
            app -> (status: String, json: String)? in
            do {
                return try await app.extendAndWait(
                    product: product, subscription: subscription, days: days, reason: reason, note: note,
                    wait: .seconds(wait))
            } catch let error as APIError {
                // Nothing was recorded: an unknown product or subscription, or Apple's limit.
                FileHandle.standardError.write(Data("storekeeper extend: \(error.code): \(error.message)\n".utf8))
                return nil
            }
        }
        guard let outcome else { throw ExitCode(1) }
        print(outcome.json)
        if outcome.status != "succeeded" { throw ExitCode(1) }
    }
}
