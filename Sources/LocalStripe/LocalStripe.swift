import Foundation
import StoreKeeperCatalog
import Stripe

/// A stateful local Stripe: Checkout Sessions that pay, decline or settle later; customers;
/// subscriptions billed through invoices on a test clock (renewals, failed payments, dunning,
/// cancellation at period end); refunds (partial, several per charge); disputes (inquiries,
/// chargebacks won and lost); balance transactions with a 2.9 % + 30 fee; and every change as
/// an event, in the API version it pins, with the shapes of `2026-07-29.dahlia` (periods on
/// subscription items, an invoice's subscription under `parent`, its payments as
/// InvoicePayments, metadata copied exactly as Stripe copies it — not at all from a session).
public final class LocalStripe: @unchecked Sendable {
    /// Every public entry holds it: one buyer, one clock, one sequence of events.
    let lock = NSRecursiveLock()
    public typealias Object = [String: Any]

    public struct Configuration: Sendable {
        public var catalog: Catalog
        public var apiVersion = StripeClient.pinnedVersion
        public var livemode = false
        /// The account's settlement currency (nil: each charge settles in its own): a charge in
        /// another is converted at `exchangeRates[charge currency]` (settlement units per unit),
        /// its balance transaction in the settlement currency with Stripe's `exchange_rate`.
        public var settlementCurrency: String?
        public var exchangeRates: [String: Double] = [:]
        public init(catalog: Catalog) { self.catalog = catalog }
    }

    public let configuration: Configuration
    /// The test clock: every object's time (advanced by the control API).
    var now: Int64
    var counter = 0
    var prices: [String: Object] = [:]
    var productOfPrice: [String: Product] = [:]
    var customers: [String: Object] = [:]
    var sessions: [String: Object] = [:]
    var paymentIntents: [String: Object] = [:]
    var charges: [String: Object] = [:]
    var refunds: [String: Object] = [:]
    var disputes: [String: Object] = [:]
    var balanceTransactions: [String: Object] = [:]
    var subscriptions: [String: Object] = [:]
    var invoices: [String: Object] = [:]
    /// Subscriptions whose next charge fails (a card that attaches, then declines off-session).
    var failingSubscriptions: Set<String> = []
    /// Events, oldest first: (id, rendered body).
    var events: [(id: String, type: String, created: Int64, body: Object)] = []
    var idempotency: [String: (parameters: String, status: Int, body: Object)] = [:]
    /// Sessions' answers as rendered since the last change (any event clears them).
    var rendered: [String: Data] = [:]

    public init(configuration: Configuration, now: Date = Date()) {
        self.configuration = configuration
        self.now = Int64(now.timeIntervalSince1970)
        for product in configuration.catalog.products {
            guard let priceId = product.storeProducts?["stripe"] else { continue }
            let price = product.price(in: "USA")
            let currency = price.currency.lowercased()
            let exponent = Self.exponent(currency)
            var scaled = price.price
            for _ in 0..<exponent { scaled *= 10 }
            var object: Object = [
                "id": priceId, "object": "price", "active": true, "currency": currency,
                "product": "prod_\(product.id)", "unit_amount": Int64(truncating: scaled as NSDecimalNumber),
                "unit_amount_decimal": "\(Int64(truncating: scaled as NSDecimalNumber))",
                "type": product.type == .autoRenewable ? "recurring" : "one_time", "livemode": configuration.livemode,
                "lookup_key": product.id, "billing_scheme": "per_unit",
            ]
            if product.type == .autoRenewable {
                let period = product.period ?? ISODuration(months: 1)
                let (interval, count): (String, Int) =
                    period.years > 0
                    ? ("year", period.years)
                    : period.months > 0
                        ? ("month", period.months)
                        : period.days > 0 && period.days % 7 == 0
                            ? ("week", period.days / 7)
                            : ("day", max(1, period.days))
                object["recurring"] = ["interval": interval, "interval_count": count, "usage_type": "licensed"]
            }
            prices[priceId] = object
            productOfPrice[priceId] = product
        }
    }

