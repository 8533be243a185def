import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// What went wrong talking to Stripe.
public struct StripeError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// 404 `resource_missing`: the object does not exist (for this key's mode).
        case notFound
        /// 400/402 and other final refusals of the request.
        case refused
        /// 401/403: the key is wrong or lacks a permission; an operator must act.
        case unauthorized
        /// 409, 429, 5xx, timeouts, network: try again later.
        case unavailable
        /// An answer this adapter cannot read.
        case malformed
    }

    public var kind: Kind
    public var message: String
    public var status: Int?
    public var code: String?

    public init(_ kind: Kind, _ message: String, status: Int? = nil, code: String? = nil) {
        self.kind = kind
        self.message = message
        self.status = status
        self.code = code
    }

    public var description: String { "Stripe \(kind.rawValue): \(message)" }
    public var isRetryable: Bool { kind == .unavailable }
}

/// Stripe's API for one account and mode: form-encoded requests with `Stripe-Version` pinned,
/// an `Idempotency-Key` on every write, retried as Stripe's own SDKs retry (network errors,
/// 409, 5xx unless `Stripe-Should-Retry: false`, 429 only for `lock_timeout`; 0.5 s + 0.5 s × n²
/// capped at 5 s, jittered to 75–100 %, at most 2 retries), every attempt and the whole call
/// under a deadline.
public struct StripeClient: Sendable {
    public static let pinnedVersion = "2026-07-29.dahlia"

    public let baseURL: String
    public let apiVersion: String
    let secretKey: String
    let http: HTTPClient
    let attemptTimeout: Duration
    let deadline: Duration
    let maxRetries: Int

    public init(
        secretKey: String, apiVersion: String = StripeClient.pinnedVersion, baseURL: String = "https://api.stripe.com",
        http: HTTPClient = .shared, attemptTimeout: Duration = .seconds(10), deadline: Duration = .seconds(25),
        maxRetries: Int = 2
    ) {
        self.secretKey = secretKey
        self.apiVersion = apiVersion
        self.baseURL = baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL
        self.http = http
        self.attemptTimeout = attemptTimeout
        self.deadline = deadline
        self.maxRetries = maxRetries
    }

    /// Whether the key is a test-mode key (`sk_test_`, `rk_test_`).
    public var isTestMode: Bool { secretKey.hasPrefix("sk_test_") || secretKey.hasPrefix("rk_test_") }

    /// The same client with every call (and attempt) bounded by `limit`: a webhook answers
    /// Stripe within its own deadline whatever the API does.
    public func bounded(by limit: Duration) -> StripeClient {
        StripeClient(
            secretKey: secretKey, apiVersion: apiVersion, baseURL: baseURL, http: http,
            attemptTimeout: min(attemptTimeout, limit), deadline: min(deadline, limit), maxRetries: maxRetries)
    }

