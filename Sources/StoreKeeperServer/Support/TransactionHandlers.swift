import Foundation
import GooglePlay
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage

/// `GET /v1/transactions/{id}` (secret key): the transaction any id names — an App Store
/// transaction or original transaction id, a Google order id as Google prints it (`GPA.…`, with
/// or without `gp:`), a Google purchase token, a web payment id — with its account, its order,
/// its refunds and its anomalies.
struct TransactionRecordJSON: Encodable {
    struct Transaction: Encodable {
        var transactionId: String
        var originalTransactionId: String
        var store: String
        var appId: String?
        var productId: String
        var quantity: Int
        var environment: String
        var storefront: String?
        var purchasedAt: String?
        var deliveredAt: String?
        var expiresAt: String?
        var price: Double?
        var currency: String?
        /// `delivered`, `refunded` (wholly), `partially_refunded`, `refunded_before_delivery`.
        var status: String
    }

    struct Refund: Encodable {
        var refundedAt: String
        /// The share refunded, 0–1.
        var share: Double
        var type: String?
        var beforeDelivery: Bool
    }

    var transaction: Transaction
    var accountId: String?
    var orderId: String?
    var refunds: [Refund]
    var anomalies: [AnomalyJSON]

    init(_ record: TransactionStore.TransactionRecord) {
        let refundedShare = record.refunds.map(\.share).max() ?? 0
        let status: String =
            if !record.delivered {
                "refunded_before_delivery"
            } else if refundedShare >= RefundPlanner.wholeShare {
                "refunded"
            } else if refundedShare > 0 {
                "partially_refunded"
            } else {
                "delivered"
            }
        transaction = Transaction(
            transactionId: record.transactionId, originalTransactionId: record.originalTransactionId,
            store: record.store.rawValue, appId: record.appId, productId: record.productId,
            quantity: record.quantity, environment: record.environment, storefront: record.storefront,
            purchasedAt: record.purchasedAt.map(StoreKeeperApp.iso),
            deliveredAt: record.deliveredAt.map(StoreKeeperApp.iso),
            expiresAt: record.expiresAt.map(StoreKeeperApp.iso),
            price: record.priceMilli.map { Double($0) / 1000 }, currency: record.currency, status: status)
        accountId = record.accountId
        orderId = record.orderId
        refunds = record.refunds.map {
            Refund(
                refundedAt: StoreKeeperApp.iso($0.refundedAt),
                share: Double($0.share) / Double(RefundPlanner.wholeShare),
                type: $0.type, beforeDelivery: $0.beforeDelivery)
        }
        anomalies = record.anomalies.map(AnomalyJSON.init)
    }
}

extension StoreKeeperApp {
    struct SupportRefundBody: RequestBody {
        var reason: String
        var note: String?
        var idempotencyKey: String?
        /// A Google Play subscription's refund: `full` (the default) or `prorated` (what is left of
        /// the period), through `purchases.subscriptionsv2.revoke`.
        var refundType: String?

        static let refundTypes = ["full", "prorated"]

        func validate() throws {
            guard !reason.trimmingCharacters(in: .whitespaces).isEmpty, reason.unicodeScalars.count <= 500 else {
                throw APIError.badRequest("field 'reason' is required: 1…500 characters, shown in the audit log")
            }
            if let refundType, !Self.refundTypes.contains(refundType) {
                throw APIError(
                    .badRequest, "invalid_refund_type",
                    "field 'refundType' must be full or prorated (a Google Play subscription's refund)")
            }
            try StoreKeeperApp.validateText(reason, field: "reason")
            _ = try StoreKeeperApp.validateNote(note)
            if let idempotencyKey {
                guard !idempotencyKey.isEmpty, idempotencyKey.unicodeScalars.count <= 200 else {
                    throw APIError.badRequest("field 'idempotencyKey' must be 1…200 characters")
                }
            }
        }
    }
}

// MARK: Google Play refunds asked by support

/// A support refund of a Google Play order, as its job carries it.
struct GoogleRefundRequest: Codable, Sendable {
    var transactionId: String
    var appId: String?
    var actor: String
    var detail: String
    var idempotencyKey: String?
    /// A subscription revoked with a prorated refund (nil: in full).
    var prorated: Bool?
}

