import Foundation
import HTTPTypes
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage
import Stripe

/// Stripe's routes: the webhook (`POST /v1/notifications/stripe`, outside `/v1`'s
/// authentication: the signature is the proof), redemption codes and the billing portal.
extension StripePayments {
    /// `POST /v1/notifications/stripe`: `Stripe-Signature` verified over the raw bytes against
    /// every Stripe app's secrets (400 when none verifies, nothing recorded); the event recorded
    /// durably, once per id, before the 200; applying it is a job that re-reads its objects.
    func receiveStripeWebhook(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        guard !stripe.isEmpty else {
            throw APIError(.notFound, "not_found", "no Stripe app is configured on this server")
        }
        var request = request
        let bytes = Array(buffer: try await request.collectBody(upTo: configuration.maxBodyBytes))
        let header = request.headers[HTTPField.Name("Stripe-Signature")!]
        var verified: StripeApp?
        var reason = StripeSignature.Failure.notSigned
        let now = Date()
        for app in stripe.values.sorted(by: { $0.configuration.id < $1.configuration.id }) {
            do {
                try StripeSignature.verify(
                    header: header, body: bytes, secrets: app.configuration.webhookSecrets, now: now)
                verified = app
                break
            } catch {
                reason = error
            }
        }
        guard let app = verified else {
            metrics.notificationRejected.increment()
            logger.warning("security: Stripe webhook rejected", metadata: ["reason": "\(reason)"])
            throw APIError(.badRequest, "invalid_signature", "Stripe-Signature does not verify: \(reason)")
        }
        guard let event = try? StripeEvent.decode(webhook: bytes), event.object == "event",
            !event.id.isEmpty, event.id.unicodeScalars.count <= 255, event.type.unicodeScalars.count <= 100,
            (event.objectId?.unicodeScalars.count ?? 0) <= 255
        else {
            throw APIError.badRequest("not a Stripe event: id, object \"event\", type and data.object are required")
        }
        try Self.validateText(event.id, field: "id")
        try Self.validateText(event.type, field: "type")
        if let object = event.objectId { try Self.validateText(object, field: "data.object.id") }
        if let live = event.livemode, live == app.client.isTestMode {
            logger.warning(
                "Stripe event in the other mode than the app's key (livemode \(live))",
                metadata: ["event": "\(event.id)", "app": "\(app.configuration.id)"])
        }
        let stripeStore = StripeStore(database: database)
        if try await stripeStore.event(event.id) != nil {
            return try Self.json(["received": true, "duplicate": true])
        }
        // Applied at once, re-read from Stripe: a delivery records the event in its own
        // database transaction (durable before the 200 either way); anything else records it
        // applied; a failure (Stripe's API slow or down) records it for its job, with backoff.
        let stored = StripeStore.Event(
            id: event.id, appId: app.configuration.id, type: event.type, objectId: event.objectId,
            created: event.created, status: "pending", outcome: nil)
        let recorded: StripeStore.Recorded
        do {
            // Answered within Stripe's patience: each of the (at most three) reads is bounded,
            // the database by its own deadlines; past them the event waits for its job.
            let bounded = StripeApp(configuration: app.configuration, client: app.client.bounded(by: .seconds(2.5)))
            let applied = try await applyStripeEvent(stored, app: bounded, now: now, recording: stored)
            recorded =
                applied.recorded
                ? .new
                : try await stripeStore.recordEvent(
                    id: event.id, appId: app.configuration.id, type: event.type, objectId: event.objectId,
                    created: event.created, now: now, applied: applied.outcome)
        } catch {
            logger.notice("Stripe event left to its job", metadata: ["event": "\(event.id)", "reason": "\(error)"])
            recorded = try await stripeStore.recordEvent(
                id: event.id, appId: app.configuration.id, type: event.type, objectId: event.objectId,
                created: event.created, now: now)
        }
        return try Self.json(["received": true, "duplicate": recorded == .duplicate])
    }

    // MARK: Redemption

    struct RedeemBody: RequestBody {
        var accountId: String?
        func validate() throws {
            if let accountId { try StoreKeeperApp.validateAccountId(accountId) }
        }
    }

    struct RedeemedJSON: Encodable {
        var status: String
        var code: String
        var transactionId: String?
        var outcome: String
        var account: AccountJSON
    }

