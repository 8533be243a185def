import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// Operations: `/healthz` and `/metrics` (open to the load balancer and the scraper; metrics
/// check their own token), `GET /v1/status` and `GET /v1/audit` (secret key).
struct OperationsController {
    let database: Database
    let store: PurchaseStore
    let jobs: JobStore
    let notifications: NotificationStore
    let authenticator: Authenticator
    let metrics: ServerMetrics
    let smallBusinessProgram: Bool
    /// `GET /v1/status`'s answer, read now (the whole deployment's state).
    let status: @Sendable () -> StatusJSON

    func addRoutes(to router: some RouterMethods<StoreKeeperContext>) {
        router.get("healthz") { _, _ in try await health() }
        router.get("metrics") { request, _ in try await metricsText(request) }
        // The OpenAPI document of this API, open like /healthz.
        router.get("openapi.json") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/json", .cacheControl: "public, max-age=300"],
                body: .init(byteBuffer: ByteBuffer(bytes: OpenAPIDocument.json)))
        }
    }

    func addAPIRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("status") { _, context in
            try context.caller().requireSecretKey()
            return try StoreKeeperApp.json(status())
        }
        v1.get("revenue") { request, context in
            try context.caller().requireScope(.read)
            try context.caller().requireEveryApp("revenue")
            func date(_ name: String) throws -> Date? {
                guard let text = request.uri.queryParameters.get(name) else { return nil }
                guard let date = StoreKeeperApp.parseDate(text) else {
                    throw APIError.badRequest("'\(name)' must be an ISO 8601 date or date-time")
                }
                return date
            }
            return try StoreKeeperApp.json(
                try await store.reports.revenue(
                    from: try date("since"), to: try date("until"),
                    smallBusinessProgram: smallBusinessProgram))
        }
        v1.get("audit") { _, context in
            try context.caller().requireScope(.read)
            try context.caller().requireEveryApp("the audit log")
            return try StoreKeeperApp.json(["entries": try await store.anomalies.audit().map(AuditJSON.init)])
        }
        // What the presented key is (never the secret): how a tool such as `storekeeper mcp`
        // learns what it may offer the key's holder.
        v1.get("keys/current") { _, context in
            let caller = try context.caller()
            try caller.requireScope(.read)
            var apps: [String]?
            if case .key(let key) = caller { apps = key.apps?.sorted() }
            return try StoreKeeperApp.json(
                CurrentKeyJSON(label: caller.label, scope: caller.scope?.rawValue ?? "read", apps: apps))
        }
    }

    struct HealthJSON: Encodable {
        var status: String
        var database: String
        /// Seconds the oldest submitted delivery has waited for its batch (0: none waiting).
        var oldestPendingDeliverySeconds: Double
        /// Seconds since the oldest pending job (an Apple lookup) was queued (0: none).
        var oldestPendingJobSeconds: Double
    }

    /// `GET /healthz`: 200 when a database round trip completes within 2 s, else 503 — answered
    /// within 2 s either way (docs/api.md), with the oldest waiting delivery and job.
    func health() async throws -> Response {
        let database = self.database
        let jobs = self.jobs
        let report: Date?
        do {
            report = try await raceDeadline(.seconds(2), what: "/healthz") {
                try await database.ping(deadline: .seconds(2))
                return try await jobs.oldestPending()
            }
        } catch {
            var failure = APIError(
                .serviceUnavailable, "storage_unavailable", "the database does not answer within 2 s", retryable: true)
            failure.headers[.retryAfter] = "1"
            throw failure
        }
        let waiting = store.oldestWaitingDelivery.map { Double($0.components.seconds) } ?? 0
        return try StoreKeeperApp.json(
            HealthJSON(
                status: "ok", database: database.kind.rawValue, oldestPendingDeliverySeconds: waiting,
                oldestPendingJobSeconds: report.map { max(0, Date().timeIntervalSince($0)) } ?? 0))
    }

    /// `GET /metrics` (a secret key or `auth.metricsToken`): the gauges read now, then every metric.
    func metricsText(_ request: Request) async throws -> Response {
        try await authenticator.authenticateMetrics(request)
        metrics.jobsPending.record(try await jobs.pendingCount())
        metrics.anomaliesOpen.record(try await store.anomalies.openAnomalyCount())
        metrics.webhooksPending.record(try await OutboxStore(database: database).pendingCount())
        metrics.notificationsPending.record(try await notifications.pendingCount())
        metrics.walBytes.record(database.walBytes ?? 0)
        return Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
            body: .init(byteBuffer: ByteBuffer(string: metrics.text())))
    }
}

/// `GET /v1/keys/current`: the presented key's label, scope and apps (never its secret).
struct CurrentKeyJSON: Encodable {
    var label: String
    var scope: String
    var apps: [String]?
}
