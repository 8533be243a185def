import AppStoreModels
import CoreMetrics
import EventLoopPinning
import Foundation
import HTTPTypes
import Hummingbird
import Metrics
import NIOCore
import Prometheus
import StoreKeeperStorage
import Synchronization

/// The server's metrics (swift-metrics, exported as Prometheus text at `/metrics`). Each app
/// has its own registry, so tests and several apps in one process never mix their numbers.
public final class ServerMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    let factory: PrometheusMetricsFactory

    let deliveries: CoreMetrics.Counter
    let duplicatesSuppressed: CoreMetrics.Counter
    let unattributed: CoreMetrics.Counter
    /// Requests answered 503 `overloaded` above `limits.maxInFlightRequests`.
    let shed: CoreMetrics.Counter
    /// SQLite's write-ahead log, in bytes (0 on PostgreSQL).
    let walBytes: CoreMetrics.Gauge
    let jobsPending: CoreMetrics.Gauge
    let anomaliesOpen: CoreMetrics.Gauge
    /// Outbox events not yet accepted by the webhook receiver (all events when no
    /// `webhooks.url` is set: they wait in the outbox).
    let webhooksPending: CoreMetrics.Gauge
    /// App Store Server Notifications accepted (durably recorded) and refused (did not verify).
    let notificationAccepted: CoreMetrics.Counter
    let notificationRejected: CoreMetrics.Counter
    /// Notifications recorded and not yet applied: the applier's backlog.
    let notificationsPending: CoreMetrics.Gauge

    public init() {
        factory = PrometheusMetricsFactory(registry: registry)
        deliveries = CoreMetrics.Counter(label: "storekeeper_deliveries_total", factory: factory)
        duplicatesSuppressed = CoreMetrics.Counter(label: "storekeeper_duplicates_suppressed_total", factory: factory)
        unattributed = CoreMetrics.Counter(label: "storekeeper_unattributed_transactions_total", factory: factory)
        shed = CoreMetrics.Counter(label: "storekeeper_requests_shed_total", factory: factory)
        walBytes = CoreMetrics.Gauge(label: "storekeeper_sqlite_wal_bytes", factory: factory)
        jobsPending = CoreMetrics.Gauge(label: "storekeeper_jobs_pending", factory: factory)
        anomaliesOpen = CoreMetrics.Gauge(label: "storekeeper_anomalies_open", factory: factory)
        webhooksPending = CoreMetrics.Gauge(label: "storekeeper_webhooks_pending", factory: factory)
        notificationAccepted = CoreMetrics.Counter(label: "storekeeper_notifications_accepted_total", factory: factory)
        notificationRejected = CoreMetrics.Counter(label: "storekeeper_notifications_rejected_total", factory: factory)
        notificationsPending = CoreMetrics.Gauge(label: "storekeeper_notifications_pending", factory: factory)
    }

    func verificationFailure(_ code: String) {
        CoreMetrics.Counter(
            label: "storekeeper_proofs_rejected_total", dimensions: [("code", code)], factory: factory
        ).increment()
    }

    func requestDuration(method: String, route: String, status: Int) -> Metrics.Timer {
        Metrics.Timer(
            label: "storekeeper_http_request_duration_seconds",
            dimensions: [("method", method), ("route", route), ("status", String(status))],
            preferredDisplayUnit: .seconds,
            factory: factory)
    }

    /// The Prometheus text exposition.
    func text() -> String {
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }
}

/// Per request: an id (the client's `X-Request-Id` or a new one) in the logs and the answer,
/// one structured log line, and the latency histogram.
struct RequestObservation<Context: RequestContext>: RouterMiddleware {
    let metrics: ServerMetrics

    /// A client's request id is echoed into logs and headers only if it is `[A-Za-z0-9._-]{1,128}`:
    /// nothing that could forge a log field or a header.
    static func isAcceptable(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 128
            && id.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                    || byte == 0x2E || byte == 0x5F || byte == 0x2D
            }
    }

    /// A version 4 UUID in lower case (`RowIdentifiers`: no system call per request).
    static func newRequestId() -> String {
        RowIdentifiers.uuidString()
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        let started = ContinuousClock.now
        let requestId =
            request.headers[HTTPField.Name("X-Request-Id")!].flatMap { Self.isAcceptable($0) ? $0 : nil }
            ?? Self.newRequestId()
        var context = context
        context.logger[metadataKey: "request_id"] = .string(requestId)
        let route = context.endpointPath ?? "unmatched"
        var status = 500
        defer {
            let elapsed = ContinuousClock.now - started
            let nanoseconds =
                elapsed.components.seconds * 1_000_000_000 + elapsed.components.attoseconds / 1_000_000_000
            metrics.requestDuration(method: request.method.rawValue, route: route, status: status)
                .recordNanoseconds(nanoseconds)
            context.logger.info(
                "request",
                metadata: [
                    "method": "\(request.method.rawValue)", "path": "\(request.uri.path)", "status": "\(status)",
                    "ms": "\(nanoseconds / 1_000_000)",
                ])
        }
        do {
            var response = try await next(request, context)
            status = Int(response.status.code)
            response.headers[HTTPField.Name("X-Request-Id")!] = requestId
            return response
        } catch let error as APIError {
            status = Int(error.status.code)
            var tagged = error
            tagged.headers[HTTPField.Name("X-Request-Id")!] = requestId
            throw tagged
        }
    }
}

