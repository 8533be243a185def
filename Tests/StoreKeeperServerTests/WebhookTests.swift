import AsyncHTTPClient
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperStorage
import Synchronization
import Testing

@testable import StoreKeeperServer

/// Webhooks: every outbox event reaches the app's backend signed, at least once, in order,
/// through failures and outages — against a real HTTP receiver.
@Suite struct WebhookTests {
    static let secret = "webhook-secret-0123456789"

    /// An HTTP backend that records what it receives and answers with scripted statuses
    /// (200 once the script is used up).
    final class Receiver: Sendable {
        struct Received: Sendable {
            var headers: HTTPFields
            var body: String
        }
        let received = Mutex<[Received]>([])
        let script: Mutex<[HTTPResponse.Status]>

        init(script: [HTTPResponse.Status]) { self.script = Mutex(script) }

        func take(_ request: Request) async throws -> Response {
            var request = request
            let body = try await request.collectBody(upTo: 1 << 20)
            received.withLock { $0.append(Received(headers: request.headers, body: String(buffer: body))) }
            let status = script.withLock { $0.isEmpty ? .ok : $0.removeFirst() }
            return Response(status: status)
        }

        var bodies: [[String: Any]] {
            received.withLock { $0 }.map {
                (try? JSONSerialization.jsonObject(with: Data($0.body.utf8))) as? [String: Any] ?? [:]
            }
        }
    }