    /// The wall clock, Unix seconds (Checkout Sessions expire on it).
    static func wallClock() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// Digits after the decimal point Stripe uses for `currency` (zero-decimal currencies).
    public static func exponent(_ currency: String) -> Int { StripeMoney.decimals(currency) }

    func newId(_ prefix: String) -> String {
        counter += 1
        let mode = configuration.livemode ? "live" : "test"
        let tail =
            String(format: "%06d", counter) + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(14)
        return prefix == "cs" ? "cs_\(mode)_\(tail)" : "\(prefix)_\(tail)"
    }

    // MARK: Errors

    public struct Failure: Error, Sendable {
        public var status: Int
        public var type: String
        public var code: String
        public var message: String
        public var param: String?

        init(_ status: Int, _ type: String, _ code: String, _ message: String, param: String? = nil) {
            self.status = status
            self.type = type
            self.code = code
            self.message = message
            self.param = param
        }

        static func missing(_ id: String) -> Failure {
            Failure(404, "invalid_request_error", "resource_missing", "No such object: '\(id)'", param: "id")
        }

        static func invalid(_ message: String, param: String) -> Failure {
            Failure(400, "invalid_request_error", "parameter_invalid", message, param: param)
        }
    }

    // MARK: Idempotency

    /// A write under `key`: replayed with its first answer; other parameters → 400
    /// `idempotency_error`.
    func idempotent(_ key: String?, parameters: String, _ body: () throws -> Object) throws -> (Object, Bool) {
        guard let key else { return (try body(), false) }
        if let saved = idempotency[key] {
            guard saved.parameters == parameters else {
                throw Failure(
                    400, "idempotency_error", "idempotency_key_in_use",
                    "Keys for idempotent requests can only be used with the same parameters they were first used with.")
            }
            return (saved.body, true)
        }
        let object = try body()
        idempotency[key] = (parameters, 200, object)
        return (object, false)
    }

    // MARK: Checkout Sessions

