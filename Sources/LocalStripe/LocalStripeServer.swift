import AsyncHTTPClient
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import Stripe
import Synchronization

/// The local Stripe over HTTP, at Stripe's paths (`/v1/…`) under the mount point, with Stripe's
/// rules: a secret key as the bearer (a publishable or wrong key → 401), form-encoded bodies,
/// `Idempotency-Key` replays (`Idempotent-Replayed: true`), Stripe's error envelope and a
/// `Request-Id` on every answer; the hosted Checkout page and the customer portal; and the
/// webhook sender, signing each attempt as Stripe does.
public final class LocalStripeServer: Sendable {
    public let stripe: LocalStripe
    public let secretKey: String
    /// Where the pages live (`…/local-stripe`): Checkout and portal URLs point here.
    let publicBaseURL: Mutex<String>
    let webhook = Mutex(Webhook())
    /// Injected faults: the next `count` API calls answer `status` (500 with
    /// `Stripe-Should-Retry: false`, 503, 429 `lock_timeout`…).
    let faults = Mutex((count: 0, status: 503))

    /// The next `count` API calls fail with `status`.
    public func injectFaults(count: Int, status: Int = 503) { faults.withLock { $0 = (max(0, count), status) } }

    public struct Webhook: Sendable {
        public var url: String?
        public var secrets: [String] = []
        /// Each event sent twice.
        public var duplicate = false
        /// A pass's events sent newest first.
        public var reverse = false
        /// Nothing sent until released (the server down for hours).
        public var hold = false
        var cursor = 0
        /// Events whose delivery failed: (index, attempts, next attempt).
        var retries: [(index: Int, attempts: Int, at: Date)] = []
        public var delivered = 0
        public var failed = 0
    }

    public init(
        stripe: LocalStripe,
        secretKey: String = "sk_test_local_"
            + (UUID().uuidString + UUID().uuidString).replacingOccurrences(of: "-", with: "")
            .lowercased(),
        publicBaseURL: String = "http://127.0.0.1:8080/local-stripe"
    ) {
        self.stripe = stripe
        self.secretKey = secretKey
        self.publicBaseURL = Mutex(publicBaseURL)
    }

    public func setPublicBaseURL(_ url: String) { publicBaseURL.withLock { $0 = url } }

    public func configureWebhook(_ change: (inout Webhook) -> Void) { webhook.withLock { change(&$0) } }
    public var webhookState: Webhook { webhook.withLock { $0 } }

    // MARK: Answers