enum GoogleRefundOutcome: Sendable {
    /// Google refunded (or had refunded) the order; what the one refund path did.
    case refunded(String, String)
    case refused(String)
    case unavailable(String)
}

extension StoreKeeperApp {
    static let googleRefundJobKind = "support_google_refund"

    /// Asks Google Play to refund (and revoke) the order, then takes back what it delivered
    /// through the one refund path, audited with the key that asked.
    func askGoogleRefund(_ request: GoogleRefundRequest, deadline: Duration) async throws -> GoogleRefundOutcome {
        guard var record = try await store.transactions.transaction(named: request.transactionId) else {
            return .refused("the transaction is no longer recorded here")
        }
        let google: GooglePlayApp
        do {
            google = try purchases.googleApp(request.appId)
        } catch {
            return .refused("no Google Play app '\(request.appId ?? "-")' is configured")
        }
        // A subscription is revoked (its latest charge refunded, access ended now) under the token
        // it is current under; a one-time purchase's order is refunded and revoked.
        let subscription = try await GooglePlayStore(database: database).currentSubscription(
            original: record.originalTransactionId)
        let now = Date()
        var share = RefundPlanner.wholeShare
        if let subscription {
            // What the revocation refunds is the chain's latest period.
            if let latest = try await store.transactions.transaction(named: record.originalTransactionId) {
                record = latest
            }
            if request.prorated == true, let start = record.purchasedAt, let end = record.expiresAt, end > start {
                let left = max(0, min(1, end.timeIntervalSince(now) / end.timeIntervalSince(start)))
                share = Int32((left * Double(RefundPlanner.wholeShare)).rounded(.down))
            }
        }
        // Google's order id is what this server's id keeps after its prefix.
        let orderId = String(record.transactionId.dropFirst(GooglePlayPlanner.prefix.count))
        do {
            try await withDeadline(deadline) {
                if let subscription {
                    try await google.client.revokeSubscription(
                        token: subscription.purchaseToken, request.prorated == true ? .proratedRefund : .fullRefund)
                } else {
                    try await google.client.refundOrder(orderId: orderId, revoke: true)
                }
            }
        } catch let error as GooglePlayError where error.status == 400 || error.status == 404 {
            return .refused("\(error)")
        } catch {
            return .unavailable("\(error)")
        }
        let full = share >= RefundPlanner.wholeShare
        var refund = RefundEvent(
            kind: .refund, store: .googlePlay, key: "support-refund:\(record.transactionId)",
            transactionId: record.transactionId, originalTransactionId: record.originalTransactionId,
            productId: record.productId,
            revocation: RefundPlanner.Revocation(
                type: full ? .refundFull : .refundProrated, percentage: full ? nil : share))
        refund.environment = record.environment
        refund.revocationType = (full ? StoreTransaction.RevocationKind.refundFull : .refundProrated).rawValue
        refund.purchasedAt = record.purchasedAt.map { Int64($0.timeIntervalSince1970 * 1000) }
        refund.periodEnd = record.expiresAt.map { Int64($0.timeIntervalSince1970 * 1000) }
        let outcome = try await notifications.applyRefund(
            refund, settings: notificationSettings(), now: Date(), actor: request.actor)
        try await store.anomalies.recordAudit(
            actor: request.actor, action: "support_refund", subject: record.transactionId,
            detail: request.detail
                + (subscription == nil
                    ? " — Google Play refunded order \(orderId): "
                    : " — Google Play revoked the subscription (\(full ? "full" : "prorated") refund of order \(orderId)): ")
                + outcome.1
                + (request.idempotencyKey.map { " (key \($0.prefix(64)))" } ?? ""),
            now: Date())
        return .refunded(outcome.0, outcome.1)
    }
}

