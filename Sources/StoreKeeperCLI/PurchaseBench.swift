import AppStoreModels
import AppStoreVerification
import ArgumentParser
import AsyncHTTPClient
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import SQLKit
import ServiceLifecycle
import StoreKeeperServer
import StoreKeeperSimulator
import StoreKeeperSupport
import Synchronization

/// End-to-end `POST /v1/purchases` load: the real server (HTTP, verification, group commit,
/// durable database) and a load generator in one process, fresh signed transactions only.
struct PurchaseBench {
    /// The secret key of the benchmark's own server (secret keys are at least 32 bytes).
    static let key = "sk_bench_" + String(repeating: "0", count: 32)

    let databaseURL: String?
    let concurrencies: [Int]
    let requestsPerLevel: Int
    var loadGenerator: LoadGeneratorKind = .lean
    /// Sign each transaction with an `appTransactionId`, as Apple does (the server records
    /// which Apple Accounts each account used); off, to measure what that costs.
    var appTransactionIds = true

    enum LoadGeneratorKind: String, CaseIterable, ExpressibleByArgument {
        case lean
        case asyncHTTPClient = "async-http-client"
    }

    /// Above this many requests at once the server sheds (`limits.maxInFlightRequests`); nil:
    /// the server's default.
    var maxInFlight: Int?
    /// After the levels: nginx answering a fixed 503 on this machine, driven by the same load
    /// generator with the same requests at each concurrency — the floor for an answer under
    /// overload (`--beside-nginx`).
    var besideNginx = false
    /// Run by `/bin/sh -c` once a level's load is under way (say, `pg_ctlcluster 15 main
    /// restart -m fast`); the report then says how long deliveries took to resume.
    var restartCommand: String?

    struct Level {
        var concurrency: Int
        var requests: Int
        var seconds: Double
        var answers: [LoadGenerator.Answer]
        /// Peak resident memory of the process (server and load generator) during the level,
        /// and what it was when the level began (the prepared requests of every level included).
        var peakMemory: Int
        var startMemory: Int
        var restart: Restart?

        var delivered: Int { answers.lazy.filter { $0.outcome == .delivered }.count }
        var shed: Int { answers.lazy.filter { $0.outcome == .shed }.count }
        var unavailable: Int { answers.lazy.filter { $0.outcome == .unavailable }.count }
        var deliveriesPerSecond: Double { Double(delivered) / seconds }
        var answersPerSecond: Double { Double(answers.count) / seconds }

        /// A percentile of every answer's latency (delivered, shed or not): what a client waited.
        func percentileOfAll(_ p: Double) -> Double {
            let sorted = answers.map(\.latency).sorted()
            guard !sorted.isEmpty else { return .nan }
            return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }

        /// A percentile of the delivered requests' latencies.
        func percentile(_ p: Double) -> Double {
            let sorted = answers.filter { $0.outcome == .delivered }.map(\.latency).sorted()
            guard !sorted.isEmpty else { return .nan }
            return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }
    }

    /// What a restart during a level looked like.
    struct Restart {
        /// When the command was started and when it returned.
        var began: NIODeadline
        var returned: NIODeadline
        var status: Int32

        /// From the command's return to the first delivery answered after it.
        func recovery(_ answers: [LoadGenerator.Answer]) -> Double? {
            answers.filter { $0.outcome == .delivered && $0.at > returned }.map(\.at).min().map {
                Double(($0 - returned).nanoseconds) / 1e9
            }
        }

        /// The longest time without any delivery, from the command's start on.
        func longestGap(_ answers: [LoadGenerator.Answer]) -> Double {
            let times = [began] + answers.filter { $0.outcome == .delivered && $0.at > began }.map(\.at).sorted()
            return zip(times, times.dropFirst()).map { Double(($1 - $0).nanoseconds) / 1e9 }.max() ?? 0
        }
    }

