import CoreMetrics
import Foundation
import HTTPTypes
import Hummingbird
import Metrics
import NIOCore
import Prometheus

/// The server's metrics (swift-metrics, exported as Prometheus text at `/metrics`). Each app
/// has its own registry, so tests and several apps in one process never mix their numbers.
public final class ServerMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    let factory: PrometheusMetricsFactory

    let deliveries: CoreMetrics.Counter
    let duplicatesSuppressed: CoreMetrics.Counter
    let unattributed: CoreMetrics.Counter
    let jobsPending: CoreMetrics.Gauge
    let anomaliesOpen: CoreMetrics.Gauge
    /// Outbox events not yet accepted by the webhook receiver (all events when no
    /// `webhooks.url` is set: they wait in the outbox).
    let webhooksPending: CoreMetrics.Gauge

    public init() {
        factory = PrometheusMetricsFactory(registry: registry)
        deliveries = CoreMetrics.Counter(label: "storekeeper_deliveries_total", factory: factory)
        duplicatesSuppressed = CoreMetrics.Counter(label: "storekeeper_duplicates_suppressed_total", factory: factory)
        unattributed = CoreMetrics.Counter(label: "storekeeper_unattributed_transactions_total", factory: factory)
        jobsPending = CoreMetrics.Gauge(label: "storekeeper_jobs_pending", factory: factory)
        anomaliesOpen = CoreMetrics.Gauge(label: "storekeeper_anomalies_open", factory: factory)
        webhooksPending = CoreMetrics.Gauge(label: "storekeeper_webhooks_pending", factory: factory)
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

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        let started = ContinuousClock.now
        let requestId =
            request.headers[HTTPField.Name("X-Request-Id")!].flatMap { Self.isAcceptable($0) ? $0 : nil }
            ?? UUID().uuidString.lowercased()
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

/// Answers 503 (retryable) when a request takes longer than the limit, so a stuck dependency
/// never holds a client forever. A delivery already committing still completes; the client's
/// retry then gets `already_delivered`.
struct RequestTimeout<Context: RequestContext>: RouterMiddleware {
    let limit: Duration

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        // The handler runs in a child task that is awaited before returning, so lending it
        // the non-escaping `next` and the request is safe.
        try await withoutActuallyEscaping(next) { next in
            let work = Unchecked(value: (next, request, context))
            return try await withThrowingTaskGroup(of: Unchecked<Response>.self) { group in
                group.addTask { Unchecked(value: try await work.value.0(work.value.1, work.value.2)) }
                group.addTask {
                    try await Task.sleep(for: limit)
                    throw APIError(
                        .serviceUnavailable, "timeout", "the request took longer than \(limit)", retryable: true)
                }
                defer { group.cancelAll() }
                return try await group.next()!.value
            }
        }
    }
}

/// A value handed to a child task that the parent awaits (see `RequestTimeout`).
struct Unchecked<Value>: @unchecked Sendable {
    let value: Value
}
