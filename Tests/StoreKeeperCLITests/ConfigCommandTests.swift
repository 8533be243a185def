import Foundation
import SQLKit
import StoreKeeperStorage
import StoreKeeperSupport
import Testing

/// Configuration is checked, loudly: every problem stops `serve` with exit code 2 naming the
/// key; `config check` prints the effective configuration and trust set; `reverify` delivers
/// kept proofs once the configuration is fixed.
@Suite struct ConfigCommandTests {
    static let secret = "sk_live_0123456789abcdef0123456789abcdef"

    static func directory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("config-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    static func write(_ text: String, _ name: String, in directory: URL) throws -> String {
        let url = directory.appendingPathComponent(name)
        try Data(text.utf8).write(to: url)
        return url.path
    }

    static func good(_ directory: URL, extra: String = "") -> String {
        """
        database: { url: "sqlite:\(directory.path)/storekeeper.sqlite" }
        apple:
          bundleId: com.goodheartapp
          appAppleId: 1234567890
          environments: [Production, Sandbox]
        auth:
          secretKeys: ["\(secret)"]
          clientTokenSecret: "client-token-secret-for-tests-0123456789"
        catalog:
          products:
            - { id: gh_super_good_ticket_1, type: consumable, grants: { currency: tickets, amount: 5 } }
        \(extra)
        """
    }

