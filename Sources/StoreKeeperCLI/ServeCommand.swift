import ArgumentParser
import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperServer
import StoreKeeperStorage

/// `storekeeper serve`: the purchase server.
struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the StoreKeeper server (docs/api.md).",
        discussion: """
            With no configuration at all (no --config, no APPLE_* variable) it starts in demo mode: \
            127.0.0.1:8080, ./storekeeper.sqlite, and the built-in local App Store (trusted), local Google Play \
            and local Stripe — for trying StoreKeeper out only. Any configuration trusts Apple's roots, Google \
            and Stripe, and no local store (unless localAppStore.enabled, localGooglePlay.enabled or \
            localStripe.enabled). A configuration problem exits with code 2, naming the key.
            """
    )

    @Option(help: "Configuration file (JSON or YAML); every key can also come from the environment.")
    var config: String?

    @Option(help: "Listen on this port (overrides http.port / HTTP_PORT).") var port: Int?
    @Option(help: "Listen on this address (overrides http.host / HTTP_HOST).") var host: String?

    @Option(
        name: .customLong("data-dir"),
        help: "Where demo mode keeps the local App Store's keys and the development secret key.")
    var dataDirectory: String = "storekeeper-data"

    func run() async throws {
        let logger = LazyMetadataLogHandler.logger(label: "storekeeper", level: .info)
        let (configuration, app) = try await ConfigurationErrors.exitingWith2 {
            var configuration = try await ServerConfiguration.load(file: config)
            if let port { configuration.port = port }
            if let host { configuration.host = host }
            try configuration.validate()
            let app = try await StoreKeeperApp.make(
                configuration, dataDirectory: URL(fileURLWithPath: dataDirectory, isDirectory: true), logger: logger)
            return (configuration, app)
        }
        // SIGTERM/SIGINT: stop accepting, give in-flight work http.shutdownGraceSeconds, then
        // cancel; a watchdog exits regardless shortly after, so a hung call never keeps the
        // process alive.
        var groupConfiguration = ServiceGroupConfiguration(
            services: [
                .init(
                    service: app.application { port in
                        let shown = configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
                        logger.notice(
                            "StoreKeeper listening on http://\(shown):\(port) (\(StoreKeeperVersion.description))")
                        if configuration.dashboardEnabled {
                            logger.notice("dashboard: http://\(shown):\(port)/dashboard (sign in with a secret key)")
                        }
                    })
            ],
            gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = .seconds(configuration.shutdownGraceSeconds)
        groupConfiguration.maximumCancellationDuration = .seconds(2)
        let watchdog = ShutdownWatchdog(grace: configuration.shutdownGraceSeconds + 4)
        let reload = SigningKeyReload(app: app, file: config, logger: logger)
        do {
            try await ServiceGroup(configuration: groupConfiguration).run()
        } catch {
            try? await app.database.close()
            if Self.isAddressInUse(error) {
                FileHandle.standardError.write(
                    Data(
                        "storekeeper: \(configuration.host):\(configuration.port) is already in use: choose another port with --port or HTTP_PORT (http.port)\n"
                            .utf8))
                throw ExitCode(2)
            }
            throw error
        }
        watchdog.cancel()
        reload.cancel()
        try? await app.database.close()
        logger.notice("StoreKeeper stopped: in-flight requests finished, database closed")
    }
}

/// SIGHUP: the answer-signing keys are read again from the configuration (file and
/// environment) and switched to at once — a key rotation without a restart.
final class SigningKeyReload: @unchecked Sendable {  // the source is only resumed and cancelled
    private let source: any DispatchSourceSignal

    init(app: StoreKeeperApp, file: String?, logger: Logger) {
        signal(SIGHUP, SIG_IGN)
        source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        source.setEventHandler {
            Task {
                do {
                    let configuration = try await ServerConfiguration.load(file: file)
                    let result = try app.reloadResponseSigningKeys(from: configuration)
                    logger.notice("SIGHUP: answer-signing keys reloaded: \(result)")
                } catch {
                    logger.error("SIGHUP: answer-signing keys not reloaded (the keys in use stay): \(error)")
                }
            }
        }
        source.resume()
    }

    func cancel() { source.cancel() }
}

extension ServeCommand {
    /// A bind that failed because another process holds the port (EADDRINUSE).
    static func isAddressInUse(_ error: Error) -> Bool {
        if let io = error as? IOError, io.errnoCode == EADDRINUSE { return true }
        let text = String(describing: error)
        return text.contains("Address already in use") || text.contains("EADDRINUSE")
    }
}

/// Exits the process `grace` seconds after SIGTERM or SIGINT, whatever is still running.
final class ShutdownWatchdog: @unchecked Sendable {  // the sources are only resumed and cancelled
    private let sources: [any DispatchSourceSignal]

    init(grace: Int) {
        sources = [SIGTERM, SIGINT].map { signalNumber in
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
            source.setEventHandler {
                FileHandle.standardError.write(
                    Data(
                        "storekeeper: \(signalNumber == SIGTERM ? "SIGTERM" : "SIGINT") received: no new connections; finishing in-flight requests (at most \(grace) s)\n"
                            .utf8))
                DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(grace)) {
                    FileHandle.standardError.write(Data("shutdown grace passed; exiting\n".utf8))
                    exit(0)
                }
            }
            source.resume()
            return source
        }
    }

    func cancel() { for source in sources { source.cancel() } }
}

/// A configuration problem stops a command with exit code 2 and the key named on standard error.
enum ConfigurationErrors {
    static func exitingWith2<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as ServerConfiguration.Invalid {
            FileHandle.standardError.write(Data("configuration error: \(error.description)\n".utf8))
            throw ExitCode(2)
        }
    }
}

extension ConfigurationErrors {
    /// A one-shot command's server (`reverify`, `reconcile`): built from the configuration as
    /// `serve` builds it, quiet but for warnings, its database closed when `body` ends.
    static func withApp<T: Sendable>(
        config: String?, dataDirectory: String, _ body: (StoreKeeperApp) async throws -> T
    ) async throws -> T {
        let quiet = LazyMetadataLogHandler.logger(label: "storekeeper", level: .warning)
        let app = try await exitingWith2 {
            try await StoreKeeperApp.make(
                try await ServerConfiguration.load(file: config),
                dataDirectory: URL(fileURLWithPath: dataDirectory, isDirectory: true), logger: quiet)
        }
        do {
            let result = try await body(app)
            try? await app.database.close()
            return result
        } catch {
            try? await app.database.close()
            throw error
        }
    }
}

/// `storekeeper migrate`: applies the schema and exits.
struct MigrateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate", abstract: "Apply database migrations (serve also does this at start).")

    @Option(help: "Configuration file (JSON or YAML).")
    var config: String?

    func run() async throws {
        let configuration = try await ConfigurationErrors.exitingWith2 {
            try await ServerConfiguration.load(file: config)
        }
        let database = try await Database.open(url: configuration.databaseURL)
        let before = Set(try await Migrations.appliedVersionsIfAny(on: database))
        do {
            try await Migrations.run(on: database)
        } catch let newer as Migrations.SchemaNewerThanBinary {
            try? await database.close()
            FileHandle.standardError.write(Data("storekeeper migrate: \(newer)\n".utf8))
            throw ExitCode(2)
        }
        let versions = try await Migrations.appliedVersions(on: database)
        let applied = versions.filter { !before.contains($0) }
        if applied.isEmpty {
            print("nothing to apply")
        } else {
            for version in applied { print("applied migration \(version)") }
        }
        print("database at schema version \(versions.last ?? 0) (\(database.kind.rawValue))")
        try await database.close()
    }
}
