import Foundation
import SQLKit
import StoreKeeperSimulator
import StoreKeeperStorage
import StoreKeeperSupport
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `scripts/cluster`: three `storekeeper serve` instances on one PostgreSQL behind nginx.
/// The same purchase sent to every instance at once is delivered once; an instance SIGKILLed
/// under load loses no acknowledged delivery. Needs PostgreSQL and nginx (CI has both; a
/// missing nginx fails in CI and skips elsewhere).
@Suite struct ClusterTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    struct Reply {
        var status: Int
        var json: [String: Any]
    }

    static func call(_ url: String, key: String, body: String) async -> Reply {
        var request = URLRequest(url: URL(string: url)!, timeoutInterval: 30)
        request.httpMethod = "POST"
        request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(body.utf8)
        guard let (data, response) = try? await URLSession.shared.data(for: request) else {
            return Reply(status: 0, json: [:])
        }
        return Reply(
            status: (response as? HTTPURLResponse)?.statusCode ?? 0,
            json: (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:])
    }

    /// Runs `scripts/cluster`; its output goes to a file, not a pipe: the instances and nginx
    /// it leaves running inherit the descriptors it was given, and would hold a pipe open.
    static func script(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("cluster-script-\(UUID()).log")
        FileManager.default.createFile(atPath: log.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: log) }
        let handle = try FileHandle(forWritingTo: log)
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [root.appendingPathComponent("scripts/cluster").path] + arguments
        process.runIn(root)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        while process.isRunning { try await Task.sleep(for: .milliseconds(100)) }
        try handle.close()
        return (process.terminationStatus, (try? String(contentsOf: log, encoding: .utf8)) ?? "")
    }

    /// docs/deployment.md's TLS front, tested: nginx terminates TLS with a self-signed
    /// certificate and the instance behind it answers over HTTPS only.
    @Test func anInstanceBehindNginxWithTLS() async throws {
        try await HeavyTests.shared.run { try await self.anInstanceBehindNginxWithTLSAlone() }
    }

    func anInstanceBehindNginxWithTLSAlone() async throws {
        guard let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] else { return }
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"].contains { FileManager.default.isExecutableFile(atPath: $0) }
        guard nginx else {
            if ProcessInfo.processInfo.environment["CI"] != nil { Issue.record("nginx is not installed") }
            return
        }
        let lease = try await ScratchDatabases.shared.lend(base: base)
        let components = URLComponents(string: lease.url)!
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cluster-tls-\(UUID())")
        var port = 0
        var started: (status: Int32, output: String) = (1, "")
        for _ in 0..<4 {
            port = try FreePort.block(4)
            started = try await Self.script([
                "start", "1", "--database-url", components.string!, "--port", String(port), "--dir", directory.path,
                "--binary", VerifyCommandTests.binary.path, "--tls",
            ])
            guard started.status != 0, started.output.contains("Address already in use") else { break }
            _ = try await Self.script(["stop", "--dir", directory.path])
        }
        defer {
            let stop = ChildProcess()
            stop.executableURL = URL(fileURLWithPath: "/bin/bash")
            stop.arguments = [
                Self.root.appendingPathComponent("scripts/cluster").path, "stop", "--dir", directory.path,
            ]
            try? stop.run()
            stop.waitUntilExit()
            try? FileManager.default.removeItem(at: directory)
            Task { await ScratchDatabases.shared.giveBack(lease) }
        }
        try #require(started.status == 0, Comment(rawValue: started.output))
        #expect(started.output.contains("https://127.0.0.1:\(port)"))
        func curl(_ arguments: [String]) throws -> (status: Int32, output: String) {
            let process = ChildProcess()
            let pipe = Pipe()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            process.arguments = ["-s", "--max-time", "10"] + arguments
            process.standardOutput = pipe
            process.standardError = pipe
            try process.run()
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: data, as: UTF8.self))
        }
        let certificate = directory.appendingPathComponent("tls.crt").path
        // Over TLS, the certificate checked: the instance behind answers.
        let health = try curl(["--cacert", certificate, "-w", " %{http_code}", "https://127.0.0.1:\(port)/healthz"])
        #expect(health.status == 0 && health.output.hasSuffix(" 200"), "\(health.output)")
        // The proxy says https: the dashboard's session cookie is Secure.
        let key = try String(contentsOf: directory.appendingPathComponent("secret-key"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let signIn = try curl([
            "--cacert", certificate, "-D", "-", "-o", "/dev/null", "--data-urlencode", "key=\(key)",
            "https://127.0.0.1:\(port)/dashboard/login",
        ])
        #expect(
            signIn.output.lowercased().contains("set-cookie:") && signIn.output.contains("Secure"), "\(signIn.output)")
        // Plain HTTP to the TLS port is not served.
        let plain = try curl(["-w", "%{http_code}", "http://127.0.0.1:\(port)/healthz"])
        #expect(!plain.output.hasSuffix("200"), "\(plain.output)")
    }

    @Test func threeInstancesBehindNginxDeliverOnceAndSurviveAKill() async throws {
        try await HeavyTests.shared.run { try await self.threeInstancesBehindNginxDeliverOnceAndSurviveAKillAlone() }
    }

    func threeInstancesBehindNginxDeliverOnceAndSurviveAKillAlone() async throws {
        guard let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES_URL"] else { return }
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"].contains { FileManager.default.isExecutableFile(atPath: $0) }
        guard nginx else {
            if ProcessInfo.processInfo.environment["CI"] != nil { Issue.record("nginx is not installed") }
            return
        }
        let lease = try await ScratchDatabases.shared.lend(base: base)
        let components = URLComponents(string: lease.url)!
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cluster-\(UUID())")
        // A random port block may meet a port another test has just taken: another block then.
        var port = 0
        var started: (status: Int32, output: String) = (1, "")
        for _ in 0..<4 {
            port = try FreePort.block(10)
            started = try await Self.script([
                "start", "3", "--database-url", components.string!, "--port", String(port), "--dir", directory.path,
                "--binary", VerifyCommandTests.binary.path,
            ])
            guard started.status != 0, started.output.contains("Address already in use") else { break }
            _ = try await Self.script(["stop", "--dir", directory.path])
        }
        defer {
            let stop = ChildProcess()
            stop.executableURL = URL(fileURLWithPath: "/bin/bash")
            stop.arguments = [
                Self.root.appendingPathComponent("scripts/cluster").path, "stop", "--dir", directory.path,
            ]
            try? stop.run()
            stop.waitUntilExit()
            try? FileManager.default.removeItem(at: directory)
            Task { await ScratchDatabases.shared.giveBack(lease) }
        }
        try #require(started.status == 0, Comment(rawValue: started.output))
        let balancer = "http://127.0.0.1:\(port)"
        let key = try String(contentsOf: directory.appendingPathComponent("secret-key"), encoding: .utf8)

        func buy(_ appleId: String) async throws -> String {
            let reply = await Self.call(
                "\(balancer)/local-app-store/control/purchases", key: key,
                body: #"{"appleId":"\#(appleId)","productId":"coins_60"}"#)
            return try #require((reply.json["signedTransactions"] as? [String])?.first, "\(reply.status) \(reply.json)")
        }

        // One purchase, submitted 24 times at once through the load balancer (round-robin over
        // the three instances): delivered exactly once.
        let jws = try await buy("apple-shared")
        let statuses = await withTaskGroup(of: String.self) { group in
            for _ in 0..<24 {
                group.addTask {
                    let reply = await Self.call(
                        "\(balancer)/v1/purchases", key: key,
                        body: #"{"accountId":"ann","signedTransaction":"\#(jws)"}"#)
                    return reply.json["status"] as? String ?? "http \(reply.status)"
                }
            }
            var all: [String] = []
            for await status in group { all.append(status) }
            return all
        }
        #expect(statuses.filter { $0 == "delivered" }.count == 1, "\(statuses)")
        #expect(statuses.filter { $0 == "already_delivered" }.count == 23, "\(statuses)")
        let log = (try? String(contentsOf: directory.appendingPathComponent("access.log"), encoding: .utf8)) ?? ""
        let upstreams = Set(
            log.split(separator: "\n").filter { $0.hasPrefix("POST /v1/purchases") }.compactMap {
                $0.split(separator: " ").last
            })
        #expect(upstreams.count == 3, "every instance took submissions: \(upstreams)")

        // Load, and one instance SIGKILLed in the middle: every acknowledged delivery is there.
        var proofs: [String] = []
        for index in 0..<90 { proofs.append(try await buy("apple-load-\(index)")) }
        let pid = try String(contentsOf: directory.appendingPathComponent("instance-2.pid"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let acknowledged = await withTaskGroup(of: Int?.self) { group in
            let killAfter = 30
            let counter = Counter()
            for (index, proof) in proofs.enumerated() {
                group.addTask {
                    for _ in 0..<60 {
                        let reply = await Self.call(
                            "\(balancer)/v1/purchases", key: key,
                            body: #"{"accountId":"load-\#(index)","signedTransaction":"\#(proof)"}"#)
                        if reply.status == 200 {
                            if counter.increment() == killAfter { kill(pid_t(pid) ?? 0, SIGKILL) }
                            return index
                        }
                        try? await Task.sleep(for: .milliseconds(100))
                    }
                    return nil
                }
            }
            var done: [Int] = []
            for await index in group { if let index { done.append(index) } }
            return done
        }
        #expect(acknowledged.count == proofs.count, "every purchase acknowledged in the end (the client retries)")
        let database = try await Database.open(url: components.string!)
        let stored: Int = try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM deliveries WHERE account_id LIKE 'load-%'").first()?
                .decode(column: "n", as: Int.self) ?? 0
        }
        #expect(stored == acknowledged.count)
        let ledger: Int = try await database.read { sql in
            try await sql.raw(
                "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS n FROM ledger WHERE account_id LIKE 'load-%'"
            )
            .first()?.decode(column: "n", as: Int.self) ?? 0
        }
        #expect(ledger == 60 * proofs.count, "no purchase credited twice")
        try await database.close()
        // Gone, or a zombie nobody reaped (the script that started it has exited).
        let state = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8))?
            .split(separator: ")").last?.split(separator: " ").first
        #expect(state == nil || state == "Z" || state == "X", "instance 2 was killed")
        let stopped = try await Self.script(["stop", "--dir", directory.path])
        #expect(stopped.status == 0, Comment(rawValue: stopped.output))
    }

    final class Counter: @unchecked Sendable {
        let lock = NSLock()
        var value = 0
        func increment() -> Int {
            lock.withLock {
                value += 1
                return value
            }
        }
    }
}
