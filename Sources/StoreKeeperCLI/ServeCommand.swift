import ArgumentParser
import Foundation
import Hummingbird
import Logging
import StoreKeeperServer
import StoreKeeperStorage

/// `storekeeper serve`: the purchase server.
struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the StoreKeeper server (API.md).",
        discussion: """
            With no configuration at all it listens on 127.0.0.1:8080, keeps its data in \
            ./storekeeper.sqlite and runs the local App Store built in (zero-config mode).
            """
    )

    @Option(help: "Configuration file (JSON or YAML); every key can also come from the environment.")
    var config: String?

    @Option(name: .customLong("data-dir"), help: "Where zero-config mode keeps the local App Store's keys.")
    var dataDirectory: String = "storekeeper-data"

    func run() async throws {
        let configuration: ServerConfiguration
        do {
            configuration = try await ServerConfiguration.load(file: config)
        } catch let error as ServerConfiguration.Invalid {
            throw ValidationError(error.description)
        }
        var mutableLogger = Logger(label: "storekeeper")
        mutableLogger.logLevel = .info
        let logger = mutableLogger
        let app = try await StoreKeeperApp.make(
            configuration, dataDirectory: URL(fileURLWithPath: dataDirectory, isDirectory: true), logger: logger)
        do {
            try await app.application { port in
                logger.notice("StoreKeeper listening on http://\(configuration.host):\(port)")
            }.runService()
        } catch {
            try? await app.database.close()
            throw error
        }
        try? await app.database.close()
    }
}

/// `storekeeper migrate`: applies the schema and exits.
struct MigrateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate", abstract: "Apply database migrations (serve also does this at start).")

    @Option(help: "Configuration file (JSON or YAML).")
    var config: String?

    func run() async throws {
        let configuration = try await ServerConfiguration.load(file: config)
        let database = try await Database.open(url: configuration.databaseURL)
        try await Migrations.run(on: database)
        let versions = try await Migrations.appliedVersions(on: database)
        print("database at schema version \(versions.last ?? 0) (\(database.kind.rawValue))")
        try await database.close()
    }
}
