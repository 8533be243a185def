import ArgumentParser
import Foundation
import LocalAppStore
import StoreKeeperServer

/// `storekeeper config …`: the configuration, checked before a deploy.
struct ConfigCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config", abstract: "Check the server's configuration.", subcommands: [ConfigCheckCommand.self])
}

/// `storekeeper config check [--config FILE]`: prints the effective configuration (secrets
/// masked) and the trust set; exits 2 on an invalid configuration and 1 when it is valid but
/// not fit for production (docs/deployment.md), 0 otherwise.
struct ConfigCheckCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Print the effective configuration and trust set; exit non-zero on any problem.",
        discussion: """
            Reads the configuration exactly as `serve` does (file and environment). With --connect it also \
            opens the database (and says which migrations a start would apply), makes one authenticated call \
            to each App Store and Google Play app, fetches Google's push certificates and checks that every \
            key file is readable by its owner only. Exit codes: 0 ready for production (and, with --connect, \
            every connection check passed); 1 valid but failing the production checklist or a connection \
            check; 2 invalid (the key is named).
            """
    )

    @Option(help: "Configuration file (JSON or YAML); every key can also come from the environment.")
    var config: String?

    @Option(name: .customLong("data-dir"), help: "Where the local App Store keeps its keys (demo mode).")
    var dataDirectory: String = "storekeeper-data"

    @Flag(help: "Also connect: the database, each store's API, Google's push certificates, key file permissions.")
    var connect = false

    @Flag(help: "One JSON object on standard output (ok, configuration, trust, problems, checks).")
    var json = false

    func run() async throws {
        let (configuration, trust) = try await ConfigurationErrors.exitingWith2 {
            let configuration = try await ServerConfiguration.load(file: config)
            var localRoots: [[UInt8]]?
            if configuration.usesLocalAppStore {
                // Shown only if the keys exist already: a check never creates them.
                let directory = URL(fileURLWithPath: dataDirectory).appendingPathComponent("local-store")
                if FileManager.default.fileExists(atPath: directory.path) {
                    localRoots = try? PKIStore.loadOrCreate(dataDirectory: directory).trustRootsDER
                }
            }
            return (configuration, try TrustPolicy(configuration: configuration, localAppStoreRoots: localRoots))
        }
        var trustLines = trust.lines
        if configuration.usesLocalAppStore, !trust.localAppStoreTrusted {
            trustLines.append("trusted root (local App Store): generated at first `serve`")
        }
        let problems = configuration.productionProblems
        let checks = connect ? await Preflight.run(configuration) : []
        let ok = problems.isEmpty && checks.allSatisfy(\.ok)
        if json {
            struct Report: Encodable {
                var ok: Bool
                var configuration: [String: String]
                var trust: [String]
                var problems: [String]
                var warnings: [String]
                var checks: [Preflight.Check]?
            }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            let report = Report(
                ok: ok,
                configuration: Dictionary(
                    configuration.effectiveValues.map { ($0.key, $0.value) }, uniquingKeysWith: { first, _ in first }),
                trust: trustLines, problems: problems, warnings: configuration.productionWarnings,
                checks: connect ? checks : nil)
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
        } else {
            print("configuration:")
            for (key, value) in configuration.effectiveValues { print("  \(key): \(value)") }
            print("trust:")
            for line in trustLines { print("  \(line)") }
            if connect {
                print("connections:")
                for check in checks { print("  \(check.ok ? "ok" : "FAILED"): \(check.name): \(check.detail)") }
            }
            for problem in problems { print("problem: \(problem)") }
            for warning in configuration.productionWarnings { print("warning: \(warning)") }
            if ok {
                print(connect ? "ok: ready for production, every connection answered" : "ok: ready for production")
            }
        }
        if !ok { throw ExitCode(1) }
    }
}