    public func createCheckoutSession(_ form: [(String, String)], idempotencyKey: String?, baseURL: String)
        throws -> (Object, Bool)
    {
        lock.lock()
        defer { lock.unlock() }
        let parameters = form.map { "\($0.0)=\($0.1)" }.joined(separator: "&")
        return try idempotent(idempotencyKey, parameters: parameters) {
            var values: [String: String] = [:]
            for (key, value) in form { values[key] = value }
            guard let mode = values["mode"], ["payment", "subscription"].contains(mode) else {
                throw Failure.invalid("mode must be payment or subscription", param: "mode")
            }
            guard let priceId = values["line_items[0][price]"], let price = prices[priceId] else {
                throw Failure(
                    400, "invalid_request_error", "resource_missing",
                    "No such price: '\(values["line_items[0][price]"] ?? "")'", param: "line_items[0][price]")
            }
            let recurring = price["recurring"] != nil
            if mode == "payment", recurring {
                throw Failure.invalid(
                    "You must provide at least one recurring price in `subscription` mode when using prices.",
                    param: "mode")
            }
            if mode == "subscription", !recurring {
                throw Failure.invalid("subscription mode needs a recurring price", param: "line_items[0][price]")
            }
            let quantity = Int(values["line_items[0][quantity]"] ?? "1") ?? 1
            guard (1...999_999).contains(quantity) else {
                throw Failure.invalid("quantity must be 1…999999", param: "line_items[0][quantity]")
            }
            // Sessions live on the wall clock (a test clock moves subscriptions, not Checkout).
            let wall = Self.wallClock()
            let expiresAt = Int64(values["expires_at"] ?? "") ?? wall + 86_400
            guard expiresAt >= wall + 1800 - 5, expiresAt <= wall + 86_400 + 5 else {
                throw Failure.invalid(
                    "The `expires_at` timestamp must be between 30 minutes and 24 hours from Checkout Session creation.",
                    param: "expires_at")
            }
            guard values["success_url"] != nil else {
                throw Failure(
                    400, "invalid_request_error", "parameter_missing", "Missing success_url", param: "success_url")
            }
            if let reference = values["client_reference_id"], reference.count > 200 {
                throw Failure.invalid(
                    "client_reference_id must be at most 200 characters", param: "client_reference_id")
            }
            let id = newId("cs")
            let amount = (price["unit_amount"] as? Int64 ?? 0) * Int64(quantity)
            let session: Object = [
                "id": id, "object": "checkout.session", "mode": mode, "status": "open", "payment_status": "unpaid",
                "url": "\(baseURL)/checkout/\(id)", "expires_at": expiresAt, "created": wall,
                "client_reference_id": values["client_reference_id"] ?? NSNull(),
                "metadata": Self.map(values, prefix: "metadata"),
                "payment_intent_data_metadata": Self.map(values, prefix: "payment_intent_data[metadata]"),
                "subscription_data_metadata": Self.map(values, prefix: "subscription_data[metadata]"),
                "customer": values["customer"] ?? NSNull(), "customer_email": values["customer_email"] ?? NSNull(),
                "success_url": values["success_url"] ?? NSNull(), "cancel_url": values["cancel_url"] ?? NSNull(),
                "amount_total": amount, "amount_subtotal": amount, "currency": price["currency"] ?? "usd",
                "livemode": configuration.livemode, "payment_intent": NSNull(), "subscription": NSNull(),
                "invoice": NSNull(), "line_price": priceId, "line_quantity": quantity, "ui_mode": "hosted_page",
            ]
            if let customer = values["customer"], customers[customer] == nil { throw Failure.missing(customer) }
            sessions[id] = session
            return render(session: session, expand: [])
        }
    }

    static func map(_ values: [String: String], prefix: String) -> [String: String] {
        var result: [String: String] = [:]
        for (key, value) in values where key.hasPrefix(prefix + "[") && key.hasSuffix("]") {
            let inner = key.dropFirst(prefix.count + 1).dropLast()
            if !inner.contains("[") { result[String(inner)] = value }
        }
        return result
    }

    /// A session's answer as JSON bytes, rendered once per change (Stripe's rendering is not
    /// the work of the server that asks: benchmarks warm these before their timed window).
    public func renderedSession(_ id: String, expand: Set<String>) throws -> Data {
        lock.lock()
        defer { lock.unlock() }
        let key = id + "|" + expand.sorted().joined(separator: ",")
        if let data = rendered[key] { return data }
        let data = try JSONSerialization.data(withJSONObject: try session(id, expand: expand))
        rendered[key] = data
        return data
    }

