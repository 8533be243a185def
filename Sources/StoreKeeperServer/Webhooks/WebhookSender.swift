import AppStoreModels
import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperStorage

/// Sends the outbox to the app's backend (`webhooks.url`): each event POSTed as JSON, signed
/// with HMAC-SHA256 (`webhooks.secret`), marked sent on any 2xx, otherwise retried with
/// exponential backoff — at least once, never dropped. Every instance runs one; on PostgreSQL
/// they share the outbox without sending an event twice at once (`SKIP LOCKED` plus a lease).
///
/// Request: `POST webhooks.url`, body `{"id","type","createdAt","data"}`, headers
/// `StoreKeeper-Event-Id: <id>` and `StoreKeeper-Signature: t=<unix seconds>,v1=<hex>` where
/// `hex = HMAC-SHA256(secret, "<t>.<body>")` (docs/webhooks.md shows how to check it).
public struct WebhookSender: Service {
    let outbox: OutboxStore
    let url: String
    let secret: String
    let client: HTTPClient
    let logger: Logger
    let pollInterval: Duration
    let timeout: TimeAmount
    let firstBackoff: TimeInterval
    let maxBackoff: TimeInterval
    /// An event refused for this long moves to the dead letters (webhooks.maxAttemptHours).
    let maxAttemptAge: TimeInterval

    public init(
        outbox: OutboxStore, url: String, secret: String, client: HTTPClient = .shared, logger: Logger,
        pollInterval: Duration = .seconds(1), timeout: TimeAmount = .seconds(10), firstBackoff: TimeInterval = 5,
        maxBackoff: TimeInterval = 3600, maxAttemptAge: TimeInterval = 72 * 3600
    ) {
        self.maxAttemptAge = maxAttemptAge
        self.outbox = outbox
        self.url = url
        self.secret = secret
        self.client = client
        self.logger = logger
        self.pollInterval = pollInterval
        self.timeout = timeout
        self.firstBackoff = firstBackoff
        self.maxBackoff = maxBackoff
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                await sendDue(now: Date())
                try await Task.sleep(for: pollInterval)
            }
        }
    }

    /// Sends every event due at `now`, oldest first, batch after batch while there is a
    /// backlog; returns how many were accepted. Stops at the first failure (the backend is
    /// likely down): the rest of that batch waits for its lease to end. Accepted events are
    /// marked sent once per batch (one commit, not one per event).
    @discardableResult
    public func sendDue(now: Date, batchSize: Int = 64) async -> Int {
        var total = 0
        var now = now
        while true {
            // A long backlog: each batch is leased from the time it is claimed.
            now = max(now, Date())
            let events: [OutboxStore.Event]
            do {
                events = try await outbox.claimDue(now: now, limit: batchSize)
            } catch {
                logger.warning("cannot read the outbox", metadata: ["error": "\(error)"])
                return total
            }
            var accepted: [String] = []
            var failed = false
            for event in events {
                do {
                    try await send(event, signedAt: Date())
                    accepted.append(event.id)
                } catch {
                    if now.timeIntervalSince(event.windowStart ?? event.createdAt) >= maxAttemptAge {
                        logger.error(
                            "webhook refused for \(Int(maxAttemptAge / 3600)) h: moved to the dead letters",
                            metadata: ["event": "\(event.id)", "type": "\(event.type)", "error": "\(error)"])
                        try? await outbox.markDead(event.id, now: now, error: "\(error)")
                        // It no longer holds back the events behind it.
                        continue
                    }
                    let delay = backoff(afterAttempt: event.attempts + 1)
                    logger.warning(
                        "webhook not accepted; will retry",
                        metadata: [
                            "event": "\(event.id)", "attempt": "\(event.attempts + 1)",
                            "retryInSeconds": "\(Int(delay))", "error": "\(error)",
                        ])
                    try? await outbox.reschedule(event.id, at: now.addingTimeInterval(delay), error: "\(error)")
                    failed = true
                    break
                }
            }
            if !accepted.isEmpty {
                do {
                    try await outbox.markSent(accepted, now: Date())
                } catch {
                    // Sent but not marked: they go again after their lease (at least once).
                    logger.warning("cannot mark webhooks sent", metadata: ["error": "\(error)"])
                    return total
                }
            }
            total += accepted.count
            if failed || events.count < batchSize { return total }
        }
    }

    struct Rejected: Error, CustomStringConvertible {
        var description: String
    }

    /// `signedAt` is the wall clock when the request leaves (receivers reject stale signatures).
    func send(_ event: OutboxStore.Event, signedAt: Date) async throws {
        let body = Self.body(event)
        let timestamp = Int(signedAt.timeIntervalSince1970)
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "StoreKeeper-Webhooks/1")
        request.headers.add(name: "StoreKeeper-Event-Id", value: event.id)
        request.headers.add(
            name: "StoreKeeper-Signature", value: Self.signature(body: body, secret: secret, timestamp: timestamp))
        request.body = .bytes(ByteBuffer(string: body))
        let response = try await client.execute(request, timeout: timeout)
        _ = try? await response.body.collect(upTo: 64 * 1024)
        guard (200..<300).contains(response.status.code) else {
            throw Rejected(description: "HTTP \(response.status.code)")
        }
    }

    /// `{"createdAt","data","id","type"}`: `data` is the event's stored JSON object, verbatim.
    static func body(_ event: OutboxStore.Event) -> String {
        var json = #"{"createdAt":"# + "\"\(StoreKeeperApp.iso(event.createdAt))\"" + #","data":"#
        json += event.payload
        json += #","id":"#
        PurchaseStore.appendJSONString(event.id, to: &json)
        json += #","type":"#
        PurchaseStore.appendJSONString(event.type, to: &json)
        json += "}"
        return json
    }

    /// `t=<timestamp>,v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`.
    static func signature(body: String, secret: String, timestamp: Int) -> String {
        let mac = HMAC<SHA256>.authenticationCode(
            for: Data("\(timestamp).\(body)".utf8), using: SymmetricKey(data: Data(secret.utf8)))
        return "t=\(timestamp),v1=" + mac.lowercaseHex
    }

    /// 5 s, 10 s, 20 s … up to `maxBackoff`, each with up to 20 % jitter (so many instances
    /// and many events do not retry in lockstep).
    func backoff(afterAttempt attempt: Int) -> TimeInterval {
        let base = min(maxBackoff, firstBackoff * pow(2, Double(min(attempt, 30) - 1)))
        return base * Double.random(in: 0.8...1.0)
    }
}