/// The server's responder: docs/api.md's routes, answered 503 `timeout` (retryable) at
/// `limits.requestTimeoutSeconds` without waiting for the handler — a stuck dependency or a
/// long computation never holds a client (or a connection) past the deadline. The abandoned
/// handler is cancelled; a delivery already committing still completes, and the client's retry
/// then gets `already_delivered`.
///
/// Above `maxInFlight` requests at once, a request is shed at once — 503 `overloaded` with
/// `Retry-After`, before its body is read — so a flood queues nowhere.
public struct DeadlineRouter<Context: RequestContext>: HTTPResponderBuilder {
    let router: Router<Context>
    let limit: Duration
    var maxInFlight = Int.max
    var metrics: ServerMetrics?

    public func buildResponder() -> DeadlineResponder<RouterResponder<Context>> {
        DeadlineResponder(inner: router.buildResponder(), limit: limit, maxInFlight: maxInFlight, metrics: metrics)
    }
}

/// Requests being answered right now.
final class InFlight: Sendable {
    let count = Atomic<Int>(0)
}

public struct DeadlineResponder<Inner: HTTPResponder & Sendable>: HTTPResponder {
    public typealias Context = Inner.Context
    let inner: Inner
    let limit: Duration
    let maxInFlight: Int
    let metrics: ServerMetrics?
    let inFlight = InFlight()

    init(inner: Inner, limit: Duration, maxInFlight: Int = .max, metrics: ServerMetrics? = nil) {
        self.inner = inner
        self.limit = limit
        self.maxInFlight = maxInFlight
        self.metrics = metrics
    }

    static var overloaded: Response {
        Response(
            status: .serviceUnavailable, headers: [.contentType: "application/json", .retryAfter: "1"],
            body: .init(
                byteBuffer: ByteBuffer(
                    string:
                        #"{"error":{"code":"overloaded","message":"too many requests in flight; retry shortly","retryable":true}}"#
                )))
    }

    public func respond(to request: Request, context: Context) async throws -> Response {
        let current = inFlight.count.add(1, ordering: .relaxed).newValue
        defer { inFlight.count.subtract(1, ordering: .relaxed) }
        guard current <= maxInFlight else {
            metrics?.shed.increment()
            return Self.overloaded
        }
        let inner = self.inner
        let limit = self.limit
        // The request and its context move to the handler's task: nothing here touches them again.
        let handed = Unchecked(value: (request, context))
        let executor = Self.runsOnEventLoop(request.uri.path) ? EventLoopTaskExecutor.pinned : nil
        return try await race(
            deadline: limit, executor: executor, timedOut: { .success(Self.timeoutResponse(limit)) },
            { try await inner.respond(to: handed.value.0, context: handed.value.1) })
    }

    /// The routes whose work is bounded — one account, order or purchase, a retention request —
    /// are handled on their connection's event loop (`EventLoopPinned`): no thread crossing.
    /// The rest (operator reports, bulk operations, the dashboard), whose SQLite reads can be
    /// long, run on Swift's pool, so they never hold up the other connections of a loop. Apple's
    /// notifications stay on the pool too: accepted on a loop they were answered no faster, and
    /// the job runner then applied the backlog ~15 % slower (BENCHMARKS.md, fifth pass).
    static func runsOnEventLoop(_ path: String) -> Bool {
        path.hasPrefix("/v1/accounts/") || path == "/v1/purchases" || path == "/v1/orders"
            || path.hasPrefix("/v1/orders/") || path == "/v1/retention/apple" || path == "/healthz"
    }

    static func timeoutResponse(_ limit: Duration) -> Response {
        let body = #"{"error":{"code":"timeout","message":"the request took longer than \#(limit)","retryable":true}}"#
        return Response(
            status: .serviceUnavailable, headers: [.contentType: "application/json", .retryAfter: "1"],
            body: .init(byteBuffer: ByteBuffer(string: body)))
    }
}

/// A value handed over to another task whose only user it becomes (see `DeadlineResponder`).
struct Unchecked<Value>: @unchecked Sendable {
    let value: Value
}