    @Test func eachConfigurationErrorStopsServeWithExitCode2NamingTheKey() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let garbage = try Self.write("-----BEGIN CERTIFICATE-----\nnot a certificate\n", "bad.pem", in: directory)
        let badKey = try Self.write(
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "bad.p8", in: directory)
        let base = Self.good(directory)
        let cases: [(String, String, String)] = [
            (
                base.replacingOccurrences(of: "bundleId:", with: "bundleID:"), "apple.bundleID",
                "did you mean 'apple.bundleId'"
            ),
            (base + "\nlimits: { maxBodyByte: 10 }\n", "limits.maxBodyByte", "did you mean 'limits.maxBodyBytes'"),
            (base.replacingOccurrences(of: "  appAppleId: 1234567890\n", with: ""), "apple.appAppleId", "Production"),
            (
                base.replacingOccurrences(
                    of:
                        "catalog:\n  products:\n    - { id: gh_super_good_ticket_1, type: consumable, grants: { currency: tickets, amount: 5 } }",
                    with: "catalog: { file: /nonexistent/catalog.yaml }"), "catalog.file", "cannot read"
            ),
            (
                base.replacingOccurrences(
                    of: "  environments: [Production, Sandbox]",
                    with: "  environments: [Production, Sandbox]\n  rootCertificates: [\(garbage)]"),
                "apple.rootCertificates", "no PEM or DER certificate"
            ),
            (
                base.replacingOccurrences(
                    of: "  environments: [Production, Sandbox]",
                    with:
                        "  environments: [Production, Sandbox]\n  serverAPI: { issuerId: i, keyId: K, privateKeyFile: \(badKey) }"
                ),
                "apple.serverAPI.privateKeyFile", "not an ES256"
            ),
            (
                base.replacingOccurrences(of: "client-token-secret-for-tests-0123456789", with: "short"),
                "auth.clientTokenSecret", "32 bytes"
            ),
            (
                base.replacingOccurrences(of: "appAppleId: 1234567890", with: "appAppleId: nope"), "apple.appAppleId",
                "number"
            ),
            (base + "\nhttp: { port: [1, 2] }\n", "http.port", "integer"),
        ]
        for (index, (text, key, message)) in cases.enumerated() where !key.isEmpty {
            let file = try Self.write(text, "case-\(index).yaml", in: directory)
            let run = try await VerifyCommandTests.run(["serve", "--config", file])
            #expect(run.status == 2, "case \(index): \(run.stderr)")
            #expect(run.stderr.contains(key), "case \(index): \(run.stderr)")
            #expect(run.stderr.contains(message), "case \(index): \(run.stderr)")
        }
        // An unreadable configuration file.
        let missing = try await VerifyCommandTests.run([
            "serve", "--config", directory.appendingPathComponent("nope.yaml").path,
        ])
        #expect(missing.status == 2)
        #expect(missing.stderr.contains("nope.yaml"))
        // Not JSON or YAML at all.
        let broken = try Self.write("{ this is: [not valid", "broken.json", in: directory)
        let unparsable = try await VerifyCommandTests.run(["serve", "--config", broken])
        #expect(unparsable.status == 2)
        #expect(unparsable.stderr.contains("broken.json"))
    }

    @Test func configCheckPrintsTheEffectiveConfigurationAndTrustSet() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let good = try Self.write(Self.good(directory), "good.yaml", in: directory)
        let run = try await VerifyCommandTests.run(["config", "check", "--config", good])
        #expect(run.status == 0, "\(run.stdout) \(run.stderr)")
        #expect(run.stdout.contains("mode: configured"))
        #expect(run.stdout.contains("apple.bundleId: com.goodheartapp"))
        #expect(run.stdout.contains("Apple Root CA - G3"))
        #expect(run.stdout.contains("63343abfb89a6a03ebb57e9b3f5fa7be7c4f5c756f3017b3a8c488c3653e9179"))
        #expect(run.stdout.contains("local App Store trusted: false"))
        #expect(run.stdout.contains("ok: ready for production"))
        // Secrets are masked.
        #expect(!run.stdout.contains(Self.secret))
        #expect(!run.stdout.contains("client-token-secret-for-tests"))
        #expect(run.stdout.contains("******"))

        // Valid but not for production: the local App Store enabled.
        let staging = try Self.write(
            Self.good(directory, extra: "localAppStore: { enabled: true }"), "staging.yaml", in: directory)
        let stagingRun = try await VerifyCommandTests.run(["config", "check", "--config", staging])
        #expect(stagingRun.status == 1)
        #expect(stagingRun.stdout.contains("problem: localAppStore.enabled"))
        // Invalid: exit 2, the key named.
        let bad = try Self.write(
            Self.good(directory).replacingOccurrences(of: "appAppleId: 1234567890", with: "appAppleID: 1"), "bad.yaml",
            in: directory)
        let badRun = try await VerifyCommandTests.run(["config", "check", "--config", bad])
        #expect(badRun.status == 2)
        #expect(badRun.stderr.contains("apple.appAppleID"))
    }

    @Test func reverifyDeliversKeptProofsOnceTheConfigurationIsFixed() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        // A genuine proof kept after a wrong_bundle rejection, and a forgery.
        let database = try await Database.open(url: "sqlite:\(directory.path)/storekeeper.sqlite")
        try await Migrations.run(on: database)
        let store = RejectedProofStore(database: database)
        let genuine = try String(
            contentsOf: VerifyCommandTests.fixtures.appendingPathComponent("apple-transaction-sandbox-consumable.jws"),
            encoding: .utf8
        ).trimmingCharacters(in: .whitespacesAndNewlines)
        _ = try await store.keep(
            kind: .signedTransaction, proof: genuine, keepText: true, code: "wrong_bundle", reason: "r",
            accountId: "p1", orderId: nil,
            serverVersion: "0", now: Date())
        _ = try await store.keep(
            kind: .signedTransaction, proof: "eyJhbGciOiJub25lIn0.e30.", keepText: true, code: "invalid_signature",
            reason: "r",
            accountId: "p2", orderId: nil, serverVersion: "0", now: Date())
        try await database.close()

        let config = try Self.write(Self.good(directory), "fixed.yaml", in: directory)
        let first = try await VerifyCommandTests.run(["reverify", "--config", config, "--data-dir", directory.path])
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdout.contains(#""delivered":1"#), "\(first.stdout)")
        #expect(first.stdout.contains(#""stillRejected":1"#))
        let second = try await VerifyCommandTests.run(["reverify", "--config", config, "--data-dir", directory.path])
        #expect(second.stdout.contains(#""delivered":0"#), "\(second.stdout)")
        let onlyChain = try await VerifyCommandTests.run([
            "reverify", "--config", config, "--code", "invalid_chain", "--data-dir", directory.path,
        ])
        #expect(onlyChain.stdout.contains(#""checked":0"#))
        let badCode = try await VerifyCommandTests.run(["reverify", "--config", config, "--code", "whatever"])
        #expect(badCode.status != 0)

        let reopened = try await Database.open(url: "sqlite:\(directory.path)/storekeeper.sqlite")
        let balance = try await reopened.read { sql in
            try await sql.raw("SELECT amount FROM balances WHERE account_id = 'p1' AND currency = 'tickets'").first()?
                .decode(column: "amount", as: Int.self)
        }
        #expect(balance == 5)
        try await reopened.close()
    }
}

