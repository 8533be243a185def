import Foundation
import Hummingbird
import NIOCore
import StoreKeeperStorage

/// The webhook dead letters (secret key): events the backend refused for
/// `webhooks.maxAttemptHours`, to look at and send again.
struct WebhooksController: RequestHandling {
    let outbox: OutboxStore
    let audit: AnomalyStore
    let maxBodyBytes: Int

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("webhooks/dead-letters") { request, context in try await listDeadLetters(request, context) }
        v1.post("webhooks/dead-letters/:id/replay") { request, context in
            try await replayDeadLetter(request, context)
        }
    }

    func listDeadLetters(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.read)
        try context.caller().requireEveryApp("the webhook dead letters")
        let letters = try await outbox.deadLetters()
        let items: [[String: Any]] = letters.map { letter in
            [
                "id": letter.event.id, "type": letter.event.type, "createdAt": Self.iso(letter.event.createdAt),
                "deadAt": Self.iso(letter.deadAt), "attempts": letter.event.attempts,
                "lastError": letter.lastError ?? NSNull(),
                "data": (try? JSONSerialization.jsonObject(with: Data(letter.event.payload.utf8))) ?? [:],
            ]
        }
        let body = try JSONSerialization.data(
            withJSONObject: ["deadLetters": items], options: [.sortedKeys, .withoutEscapingSlashes])
        return Response(
            status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }

    func replayDeadLetter(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireSecretKey()
        let id = try Self.parameter(context, "id")
        guard try await outbox.replay(id, now: Date()) else {
            throw APIError.notFound("no dead letter '\(id.prefix(64))'")
        }
        try await audit.recordAudit(
            actor: try context.caller().auditActor, action: "webhook_replay", subject: id,
            detail: "dead letter queued again", now: Date())
        return try Self.json(["id": id, "status": "pending"], status: .accepted)
    }
}