    static func json(_ object: Any, status: HTTPResponse.Status = .ok, replayed: Bool = false) -> Response {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [])) ?? Data("{}".utf8)
        var response = Response(status: status, body: .init(byteBuffer: ByteBuffer(bytes: data)))
        response.headers[.contentType] = "application/json"
        response.headers[HTTPField.Name("Request-Id")!] =
            "req_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(14)
        if replayed { response.headers[HTTPField.Name("Idempotent-Replayed")!] = "true" }
        return response
    }

    static func error(_ failure: LocalStripe.Failure) -> Response {
        var inner: [String: Any] = ["type": failure.type, "code": failure.code, "message": failure.message]
        if let param = failure.param { inner["param"] = param }
        inner["doc_url"] =
            "https://stripe.com/docs/error-codes/\(failure.code.replacingOccurrences(of: "_", with: "-"))"
        return json(["error": inner], status: .init(code: failure.status))
    }

    func authorized(_ request: Request, _ body: () async throws -> Response) async -> Response {
        let fault: Int? = faults.withLock {
            guard $0.count > 0 else { return nil }
            $0.count -= 1
            return $0.status
        }
        if let fault {
            var response = Self.error(
                fault == 429
                    ? .init(429, "invalid_request_error", "lock_timeout", "This object cannot be accessed right now.")
                    : .init(fault, "api_error", "api_error", "An error occurred with our connection to Stripe."))
            if fault == 500 { response.headers[HTTPField.Name("Stripe-Should-Retry")!] = "false" }
            return response
        }
        let header = request.headers[.authorization] ?? ""
        guard Self.sameBytes(header, "Bearer \(secretKey)") else {
            let message =
                header.hasPrefix("Bearer pk_")
                ? "This API call cannot be made with a publishable API key. Please use a secret API key."
                : "Invalid API Key provided."
            return Self.error(.init(401, "invalid_request_error", "api_key_invalid", message))
        }
        do {
            return try await body()
        } catch let failure as LocalStripe.Failure {
            return Self.error(failure)
        } catch {
            return Self.error(.init(500, "api_error", "internal", "\(error)"))
        }
    }

    static func form(_ request: Request) async throws -> [(String, String)] {
        var request = request
        let buffer = try await request.collectBody(upTo: 1 << 20)
        return StripeForm.parse(String(buffer: buffer))
    }

    static func expand(_ request: Request) -> Set<String> {
        Set(
            (request.uri.queryParameters.getAll("expand[]") + request.uri.queryParameters.getAll("expand%5B%5D"))
                .map { String($0) })
    }

    // MARK: Routes

    public func addRoutes<Context: RequestContext>(to router: some RouterMethods<Context>) {
        let v1 = router.group("v1")
        v1.post("checkout/sessions") { request, _ in
            await self.authorized(request) {
                let form = try await Self.form(request)
                let (session, replayed) = try self.stripe.createCheckoutSession(
                    form, idempotencyKey: request.headers[HTTPField.Name("Idempotency-Key")!],
                    baseURL: self.publicBaseURL.withLock { $0 })
                return Self.json(session, replayed: replayed)
            }
        }
        v1.get("checkout/sessions/:id") { request, context in
            await self.authorized(request) {
                let data = try self.stripe.renderedSession(
                    context.parameters.get("id") ?? "", expand: Self.expand(request))
                var response = Response(status: .ok, body: .init(byteBuffer: ByteBuffer(bytes: data)))
                response.headers[.contentType] = "application/json"
                response.headers[HTTPField.Name("Request-Id")!] =
                    "req_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(14)
                return response
            }
        }
        v1.post("checkout/sessions/:id/expire") { request, context in
            await self.authorized(request) {
                Self.json(try self.stripe.expire(session: context.parameters.get("id") ?? ""))
            }
        }
        v1.get("payment_intents/:id") { request, context in
            await self.authorized(request) {
                Self.json(
                    try self.stripe.paymentIntent(context.parameters.get("id") ?? "", expand: Self.expand(request)))
            }
        }
        v1.get("charges/:id") { request, context in
            await self.authorized(request) {
                Self.json(try self.stripe.charge(context.parameters.get("id") ?? "", expand: Self.expand(request)))
            }
        }
        v1.get("refunds") { request, _ in
            await self.authorized(request) {
                Self.json(self.stripe.refundList(charge: request.uri.queryParameters.get("charge") ?? ""))
            }
        }
        v1.get("refunds/:id") { request, context in
            await self.authorized(request) {
                Self.json(try self.stripe.refundObject(context.parameters.get("id") ?? ""))
            }
        }
        v1.post("refunds") { request, _ in
            await self.authorized(request) {
                var values: [String: String] = [:]
                for (key, value) in try await Self.form(request) { values[key] = value }
                let (refund, replayed) = try self.stripe.refund(
                    paymentIntent: values["payment_intent"], charge: values["charge"],
                    amount: values["amount"].flatMap { Int64($0) }, reason: values["reason"],
                    idempotencyKey: request.headers[HTTPField.Name("Idempotency-Key")!])
                return Self.json(refund, replayed: replayed)
            }
        }
        v1.get("disputes") { request, _ in
            await self.authorized(request) {
                let query = request.uri.queryParameters
                return Self.json(
                    self.stripe.disputeList(
                        charge: query.get("charge").map { String($0) },
                        paymentIntent: query.get("payment_intent").map { String($0) }))
            }
        }
        v1.get("disputes/:id") { request, context in
            await self.authorized(request) { Self.json(try self.stripe.dispute(context.parameters.get("id") ?? "")) }
        }
        v1.get("subscriptions/:id") { request, context in
            await self.authorized(request) {
                Self.json(
                    try self.stripe.subscription(context.parameters.get("id") ?? "", expand: Self.expand(request)))
            }
        }
        v1.get("invoices/:id") { request, context in
            await self.authorized(request) {
                Self.json(try self.stripe.invoice(context.parameters.get("id") ?? "", expand: Self.expand(request)))
            }
        }
        v1.get("events") { request, _ in
            await self.authorized(request) {
                let query = request.uri.queryParameters
                return Self.json(
                    self.stripe.eventList(
                        createdAfter: (query.get("created[gte]") ?? query.get("created%5Bgte%5D")).flatMap {
                            Int64($0)
                        },
                        startingAfter: query.get("starting_after"), limit: query.get("limit").flatMap { Int($0) } ?? 10,
                        types: Self.queryValues(request.uri.query, named: "types[]"))
                )
            }
        }
        v1.get("events/:id") { request, context in
            await self.authorized(request) { Self.json(try self.stripe.event(context.parameters.get("id") ?? "")) }
        }
        v1.post("customers") { request, _ in
            await self.authorized(request) {
                let form = try await Self.form(request)
                var metadata: [String: String] = [:]
                for (key, value) in form where key.hasPrefix("metadata[") && key.hasSuffix("]") {
                    metadata[String(key.dropFirst(9).dropLast())] = value
                }
                let (customer, replayed) = try self.stripe.createCustomer(
                    metadata: metadata, idempotencyKey: request.headers[HTTPField.Name("Idempotency-Key")!])
                return Self.json(customer, replayed: replayed)
            }
        }
        v1.post("billing_portal/sessions") { request, _ in
            await self.authorized(request) {
                var values: [String: String] = [:]
                for (key, value) in try await Self.form(request) { values[key] = value }
                return Self.json(
                    try self.stripe.portalSession(
                        customer: values["customer"] ?? "", returnURL: values["return_url"],
                        baseURL: self.publicBaseURL.withLock { $0 }))
            }
        }
        // Where the demo's Stripe app sends the buyer back (a real app's successURL is its own).
        for (path, title) in [("done", "Payment received"), ("cancelled", "Payment cancelled")] {
            router.get(RouterPath(stringLiteral: path)) { request, _ in
                let code = request.uri.queryParameters.get("redemption").map { String($0.prefix(40)) }
                let html = """
                    <!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
                    <title>\(title)</title></head><body style="font-family:system-ui;max-width:420px;margin:2em auto">
                    <h1>\(title)</h1>\(code.map { "<p>Redemption code: <code>\($0.filter { $0.isLetter || $0.isNumber })</code> — enter it in the app.</p>" } ?? "")
                    </body></html>
                    """
                var response = Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: html)))
                response.headers[.contentType] = "text/html; charset=utf-8"
                return response
            }
        }
        // The hosted Checkout page: what the buyer sees, with the outcomes the fake can play.
        router.get("checkout/:id") { _, context in
            let id = context.parameters.get("id") ?? ""
            let session = try? self.stripe.session(id, expand: ["line_items"])
            let status = session?["status"] as? String ?? "unknown"
            let html = """
                <!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
                <title>Local Stripe Checkout</title></head><body style="font-family:system-ui;max-width:420px;margin:2em auto">
                <h1>Local Stripe Checkout</h1><p>Session <code>\(id.prefix(80))</code>: \(status)</p>
                <p>Amount: \(session?["amount_total"] as? Int64 ?? 0) \(session?["currency"] as? String ?? "")</p>
                <p>Pay through the control API: <code>POST …/local-stripe/control/sessions/\(id.prefix(80))/pay</code>
                with <code>{"outcome": "paid" | "async" | "declined" | "dispute" | "inquiry" | "failLater"}</code>.</p>
                </body></html>
                """
            var response = Response(
                status: session == nil ? .notFound : .ok, body: .init(byteBuffer: ByteBuffer(string: html)))
            response.headers[.contentType] = "text/html; charset=utf-8"
            return response
        }
    }

    // MARK: Control API (tests and the demo)

    struct PayBody: Decodable {
        var outcome: String?
        var email: String?
    }

    struct SettleBody: Decodable { var succeeded: Bool }
    struct AdvanceBody: Decodable { var seconds: Int64 }
    struct RefundBody: Decodable { var amount: Int64? }
    struct DisputeBody: Decodable {
        var inquiry: Bool?
        var reason: String?
    }
    struct CloseBody: Decodable { var outcome: String }
    struct CancelBody: Decodable { var atPeriodEnd: Bool? }
    struct PlanBody: Decodable { var price: String }
    struct CardBody: Decodable { var fails: Bool }
    struct FaultBody: Decodable {
        var count: Int
        var status: Int?
    }
    struct WebhookBody: Decodable {
        var url: String?
        var secrets: [String]?
        var duplicate: Bool?
        var reverse: Bool?
        var hold: Bool?
    }

    public func addControl<Context: RequestContext>(to control: some RouterMethods<Context>) {
        @Sendable func run(_ body: () throws -> Any) -> Response {
            do {
                return Self.json(try body())
            } catch let failure as LocalStripe.Failure {
                return Self.error(failure)
            } catch {
                return Self.error(.init(400, "invalid_request_error", "parameter_invalid", "\(error)"))
            }
        }
        control.post("sessions/:id/pay") { request, context in
            let body = (try? await request.decode(as: PayBody.self, context: context)) ?? PayBody()
            let id = context.parameters.get("id") ?? ""
            return run {
                try self.stripe.pay(
                    session: id, outcome: body.outcome ?? "paid", email: body.email ?? "buyer@example.com")
            }
        }
        control.post("sessions/:id/settle") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = try await request.decode(as: SettleBody.self, context: context)
            return run {
                try self.stripe.settleAsync(session: id, succeeded: body.succeeded)
                return ["settled": body.succeeded]
            }
        }
        control.post("advance") { request, context in
            let body = try await request.decode(as: AdvanceBody.self, context: context)
            return run {
                self.stripe.advance(seconds: body.seconds)
                return ["now": self.stripe.clock]
            }
        }
        control.post("charges/:id/refund") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = (try? await request.decode(as: RefundBody.self, context: context)) ?? RefundBody()
            return run {
                try self.stripe.refund(
                    paymentIntent: nil, charge: id, amount: body.amount, reason: "requested_by_customer",
                    idempotencyKey: nil
                ).0
            }
        }
        control.post("refunds/:id/fail") { _, context in
            let id = context.parameters.get("id") ?? ""
            return run { try self.stripe.failRefund(id) }
        }
        control.post("charges/:id/dispute") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = (try? await request.decode(as: DisputeBody.self, context: context)) ?? DisputeBody()
            return run {
                try self.stripe.openDispute(
                    charge: id, inquiry: body.inquiry ?? false, reason: body.reason ?? "fraudulent")
            }
        }
        control.post("disputes/:id/close") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = try await request.decode(as: CloseBody.self, context: context)
            return run { try self.stripe.closeDispute(id, outcome: body.outcome) }
        }
        control.post("subscriptions/:id/cancel") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = (try? await request.decode(as: CancelBody.self, context: context)) ?? CancelBody()
            return run {
                try self.stripe.cancel(subscription: id, atPeriodEnd: body.atPeriodEnd ?? true)
                return try self.stripe.subscription(id, expand: [])
            }
        }
        control.post("subscriptions/:id/uncancel") { _, context in
            let id = context.parameters.get("id") ?? ""
            return run {
                try self.stripe.uncancel(subscription: id)
                return try self.stripe.subscription(id, expand: [])
            }
        }
        control.post("subscriptions/:id/plan") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = try await request.decode(as: PlanBody.self, context: context)
            return run {
                try self.stripe.changePlan(subscription: id, price: body.price)
                return try self.stripe.subscription(id, expand: [])
            }
        }
        control.post("subscriptions/:id/card") { request, context in
            let id = context.parameters.get("id") ?? ""
            let body = try await request.decode(as: CardBody.self, context: context)
            return run {
                try self.stripe.setCardFails(subscription: id, body.fails)
                return ["fails": body.fails]
            }
        }
        control.post("webhooks") { request, context in
            let body = try await request.decode(as: WebhookBody.self, context: context)
            self.configureWebhook {
                if let url = body.url { $0.url = url }
                if let secrets = body.secrets { $0.secrets = secrets }
                if let duplicate = body.duplicate { $0.duplicate = duplicate }
                if let reverse = body.reverse { $0.reverse = reverse }
                if let hold = body.hold { $0.hold = hold }
            }
            let state = self.webhookState
            return Self.json([
                "url": state.url ?? "", "duplicate": state.duplicate, "reverse": state.reverse, "hold": state.hold,
            ])
        }
        control.post("faults") { request, context in
            let body = try await request.decode(as: FaultBody.self, context: context)
            self.injectFaults(count: body.count, status: body.status ?? 503)
            return Self.json(["count": body.count])
        }
        control.post("webhooks/flush") { _, _ in
            let sent = await self.deliverDue(force: true)
            return Self.json(["delivered": sent])
        }
        control.get("events") { _, _ in
            let events = self.stripe.eventSummaries().map { ["id": $0.id, "type": $0.type] }
            return Self.json(["data": events])
        }
    }

    // MARK: Webhooks

    /// The signed request Stripe sends for `body` now (each attempt signed anew).
    public func signedDelivery(_ body: Data, secrets: [String], at date: Date = Date()) -> (body: Data, header: String)
    {
        (
            body,
            StripeSignature.header(body: Array(body), secrets: secrets, timestamp: Int64(date.timeIntervalSince1970))
        )
    }

    /// One pass: every new event (and every retry that is due) sent once, in order — or newest
    /// first, twice, per the webhook's modes; `force` sends retries now and ignores `hold`.
    /// Returns how many were acknowledged with a 2xx.
    @discardableResult
    public func deliverDue(force: Bool = false, now: Date = Date()) async -> Int {
        let state = webhookState
        guard let url = state.url, !state.secrets.isEmpty, force || !state.hold else { return 0 }
        let fresh = stripe.events(from: state.cursor)
        let cursor = state.cursor + fresh.count
        let due = state.retries.filter { force || $0.at <= now }
        var batch = fresh.enumerated().map { (index: state.cursor + $0.offset, attempts: 0) }
        batch += due.map { (index: $0.index, attempts: $0.attempts) }
        webhook.withLock {
            $0.cursor = cursor
            $0.retries.removeAll { retry in due.contains { $0.index == retry.index } }
        }
        if state.reverse { batch.reverse() }
        var acknowledged = 0
        for item in batch {
            guard let body = stripe.event(at: item.index) else { continue }
            let data =
                (try? JSONSerialization.data(
                    withJSONObject: body, options: [.prettyPrinted, .sortedKeys]))
                ?? Data()
            var ok = false
            for _ in 0..<(state.duplicate ? 2 : 1) {
                let delivery = signedDelivery(data, secrets: state.secrets)
                var request = HTTPClientRequest(url: url)
                request.method = .POST
                request.headers.add(name: "Content-Type", value: "application/json; charset=utf-8")
                request.headers.add(name: "Stripe-Signature", value: delivery.header)
                request.headers.add(name: "User-Agent", value: "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
                request.body = .bytes(ByteBuffer(bytes: delivery.body))
                if let response = try? await HTTPClient.shared.execute(request, timeout: .seconds(10)),
                    (200..<300).contains(response.status.code)
                {
                    ok = true
                    _ = try? await response.body.collect(upTo: 1 << 16)
                }
            }
            if ok {
                acknowledged += 1
                webhook.withLock { $0.delivered += 1 }
            } else {
                // Test mode retries a few times, further apart each time.
                let attempts = item.attempts + 1
                webhook.withLock {
                    $0.failed += 1
                    if attempts <= 3 {
                        $0.retries.append((item.index, attempts, now.addingTimeInterval(pow(2, Double(attempts)))))
                    }
                }
            }
        }
        return acknowledged
    }

    /// The sender as a service: a pass every 200 ms.
    public struct Sender: Service {
        let server: LocalStripeServer
        public init(server: LocalStripeServer) { self.server = server }
        public func run() async throws {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                await server.deliverDue()
                try? await Task.sleep(for: .milliseconds(200))
            }
        }
    }
}

