import AppStoreModels
import AppStoreVerification
import ArgumentParser
import AsyncHTTPClient
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperServer
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

    enum LoadGeneratorKind: String, CaseIterable, ExpressibleByArgument {
        case lean
        case asyncHTTPClient = "async-http-client"
    }

    struct Level {
        var concurrency: Int
        var requests: Int
        var seconds: Double
        var latencies: [Double]
        var deliveriesPerSecond: Double { Double(requests) / seconds }
        func percentile(_ p: Double) -> Double {
            let sorted = latencies.sorted()
            return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }
    }

    func run() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("storekeeper-bench-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var configuration = ServerConfiguration()
        configuration.port = 0
        configuration.databaseURL = databaseURL ?? "sqlite:\(directory.path)/bench.sqlite"
        configuration.secretKeys = [Self.key]
        // The local App Store signs the load's proofs.
        configuration.localAppStoreEnabled = true
        configuration.bundleId = "com.example.app"
        configuration.appAppleId = 1_234_567_890
        var logger = Logger(label: "bench")
        logger.logLevel = .error
        let app = try await StoreKeeperApp.make(configuration, dataDirectory: directory, logger: logger)
        guard let store = app.localAppStore else { return }

        let port = Mutex(0)
        let application = app.application { bound in port.withLock { $0 = bound } }
        let serviceGroup = ServiceGroup(
            configuration: .init(services: [application], gracefulShutdownSignals: [], logger: logger))
        let server = Task { try await serviceGroup.run() }
        while port.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(20)) }
        let base = "http://127.0.0.1:\(port.withLock { $0 })"

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
            let payload = issuer.transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(3_000_000_000_000_000 + run * 10_000_000 + UInt64(index)))
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
            let started = ContinuousClock.now
            let latencies: [Double]
            switch loadGenerator {
            case .lean:
                latencies = try await LoadGenerator.run(
                    host: "127.0.0.1", port: port.withLock { $0 }, path: "/v1/purchases",
                    authorization: "Bearer \(Self.key)", bodies: slice, concurrency: concurrency,
                    expect: #""status":"delivered""#)
            case .asyncHTTPClient:
                latencies = try await Self.sendWithAsyncHTTPClient(
                    client, url: base + "/v1/purchases", bodies: slice, concurrency: concurrency)
            }
            guard latencies.count == slice.count else {
                throw BenchFailure(description: "\(latencies.count) answers for \(slice.count) requests")
            }
            levels.append(
                Level(
                    concurrency: concurrency, requests: slice.count,
                    seconds: BenchCommand.seconds(ContinuousClock.now - started), latencies: latencies))
        }
        try await client.shutdown()
        await serviceGroup.triggerGracefulShutdown()
        _ = try? await server.value
        try? await app.database.close()

        print("## POST /v1/purchases end to end — \(app.database.kind.rawValue)")
        print("")
        print("verification alone (all cores): \(String(format: "%.0f", verifyPerSecond)) /s")
        print("")
        print("| concurrency | requests | deliveries/s | p50 | p99 | vs verification |")
        print("|---:|---:|---:|---:|---:|---:|")
        for level in levels {
            print(
                "| \(level.concurrency) | \(level.requests) | \(String(format: "%.0f", level.deliveriesPerSecond)) | "
                    + "\(String(format: "%.1f ms", level.percentile(0.5) * 1000)) | "
                    + "\(String(format: "%.1f ms", level.percentile(0.99) * 1000)) | "
                    + "\(String(format: "%.2f", level.deliveriesPerSecond / verifyPerSecond)) |")
        }
        print("")
    }
}

extension PurchaseBench {
    /// The same load through AsyncHTTPClient (`--load-generator async-http-client`): a general
    /// client, heavier on the shared cores, kept to show how much the load generator weighs.
    static func sendWithAsyncHTTPClient(_ client: HTTPClient, url: String, bodies: [String], concurrency: Int)
        async throws -> [Double]
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
                        latencies.values.withLock { $0.append(elapsed) }
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
    let values = Mutex<[Double]>([])
}

struct BenchFailure: Error, CustomStringConvertible {
    var description: String
}