extension JobRunner {
    /// A support refund Google did not answer at once: asked again with backoff until it
    /// refunds or refuses for good (audited either way).
    func retryGoogleRefund(_ job: JobStore.Job, now: Date) async {
        guard let request = try? JSONDecoder().decode(GoogleRefundRequest.self, from: Data(job.payload.utf8)) else {
            try? await app.jobs.fail(job.id, error: "unreadable payload")
            return
        }
        do {
            switch try await app.askGoogleRefund(request, deadline: .seconds(20)) {
            case .refunded:
                try await app.jobs.complete(job.id)
            case .refused(let why):
                try await app.store.anomalies.recordAudit(
                    actor: request.actor, action: "support_refund_refused", subject: request.transactionId,
                    detail: request.detail + " — Google Play refused: \(why)", now: now)
                try await app.jobs.fail(job.id, error: why)
            case .unavailable(let why):
                let backoff = min(maxBackoff, 30 * pow(2, Double(min(job.attempts, 12))))
                try await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: why)
            }
        } catch {
            let backoff = min(maxBackoff, 30 * pow(2, Double(min(job.attempts, 12))))
            try? await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: "\(error)")
        }
    }
}

extension StoreKeeperApp {
    struct TransferBody: RequestBody {
        var toAccountId: String
        var note: String?

        func validate() throws {
            try StoreKeeperApp.validateAccountId(toAccountId)
            _ = try StoreKeeperApp.validateNote(note)
        }
    }
}

extension StoreKeeperApp {
    /// Support's refunds and transfers, as the API and the dashboard use them.
    var supportActions: SupportActions {
        SupportActions(
            transactions: store.transactions, audit: store.anomalies, database: database,
            refundStripe: { [self] id, appId, caller, detail in
                try await stripePayments.refundStripePurchase(id, appId: appId, caller: caller, detail: detail)
            },
            refundWeb: { [self] paymentId in try await purchases.refundWebPurchase(paymentId) },
            askGoogle: { [self] request, deadline in try await askGoogleRefund(request, deadline: deadline) },
            lookUpAppleOrder: { [self] orderId in try await appleOrderTransactions(orderId) })
    }

    /// The transactions Apple says an Order ID (the customer's receipt e-mail) paid, each
    /// verified like any signed transaction; nil when no App Store Server API (nor local App
    /// Store) is configured to ask.
    func appleOrderTransactions(_ orderId: String) async throws -> [String]? {
        guard let source = transactionSource else { return nil }
        var ids: [String] = []
        for signed in try await source.lookUpOrderId(orderId) {
            if let id = try await verifier.verifyTransaction(signed).transactionId { ids.append(id) }
        }
        return ids
    }
}

/// Support's refunds and transfers of a recorded purchase: the transactions and the audit log it
/// reads and writes, and each store's refund call (Stripe's and the web's refund paths, Google's
/// `orders.refund` through the refund job), handed in by the app that owns those clients.
struct SupportActions: Sendable {
    let transactions: TransactionStore
    let audit: AnomalyStore
    let database: Database
    let refundStripe:
        @Sendable (_ transactionId: String, _ appId: String?, _ caller: Caller, _ detail: String) async throws ->
            Response
    let refundWeb: @Sendable (_ paymentId: String) async throws -> Response
    let askGoogle: @Sendable (GoogleRefundRequest, Duration) async throws -> GoogleRefundOutcome
    /// Apple's Look Up Order ID, verified: the transaction ids an Order ID paid (nil: no way to ask).
    let lookUpAppleOrder: @Sendable (_ orderId: String) async throws -> [String]?