    /// `POST /v1/redemptions/{code}`: a purchase made before the buyer had an account, bound to
    /// the caller's account (a client token's, or a key's `accountId`) once, then delivered.
    func redeem(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let code = try Self.parameter(context, "code").uppercased()
        guard code.count == 12, code.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber) }) else {
            throw APIError(.notFound, "not_found", "no redemption code '\(code.prefix(40))'")
        }
        let body = try await decodeOptional(RedeemBody.self, request)
        let accountId: String
        switch caller {
        case .account(let own):
            if let given = body?.accountId, !Identifiers.same(given, own) {
                throw APIError.forbidden("a client token may redeem only for its own account")
            }
            accountId = own
        case .secretKey, .key:
            try caller.requireScope(.support)
            guard let given = body?.accountId else { throw APIError.badRequest("field 'accountId' is required") }
            accountId = given
        }
        let stripeStore = StripeStore(database: database)
        guard let found = try await stripeStore.checkout(redemptionCode: code), found.transactionId != nil else {
            throw APIError(.notFound, "not_found", "no paid purchase has redemption code '\(code)'")
        }
        // A key limited to some apps redeems only their purchases.
        try caller.requireApp(
            found.appId, notFound: APIError(.notFound, "not_found", "no paid purchase has redemption code '\(code)'"))
        switch try await stripeStore.claim(code: code, account: accountId, now: Date()) {
        case .unknown:
            throw APIError(.notFound, "not_found", "no paid purchase has redemption code '\(code)'")
        case .expired:
            throw APIError(.gone, "redemption_expired", "redemption code '\(code)' expired; support can renew it")
        case .alreadyRedeemed:
            throw APIError(.conflict, "already_redeemed", "redemption code '\(code)' was already used")
        case .claimed(let checkout):
            let app = try stripeApp(checkout.appId)
            let outcome: String
            do {
                outcome = try await applyStripeSession(checkout.sessionId, app: app, now: Date()).outcome
            } catch let error as StripeError {
                // Claimed: the next webhook or reconciliation delivers it to this account.
                throw Self.stripeAPIError(error)
            }
            return try Self.json(
                RedeemedJSON(
                    status: "redeemed", code: code, transactionId: checkout.transactionId, outcome: outcome,
                    account: try await account(accountId)))
        }
    }

    /// `POST /v1/redemptions/{code}/renew` (support): an unredeemed code valid again for the
    /// app's `redemptionMinutes` from now (the player lost the first hour); audited.
    func renewRedemption(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        try caller.requireScope(.support)
        let code = try Self.parameter(context, "code").uppercased()
        let stripeStore = StripeStore(database: database)
        guard code.count == 12, let checkout = try await stripeStore.checkout(redemptionCode: code),
            checkout.transactionId != nil
        else { throw APIError(.notFound, "not_found", "no paid purchase has redemption code '\(code.prefix(40))'") }
        try caller.requireApp(
            checkout.appId,
            notFound: APIError(.notFound, "not_found", "no paid purchase has redemption code '\(code.prefix(40))'"))
        guard checkout.redeemedBy == nil else {
            throw APIError(.conflict, "already_redeemed", "redemption code '\(code)' was already used")
        }
        let minutes = stripe[checkout.appId]?.configuration.redemptionMinutes ?? 60
        let expires = Date().addingTimeInterval(Double(minutes) * 60)
        guard try await stripeStore.renewRedemption(code: code, expiresAt: expires) else {
            throw APIError(.conflict, "already_redeemed", "redemption code '\(code)' was already used")
        }
        try await store.anomalies.recordAudit(
            actor: caller.auditActor, action: "renew_redemption", subject: checkout.orderId,
            detail: "redemption code \(code.prefix(4))… valid until \(Self.iso(expires))", now: Date())
        return try Self.json(["code": code, "expiresAt": Self.iso(expires)])
    }

    func decodeOptional<T: RequestBody>(_ type: T.Type, _ request: Request) async throws -> T? {
        var request = request
        let buffer = try await request.collectBody(upTo: configuration.maxBodyBytes)
        guard buffer.readableBytes > 0 else { return nil }
        return try Self.decodeBody(T.self, Data(buffer: buffer))
    }

    // MARK: The billing portal

    struct PortalBody: RequestBody {
        var appId: String?
        var returnURL: String?
        func validate() throws {
            if let appId { try StoreKeeperApp.validateText(appId, field: "appId") }
            if let returnURL {
                guard returnURL.count <= 2048, let url = URL(string: returnURL),
                    url.scheme == "https" || url.scheme == "http"
                else { throw APIError.badRequest("field 'returnURL' must be an http(s) URL") }
            }
        }
    }

    /// `POST /v1/accounts/{accountId}/billing-portal`: a Stripe customer-portal URL for the
    /// account's Stripe customer (cancel, change plan, update the card; what they do there
    /// comes back as events).
    func billingPortal(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let accountId = try Self.parameter(context, "accountId")
        try Self.validateAccountId(accountId)
        try caller.require(accountId, scope: .support)
        let body = try await decodeOptional(PortalBody.self, request)
        let app = try stripeApp(body?.appId)
        if let returnURL = body?.returnURL, !app.configuration.allowsReturn(to: returnURL) {
            throw APIError.badRequest(
                "field 'returnURL' is not one of this app's portalReturnURLs (nor successURL's origin)")
        }
        // Each portal is a write at Stripe (Stripe allows a client about 20 a second): an account
        // opens a few a minute at most.
        if let retry = app.portalLimiter.admit(app.configuration.id + "\u{0}" + accountId) {
            var error = APIError(
                .tooManyRequests, "rate_limited", "the billing portal was opened too often; try again shortly",
                retryable: true)
            error.headers[.retryAfter] = String(retry)
            throw error
        }
        try caller.requireApp(
            app.configuration.id,
            notFound: APIError(.badRequest, "unknown_app", "no Stripe app '\(app.configuration.id)' is configured"))
        guard
            let customer = try await StripeStore(database: database).customer(
                appId: app.configuration.id, accountId: accountId)
        else {
            throw APIError(
                .notFound, "no_stripe_customer", "account '\(accountId.prefix(64))' has bought nothing through Stripe")
        }
        do {
            let session = try await app.client.createPortalSession(
                customer: customer, returnURL: body?.returnURL ?? app.configuration.successURL,
                idempotencyKey: "portal:\(UUID().uuidString.lowercased())")
            return try Self.json(["url": session.url])
        } catch let error as StripeError {
            throw Self.stripeAPIError(error)
        }
    }
}

