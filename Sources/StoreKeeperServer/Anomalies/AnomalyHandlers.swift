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

/// The anomaly queue: list and resolve (with an audit entry). The dashboard resolves through
/// the same `resolve(anomaly:…)`.
struct AnomaliesController: RequestHandling {
    let store: PurchaseStore
    let catalog: Catalog
    let maxBodyBytes: Int

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("anomalies") { request, context in try await listAnomalies(request, context) }
        v1.post("anomalies/:id/resolve") { request, context in try await resolveAnomaly(request, context) }
    }

    func listAnomalies(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        try caller.requireScope(.read)
        // Read by the query parser (on bytes), never by splitting the raw query on `Character`s.
        var status = request.uri.queryParameters.get("status")
        if let given = status, !["open", "resolved", "all"].contains(given) {
            throw APIError.badRequest("query 'status' must be open, resolved or all")
        }
        if status == "all" { status = nil }
        // A page at a time, oldest first: `limit` (1…1000, default 500), then `after=<nextCursor>`.
        let limit: Int
        if let text = request.uri.queryParameters.get("limit") {
            guard let value = Int(text), (1...1_000).contains(value) else {
                throw APIError.badRequest("query 'limit' must be 1…1000")
            }
            limit = value
        } else {
            limit = 500
        }
        var after: (Int64, String)?
        if let cursor = request.uri.queryParameters.get("after") {
            let parts = cursor.split(separator: ".", maxSplits: 1)
            guard parts.count == 2, let at = Int64(parts[0]), parts[1].utf8.count <= 64 else {
                throw APIError.badRequest("query 'after' must be a nextCursor of this list")
            }
            after = (at, String(parts[1]))
        }
        let page = try await store.anomalies.anomalies(status: status, limit: limit + 1, after: after)
        struct Page: Encodable {
            var anomalies: [AnomalyJSON]
            var nextCursor: String?
        }
        let shown = page.prefix(limit)
        let next =
            page.count > limit
            ? shown.last.map { "\(Int64(($0.createdAt.timeIntervalSince1970 * 1000).rounded())).\($0.id)" } : nil
        // A key of some apps sees their anomalies only (the page's cursor is the same).
        return try Self.json(
            Page(anomalies: shown.filter { caller.covers(app: $0.appId) }.map(AnomalyJSON.init), nextCursor: next))
    }

    struct ResolveBody: RequestBody {
        var action: String
        var accountId: String?
        var note: String?

        func validate() throws {
            // The action is checked after the anomaly is found: an unknown id is 404 whatever the body.
            if let accountId { try AnomaliesController.validateAccountId(accountId) }
            guard (note ?? "").unicodeScalars.count <= 2_000 else {
                throw APIError.badRequest("field 'note' must be at most 2000 characters")
            }
        }
    }

    func resolveAnomaly(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        try caller.requireScope(.support)
        let id = try Self.parameter(context, "id")
        let body = try await decode(ResolveBody.self, request)
        if let existing = try await store.anomalies.anomaly(id) {
            try caller.requireApp(existing.appId, notFound: APIError.notFound("no anomaly '\(id.prefix(64))'"))
        }
        let (anomaly, outcome) = try await resolve(
            anomaly: id, action: body.action, accountId: body.accountId, note: body.note, actor: caller.auditActor)
        var json = AnomalyJSON(anomaly)
        json.outcome = outcome
        return try Self.json(json)
    }

    /// What a manual delivery did, exactly: `delivered` (to `accountId`), `already_delivered`
    /// (to `accountId`, before: nothing was given again), `refused` (with the `code` a purchase
    /// submission would get, and why) — never "delivered" on a no-op.
    struct ResolveOutcome: Encodable, Hashable {
        var outcome: String
        var accountId: String?
        var code: String?
        var message: String?
    }

    /// Resolving an anomaly, the one code path of the API and the dashboard: `deliver` hands
    /// the transaction it holds to an account (exactly once, keyed by transactionId, with an
    /// audit entry), `dismiss` closes it. An anomaly already resolved is answered as it is.
    func resolve(
        anomaly id: String, action: String, accountId: String?, note: String?, actor: String = "operator"
    ) async throws -> (AnomalyStore.StoredAnomaly, ResolveOutcome?) {
        guard let anomaly = try await store.anomalies.anomaly(id) else {
            throw APIError.notFound("no anomaly '\(id.prefix(64))'")
        }
        let note = note ?? ""
        guard note.unicodeScalars.count <= 2_000 else {
            throw APIError.badRequest("field 'note' must be at most 2000 characters")
        }
        var resolution = action
        var outcome: ResolveOutcome?
        switch action {
        case "dismiss":
            break
        case "deliver":
            guard anomaly.status == "open" else { return (anomaly, nil) }
            guard let transaction = anomaly.transaction else {
                throw APIError.badRequest("this anomaly holds no transaction to deliver")
            }
            guard let accountId = accountId ?? anomaly.accountId else {
                throw APIError.badRequest("field 'accountId' is required to deliver this anomaly")
            }
            try Self.validateAccountId(accountId)
            // The operator decides: delivered to the account named, exactly once (keyed by transactionId).
            let result = try await store.deliver(
                transaction, submittingAccount: accountId, catalog: catalog, policy: .transfer, now: Date())
            if let refusal = result.plan.refusal {
                let error = APIError.refusal(refusal)
                outcome = ResolveOutcome(outcome: "refused", code: error.code, message: error.message)
            } else {
                switch result.plan.outcome {
                case .delivered:
                    outcome = ResolveOutcome(
                        outcome: "delivered", accountId: result.plan.delivery?.accountId ?? accountId)
                case .alreadyDelivered:
                    outcome = ResolveOutcome(
                        outcome: "already_delivered", accountId: result.existing?.accountId,
                        message:
                            "delivered before, to account \(Identifiers.quoted(result.existing?.accountId ?? "?")): nothing was given again"
                    )
                    resolution = "already_delivered"
                case .unattributed, .refunded, .notDelivered:
                    outcome = ResolveOutcome(
                        outcome: "refused", code: result.plan.outcome.rawValue,
                        message: "nothing was delivered: \(result.plan.outcome.rawValue)")
                }
            }
            try await store.anomalies.recordAudit(
                actor: actor, action: "manual_delivery", subject: transaction.transactionId,
                detail:
                    "anomaly \(id), delivery to \(Identifiers.quoted(accountId)): \(outcome?.outcome ?? "?")\(outcome?.code.map { " (\($0))" } ?? ""). \(note)",
                now: Date()
            )
            // Refused: nothing changed, the anomaly stays open for another decision.
            if outcome?.outcome == "refused" {
                return (try await store.anomalies.anomaly(id) ?? anomaly, outcome)
            }
        default:
            throw APIError.badRequest("field 'action' must be deliver or dismiss")
        }
        guard
            let resolved = try await store.anomalies.resolveAnomaly(
                id, resolution: resolution, actor: actor, note: note, now: Date())
        else { throw APIError.notFound("no anomaly '\(id.prefix(64))'") }
        return (resolved, outcome)
    }
}