    static func withReceiver(
        script: [HTTPResponse.Status] = [], _ body: (String, Receiver) async throws -> Void
    ) async throws {
        let receiver = Receiver(script: script)
        let router = Router()
        router.post("hooks") { request, _ in try await receiver.take(request) }
        let port = Mutex(0)
        var logger = Logger(label: "receiver")
        logger.logLevel = .error
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in port.withLock { $0 = channel.localAddress?.port ?? 0 } }, logger: logger)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: logger))
        let running = Task { try await group.run() }
        while port.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        do {
            try await body("http://127.0.0.1:\(port.withLock { $0 })/hooks", receiver)
        } catch {
            await group.triggerGracefulShutdown()
            _ = try? await running.value
            throw error
        }
        await group.triggerGracefulShutdown()
        _ = try? await running.value
    }

    static func deliver(_ app: StoreKeeperApp, _ client: any TestClientProtocol, account: String) async throws {
        let bought = try await app.localAppStore!.buy(account, items: [.init(productId: "coins_60")])
        let reply = try await ServerAPITests.submit(
            client, account: account, signedTransaction: bought.signedTransactions[0])
        #expect(reply.status == .ok)
    }

    /// Checks `StoreKeeper-Signature` the way docs/webhooks.md tells a backend to.
    static func signatureIsValid(_ received: Receiver.Received, secret: String = secret) -> Bool {
        guard let header = received.headers[HTTPField.Name("StoreKeeper-Signature")!] else { return false }
        let parts = Dictionary(
            uniqueKeysWithValues: header.split(separator: ",").compactMap { part -> (String, String)? in
                let pair = part.split(separator: "=", maxSplits: 1)
                return pair.count == 2 ? (String(pair[0]), String(pair[1])) : nil
            })
        guard let timestamp = parts["t"], let given = parts["v1"] else { return false }
        let expected = HMAC<SHA256>.authenticationCode(
            for: Data("\(timestamp).\(received.body)".utf8), using: SymmetricKey(data: Data(secret.utf8))
        ).map { String(format: "%02x", $0) }.joined()
        return expected == given
    }

    @Test(arguments: ServerAPITests.databases)
    func deliveriesReachTheBackendSignedAndOnce(kind: String) async throws {
        try await Self.withReceiver { url, receiver in
            try await ServerAPITests.withServer(kind) { app, client in
                try await Self.deliver(app, client, account: "hook-1")
                try await Self.deliver(app, client, account: "hook-2")
                let sender = WebhookSender(
                    outbox: OutboxStore(database: app.database), url: url, secret: Self.secret, logger: app.logger,
                    timeout: .seconds(60))
                #expect(await sender.sendDue(now: Date()) == 2)
                #expect(await sender.sendDue(now: Date().addingTimeInterval(3600)) == 0)  // nothing twice
                let received = receiver.received.withLock { $0 }
                #expect(received.count == 2)
                #expect(received.allSatisfy { Self.signatureIsValid($0) })
                #expect(!Self.signatureIsValid(received[0], secret: "another-secret-000000"))
                let bodies = receiver.bodies
                #expect(bodies.map { $0["type"] as? String } == ["delivery", "delivery"])
                #expect(bodies.map { ($0["data"] as? [String: Any])?["accountId"] as? String } == ["hook-1", "hook-2"])
                #expect(((bodies[0]["data"] as? [String: Any])?["transactionId"] as? String)?.isEmpty == false)
                #expect(bodies[0]["createdAt"] is String)
                let eventIds = received.map { $0.headers[HTTPField.Name("StoreKeeper-Event-Id")!] }
                #expect(eventIds == bodies.map { $0["id"] as? String })
                #expect(try await OutboxStore(database: app.database).pendingCount() == 0)
            }
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aFailingBackendIsRetriedWithBackoffAndInOrder(kind: String) async throws {
        try await Self.withReceiver(script: [.internalServerError, .serviceUnavailable]) { url, receiver in
            try await ServerAPITests.withServer(kind) { app, client in
                try await Self.deliver(app, client, account: "retry-1")
                try await Self.deliver(app, client, account: "retry-2")
                let outbox = OutboxStore(database: app.database)
                // Backoffs of minutes: a sender never schedules before the wall clock, and a loaded
                // machine's PostgreSQL may take seconds between two calls.
                let sender = WebhookSender(
                    outbox: outbox, url: url, secret: Self.secret, logger: app.logger, timeout: .seconds(60),
                    firstBackoff: 600)
                let start = Date()
                #expect(await sender.sendDue(now: start) == 0)  // 500: stop, keep the rest for later
                let first = try await outbox.all()
                #expect(first[0].event.attempts == 1)
                #expect(first[0].lastError?.contains("500") == true)
                #expect(first.allSatisfy { $0.sentAt == nil })
                #expect(await sender.sendDue(now: start.addingTimeInterval(1)) == 0)  // backing off, leased
                #expect(receiver.received.withLock { $0.count } == 1)
                #expect(await sender.sendDue(now: start.addingTimeInterval(601)) == 0)  // 503
                #expect(receiver.received.withLock { $0.count } == 2)
                #expect(await sender.sendDue(now: start.addingTimeInterval(601 + 1_201)) == 2)
                // Every attempt carried the same event first: order is kept through failures.
                let accounts = receiver.bodies.map { ($0["data"] as? [String: Any])?["accountId"] as? String }
                #expect(accounts == ["retry-1", "retry-1", "retry-1", "retry-2"])
                // Signed with the wall clock when sent, not the scheduling time (which ran ahead here).
                let stamps = receiver.received.withLock { $0 }.compactMap { received -> Double? in
                    received.headers[HTTPField.Name("StoreKeeper-Signature")!]?.split(separator: ",").first
                        .flatMap { Double($0.dropFirst(2)) }
                }
                #expect(stamps.count == 4)
                #expect(stamps.allSatisfy { abs($0 - Date().timeIntervalSince1970) < 120 })
                #expect(try await outbox.pendingCount() == 0)
            }
        }
    }

    @Test func aBacklogDrainsInOneCallInOrder() async throws {
        try await Self.withReceiver { url, receiver in
            try await ServerAPITests.withServer("sqlite") { app, client in
                for index in 0..<30 { try await Self.deliver(app, client, account: "backlog-\(index)") }
                let sender = WebhookSender(
                    outbox: OutboxStore(database: app.database), url: url, secret: Self.secret, logger: app.logger,
                    timeout: .seconds(60))
                // Batches of 8: the call keeps going while batches come back full.
                #expect(await sender.sendDue(now: Date(), batchSize: 8) == 30)
                let accounts = receiver.bodies.compactMap { ($0["data"] as? [String: Any])?["accountId"] as? String }
                #expect(accounts == (0..<30).map { "backlog-\($0)" })
                #expect(try await OutboxStore(database: app.database).pendingCount() == 0)
            }
        }
    }

    @Test func anUnreachableBackendLosesNothing() async throws {
        try await ServerAPITests.withServer("sqlite") { app, client in
            try await Self.deliver(app, client, account: "down-1")
            let outbox = OutboxStore(database: app.database)
            // Nothing listens on port 9 (discard) here: connection refused.
            let down = WebhookSender(
                outbox: outbox, url: "http://127.0.0.1:9/hooks", secret: Self.secret, logger: app.logger,
                timeout: .seconds(2))
            let start = Date()
            #expect(await down.sendDue(now: start) == 0)
            #expect(try await outbox.pendingCount() == 1)
            try await Self.withReceiver { url, receiver in
                let up = WebhookSender(
                    outbox: outbox, url: url, secret: Self.secret, logger: app.logger, timeout: .seconds(60))
                #expect(await up.sendDue(now: start.addingTimeInterval(120)) == 1)
                #expect(receiver.received.withLock { $0.count } == 1)
            }
            #expect(try await outbox.pendingCount() == 0)
        }
    }

    @Test func theServerSendsThemByItself() async throws {
        try await Self.withReceiver { url, receiver in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("webhook-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            var configuration = ServerConfiguration()
            configuration.port = 0
            configuration.databaseURL = "sqlite:\(directory.path)/storekeeper.sqlite"
            configuration.secretKeys = [ServerAPITests.secret]
            configuration.webhookURL = url
            configuration.webhookSecret = Self.secret
            configuration.localAppStoreEnabled = true
            configuration.bundleId = "com.example.app"
            configuration.appAppleId = 1_234_567_890
            var logger = Logger(label: "webhook-test")
            logger.logLevel = .error
            let app = try await StoreKeeperApp.make(configuration, dataDirectory: directory, logger: logger)
            let port = Mutex(0)
            let group = ServiceGroup(
                configuration: .init(
                    services: [app.application { bound in port.withLock { $0 = bound } }],
                    gracefulShutdownSignals: [], logger: logger))
            let running = Task { try await group.run() }
            while port.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
            let bought = try await app.localAppStore!.buy("auto", items: [.init(productId: "coins_60")])
            var request = HTTPClientRequest(url: "http://127.0.0.1:\(port.withLock { $0 })/v1/purchases")
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(ServerAPITests.secret)")
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(
                ByteBuffer(string: #"{"accountId":"auto","signedTransaction":"\#(bought.signedTransactions[0])"}"#))
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
            #expect(response.status == .ok)
            // The sender polls every second; allow a generous while on a loaded machine.
            for _ in 0..<600 where receiver.received.withLock({ $0.isEmpty }) {
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(receiver.received.withLock { $0.count } == 1)
            #expect(receiver.received.withLock { $0 }.allSatisfy { Self.signatureIsValid($0) })
            await group.triggerGracefulShutdown()
            _ = try? await running.value
            try? await app.database.close()
        }
    }

    @Test func webhookConfigurationIsChecked() async throws {
        for (environment, message) in [
            (["WEBHOOKS_URL": "http://127.0.0.1:1/hooks"], "webhooks.secret"),
            (["WEBHOOKS_URL": "http://127.0.0.1:1/hooks", "WEBHOOKS_SECRET": "short"], "webhooks.secret"),
            (["WEBHOOKS_URL": "ftp://example.com/x", "WEBHOOKS_SECRET": Self.secret], "webhooks.url"),
            (["WEBHOOKS_URL": "not a url", "WEBHOOKS_SECRET": Self.secret], "webhooks.url"),
        ] {
            do {
                _ = try await ServerConfiguration.load(file: nil, environment: environment)
                Issue.record("accepted \(environment)")
            } catch let error as ServerConfiguration.Invalid {
                #expect(error.description.contains(message), "\(error)")
            }
        }
        let valid = try await ServerConfiguration.load(
            file: nil, environment: ["WEBHOOKS_URL": "https://backend.example/hooks", "WEBHOOKS_SECRET": Self.secret])
        #expect(valid.webhookURL == "https://backend.example/hooks")
    }
}