    /// Whether `id` has the shape of Apple's Order ID on a receipt e-mail (letters and digits,
    /// 8…12, at least one letter — a transaction id is digits only).
    static func looksLikeAppleOrderId(_ id: String) -> Bool {
        (8...12).contains(id.utf8.count)
            && id.utf8.allSatisfy {
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A)
            }
            && id.utf8.contains { !($0 >= 0x30 && $0 <= 0x39) }
    }

    /// The one resolver for the API, the dashboard and the MCP desk: any id a player or support
    /// quotes, recorded here; else, shaped like Apple's Order ID, asked of Apple (Look Up Order
    /// ID) and resolved through the transactions it paid.
    func resolve(_ id: String) async throws -> TransactionStore.TransactionRecord? {
        if let record = try await transactions.transaction(named: id) { return record }
        guard Self.looksLikeAppleOrderId(id) else { return nil }
        let paid: [String]?
        do {
            paid = try await lookUpAppleOrder(id.uppercased())
        } catch {
            throw APIError(
                .serviceUnavailable, "store_unavailable",
                "'\(id.prefix(40))' looks like Apple's Order ID and Apple could not be asked now; try again",
                retryable: true)
        }
        for transactionId in paid ?? [] {
            if let record = try await transactions.transaction(named: transactionId) { return record }
        }
        return nil
    }

    /// The refund itself, for the API and the dashboard's account page alike.
    func refund(id: String, body: StoreKeeperApp.SupportRefundBody, caller: Caller) async throws -> Response {
        guard let record = try await transactions.transaction(named: id), caller.covers(app: record.appId) else {
            throw APIError(.notFound, "not_found", "no transaction '\(id.prefix(200))' is recorded here")
        }
        func answer(_ status: String, _ detail: String) throws -> Response {
            try StoreKeeperApp.json([
                "transactionId": record.transactionId, "store": record.store.rawValue, "status": status,
                "detail": detail,
            ])
        }
        if record.refunds.contains(where: { $0.share >= RefundPlanner.wholeShare }) {
            return try answer("already_refunded", "the store refunded it already; nothing was asked again")
        }
        let detail =
            "refund asked by \(caller.label): \(body.reason)\(body.note.map { " — \($0)" } ?? "")"
        if body.refundType == "prorated", record.store != .googlePlay || record.expiresAt == nil {
            throw APIError(
                .unprocessableContent, "invalid_refund_type",
                "a prorated refund is for a Google Play subscription; this is a \(record.store.rawValue) purchase"
                    + (record.expiresAt == nil ? " that does not renew" : ""))
        }
        switch record.store {
        case .appStore:
            throw APIError(
                .unprocessableContent, "refunded_by_apple_only",
                "App Store refunds are Apple's to grant: the player asks at https://reportaproblem.apple.com; Apple's REFUND notification then takes back what was delivered"
            )
        case .stripe:
            return try await refundStripe(record.transactionId, record.appId, caller, detail)
        case .web:
            guard
                let payment = try await ExternalPurchaseStore(database: database).payment(
                    ofTransaction: record.transactionId)
            else { throw APIError(.notFound, "not_found", "no web payment for '\(record.transactionId)'") }
            try await audit.recordAudit(
                actor: caller.auditActor, action: "support_refund", subject: record.transactionId, detail: detail,
                now: Date())
            return try await refundWeb(payment.paymentId)
        case .googlePlay:
            guard record.transactionId.hasPrefix(GooglePlayPlanner.prefix) else {
                throw APIError(.unprocessableContent, "store_refused", "this Google purchase has no order id to refund")
            }
            // One request at a time per purchase: a second while Google is asked answers 202.
            let jobs = JobStore(database: database)
            if let waiting = try await jobs.pending(kind: StoreKeeperApp.googleRefundJobKind).first(where: {
                (try? JSONDecoder().decode(GoogleRefundRequest.self, from: Data($0.payload.utf8)))?.transactionId
                    == record.transactionId
            }) {
                return try pendingAnswer(record, jobId: waiting.id)
            }
            let request = GoogleRefundRequest(
                transactionId: record.transactionId, appId: record.appId, actor: caller.auditActor, detail: detail,
                idempotencyKey: body.idempotencyKey, prorated: body.refundType == "prorated" ? true : nil)
            switch try await askGoogle(request, .seconds(10)) {
            case .refunded(let outcome, let note):
                return try answer(outcome == "applied" ? "refunded" : outcome, note)
            case .refused(let why):
                throw APIError(.unprocessableContent, "store_refused", "Google Play refused the refund: \(why)")
            case .unavailable(let why):
                // Google is slow or down: asked again by a job until it answers; 202 meanwhile.
                let payload = String(decoding: try JSONEncoder().encode(request), as: UTF8.self)
                let jobId = try await jobs.enqueue(
                    kind: StoreKeeperApp.googleRefundJobKind,
                    dedupeKey: "\(StoreKeeperApp.googleRefundJobKind)|\(record.transactionId)|\(UUID().uuidString)",
                    payload: payload, runAt: Date().addingTimeInterval(30), now: Date())
                try await audit.recordAudit(
                    actor: caller.auditActor, action: "support_refund_pending", subject: record.transactionId,
                    detail: detail + " — Google Play did not answer (\(why)); asked again until it does", now: Date())
                return try pendingAnswer(record, jobId: jobId)
            }
        }
    }

    func pendingAnswer(_ record: TransactionStore.TransactionRecord, jobId: String) throws -> Response {
        var response = try StoreKeeperApp.json(
            [
                "transactionId": record.transactionId, "store": record.store.rawValue, "status": "pending",
                "detail": "Google Play is being asked; the refund is applied as soon as it answers", "requestId": jobId,
            ], status: .accepted)
        response.headers[.retryAfter] = "30"
        return response
    }

    /// The transfer itself, for the API and the dashboard's account page alike.
    func transfer(id: String, body: StoreKeeperApp.TransferBody, caller: Caller) async throws -> Response {
        guard let record = try await transactions.transaction(named: id), caller.covers(app: record.appId) else {
            throw APIError(.notFound, "not_found", "no transaction '\(id.prefix(200))' is recorded here")
        }
        let outcome = try await transactions.transfer(
            originalTransactionId: record.originalTransactionId, to: body.toAccountId, actor: caller.auditActor,
            note: body.note ?? "", now: Date())
        var json: [String: String] = [
            "transactionId": record.transactionId, "originalTransactionId": record.originalTransactionId,
            "accountId": body.toAccountId,
        ]
        switch outcome {
        case .transferred(let from):
            json["status"] = "transferred"
            json["fromAccountId"] = from
        case .alreadyHeld:
            json["status"] = "already_held"
        case .notOwned:
            throw APIError(
                .unprocessableContent, "not_transferable",
                "nobody owns '\(record.transactionId)': a consumable is spent where it was delivered (credit the other account instead)"
            )
        }
        return try StoreKeeperApp.json(json)
    }
}