extension ConfigCommandTests {
    @Test func reconcileNeedsTheServerAPIKeyAndAValidSince() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let good = try Self.write(Self.good(directory), "good.yaml", in: directory)
        let unconfigured = try await VerifyCommandTests.run(["reconcile", "--config", good])
        #expect(unconfigured.status == 2, "\(unconfigured.stdout) \(unconfigured.stderr)")
        #expect(unconfigured.stderr.contains("apple.serverAPI"))
        let badSince = try await VerifyCommandTests.run(["reconcile", "--config", good, "--since", "last tuesday"])
        #expect(badSince.status != 0)
        #expect(badSince.stderr.contains("--since"))
    }
}

/// `config check --connect`: what the configuration reaches, not only what it says.
@Suite struct ConfigConnectTests {
    typealias Config = ConfigCommandTests

    static func checks(_ run: VerifyCommandTests.Run) -> [String: [String: Any]] {
        var byName: [String: [String: Any]] = [:]
        for check in run.json?["checks"] as? [[String: Any]] ?? [] {
            byName[check["name"] as? String ?? ""] = check
        }
        return byName
    }

    @Test func aWrongDatabasePasswordIsAFailedCheckNotOk() async throws {
        let directory = try Config.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        // Nothing listens on port 1: a refused connection, answered at once.
        let wrong = try Config.write(
            Config.good(directory).replacingOccurrences(
                of: "sqlite:\(directory.path)/storekeeper.sqlite", with: "postgres://storekeeper:wrong@127.0.0.1:1/nope"
            ),
            "wrong.yaml", in: directory)
        let run = try await VerifyCommandTests.run(["config", "check", "--config", wrong, "--connect", "--json"])
        #expect(run.status == 1, "\(run.stdout) \(run.stderr)")
        #expect(run.json?["ok"] as? Bool == false)
        let database = try #require(Self.checks(run)["database"])
        #expect(database["ok"] as? Bool == false)
        #expect((database["detail"] as? String ?? "").contains("connection refused at 127.0.0.1:1"))
        // A real PostgreSQL (CI's) with a wrong password, and then the right one.
        if let url = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"],
            var components = URLComponents(string: url)
        {
            components.password = "not-the-password"
            let badPassword = try Config.write(
                Config.good(directory).replacingOccurrences(
                    of: "sqlite:\(directory.path)/storekeeper.sqlite", with: components.string!),
                "password.yaml", in: directory)
            let refused = try await VerifyCommandTests.run(
                ["config", "check", "--config", badPassword, "--connect", "--json"])
            #expect(refused.status == 1, "\(refused.stdout) \(refused.stderr)")
            #expect(Self.checks(refused)["database"]?["ok"] as? Bool == false)
            let right = try Config.write(
                Config.good(directory).replacingOccurrences(
                    of: "sqlite:\(directory.path)/storekeeper.sqlite", with: url),
                "right.yaml", in: directory)
            let connected = try await VerifyCommandTests.run([
                "config", "check", "--config", right, "--connect", "--json",
            ])
            #expect(Self.checks(connected)["database"]?["ok"] as? Bool == true, "\(connected.stdout)")
        }
        // Without --connect the same file passes the checklist: the difference is the connection.
        let offline = try await VerifyCommandTests.run(["config", "check", "--config", wrong])
        #expect(offline.status == 0, "\(offline.stdout)")
    }

