import ArgumentParser
import Foundation
import StoreKeeperKitCore
import StoreKeeperSimulator

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `storekeeper simulate`: devices running StoreKeeperKit's real core against the server and
/// its local App Store, through crashes and faults; exits 1 if anything paid was lost, doubled,
/// misattributed or finished before the server had it.
struct SimulateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract:
            "Drive simulated devices (the real StoreKeeperKit core) through crashes and faults, then compare paid with delivered.",
        discussion: """
            The server must run its local App Store (demo mode, or localAppStore.enabled with this
            secret key). Each device has its own Apple ID and account; a payment queue backed by
            URL/local-app-store pays, and drops, duplicates, delays and reorders callbacks, drops
            tokens, merges payments, defers (Ask to Buy) and lets the user double-tap. When all has
            settled, what each account paid (the local App Store's record) is compared with what
            the server delivered. Exit status: 0 clean, 1 a purchase was lost, doubled,
            misattributed or finished before the server acknowledged it, a purchase call was
            stuck, the server saw a product_mismatch, something was still held (or nothing settled),
            2 the server or its local App Store could not be reached, 64 invalid options.
            """)

    @Option(name: .long, help: "The StoreKeeper server, e.g. http://127.0.0.1:8080.") var server: String
    @Option(name: .long, help: "A secret key of the server.") var key: String
    @Option(name: .long, help: "Simulated devices (default 10).") var devices: Int = 10
    @Option(name: .long, help: "Purchases in all (default 100).") var purchases: Int = 100
    @Option(name: .customLong("crash-rate"), help: "Share of purchases during which the app is killed (0…1).")
    var crashRate: Double = 0.05
    @Option(name: .customLong("network-failure-rate"), help: "Share of requests that fail (0…1).")
    var networkFailureRate: Double = 0.1
    @Option(name: .long, help: "Random seed: the same seed makes the same choices.") var seed: UInt64 = 1
    @Option(name: .customLong("settle-seconds"), help: "How long settling may take (default 300).")
    var settleSeconds: Double = 300
    @Option(
        name: .customLong("storekit"),
        help:
            "1, 2 or mixed (default 2): StoreKit 1 devices call back out of order, drop applicationUsername, hand back old transactions and prove with the app receipt."
    )
    var storeKit: String = "2"
    @Option(
        name: .customLong("accounts-per-device"), help: "App accounts logging in and out on each device (default 1).")
    var accountsPerDevice: Int = 1
    @Option(
        name: .customLong("middlebox-error-rate"),
        help: "Share of requests a proxy answers with HTML 400/404/413/502 (0…1).")
    var middleboxErrorRate: Double = 0
    @Option(
        name: .customLong("clock-jump-rate"),
        help: "Share of purchases before which the device clock jumps up to a day (0…1).")
    var clockJumpRate: Double = 0
    @Option(
        name: .customLong("replay-flood"),
        help: "Old transactions Transaction.updates replays at each launch (StoreKit 2).")
    var replayFlood: Int = 0
    @Option(
        name: .customLong("tokenless-rate"),
        help: "Share of purchases beside which one is made outside the app, without token (0…1).")
    var tokenlessRate: Double = 0
    @Option(
        name: .long,
        help:
            "app_store (default); google_play: simulated Android devices (Play Billing's behaviour) against the server's local Google Play; stripe: web checkouts against its local Stripe (--devices buyers, --pending-rate delayed payments, --network-failure-rate Stripe's API failing, --outage-hours)."
    )
    var store: String = "app_store"
    @Option(
        name: .customLong("pending-rate"),
        help: "With --store google_play: share of purchases paid later by a slow payment method (0…1).")
    var pendingRate: Double = 0.1
    @Option(
        name: .customLong("outage-hours"),
        help:
            "With --store google_play: the server is down (unreachable from devices and Google) for this many hours of Google's clock after the purchases, 0…60 (0: none)."
    )
    var outageHours: Double = 48
    @Option(
        name: .customLong("app-id"),
        help:
            "The app the devices are (apps[].id), sent with orders and purchases; needed on a server with several apps."
    )
    var appId: String?
    @Flag(
        name: .customLong("signed-answers"),
        help:
            "The devices check signed answers with every key GET /v1/status lists in responseSigningKeys (the current one and, during a rotation, the next)."
    )
    var signedAnswers = false
    @Option(
        name: .customLong("rotate-command"),
        help:
            "With --signed-answers: a shell command run once half the purchases have started, which switches the server to its next signing key (say, a restart with the keys swapped); the run then checks the key changed and nothing was stranded."
    )
    var rotateCommand: String?
    @Flag(name: .long, help: "Print the report as JSON.") var json = false

    func validate() throws {
        guard let url = URL(string: server), url.scheme == "http" || url.scheme == "https", url.host != nil else {
            throw ValidationError("--server must be an http(s) URL")
        }
        guard (1...10_000).contains(devices) else { throw ValidationError("--devices must be 1…10000") }
        guard (0...1_000_000).contains(purchases) else { throw ValidationError("--purchases must be 0…1000000") }
        guard (0...1).contains(crashRate) else { throw ValidationError("--crash-rate must be 0…1") }
        guard (0...1).contains(networkFailureRate) else { throw ValidationError("--network-failure-rate must be 0…1") }
        guard settleSeconds > 0 else { throw ValidationError("--settle-seconds must be positive") }
        guard Simulation.StoreKitMode(rawValue: storeKit) != nil else {
            throw ValidationError("--storekit must be 1, 2 or mixed")
        }
        guard (1...20).contains(accountsPerDevice) else { throw ValidationError("--accounts-per-device must be 1…20") }
        guard (0...1).contains(middleboxErrorRate) else { throw ValidationError("--middlebox-error-rate must be 0…1") }
        guard (0...1).contains(clockJumpRate) else { throw ValidationError("--clock-jump-rate must be 0…1") }
        guard (0...10_000).contains(replayFlood) else { throw ValidationError("--replay-flood must be 0…10000") }
        guard (0...1).contains(tokenlessRate) else { throw ValidationError("--tokenless-rate must be 0…1") }
        guard ["app_store", "google_play", "stripe"].contains(store) else {
            throw ValidationError("--store must be app_store, google_play or stripe")
        }
        guard (0...1).contains(pendingRate) else { throw ValidationError("--pending-rate must be 0…1") }
        // Google refunds what is unacknowledged after 3 days: an outage close to that is a loss.
        guard (0...60).contains(outageHours) else { throw ValidationError("--outage-hours must be 0…60") }
        if rotateCommand != nil, !signedAnswers {
            throw ValidationError("--rotate-command needs --signed-answers (a rotation changes how answers are signed)")
        }
        if let appId, appId.isEmpty || appId.utf8.count > 200 { throw ValidationError("--app-id must be 1…200 bytes") }
    }

    /// `/bin/sh -c command`, waited for (at most 5 minutes), then the server's status until it
    /// answers again (a restart).
    static func rotate(_ command: String, server: URL, key: String) async throws {
        // posix_spawn and waitpid (a command that starts a server in the background leaves it
        // holding Foundation.Process's descriptors, and Process would wait for the server).
        var pid = pid_t()
        let arguments = ["/bin/sh", "-c", command]
        let argv = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        guard posix_spawn(&pid, arguments[0], nil, nil, argv, environ) == 0 else {
            throw LocalStoreControl.Failure(description: "--rotate-command could not be started")
        }
        let deadline = Date().addingTimeInterval(300)
        var status: Int32 = 0
        while true {
            let done = waitpid(pid, &status, WNOHANG)
            if done == pid { break }
            if done == -1 && errno != EINTR {
                throw LocalStoreControl.Failure(description: "--rotate-command: waitpid failed (errno \(errno))")
            }
            guard Date() < deadline else {
                kill(pid, SIGTERM)
                throw LocalStoreControl.Failure(description: "--rotate-command did not end within 5 minutes")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        // WIFEXITED && WEXITSTATUS == 0
        guard status & 0x7F == 0, (status >> 8) & 0xFF == 0 else {
            throw LocalStoreControl.Failure(description: "--rotate-command failed (wait status \(status))")
        }
        let control = LocalStoreControl(server: server, key: key)
        let back = Date().addingTimeInterval(120)
        while true {
            if (try? await control.signingKeyId()) != nil { return }
            guard Date() < back else {
                throw LocalStoreControl.Failure(
                    description: "the server did not answer within 2 minutes of the rotation")
            }
            try await Task.sleep(for: .milliseconds(200))
        }
    }

    func runGoogle() async throws {
        var options = GoogleSimulation.Options(server: URL(string: server)!, key: key)
        options.devices = devices
        options.purchases = purchases
        options.crashRate = crashRate
        options.networkFailureRate = networkFailureRate
        options.pendingRate = pendingRate
        options.seed = seed
        options.settleSeconds = settleSeconds
        options.outageHours = outageHours
        try await report(
            { progress in try await GoogleSimulation(options: options).run(progress: progress) },
            text: { report in
                """
                Google Play: purchases \(report.purchases) · paid \(report.paid) (\(report.pending) pending first) · delivered \(report.delivered)
                lost \(report.lost) · doubled \(report.doubled) · refunded by Google for want of an acknowledgement \(report.autoRefunded) · unacknowledged \(report.unacknowledged)
                server down \(report.outageHours) h of Google's clock with \(report.outagePurchases) purchases paid and not yet submitted; \(report.waitingWhenBack) unacknowledged when it came back
                settled \(report.settled ? "in \(report.secondsToSettle) s" : "NOT within \(settleSeconds) s") · \(report.crashes) crashes · \(report.networkFailures) network failures · seed \(report.seed)
                """
            }, clean: \.clean)
    }

    /// Runs a simulation: progress (and problems) on stderr, the report as text or JSON on
    /// stdout; exit 2 when it could not run, 1 when it is not clean.
    func report<Report: Encodable>(
        _ simulate: (@escaping @Sendable (String) -> Void) async throws -> Report, text: (Report) -> String,
        clean: (Report) -> Bool
    ) async throws {
        let json = self.json
        let report: Report
        do {
            report = try await simulate { line in
                // Progress without --json; what went wrong always (stderr: the JSON stays clean).
                if !json || line.hasPrefix("problem") {
                    FileHandle.standardError.write(Data("simulate: \(line)\n".utf8))
                }
            }
        } catch {
            FileHandle.standardError.write(Data("simulate: \(error)\n".utf8))
            throw ExitCode(2)
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
        } else {
            print(text(report))
        }
        if !clean(report) { throw ExitCode(1) }
    }

    func runStripe() async throws {
        var options = StripeSimulation.Options(server: URL(string: server)!, key: key)
        options.buyers = devices
        options.purchases = purchases
        options.asyncRate = pendingRate
        options.apiFailureRate = networkFailureRate
        options.seed = seed
        options.settleSeconds = settleSeconds
        options.outageHours = outageHours
        if let appId { options.appId = appId }
        try await report(
            { progress in try await StripeSimulation(options: options).run(progress: progress) },
            text: { report in
                """
                Stripe: checkouts \(report.purchases) · paid \(report.paid) · declined first \(report.declined) · delayed payments failed \(report.asyncFailed) · delivered \(report.delivered)
                lost \(report.lost) · doubled \(report.doubled) · webhooks duplicated and reversed · Stripe's API failing for \(report.apiFailures) purchases · server unreachable \(report.outageHours) h of Stripe's clock
                settled \(report.settled ? "in \(report.secondsToSettle) s" : "NOT within \(settleSeconds) s") · seed \(report.seed)
                """
            }, clean: \.clean)
    }

    func run() async throws {
        if store == "google_play" { return try await runGoogle() }
        if store == "stripe" { return try await runStripe() }
        var options = Simulation.Options(server: URL(string: server)!, key: key)
        options.devices = devices
        options.purchases = purchases
        options.crashRate = crashRate
        options.networkFailureRate = networkFailureRate
        options.seed = seed
        options.settleSeconds = settleSeconds
        options.storeKit = Simulation.StoreKitMode(rawValue: storeKit) ?? .two
        options.accountsPerDevice = accountsPerDevice
        options.middleboxErrorRate = middleboxErrorRate
        options.clockJumpRate = clockJumpRate
        options.replayFlood = replayFlood
        options.tokenlessRate = tokenlessRate
        options.appId = appId
        if signedAnswers {
            let listed: [(keyId: String, publicKey: String, use: String)]
            do {
                listed = try await LocalStoreControl(server: URL(string: server)!, key: key).responseSigningKeys()
            } catch {
                FileHandle.standardError.write(Data("simulate: \(error)\n".utf8))
                throw ExitCode(2)
            }
            guard !listed.isEmpty else {
                FileHandle.standardError.write(
                    Data("simulate: --signed-answers, but the server does not sign answers\n".utf8))
                throw ExitCode(2)
            }
            options.responseSigningKeys = try listed.map { try ResponseSigningKey($0.publicKey) }
        }
        if let rotateCommand {
            let server = URL(string: server)!
            let key = key
            options.rotateSigningKey = { try await Self.rotate(rotateCommand, server: server, key: key) }
        }
        try await report(
            { progress in try await Simulation(options: options).run(progress: progress) },
            text: { report in
                """
                purchases \(report.purchases) · paid \(report.paid) · delivered \(report.delivered)
                lost \(report.lost) · doubled \(report.doubled) · misattributed \(report.misattributed) · finished before ack \(report.finishedBeforeAck)
                stuck purchases \(report.stuckPurchases) · product mismatches \(report.productMismatches) · held \(report.held) · \(report.requestsPerPurchase) requests per purchase
                settled \(report.settled ? "in \(report.secondsToSettle) s" : "NOT within \(settleSeconds) s") · \(report.crashes) crashes · \(report.networkFailures) network failures · seed \(report.seed)
                \(report.signedAnswers ? "signed answers: \(report.unverifiedAnswers) refused" : "answers not checked")\(report.keyRotation.map { " · key rotation \($0.from ?? "?") → \($0.to ?? "?")\($0.rotated ? "" : " DID NOT HAPPEN")" } ?? "")\(report.appId.map { " · app \($0)" } ?? "")
                """
            }, clean: \.clean)
    }
}