/// `/v1/transactions/…`: the lookup, support's refunds and transfers; owns the support actions and
/// the body limit.
struct TransactionsController: RequestHandling {
    let actions: SupportActions
    let maxBodyBytes: Int

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("transactions/:transactionId") { _, context in
            let caller = try context.caller()
            try caller.requireScope(.read)
            let id = try StoreKeeperApp.parameter(context, "transactionId")
            guard !id.isEmpty, id.unicodeScalars.count <= 4096 else {
                throw APIError.badRequest("the id must be 1…4096 characters")
            }
            try StoreKeeperApp.validateText(id, field: "transactionId", requireNFC: false)
            guard let record = try await actions.resolve(id), caller.covers(app: record.appId) else {
                throw APIError(
                    .notFound, "not_found",
                    "no transaction, original transaction, order, Apple Order ID, Google order or purchase token, Stripe or web payment '\(id.prefix(200))' is recorded here"
                )
            }
            return try StoreKeeperApp.json(TransactionRecordJSON(record))
        }
        v1.post("transactions/:transactionId/refund") { request, context in
            try await supportRefund(request, context)
        }
        v1.post("transactions/:transactionId/transfer") { request, context in
            try await supportTransfer(request, context)
        }
    }

    /// `POST /v1/transactions/{id}/refund` (support): refunds a purchase on the store that lets
    /// a developer refund — Google Play through `orders.refund` (revoking what it bought) or, for
    /// a subscription, `purchases.subscriptionsv2.revoke` (full or prorated; access ends now), a web
    /// payment through its refund — and takes back what it delivered through the one refund path.
    /// App Store refunds are Apple's to grant: 422 `refunded_by_apple_only`. A purchase already
    /// refunded answers `already_refunded` without asking the store again.
    func supportRefund(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        try caller.requireScope(.support)
        let id = try StoreKeeperApp.parameter(context, "transactionId")
        try StoreKeeperApp.validateText(id, field: "transactionId", requireNFC: false)
        let body = try await decode(StoreKeeperApp.SupportRefundBody.self, request)
        return try await actions.refund(id: id, body: body, caller: caller)
    }

    /// `POST /v1/transactions/{id}/transfer` (support): moves a non-consumable or subscription
    /// to another account — ownership, entitlements, subscription — audited with the key and
    /// note. A consumable is spent where it was delivered: 422 `not_transferable`.
    func supportTransfer(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        try caller.requireScope(.support)
        let id = try StoreKeeperApp.parameter(context, "transactionId")
        try StoreKeeperApp.validateText(id, field: "transactionId", requireNFC: false)
        let body = try await decode(StoreKeeperApp.TransferBody.self, request)
        return try await actions.transfer(id: id, body: body, caller: caller)
    }
}
