import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// Events the backend refuses for the whole attempt window become dead letters an operator
/// sees and replays; they no longer hold back the events behind them.
extension WebhookTests {
    @Test(arguments: ServerAPITests.databases)
    func eventsRefusedForTheWindowBecomeDeadLettersAndCanBeReplayed(kind: String) async throws {
        // The first event is refused twice (the second time past its 72 h), then all is accepted.
        try await Self.withReceiver(script: [.internalServerError, .badRequest]) { url, receiver in
            try await ServerAPITests.withServer(kind) { app, client in
                try await Self.deliver(app, client, account: "dead-1")
                try await Self.deliver(app, client, account: "dead-2")
                let outbox = OutboxStore(database: app.database)
                let sender = WebhookSender(
                    outbox: outbox, url: url, secret: Self.secret, logger: app.logger, timeout: .seconds(60),
                    maxAttemptAge: 72 * 3600)
                let start = Date()
                #expect(await sender.sendDue(now: start) == 0)
                // 73 hours later the first is refused again: dead; the second goes through.
                #expect(await sender.sendDue(now: start.addingTimeInterval(73 * 3600)) == 1)
                #expect(try await outbox.pendingCount() == 0)

                let listed = try await ServerAPITests.call(client, .get, "/v1/webhooks/dead-letters")
                #expect(listed.status == .ok)
                let letters = listed.json["deadLetters"] as? [[String: Any]] ?? []
                #expect(letters.count == 1)
                let letter = try #require(letters.first)
                #expect(letter["type"] as? String == "delivery")
                #expect((letter["data"] as? [String: Any])?["accountId"] as? String == "dead-1")
                #expect(letter["attempts"] as? Int == 2)
                #expect((letter["lastError"] as? String)?.contains("400") == true)
                #expect(letter["deadAt"] is String && letter["createdAt"] is String)
                let id = try #require(letter["id"] as? String)

                // Operator only: a client token cannot see or replay them.
                let token = try await ServerAPITests.clientToken("dead-1")
                #expect(
                    try await ServerAPITests.call(client, .get, "/v1/webhooks/dead-letters", token: token).status
                        == .forbidden)
                #expect(
                    try await ServerAPITests.call(
                        client, .post, "/v1/webhooks/dead-letters/\(id)/replay", token: token
                    ).status == .forbidden)
                #expect(
                    try await ServerAPITests.call(client, .post, "/v1/webhooks/dead-letters/nope/replay").status
                        == .notFound)

                let replayed = try await ServerAPITests.call(client, .post, "/v1/webhooks/dead-letters/\(id)/replay")
                #expect(replayed.status == .accepted)
                #expect(replayed.json["status"] as? String == "pending")
                // Replayed once; a second replay finds no dead letter.
                #expect(
                    try await ServerAPITests.call(client, .post, "/v1/webhooks/dead-letters/\(id)/replay").status
                        == .notFound)
                #expect(await sender.sendDue(now: Date()) == 1)
                let accounts = receiver.bodies.map { ($0["data"] as? [String: Any])?["accountId"] as? String }
                #expect(accounts == ["dead-1", "dead-1", "dead-2", "dead-1"])
                #expect(
                    (try await ServerAPITests.call(client, .get, "/v1/webhooks/dead-letters").json["deadLetters"]
                        as? [Any])?.isEmpty == true)
                #expect(try await app.store.anomalies.audit().contains { $0.action == "webhook_replay" })
            }
        }
    }
}