    public func session(_ id: String, expand: Set<String>) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard let session = sessions[id] else { throw Failure.missing(id) }
        return render(session: session, expand: expand)
    }

    func render(session: Object, expand: Set<String>) -> Object {
        var out = session
        for key in ["payment_intent_data_metadata", "subscription_data_metadata", "line_price", "line_quantity"] {
            out[key] = nil
        }
        if (session["status"] as? String) != "open" { out["url"] = NSNull() }
        if expand.contains("line_items"), let priceId = session["line_price"] as? String {
            out["line_items"] =
                [
                    "object": "list", "has_more": false, "url": "/v1/checkout/sessions/\(session["id"]!)/line_items",
                    "data": [
                        [
                            "id": "li_\(session["id"]!)", "object": "item", "quantity": session["line_quantity"] ?? 1,
                            "price": prices[priceId] ?? [:], "amount_total": session["amount_total"] ?? 0,
                            "currency": session["currency"] ?? "usd",
                        ] as Object
                    ],
                ] as Object
        }
        if let pi = session["payment_intent"] as? String, expand.contains(where: { $0.hasPrefix("payment_intent") }) {
            out["payment_intent"] =
                (try? paymentIntent(
                    pi,
                    expand: Set(
                        expand.compactMap {
                            $0.hasPrefix("payment_intent.") ? String($0.dropFirst("payment_intent.".count)) : nil
                        }))) ?? pi
        }
        if let sub = session["subscription"] as? String, expand.contains("subscription") {
            out["subscription"] = (try? subscription(sub, expand: [])) ?? sub
        }
        return out
    }

    /// The buyer on the hosted page: `paid` (a card that succeeds), `async` (a bank debit that
    /// settles later: complete + unpaid), `declined` (the page stays open, no event),
    /// `no_payment` (a free trial). `dispute` / `inquiry`: paid, then a chargeback or an
    /// inquiry opens. `failLater`: paid, but the subscription's renewals decline.
    @discardableResult
    public func pay(session id: String, outcome: String = "paid", email: String = "buyer@example.com") throws -> Object
    {
        lock.lock()
        defer { lock.unlock() }
        guard var session = sessions[id] else { throw Failure.missing(id) }
        guard (session["status"] as? String) == "open" else {
            throw Failure(
                400, "invalid_request_error", "checkout_session_not_open",
                "This Checkout Session is \(session["status"]!).")
        }
        guard (session["expires_at"] as? Int64 ?? 0) > Self.wallClock() else {
            session["status"] = "expired"
            sessions[id] = session
            emit("checkout.session.expired", render(session: session, expand: []))
            throw Failure(400, "invalid_request_error", "checkout_session_expired", "This Checkout Session expired.")
        }
        if outcome == "declined" {
            throw Failure(402, "card_error", "card_declined", "Your card was declined.")
        }
        let customerId = try ensureCustomer(session: &session, email: email)
        session["customer_details"] = ["email": email, "address": ["country": "US"]] as Object
        session["status"] = "complete"
        let settled = outcome != "async"
        let amount = session["amount_total"] as? Int64 ?? 0
        let currency = session["currency"] as? String ?? "usd"
        if (session["mode"] as? String) == "payment" {
            let pi = newId("pi")
            var intent: Object = [
                "id": pi, "object": "payment_intent", "amount": amount, "currency": currency,
                "status": settled ? "succeeded" : "processing",
                "metadata": session["payment_intent_data_metadata"] ?? [:],
                "customer": customerId ?? NSNull(), "created": now, "livemode": configuration.livemode,
                "amount_received": settled ? amount : 0, "latest_charge": NSNull(),
            ]
            paymentIntents[pi] = intent
            session["payment_intent"] = pi
            if settled {
                let charge = makeCharge(amount: amount, currency: currency, paymentIntent: pi, customer: customerId)
                intent["latest_charge"] = charge
                paymentIntents[pi] = intent
                emit("payment_intent.succeeded", intentObject(pi))
                emit("charge.succeeded", chargeObject(charge))
            }
            session["payment_status"] = settled ? "paid" : "unpaid"
        } else {
            let sub = try startSubscription(
                session: session, customer: customerId ?? "", noPayment: outcome == "no_payment")
            session["subscription"] = sub.subscription
            session["invoice"] = sub.invoice
            session["payment_status"] = outcome == "no_payment" ? "no_payment_required" : "paid"
            if outcome == "failLater" { failingSubscriptions.insert(sub.subscription) }
        }
        sessions[id] = session
        emit("checkout.session.completed", render(session: session, expand: []))
        if outcome == "dispute" || outcome == "inquiry", let charge = latestCharge(ofSession: session) {
            _ = try openDispute(charge: charge, inquiry: outcome == "inquiry")
        }
        return render(session: session, expand: [])
    }

    func ensureCustomer(session: inout Object, email: String) throws -> String? {
        if let customer = session["customer"] as? String { return customer }
        // Payment mode without `customer_creation=always`: a guest (no Customer); subscription
        // mode always creates one.
        guard (session["mode"] as? String) == "subscription" else { return nil }
        let id = newId("cus")
        customers[id] = [
            "id": id, "object": "customer", "email": email, "metadata": [String: String](), "created": now,
        ]
        session["customer"] = id
        emit("customer.created", customers[id]!)
        return id
    }

    /// The delayed method settles (`succeeded`) or fails.
    public func settleAsync(session id: String, succeeded: Bool) throws {
        lock.lock()
        defer { lock.unlock() }
        guard var session = sessions[id], (session["payment_status"] as? String) == "unpaid",
            (session["status"] as? String) == "complete", let pi = session["payment_intent"] as? String,
            var intent = paymentIntents[pi]
        else { throw Failure.invalid("no pending asynchronous payment on this session", param: "session") }
        if succeeded {
            let amount = intent["amount"] as? Int64 ?? 0
            let charge = makeCharge(
                amount: amount, currency: intent["currency"] as? String ?? "usd", paymentIntent: pi,
                customer: intent["customer"] as? String)
            intent["status"] = "succeeded"
            intent["amount_received"] = amount
            intent["latest_charge"] = charge
            session["payment_status"] = "paid"
            paymentIntents[pi] = intent
            sessions[id] = session
            emit("charge.succeeded", chargeObject(charge))
            emit("checkout.session.async_payment_succeeded", render(session: session, expand: []))
        } else {
            intent["status"] = "requires_payment_method"
            paymentIntents[pi] = intent
            emit("checkout.session.async_payment_failed", render(session: session, expand: []))
        }
    }

    public func expire(session id: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard var session = sessions[id] else { throw Failure.missing(id) }
        guard (session["status"] as? String) == "open" else {
            throw Failure.invalid(
                "Only Checkout Sessions with a status in [\"open\"] can be expired.", param: "session")
        }
        session["status"] = "expired"
        sessions[id] = session
        let rendered = render(session: session, expand: [])
        emit("checkout.session.expired", rendered)
        return rendered
    }

    // MARK: Charges and money

    func makeCharge(amount: Int64, currency: String, paymentIntent: String, customer: String?) -> String {
        let id = newId("ch")
        // Settled in the account's currency when it is another (Stripe converts at its rate).
        var settled = amount
        var settlement = currency
        var rate: Any = NSNull()
        if let target = configuration.settlementCurrency?.lowercased(), target != currency.lowercased(),
            let exchange = configuration.exchangeRates[currency.lowercased()]
        {
            let major = Double(amount) / pow(10, Double(Self.exponent(currency)))
            settled = Int64((major * exchange * pow(10, Double(Self.exponent(target)))).rounded())
            settlement = target
            rate = exchange
        }
        let fee = settled == 0 ? 0 : (settled * 29 + 500) / 1000 + 30
        let txn = newId("txn")
        balanceTransactions[txn] = [
            "id": txn, "object": "balance_transaction", "amount": settled, "fee": fee, "net": settled - fee,
            "currency": settlement, "exchange_rate": rate, "status": "pending", "type": "charge",
            "reporting_category": "charge", "created": now,
            "fee_details": [
                ["amount": fee, "currency": settlement, "type": "stripe_fee", "description": "Stripe processing fees"]
            ],
        ]
        charges[id] = [
            "id": id, "object": "charge", "amount": amount, "amount_captured": amount, "amount_refunded": Int64(0),
            "refunded": false, "currency": currency, "status": "succeeded", "paid": true, "captured": true,
            "disputed": false, "payment_intent": paymentIntent, "balance_transaction": txn,
            "customer": customer ?? NSNull(), "created": now, "livemode": configuration.livemode,
            "metadata": paymentIntents[paymentIntent]?["metadata"] ?? [:],
            "billing_details": ["address": ["country": "US"]],
        ]
        return id
    }

    func latestCharge(ofSession session: Object) -> String? {
        if let pi = session["payment_intent"] as? String { return paymentIntents[pi]?["latest_charge"] as? String }
        if let invoice = session["invoice"] as? String, let pi = invoices[invoice]?["payment_intent_id"] as? String {
            return paymentIntents[pi]?["latest_charge"] as? String
        }
        return nil
    }

    public func paymentIntent(_ id: String, expand: Set<String>) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard paymentIntents[id] != nil else { throw Failure.missing(id) }
        var out = intentObject(id)
        if let charge = out["latest_charge"] as? String, expand.contains(where: { $0.hasPrefix("latest_charge") }) {
            out["latest_charge"] = try self.charge(
                charge, expand: expand.contains("latest_charge.balance_transaction") ? ["balance_transaction"] : [])
        }
        return out
    }

    func intentObject(_ id: String) -> Object { paymentIntents[id] ?? [:] }

    func chargeObject(_ id: String) -> Object {
        var charge = charges[id] ?? [:]
        let list = refunds.values.filter { ($0["charge"] as? String) == id }
            .sorted {
                ($0["created"] as? Int64 ?? 0, $0["id"] as? String ?? "") > (
                    $1["created"] as? Int64 ?? 0, $1["id"] as? String ?? ""
                )
            }
        charge["refunds"] = ["object": "list", "has_more": false, "data": list] as Object
        return charge
    }

    public func charge(_ id: String, expand: Set<String>) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard charges[id] != nil else { throw Failure.missing(id) }
        var out = chargeObject(id)
        if expand.contains("balance_transaction"), let txn = out["balance_transaction"] as? String {
            out["balance_transaction"] = balanceTransactions[txn] ?? txn
        }
        return out
    }

    /// A refund of `amount` (nil: what is left) of a payment intent's charge.
    public func refund(
        paymentIntent: String?, charge chargeId: String?, amount: Int64?, reason: String?,
        idempotencyKey: String?
    ) throws -> (Object, Bool) {
        lock.lock()
        defer { lock.unlock() }
        let parameters = "pi=\(paymentIntent ?? "")&charge=\(chargeId ?? "")&amount=\(amount.map(String.init) ?? "")"
        return try idempotent(idempotencyKey, parameters: parameters) {
            let id = chargeId ?? paymentIntent.flatMap { paymentIntents[$0]?["latest_charge"] as? String }
            guard let id, var charge = charges[id] else { throw Failure.missing(chargeId ?? paymentIntent ?? "") }
            let total = charge["amount"] as? Int64 ?? 0
            let refunded = charge["amount_refunded"] as? Int64 ?? 0
            let value = amount ?? (total - refunded)
            guard value > 0 else {
                throw Failure(
                    400, "invalid_request_error", "charge_already_refunded", "Charge \(id) has already been refunded.")
            }
            guard refunded + value <= total else {
                throw Failure.invalid(
                    "Refund amount (\(value)) is greater than unrefunded amount on charge (\(total - refunded))",
                    param: "amount")
            }
            charge["amount_refunded"] = refunded + value
            charge["refunded"] = refunded + value == total
            charges[id] = charge
            let refundId = newId("re")
            let txn = newId("txn")
            let currency = charge["currency"] as? String ?? "usd"
            balanceTransactions[txn] = [
                "id": txn, "object": "balance_transaction", "amount": -value, "fee": Int64(0), "net": -value,
                "currency": currency, "status": "available", "type": "refund", "reporting_category": "refund",
                "created": now,
            ]
            refunds[refundId] = [
                "id": refundId, "object": "refund", "amount": value, "charge": id,
                "payment_intent": charge["payment_intent"] ?? NSNull(), "currency": currency, "status": "succeeded",
                "reason": reason ?? NSNull(), "created": now, "balance_transaction": txn,
                "metadata": [String: String](),
            ]
            emit("refund.created", refunds[refundId]!)
            emit("charge.refunded", chargeObject(id))
            return refunds[refundId]!
        }
    }

    public func refundObject(_ id: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard let refund = refunds[id] else { throw Failure.missing(id) }
        return refund
    }

    public func refundList(charge: String) -> Object {
        lock.lock()
        defer { lock.unlock() }
        let list = refunds.values.filter { ($0["charge"] as? String) == charge }
            .sorted {
                ($0["created"] as? Int64 ?? 0, $0["id"] as? String ?? "") > (
                    $1["created"] as? Int64 ?? 0, $1["id"] as? String ?? ""
                )
            }
        return ["object": "list", "has_more": false, "url": "/v1/refunds", "data": list]
    }

    // MARK: Customers and the portal

    public func createCustomer(metadata: [String: String], idempotencyKey: String?) throws -> (Object, Bool) {
        lock.lock()
        defer { lock.unlock() }
        return try idempotent(
            idempotencyKey,
            parameters: metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "&")
        ) {
            let id = newId("cus")
            customers[id] = ["id": id, "object": "customer", "metadata": metadata, "created": now, "email": NSNull()]
            emit("customer.created", customers[id]!)
            return customers[id]!
        }
    }

    public func portalSession(customer: String, returnURL: String?, baseURL: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard customers[customer] != nil else { throw Failure.missing(customer) }
        let id = newId("bps")
        return [
            "id": id, "object": "billing_portal.session", "customer": customer,
            "url": "\(baseURL)/portal/\(id)?customer=\(customer)",
            "return_url": returnURL ?? NSNull(), "created": now, "livemode": configuration.livemode,
        ]
    }

    // MARK: Events

    func emit(_ type: String, _ object: Object, previous: Object? = nil) {
        rendered.removeAll(keepingCapacity: true)
        let id = newId("evt")
        var data: Object = ["object": object]
        if let previous { data["previous_attributes"] = previous }
        let body: Object = [
            "id": id, "object": "event", "api_version": configuration.apiVersion, "created": now, "type": type,
            "livemode": configuration.livemode, "pending_webhooks": 1,
            "request": ["id": NSNull(), "idempotency_key": NSNull()] as Object, "data": data,
        ]
        events.append((id, type, now, body))
    }

    public func event(_ id: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard let event = events.first(where: { $0.id == id }) else { throw Failure.missing(id) }
        return event.body
    }

    /// `GET /v1/events`: newest first, `created[gte]`, `starting_after`, `limit`.
    public func eventList(createdAfter: Int64?, startingAfter: String?, limit: Int, types: Set<String> = [])
        -> Object
    {
        lock.lock()
        defer { lock.unlock() }
        var list = events.reversed().filter {
            $0.created >= (createdAfter ?? 0) && (types.isEmpty || types.contains($0.type))
        }
        if let startingAfter, let index = list.firstIndex(where: { $0.id == startingAfter }) {
            list = Array(list[(index + 1)...])
        }
        let page = list.prefix(max(1, min(limit, 100)))
        return ["object": "list", "url": "/v1/events", "has_more": list.count > page.count, "data": page.map(\.body)]
    }

    /// Events since index `from` (the webhook sender's cursor).
    /// The event at `index` (oldest first), if there is one.
    public func event(at index: Int) -> Object? {
        lock.lock()
        defer { lock.unlock() }
        return events.indices.contains(index) ? events[index].body : nil
    }

    public func events(from index: Int) -> [(id: String, body: Object)] {
        lock.lock()
        defer { lock.unlock() }
        return index < events.count ? events[index...].map { ($0.id, $0.body) } : []
    }

    public var eventCount: Int { locked { events.count } }

    /// The test clock's time (Unix seconds).
    public var clock: Int64 { locked { now } }

    /// Every event so far: (id, type), oldest first.
    public func eventSummaries() -> [(id: String, type: String)] { locked { events.map { ($0.id, $0.type) } } }

    func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}