    @Test func anUnreachableStoreAPIIsAFailedCheckWithAClearLine() async throws {
        let directory = try Config.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let key = directory.appendingPathComponent("AuthKey_TEST.p8").path
        let openssl = ChildProcess()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        openssl.arguments = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key]
        try openssl.run()
        openssl.waitUntilExit()
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        // Apple's API on a closed port: the key is fine, the store does not answer.
        let unreachable = try Config.write(
            Config.good(directory).replacingOccurrences(
                of: "  environments: [Production, Sandbox]\n",
                with:
                    "  environments: [Production, Sandbox]\n  serverAPI: { issuerId: 57246542-96fe-1a63-e053-0824d011072a, keyId: TESTKEY123, privateKeyFile: \"\(key)\", baseURL: \"http://127.0.0.1:1\" }\n"
            ), "unreachable.yaml", in: directory)
        let run = try await VerifyCommandTests.run(["config", "check", "--config", unreachable, "--connect"])
        #expect(run.status == 1, "\(run.stdout) \(run.stderr)")
        #expect(
            run.stdout.contains("FAILED: App Store Server API (com.goodheartapp): cannot reach Apple"), "\(run.stdout)")
        #expect(run.stdout.contains("ok: key file apple.serverAPI.privateKeyFile"), "\(run.stdout)")
        #expect(!run.stdout.contains("ready for production"))
    }

    @Test func aReachableDatabaseSaysWhichMigrationsWouldRunAndAnExposedKeyFails() async throws {
        let directory = try Config.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let good = try Config.write(Config.good(directory), "good.yaml", in: directory)
        let run = try await VerifyCommandTests.run(["config", "check", "--config", good, "--connect"])
        #expect(run.status == 0, "\(run.stdout) \(run.stderr)")
        #expect(run.stdout.contains("ok: database:"))
        #expect(run.stdout.contains("migrations will run"))
        #expect(run.stdout.contains("every connection answered"))
        // Key files: each is checked to be its owner's alone (an exposed one stops the load, exit 2).
        let key = directory.appendingPathComponent("signing.pem").path
        let openssl = ChildProcess()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        openssl.arguments = ["genpkey", "-algorithm", "ed25519", "-out", key]
        try openssl.run()
        openssl.waitUntilExit()
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        let signed = try Config.write(
            Config.good(directory).replacingOccurrences(
                of: "  clientTokenSecret:", with: "  responseSigningKeys: [\"\(key)\"]\n  clientTokenSecret:"),
            "signed.yaml", in: directory)
        let signedRun = try await VerifyCommandTests.run(["config", "check", "--config", signed, "--connect", "--json"])
        let keyCheck = Self.checks(signedRun).first { $0.key.hasPrefix("key file") }?.value
        #expect(keyCheck?["ok"] as? Bool == true, "\(signedRun.stdout) \(signedRun.stderr)")
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: key)
        let exposedRun = try await VerifyCommandTests.run(["config", "check", "--config", signed, "--connect"])
        #expect(exposedRun.status == 2)
        #expect(exposedRun.stderr.contains("chmod 600"))
    }
}

/// `storekeeper migrate` lists what it applied; a schema newer than the binary is refused.
@Suite struct MigrateCommandTests {
    typealias Config = ConfigCommandTests

    @Test func migrateListsWhatItAppliedAndRefusesANewerSchema() async throws {
        let directory = try Config.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let config = try Config.write(Config.good(directory), "good.yaml", in: directory)
        let first = try await VerifyCommandTests.run(["migrate", "--config", config])
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdout.contains("applied migration 1\n") && first.stdout.contains("applied migration 26"))
        let again = try await VerifyCommandTests.run(["migrate", "--config", config])
        #expect(again.stdout.contains("nothing to apply"))
        // A later release's migration in the database: this binary refuses it, and so does a
        // pre-flight.
        let database = try await Database.open(url: "sqlite:\(directory.path)/storekeeper.sqlite")
        try await database.transaction { sql in
            try await sql.raw("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 0)").run()
        }
        try await database.close()
        let newer = try await VerifyCommandTests.run(["migrate", "--config", config])
        #expect(newer.status == 2)
        #expect(newer.stderr.contains("newer than this binary knows"), "\(newer.stderr)")
        let preflight = try await VerifyCommandTests.run(["config", "check", "--config", config, "--connect"])
        #expect(preflight.status == 1)
        #expect(preflight.stdout.contains("FAILED: database"), "\(preflight.stdout)")
    }
}