struct StripeController {
    let stripe: StripePayments

    /// The webhook, outside `/v1`'s authentication.
    func addWebhook(to router: some RouterMethods<StoreKeeperContext>) {
        router.post("v1/notifications/stripe") { request, context in
            try await stripe.receiveStripeWebhook(request, context)
        }
    }

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.post("redemptions/:code") { request, context in try await stripe.redeem(request, context) }
        v1.post("redemptions/:code/renew") { request, context in try await stripe.renewRedemption(request, context) }
        v1.post("accounts/:accountId/billing-portal") { request, context in
            try await stripe.billingPortal(request, context)
        }
    }
}

extension JobRunner {
    /// Stripe's duties: a recorded event applied (its objects re-read from Stripe).
    static let stripeKinds: [JobKind] = [.duty(StripeStore.eventJobKind) { $0.applyStripeEventJob }]

    func applyStripeEventJob(_ job: JobStore.Job, now: Date) async {
        let stripeStore = StripeStore(database: app.database)
        guard let event = try? await stripeStore.event(job.payload), let stripe = app.stripe[event.appId] else {
            try? await app.jobs.fail(job.id, error: "unknown event or app")
            return
        }
        do {
            let applied = try await app.stripePayments.applyStripeEvent(event, app: stripe, now: now)
            try await stripeStore.finishEvent(event.id, status: "applied", outcome: applied.outcome, now: now)
            try await app.jobs.complete(job.id)
        } catch let error as StripeError where error.kind == .notFound || error.kind == .refused {
            try? await stripeStore.finishEvent(event.id, status: "ignored", outcome: error.description, now: now)
            try? await app.jobs.fail(job.id, error: error.description)
        } catch {
            await backoff(job, now: now, error: error)
        }
    }
}

extension StripePayments {
    /// Support's refund of a Stripe payment: Stripe refunds what is left of its charge (one
    /// idempotency key per transaction: asked twice, refunded once), then the refund is applied
    /// through the one refund path from the Refund object Stripe answered (its webhook later
    /// finds it applied).
    func refundStripePurchase(_ transactionId: String, appId: String?, caller: Caller, detail: String) async throws
        -> Response
    {
        let stripeStore = StripeStore(database: database)
        guard let intent = try await stripeStore.paymentIntent(ofTransaction: transactionId) else {
            throw APIError(
                .unprocessableContent, "store_refused", "no Stripe payment is recorded for '\(transactionId)'")
        }
        let app = try stripeApp(appId ?? (stripe.count == 1 ? stripe.keys.first : nil))
        let refund: StripeRefund
        do {
            refund = try await app.client.createRefund(
                paymentIntent: intent, amount: nil, reason: "requested_by_customer",
                idempotencyKey: "support-refund:\(transactionId)")
        } catch let error as StripeError where error.kind == .refused || error.kind == .notFound {
            throw APIError(.unprocessableContent, "store_refused", "Stripe refused the refund: \(error.message)")
        } catch {
            throw APIError(
                .serviceUnavailable, "store_unavailable",
                "Stripe did not answer the refund (\(error)); nothing changed here — ask again")
        }
        let outcome = try await applyStripeRefunds(charge: refund.charge?.id ?? "", app: app, now: Date())
        try await store.anomalies.recordAudit(
            actor: caller.auditActor, action: "support_refund", subject: transactionId,
            detail: detail + " — Stripe refund \(refund.id): \(outcome)", now: Date())
        var answer = ["transactionId": transactionId, "store": "stripe", "status": "refunded", "detail": outcome]
        // A subscription's payment: the refund ends this period's access; Stripe still renews the
        // subscription until it is cancelled there — said, not done behind support's back.
        if let original = try await stripeStore.payment(paymentIntent: intent)?.originalTransactionId,
            original.hasPrefix("stripe:sub_")
        {
            answer["subscription"] =
                "\(original) is still active at Stripe and renews unless cancelled (the customer's billing portal, or Stripe's dashboard)"
        }
        return try Self.json(answer)
    }
}
