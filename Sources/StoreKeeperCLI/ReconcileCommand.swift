import ArgumentParser
import Foundation
import Logging
import StoreKeeperServer

/// `storekeeper reconcile [--since DATE]`: one reconciliation pass against the App Store
/// Server API (what `serve` also runs every hour), its report printed as JSON.
struct ReconcileCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reconcile",
        abstract: "Pull what Apple sent while the server was not listening, and apply it.",
        discussion: """
            Notification History (failures first), Get All Subscription Statuses for subscriptions past their \
            period without news, Transaction History for accounts active since DATE. Needs the \
            apple.serverAPI key. Idempotent and safe beside running servers. Prints the report as JSON; \
            exits 1 when a step failed (the report's "errors" says which), 2 on a configuration problem.
            """
    )

    @Option(help: "Configuration file (JSON or YAML), as given to serve.")
    var config: String?

    @Option(help: "Start of the window: an ISO 8601 date or date-time (default: 3 days ago).")
    var since: String?

    @Option(name: .customLong("data-dir"), help: "Where demo mode keeps the local App Store's keys.")
    var dataDirectory: String = "storekeeper-data"

    @Option(
        help: "app_store (the default), or stripe: list each Stripe app's events since DATE and apply the missed ones.")
    var store: String = "app_store"

    func run() async throws {
        var start = Date().addingTimeInterval(-3 * 86_400)
        if let since {
            guard let date = StoreKeeperApp.parseDate(since) else {
                throw ValidationError("--since must be an ISO 8601 date or date-time")
            }
            start = date
        }
        guard ["app_store", "stripe"].contains(store) else {
            throw ValidationError("--store must be app_store or stripe")
        }
        if store == "stripe" {
            let reconciled = try await ConfigurationErrors.withApp(config: config, dataDirectory: dataDirectory) {
                app -> StripeReconciler.Report? in
                app.stripe.isEmpty ? nil : await StripeReconciler(app: app).run(since: start)
            }
            guard let report = reconciled else {
                FileHandle.standardError.write(
                    Data("storekeeper: no Stripe app is configured (apps[] with store: stripe)\n".utf8))
                throw ExitCode(2)
            }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
            if !report.errors.isEmpty { throw ExitCode(1) }
            return
        }
        let report: Reconciler.Report
        do {
            report = try await ConfigurationErrors.withApp(config: config, dataDirectory: dataDirectory) { app in
                try await Reconciler(app: app).run(since: start)
            }
        } catch let error as Reconciler.NotConfigured {
            FileHandle.standardError.write(Data("storekeeper: \(error)\n".utf8))
            throw ExitCode(2)
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        print(String(decoding: try encoder.encode(report), as: UTF8.self))
        if !report.errors.isEmpty { throw ExitCode(1) }
    }
}