    /// `/bin/sh -c command` on a thread of its own, once the load has run for `after`.
    static func restart(_ command: String, after: Duration) async -> Restart {
        try? await Task.sleep(for: after)
        let began = NIODeadline.now()
        let status: Int32 = await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                var pid = pid_t()
                let arguments = ["/bin/sh", "-c", command]
                let argv = arguments.map { strdup($0) } + [nil]
                defer { for pointer in argv { free(pointer) } }
                guard posix_spawn(&pid, arguments[0], nil, nil, argv, environ) == 0 else {
                    return continuation.resume(returning: -1)
                }
                var status: Int32 = 0
                while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                continuation.resume(returning: status)
            }
        }
        return Restart(began: began, returned: .now(), status: status)
    }

    /// The benchmark's own server, the real one (HTTP, services, database), on a free port;
    /// the local App Store enabled to sign the load.
    struct Server {
        let app: StoreKeeperApp
        let store: LocalAppStore
        let port: Int
        let directory: URL
        let group: ServiceGroup
        let running: Task<Void, any Error>

        /// `port` 0: the kernel's pick. `directory`: the data directory (default a new
        /// temporary one, removed by `stop`).
        static func start(
            databaseURL: String?, maxInFlight: Int? = nil, runJobs: Bool = true, port: Int = 0,
            directory: URL? = nil, logLevel: Logger.Level = .error,
            configure: (inout ServerConfiguration) -> Void = { _ in }
        ) async throws -> Server {
            let directory =
                directory
                ?? FileManager.default.temporaryDirectory.appendingPathComponent("storekeeper-bench-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            var configuration = ServerConfiguration()
            configuration.port = port
            configuration.databaseURL = databaseURL ?? "sqlite:\(directory.path)/bench.sqlite"
            configuration.secretKeys = [PurchaseBench.key]
            configuration.localAppStoreEnabled = true
            configuration.bundleId = "com.example.app"
            configuration.appAppleId = 1_234_567_890
            if let maxInFlight { configuration.maxInFlightRequests = maxInFlight }
            configure(&configuration)
            let logger = LazyMetadataLogHandler.logger(label: "bench", level: logLevel)
            let app = try await StoreKeeperApp.make(configuration, dataDirectory: directory, logger: logger)
            let port = Mutex(0)
            let application = app.application(runJobs: runJobs) { bound in port.withLock { $0 = bound } }
            let group = ServiceGroup(
                configuration: .init(services: [application], gracefulShutdownSignals: [], logger: logger))
            let running = Task { try await group.run() }
            while port.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(20)) }
            return Server(
                app: app, store: app.localAppStore!, port: port.withLock { $0 }, directory: directory, group: group,
                running: running)
        }

        func stop() async {
            await group.triggerGracefulShutdown()
            _ = try? await running.value
            try? await app.database.close()
            try? FileManager.default.removeItem(at: directory)
        }
    }

    func run() async throws {
        let server = try await Server.start(databaseURL: databaseURL, maxInFlight: maxInFlight)
        let (app, store) = (server.app, server.store)
        let base = "http://127.0.0.1:\(server.port)"

        let total = requestsPerLevel * concurrencies.count
        FileHandle.standardError.write(Data("signing \(total) transactions…\n".utf8))
        let signer = store.pki.jwsSigner
        let issuer = TransactionIssuer()
        var bodies: [String] = []
        bodies.reserveCapacity(total)
        // Fresh transaction ids and accounts on every run, so a database reused between runs
        // (PostgreSQL) measures new deliveries, never already_delivered answers.
        let run = UInt64.random(in: 0..<1_000_000)
        for index in 0..<total {
            var payload = issuer.transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(3_000_000_000_000_000 + run * 10_000_000 + UInt64(index)))
            // One Apple Account per account, as Apple signs it on every transaction: the
            // server records which Apple Accounts each account used (shared_apple_id).
            if appTransactionIds {
                payload.appTransactionId = String(705_000_000_000_000_000 + run * 1_000 + UInt64(index % 1000))
            }
            bodies.append(
                #"{"accountId":"bench\#(run)-\#(index % 1000)","signedTransaction":"\#(try signer.sign(payload))"}"#)
        }

        // Verification alone, all cores, on the same proofs: the ceiling for deliveries.
        let verifier = try SignedDataVerifier(
            .init(trustedRoots: store.pki.trustRootsDER, bundleId: "com.example.app", environments: [.production]))
        let jws = bodies.prefix(2000).map { String($0.split(separator: "\"")[7]) }
        let verifyStart = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<ProcessInfo.processInfo.activeProcessorCount {
                group.addTask {
                    for index in stride(from: worker, to: jws.count, by: ProcessInfo.processInfo.activeProcessorCount) {
                        _ = try await verifier.verifyTransaction(jws[index])
                    }
                }
            }
            try await group.waitForAll()
        }
        let verifyPerSecond = Double(jws.count) / BenchCommand.seconds(ContinuousClock.now - verifyStart)

        let client = HTTPClient(
            eventLoopGroupProvider: .singleton,
            configuration: .init(
                connectionPool: .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 512)))
        var levels: [Level] = []
        var offset = 0
        for concurrency in concurrencies {
            let slice = Array(bodies[offset..<(offset + requestsPerLevel)])
            offset += requestsPerLevel
            let startMemory = Memory.resetPeak()
            let started = ContinuousClock.now
            let restart = restartCommand.map { command in
                Task { await Self.restart(command, after: .seconds(1)) }
            }
            let answers: [LoadGenerator.Answer]
            switch loadGenerator {
            case .lean:
                answers = try await LoadGenerator.run(
                    host: "127.0.0.1", port: server.port, path: "/v1/purchases",
                    authorization: "Bearer \(Self.key)", bodies: slice, concurrency: concurrency,
                    expect: #""status":"delivered""#)
            case .asyncHTTPClient:
                answers = try await Self.sendWithAsyncHTTPClient(
                    client, url: base + "/v1/purchases", bodies: slice, concurrency: concurrency)
            }
            let seconds = BenchCommand.seconds(ContinuousClock.now - started)
            guard answers.count == slice.count else {
                throw BenchFailure(description: "\(answers.count) answers for \(slice.count) requests")
            }
            levels.append(
                Level(
                    concurrency: concurrency, requests: slice.count, seconds: seconds, answers: answers,
                    peakMemory: Memory.peak(), startMemory: startMemory, restart: await restart?.value))
        }
        // Every acknowledged delivery is in the database, once (a 503 may still have committed).
        let rows = try await app.database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE \(bind: "bench\(run)-%")")
                .first()?.decode(column: "n", as: Int.self) ?? 0
        }
        let acknowledged = levels.map(\.delivered).reduce(0, +)
        try await client.shutdown()
        await server.stop()
        var nginxLevels: [Level] = []
        if besideNginx {
            nginxLevels = try await Self.nginxFixed503(
                concurrencies: concurrencies, bodies: Array(bodies.prefix(requestsPerLevel)))
        }

        print("## POST /v1/purchases end to end — \(app.database.kind.rawValue)")
        print("")
        print("verification alone (all cores): \(String(format: "%.0f", verifyPerSecond)) /s")
        print("")
        print(
            "| concurrency | requests | deliveries/s | p50 | p99 | vs verification | shed (503 overloaded) | other 503 | peak memory | above the level's start |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for level in levels {
            print(
                "| \(level.concurrency) | \(level.requests) | \(String(format: "%.0f", level.deliveriesPerSecond)) | "
                    + "\(String(format: "%.1f ms", level.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", level.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.2f", level.deliveriesPerSecond / verifyPerSecond)) | "
                    + "\(String(format: "%.1f %%", Double(level.shed) * 100 / Double(level.requests))) | "
                    + "\(level.unavailable) | \(Memory.format(level.peakMemory)) | "
                    + "\(Memory.format(max(0, level.peakMemory - level.startMemory))) |")
        }
        print("")
        for level in levels {
            guard let restart = level.restart else { continue }
            let recovery = restart.recovery(level.answers).map { String(format: "%.2f s", $0) } ?? "never"
            print(
                "restart at concurrency \(level.concurrency) (command exited \(restart.status), took "
                    + "\(String(format: "%.2f s", Double((restart.returned - restart.began).nanoseconds) / 1e9))): "
                    + "first delivery \(recovery) after it returned; longest time without a delivery "
                    + "\(String(format: "%.2f s", restart.longestGap(level.answers))); \(level.unavailable) answered 503"
            )
        }
        if !nginxLevels.isEmpty {
            print(
                "Every answer (delivered or shed) beside nginx answering a fixed 503, same load generator and requests:"
            )
            print("")
            print(
                "| concurrency | answers/s | p50 | p99 | max | nginx answers/s | nginx p50 | nginx p99 | nginx max | p99 ratio to nginx |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for (level, nginx) in zip(levels, nginxLevels) {
                func ms(_ value: Double) -> String { String(format: "%.1f ms", value * 1000) }
                print(
                    "| \(level.concurrency) | \(String(format: "%.0f", level.answersPerSecond)) | "
                        + "\(ms(level.percentileOfAll(0.5))) | \(ms(level.percentileOfAll(0.99))) | "
                        + "\(ms(level.percentileOfAll(1))) | \(String(format: "%.0f", nginx.answersPerSecond)) | "
                        + "\(ms(nginx.percentileOfAll(0.5))) | \(ms(nginx.percentileOfAll(0.99))) | "
                        + "\(ms(nginx.percentileOfAll(1))) | "
                        + "\(String(format: "%.1f", level.percentileOfAll(0.99) / nginx.percentileOfAll(0.99))) |")
            }
            print("")
        }
        print(
            "acknowledged deliveries: \(acknowledged); in the database: \(rows) (lost: \(max(0, acknowledged - rows)))")
        print("")
        if rows < acknowledged {
            throw BenchFailure(description: "\(acknowledged - rows) acknowledged deliveries are not in the database")
        }
    }
}

