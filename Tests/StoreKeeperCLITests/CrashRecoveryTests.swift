import Foundation
import SQLKit
import StoreKeeperStorage
import StoreKeeperSupport
import Synchronization
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// SIGKILL under load, then restart (scenario O1): every acknowledged delivery is present,
/// none is duplicated, and the rest deliver once when resubmitted.
@Suite struct CrashRecoveryTests {
    static func post(_ port: Int, _ path: String, key: String?, body: String) async throws -> [String: Any] {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.httpMethod = "POST"
        request.timeoutInterval = 30
        if let key { request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization") }
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(body.utf8)
        let data = try await LocalStoreServeTests.fetch(request)
        return (try? JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
    }

    static var databases: [String] {
        ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] == nil
            ? ["sqlite"] : ["sqlite", "postgres"]
    }

    @Test(arguments: databases)
    func killedUnderLoadLosesNothingAndDuplicatesNothing(database kind: String) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("crash-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var databaseURL: String?
        var lease: ScratchDatabases.Lease?
        if kind == "postgres", let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] {
            lease = try await ScratchDatabases.shared.lend(base: base)
            databaseURL = lease?.url
        }
        defer { if let lease { Task { await ScratchDatabases.shared.giveBack(lease) } } }

        let first = try ServerProcess(directory: directory, databaseURL: databaseURL)
        try await first.waitUntilListening()
        let key = try String(
            contentsOf: directory.appendingPathComponent("storekeeper-data/dev-secret-key"), encoding: .utf8)

        // Proofs bought beforehand: the local App Store's keys persist, so they verify after the restart.
        var proofs: [String] = []
        for index in 0..<120 {
            let bought = try await Self.post(
                first.port, "/local-app-store/control/purchases", key: nil,
                body: #"{"appleId":"crash\#(index % 7)","productId":"coins_60"}"#)
            proofs.append(try #require((bought["signedTransactions"] as? [String])?.first))
        }

        let acknowledged = Acknowledged()
        let port = first.port
        let allProofs = proofs
        let load = Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<8 {
                    group.addTask {
                        for index in stride(from: worker, to: allProofs.count, by: 8) {
                            let reply = try? await Self.post(
                                port, "/v1/purchases", key: key,
                                body: #"{"accountId":"victim","signedTransaction":"\#(allProofs[index])"}"#)
                            if reply?["status"] as? String == "delivered" {
                                acknowledged.indices.withLock { _ = $0.insert(index) }
                            }
                        }
                    }
                }
            }
        }
        // Kill it mid-load, once some deliveries were acknowledged.
        let deadline = Date().addingTimeInterval(30)
        while acknowledged.indices.withLock({ $0.count }) < 20, Date() < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        first.kill()
        await load.value
        let before = acknowledged.indices.withLock { $0 }
        #expect(before.count >= 20)

        let second = try ServerProcess(directory: directory, databaseURL: databaseURL)
        try await second.waitUntilListening()
        for index in before {
            let reply = try await Self.post(
                second.port, "/v1/purchases", key: key,
                body: #"{"accountId":"victim","signedTransaction":"\#(proofs[index])"}"#)
            #expect(reply["status"] as? String == "already_delivered", "acknowledged delivery \(index) was lost")
        }
        for index in proofs.indices where !before.contains(index) {
            _ = try await Self.post(
                second.port, "/v1/purchases", key: key,
                body: #"{"accountId":"victim","signedTransaction":"\#(proofs[index])"}"#)
        }
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(second.port)/v1/accounts/victim")!)
        request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        let account =
            try JSONSerialization.jsonObject(with: try await LocalStoreServeTests.fetch(request)) as? [String: Any]
        #expect((account?["balances"] as? [String: Int])?["coins"] == 60 * proofs.count)  // each exactly once
        second.kill()
    }
}

/// A `storekeeper serve` child process.
final class ServerProcess: @unchecked Sendable {
    let process = ChildProcess()
    let output = Pipe()
    /// Reads the server's log as it comes, for its whole life: unread, the pipe would fill up
    /// and the server would block on its next log line.
    private(set) var drain: PipeDrain!
    var port = 0
    var key = ""

    init(directory: URL, databaseURL: String? = nil, environment extra: [String: String] = [:]) throws {
        process.executableURL = VerifyCommandTests.binary
        process.arguments = ["serve"]
        process.runIn(directory)
        var environment = ProcessInfo.processInfo.environment.filter {
            !$0.key.hasPrefix("APPLE_") && !$0.key.hasPrefix("AUTH_") && !$0.key.hasPrefix("DATABASE_")
        }
        environment["HTTP_PORT"] = "0"
        if let databaseURL { environment["DATABASE_URL"] = databaseURL }
        environment.merge(extra) { $1 }
        process.environment = environment
        process.standardOutput = output
        process.standardError = output
        try process.run()
        drain = PipeDrain(output.fileHandleForReading)
    }

    /// Waits for the "listening" log line; returns the log so far. The deadline is generous: a
    /// whole test run starts many servers at once on two cores.
    @discardableResult
    func waitUntilListening() async throws -> String {
        let started = Date()
        let deadline = started.addingTimeInterval(180)
        // Looks once more after the deadline: a loop that was not scheduled for a while must
        // not fail a server that started meanwhile.
        while true {
            let log = drain.text
            if let range = log.range(of: "StoreKeeper listening on http://127.0.0.1:") {
                port = Int(log[range.upperBound...].prefix(while: \.isNumber)) ?? 0
                if port > 0 { return log }
            }
            if Date() >= deadline { break }
            // A server that ended (a port taken meanwhile, a bad configuration) never will.
            if !process.isRunning {
                _ = try await drain.all(limit: .seconds(5))
                if drain.text.contains("StoreKeeper listening on http://127.0.0.1:") { continue }
                break
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw ServerDidNotStart(seconds: Date().timeIntervalSince(started), log: drain.text)
    }

    func kill() {
        guard process.isRunning else { return }
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}

/// Everything a pipe carries, read on a thread of its own until its end (never on the test
/// process's cooperative pool, which a blocking read would stall).
final class PipeDrain: Sendable {
    private let data = Mutex(Data())
    private let ended = Mutex(false)

    init(_ handle: FileHandle) {
        Thread.detachNewThread { [self] in
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                data.withLock { $0.append(chunk) }
            }
            ended.withLock { $0 = true }
        }
    }

    var text: String { data.withLock { String(decoding: $0, as: UTF8.self) } }

    /// Everything, once the pipe has ended (every writer gone) — or what came within `limit`,
    /// if something still holds it open (a grandchild that outlived the process).
    func all(limit: Duration = .seconds(60)) async throws -> String {
        let deadline = ContinuousClock.now + limit
        while !ended.withLock({ $0 }), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        return text
    }
}

/// A child server that never said it was listening: how long it was given, and its log's end.
struct ServerDidNotStart: Error, CustomStringConvertible {
    let seconds: Double
    let log: String

    var description: String {
        "no \"listening\" line within \(Int(seconds)) s; the log ends:\n\(log.suffix(2_000))"
    }
}

/// Indices of acknowledged deliveries, shared by the load workers.
final class Acknowledged: Sendable {
    let indices = Mutex<Set<Int>>([])
}

extension ChildProcess {
    /// Runs the process (executable and arguments already set) in `directory`, through
    /// coreutils' `env -C` (posix_spawn's change of directory is a glibc extension the C module
    /// does not import).
    func runIn(_ directory: URL) {
        let executable = executableURL?.path ?? "/bin/sh"
        executableURL = URL(fileURLWithPath: "/usr/bin/env")
        arguments = ["-C", directory.path, executable] + (arguments ?? [])
    }
}
