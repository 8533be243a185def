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
            Reads the configuration exactly as `serve` does (file and environment). Exit codes: 0 ready for \
            production; 1 valid but failing the production checklist (demo mode, local App Store enabled, no \
            secret key, no client-token secret, no catalog, roots other than Apple's); 2 invalid (the key is \
            named).
            """
    )

    @Option(help: "Configuration file (JSON or YAML); every key can also come from the environment.")
    var config: String?

    @Option(name: .customLong("data-dir"), help: "Where the local App Store keeps its keys (demo mode).")
    var dataDirectory: String = "storekeeper-data"

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
        print("configuration:")
        for (key, value) in configuration.effectiveValues { print("  \(key): \(value)") }
        print("trust:")
        for line in trust.lines { print("  \(line)") }
        if configuration.usesLocalAppStore, !trust.localAppStoreTrusted {
            print("  trusted root (local App Store): generated at first `serve`")
        }
        let problems = configuration.productionProblems
        if problems.isEmpty {
            print("ok: ready for production")
        } else {
            for problem in problems { print("problem: \(problem)") }
            throw ExitCode(1)
        }
    }
}