extension PurchaseBench {
    /// The same load through AsyncHTTPClient (`--load-generator async-http-client`): a general
    /// client, heavier on the shared cores, kept to show how much the load generator weighs.
    static func sendWithAsyncHTTPClient(_ client: HTTPClient, url: String, bodies: [String], concurrency: Int)
        async throws -> [LoadGenerator.Answer]
    {
        let latencies = LatencyLog()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    for index in stride(from: worker, to: bodies.count, by: concurrency) {
                        var request = HTTPClientRequest(url: url)
                        request.method = .POST
                        request.headers.add(name: "Authorization", value: "Bearer \(Self.key)")
                        request.headers.add(name: "Content-Type", value: "application/json")
                        request.body = .bytes(ByteBuffer(string: bodies[index]))
                        let sent = ContinuousClock.now
                        let response = try await client.execute(request, timeout: .seconds(60))
                        let reply = try await response.body.collect(upTo: 1 << 20)
                        // Every answer must be a new delivery, acknowledged after its commit.
                        guard response.status == .ok, String(buffer: reply).contains(#""status":"delivered""#)
                        else {
                            throw BenchFailure(
                                description: "unexpected answer \(response.status.code): \(String(buffer: reply))")
                        }
                        let elapsed = BenchCommand.seconds(ContinuousClock.now - sent)
                        let answer = LoadGenerator.Answer(latency: elapsed, at: .now(), outcome: .delivered)
                        latencies.values.withLock { $0.append(answer) }
                    }
                }
            }
            try await group.waitForAll()
        }
        return latencies.values.withLock { $0 }
    }
}