    public static func segment(_ text: String) -> String {
        // Stripe's ids are ASCII letters, digits and `_`: nothing to escape (the common case,
        // without Foundation's character sets).
        if !text.isEmpty,
            text.utf8.allSatisfy({
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x5F
                    || $0 == 0x2D
            })
        {
            return text
        }
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-_")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }

    // MARK: Checkout

    public func createCheckoutSession(_ form: StripeForm, idempotencyKey: String) async throws -> StripeCheckoutSession
    {
        try await send(.POST, "/v1/checkout/sessions", form: form, idempotencyKey: idempotencyKey)
    }

    /// A session with its line items, payment intent (its latest charge and balance
    /// transaction) and subscription expanded.
    public func checkoutSession(_ id: String) async throws -> StripeCheckoutSession {
        try await send(
            .GET,
            "/v1/checkout/sessions/\(Self.segment(id))?expand[]=line_items&expand[]=payment_intent.latest_charge.balance_transaction&expand[]=subscription"
        )
    }

    public func expireCheckoutSession(_ id: String) async throws -> StripeCheckoutSession {
        try await send(
            .POST, "/v1/checkout/sessions/\(Self.segment(id))/expire", form: StripeForm(),
            idempotencyKey: "expire:\(id)")
    }

    // MARK: Objects

    public func paymentIntent(_ id: String) async throws -> StripePaymentIntent {
        try await send(.GET, "/v1/payment_intents/\(Self.segment(id))?expand[]=latest_charge.balance_transaction")
    }

    public func charge(_ id: String) async throws -> StripeCharge {
        try await send(.GET, "/v1/charges/\(Self.segment(id))?expand[]=balance_transaction&expand[]=refunds")
    }

    public func refund(_ id: String) async throws -> StripeRefund {
        try await send(.GET, "/v1/refunds/\(Self.segment(id))")
    }

    /// Every refund of a charge (newest first, up to 100).
    public func refunds(charge: String) async throws -> StripeList<StripeRefund> {
        try await send(.GET, "/v1/refunds?charge=\(Self.segment(charge))&limit=100")
    }

    public func dispute(_ id: String) async throws -> StripeDispute {
        try await send(.GET, "/v1/disputes/\(Self.segment(id))")
    }

    /// Every dispute of a charge (newest first, up to 100).
    public func disputes(charge: String) async throws -> StripeList<StripeDispute> {
        try await send(.GET, "/v1/disputes?charge=\(Self.segment(charge))&limit=100")
    }

    public func subscription(_ id: String) async throws -> StripeSubscription {
        try await send(.GET, "/v1/subscriptions/\(Self.segment(id))?expand[]=latest_invoice")
    }

    public func invoice(_ id: String) async throws -> StripeInvoice {
        try await send(.GET, "/v1/invoices/\(Self.segment(id))?expand[]=payments")
    }

    /// Recent events, newest first (Stripe keeps 30 days).
    /// `types`: only these (Stripe takes up to 20).
    public func events(createdAfter: Int64?, startingAfter: String?, limit: Int = 100, types: [String] = [])
        async throws -> StripeList<StripeEvent>
    {
        var query = ["limit=\(max(1, min(limit, 100)))"]
        if let createdAfter { query.append("created[gte]=\(createdAfter)") }
        // Event types are lowercase letters, `.` and `_` (the URL is encoded once, by the client).
        for type in types.prefix(20)
        where type.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2E || $0 == 0x5F }) {
            query.append("types[]=\(type)")
        }
        if let startingAfter { query.append("starting_after=\(Self.segment(startingAfter))") }
        return try await send(.GET, "/v1/events?" + query.joined(separator: "&"))
    }

    // MARK: Writes

    public func createRefund(paymentIntent: String, amount: Int64?, reason: String?, idempotencyKey: String)
        async throws -> StripeRefund
    {
        var form = StripeForm()
        form.add("payment_intent", paymentIntent)
        form.add("amount", amount.map(String.init))
        form.add("reason", reason)
        return try await send(.POST, "/v1/refunds", form: form, idempotencyKey: idempotencyKey)
    }

    public func createCustomer(metadata: [String: String], idempotencyKey: String) async throws -> StripeCustomer {
        var form = StripeForm()
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) { form.add("metadata[\(key)]", value) }
        return try await send(.POST, "/v1/customers", form: form, idempotencyKey: idempotencyKey)
    }

    public func createPortalSession(customer: String, returnURL: String?, idempotencyKey: String) async throws
        -> StripePortalSession
    {
        var form = StripeForm()
        form.add("customer", customer)
        form.add("return_url", returnURL)
        return try await send(.POST, "/v1/billing_portal/sessions", form: form, idempotencyKey: idempotencyKey)
    }

    /// One cheap authenticated read (the pre-flight's).
    public func ping() async throws {
        let _: StripeList<StripeEvent> = try await send(.GET, "/v1/events?limit=1")
    }

    // MARK: HTTP

    func send<T: Decodable>(
        _ method: HTTPMethod, _ path: String, form: StripeForm? = nil, idempotencyKey: String? = nil
    )
        async throws -> T
    {
        let body = try await call(method, path, form: form, idempotencyKey: idempotencyKey)
        do {
            // The hot reads (a session, a payment intent) by hand, the rest by `JSONDecoder`.
            if let fast = T.self as? any StripeFastDecodable.Type {
                return try fast.decode(json: body) as! T
            }
            return try JSONDecoder().decode(T.self, from: Data(body))
        } catch {
            throw StripeError(.malformed, "unreadable answer to \(method) \(path.prefix(80)): \(error)")
        }
    }

    func call(_ method: HTTPMethod, _ path: String, form: StripeForm?, idempotencyKey: String?) async throws
        -> [UInt8]
    {
        let clock = ContinuousClock()
        let end = clock.now + deadline
        var attempt = 0
        while true {
            var request = HTTPClientRequest(url: baseURL + path)
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(secretKey)")
            request.headers.add(name: "Stripe-Version", value: apiVersion)
            request.headers.add(name: "User-Agent", value: "StoreKeeper")
            if method == .POST {
                request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
                if let idempotencyKey { request.headers.add(name: "Idempotency-Key", value: idempotencyKey) }
                request.body = .bytes(ByteBuffer(string: (form ?? StripeForm()).encoded))
            }
            let remaining = end - clock.now
            guard remaining > .zero else {
                throw StripeError(.unavailable, "Stripe did not answer within the deadline")
            }
            let timeout = min(remaining, attemptTimeout)
            var retryable: Bool
            var failure: StripeError
            do {
                let (seconds, attoseconds) = timeout.components
                let response = try await http.execute(
                    request, timeout: .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
                let body = Array(buffer: try await response.body.collect(upTo: 8 << 20))
                let status = Int(response.status.code)
                if (200..<300).contains(status) { return body }
                let envelope = try? JSONDecoder().decode(StripeErrorBody.self, from: Data(body))
                let message = envelope?.error.message ?? "HTTP \(status)"
                let code = envelope?.error.code
                let shouldRetry = response.headers.first(name: "Stripe-Should-Retry")
                switch status {
                case 404: failure = StripeError(.notFound, message, status: status, code: code)
                case 401, 403: failure = StripeError(.unauthorized, message, status: status, code: code)
                case 409, 429, 500...: failure = StripeError(.unavailable, message, status: status, code: code)
                default: failure = StripeError(.refused, message, status: status, code: code)
                }
                if shouldRetry == "true" {
                    retryable = true
                } else if shouldRetry == "false" {
                    retryable = false
                } else {
                    retryable = status == 409 || status >= 500 || (status == 429 && code == "lock_timeout")
                }
            } catch let error as StripeError {
                throw error
            } catch {
                failure = StripeError(.unavailable, "cannot reach Stripe: \(error)")
                retryable = true
            }
            guard retryable, attempt < maxRetries else { throw failure }
            attempt += 1
            let base = min(5.0, 0.5 + 0.5 * Double(attempt * attempt))
            let delay = Duration.milliseconds(Int(base * Double.random(in: 0.75...1.0) * 1000))
            guard clock.now + delay < end else { throw failure }
            try await Task.sleep(for: delay)
        }
    }
}