extension LocalStripeServer {
    /// The server listening on `host` (port 0: a free one) in the background, Stripe's paths at
    /// its root and the control API under `/control`; `stop()` ends it.
    public final class Running: Sendable {
        public let baseURL: String
        let group: ServiceGroup
        let task: Task<Void, any Error>

        init(baseURL: String, group: ServiceGroup, task: Task<Void, any Error>) {
            self.baseURL = baseURL
            self.group = group
            self.task = task
        }

        public func stop() async {
            await group.triggerGracefulShutdown()
            _ = try? await task.value
        }
    }

    public func start(host: String = "127.0.0.1", port: Int = 0) async throws -> Running {
        let bound = Mutex(0)
        var log = Logger(label: "local-stripe")
        log.logLevel = .error
        let router = Router()
        addRoutes(to: router)
        addControl(to: router.group("control"))
        let app = Application(
            router: router, configuration: .init(address: .hostname(host, port: port), serverName: "LocalStripe"),
            onServerRunning: { channel in bound.withLock { $0 = channel.localAddress?.port ?? port } }, logger: log)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: log))
        let task = Task { try await group.run() }
        // A bound on a start that never comes, not a timing: on a loaded 2-core machine (CPU-bound
        // tests beside it) a listener has taken over a minute to come up.
        let deadline = ContinuousClock.now + .seconds(300)
        while bound.withLock({ $0 }) == 0 {
            guard ContinuousClock.now < deadline else {
                await group.triggerGracefulShutdown()
                throw LocalStripe.Failure(500, "api_error", "not_started", "the local Stripe did not start listening")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        let base = "http://\(host):\(bound.withLock { $0 })"
        setPublicBaseURL(base)
        return Running(baseURL: base, group: group, task: task)
    }

    /// Every event not yet taken, as Stripe would send it now (for tests that post through
    /// their own client): the pretty-printed body and its `Stripe-Signature`.
    /// Constant-time comparison of two strings' bytes (no early exit on the first difference).
    static func sameBytes(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8)
        let y = Array(b.utf8)
        var difference = UInt8(x.count == y.count ? 0 : 1)
        for index in 0..<min(x.count, y.count) { difference |= x[index] ^ y[index] }
        return difference == 0
    }

    /// Every value of `name` in a query string, keys and values percent-decoded (`types[]`
    /// arrives as `types%5B%5D` from most clients).
    static func queryValues(_ query: String?, named name: String) -> Set<String> {
        var values: Set<String> = []
        for pair in (query ?? "").split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, (parts[0].removingPercentEncoding ?? parts[0]) == name else { continue }
            values.insert(parts[1].removingPercentEncoding ?? parts[1])
        }
        return values
    }

    public func takeDeliveries(secrets: [String], at date: Date = Date()) -> [(
        id: String, type: String, body: Data, header: String
    )] {
        let state = webhookState
        let fresh = stripe.events(from: state.cursor)
        webhook.withLock { $0.cursor = state.cursor + fresh.count }
        return fresh.map { event in
            let data =
                (try? JSONSerialization.data(withJSONObject: event.body, options: [.prettyPrinted, .sortedKeys]))
                ?? Data()
            let delivery = signedDelivery(data, secrets: secrets, at: date)
            return (event.id, event.body["type"] as? String ?? "", delivery.body, delivery.header)
        }
    }
}