/// Latencies recorded by the load workers.
final class LatencyLog: Sendable {
    let values = Mutex<[LoadGenerator.Answer]>([])
}

struct BenchFailure: Error, CustomStringConvertible {
    var description: String
}

extension PurchaseBench {
    /// nginx (Debian's) on a free loopback port, two workers, answering every request with the
    /// server's own 503 `overloaded` body; each concurrency driven with `bodies` as the server was.
    static func nginxFixed503(concurrencies: [Int], bodies: [String]) async throws -> [Level] {
        guard let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"].first(where: FileManager.default.isExecutableFile)
        else { throw BenchFailure(description: "--beside-nginx: nginx is not installed (apt-get install nginx)") }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "storekeeper-nginx-503-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let port = try FreePort.pick()
        // The server's own answer when it sheds (LoadShedder).
        let body =
            #"{"error":{"code":"overloaded","message":"too many requests in flight; retry shortly","retryable":true}}"#
        let config = """
            worker_processes 2;
            worker_rlimit_nofile 65536;
            daemon off;
            pid \(directory.path)/nginx.pid;
            error_log \(directory.path)/error.log;
            events { worker_connections 16384; }
            http {
              access_log off;
              client_body_temp_path \(directory.path);
              server {
                listen 127.0.0.1:\(port) backlog=4096;
                location / {
                  default_type application/json;
                  add_header Retry-After 1 always;
                  return 503 '\(body)';
                }
              }
            }
            """
        let file = directory.appendingPathComponent("nginx.conf")
        try config.write(to: file, atomically: true, encoding: .utf8)
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["-c", file.path, "-p", directory.path]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }
        // Listening?
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if (try? await LoadGenerator.run(
                host: "127.0.0.1", port: port, path: "/", authorization: "Bearer x", bodies: ["{}"], concurrency: 1,
                expect: "")) != nil
            {
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        var levels: [Level] = []
        for concurrency in concurrencies {
            let started = ContinuousClock.now
            let answers = try await LoadGenerator.run(
                host: "127.0.0.1", port: port, path: "/v1/purchases", authorization: "Bearer \(key)", bodies: bodies,
                concurrency: concurrency, expect: #""status":"delivered""#)
            levels.append(
                Level(
                    concurrency: concurrency, requests: bodies.count,
                    seconds: BenchCommand.seconds(ContinuousClock.now - started), answers: answers,
                    peakMemory: 0, startMemory: 0, restart: nil))
        }
        return levels
    }
}
