import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Errors from the server other than a submission's verdict.
public enum BackendError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The server answered with an error (docs/api.md's `{"error": {"code", "message", "retryable"}}`).
    case server(status: Int, code: String, message: String, retryable: Bool)
    /// No answer: offline, timeout, connection reset.
    case network(String)
    /// An answer that is not the contract's JSON.
    case malformed(String)
    /// An answer whose signature did not verify though signing keys are configured: not the
    /// server's word (held, retried), and worth telling the app's developers about.
    case unverifiedAnswer(SignatureProblem)

    public var description: String {
        switch self {
        case .server(let status, let code, let message, _): "\(status) \(code): \(message)"
        case .network(let message): "network: \(message)"
        case .malformed(let message): "malformed answer: \(message)"
        case .unverifiedAnswer(let problem): "unverified answer: \(problem)"
        }
    }

    public var isRetryable: Bool {
        switch self {
        case .server(_, _, _, let retryable): retryable
        case .network, .unverifiedAnswer: true
        case .malformed: false
        }
    }
}

/// The app's client tokens (docs/api.md: HS256 JWT, `sub` = accountId), minted by the app's own
/// backend. `refresh` is true after the server answered 401 to the previous one.
public typealias ClientTokenProvider = @Sendable (_ accountId: String, _ refresh: Bool) async throws -> String

/// How requests reach the server: `URLSession` by default; an app with its own networking
/// stack (or a simulator running hundreds of devices on Linux, where `URLSession` stalls under
/// that much concurrency) brings its own.
public protocol HTTPTransport: Sendable {
    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse)
}

public struct URLSessionTransport: HTTPTransport {
    let session: URLSession
    public init(session: URLSession = .shared) { self.session = session }
    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await session.data(for: request)
        guard let http = response as? HTTPURLResponse else { throw BackendError.network("no HTTP response") }
        return (data, http)
    }
}

/// The StoreKeeper server over HTTP, with a client token on every call; a 401 asks the app
/// for a fresh token once, then tries again. Given the server's answer-signing keys (the
/// current one, and during a rotation the next), purchase and account answers count only when
/// their signature verifies with the key it names (over a fresh nonce per request, the method,
/// path and body sent, the status and the body answered); anything else is
/// `unverified_answer` — held, never a verdict, and reported (`BackendError.unverifiedAnswer`).
public struct HTTPBackend: Backend {
    public var baseURL: URL
    public var timeout: TimeInterval
    /// The keys an answer may be signed with; empty: answers are not checked.
    public var responseSigningKeys: [ResponseSigningKey]
    /// The first of `responseSigningKeys` (kept for apps written against one key).
    public var responseSigningKey: ResponseSigningKey? {
        get { responseSigningKeys.first }
        set { responseSigningKeys = newValue.map { [$0] } ?? [] }
    }
    /// This app's id on the server (`apps[].id`): sent with every order and purchase — a server
    /// that serves several apps (an iOS and an Android app) refuses an order without it.
    public var appId: String?
    let transport: HTTPTransport
    let tokens: ClientTokenProvider
    /// Answers refused because their signature did not verify.
    public let signatureDiagnostics: SignatureDiagnostics? = SignatureDiagnostics()

    public init(
        baseURL: URL, appId: String? = nil, timeout: TimeInterval = 30,
        transport: HTTPTransport = URLSessionTransport(),
        responseSigningKey: ResponseSigningKey? = nil, tokens: @escaping ClientTokenProvider
    ) {
        self.init(
            baseURL: baseURL, appId: appId, timeout: timeout, transport: transport,
            responseSigningKeys: responseSigningKey.map { [$0] } ?? [], tokens: tokens)
    }

    /// `responseSigningKeys`: every key the server may sign with while this build is installed —
    /// every one `GET /v1/status` lists in `responseSigningKeys` (the current and, during a
    /// rotation, the next).
    public init(
        baseURL: URL, appId: String? = nil, timeout: TimeInterval = 30,
        transport: HTTPTransport = URLSessionTransport(),
        responseSigningKeys: [ResponseSigningKey], tokens: @escaping ClientTokenProvider
    ) {
        self.appId = appId
        self.baseURL = baseURL
        self.timeout = timeout
        self.transport = transport
        self.responseSigningKeys = responseSigningKeys
        self.tokens = tokens
    }

    struct Answer {
        var status: Int
        var body: Data
        var retryAfter: TimeInterval?
        /// An unsigned 503 (the load shedder's): its body is not the server's word.
        var unsignedUnavailable = false
        /// The server's `Date` header: its time when it answered.
        var serverDate: Date? = nil
    }

    /// An HTTP date (RFC 9110's IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`), read by hand: no
    /// `DateFormatter` (on Linux its shared ICU state is not safe to build from many threads at once).
    static func httpDate(_ text: String?) -> Date? {
        guard let text else { return nil }
        let parts = text.split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]), let year = Int(parts[3]),
            let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
                .firstIndex(of: String(parts[2])).map({ $0 + 1 })
        else { return nil }
        let clock = parts[4].split(separator: ":").compactMap { Int($0) }
        guard clock.count == 3, (1...31).contains(day), (1970...9999).contains(year), (0...23).contains(clock[0]),
            (0...59).contains(clock[1]), (0...60).contains(clock[2])
        else { return nil }
        // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
        let y = month <= 2 ? year - 1 : year
        let era = y / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = era * 146_097 + dayOfEra - 719_468
        return Date(timeIntervalSince1970: TimeInterval(days * 86_400 + clock[0] * 3600 + clock[1] * 60 + clock[2]))
    }

    struct ErrorBody: Decodable {
        struct Inner: Decodable {
            var code: String
            var message: String?
            var retryable: Bool?
        }
        var error: Inner
    }

    /// An answer whose signature did not verify (or was missing) though keys are configured.
    public struct UnsignedAnswer: Error, CustomStringConvertible, Sendable {
        public var path: String
        public var problem: SignatureProblem
        public var description: String { "the answer to \(path): \(problem)" }
    }

    func send(_ method: String, _ path: String, accountId: String, body: Data?, signed: Bool = false) async throws
        -> Answer
    {
        var answer = try await sendOnce(
            method, path, token: try await tokens(accountId, false), body: body, signed: signed)
        if answer.status == 401 {
            answer = try await sendOnce(
                method, path, token: try await tokens(accountId, true), body: body, signed: signed)
        }
        return answer
    }

    func sendOnce(_ method: String, _ path: String, token: String, body: Data?, signed: Bool) async throws -> Answer {
        var base = baseURL.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base + "/" + path) else { throw BackendError.malformed("bad URL for \(path)") }
        var request = URLRequest(url: url, timeoutInterval: timeout)
        request.httpMethod = method
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        let nonce = UUID().uuidString.lowercased()
        let checked = signed && !responseSigningKeys.isEmpty
        if checked {
            request.setValue(nonce, forHTTPHeaderField: "StoreKeeper-Nonce")
            request.setValue("2", forHTTPHeaderField: "StoreKeeper-Signature-Version")
        }
        if let body {
            request.httpBody = body
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, http): (Data, HTTPURLResponse)
        do {
            (data, http) = try await transport.send(request)
        } catch {
            if Self.isCancellation(error) { throw CancellationError() }
            throw BackendError.network(String(describing: error))
        }
        let retryAfter = (http.value(forHTTPHeaderField: "Retry-After")).flatMap(TimeInterval.init)
        if checked,
            let problem = responseSigningKeys.problem(
                http.value(forHTTPHeaderField: "StoreKeeper-Signature"), nonce: nonce, method: method,
                path: "/" + path, status: http.statusCode, requestBody: body ?? Data(), body: data)
        {
            // The server's load shedder and deadline answer 503 unsigned: "later", never a
            // verdict — taken as such, with its Retry-After (a man in the middle can always
            // make the device wait by dropping the connection anyway).
            if http.statusCode == 503 {
                return Answer(status: 503, body: Data(), retryAfter: retryAfter, unsignedUnavailable: true)
            }
            signatureDiagnostics?.record(problem)
            throw UnsignedAnswer(path: "/" + path, problem: problem)
        }
        return Answer(
            status: http.statusCode, body: data, retryAfter: retryAfter,
            serverDate: Self.httpDate(http.value(forHTTPHeaderField: "Date")))
    }

    static func isCancellation(_ error: Error) -> Bool {
        if Task.isCancelled || error is CancellationError { return true }
        if let error = error as? URLError, error.code == .cancelled { return true }
        return false
    }

    static func error(_ answer: Answer) -> BackendError {
        let parsed = try? JSONDecoder().decode(ErrorBody.self, from: answer.body)
        return .server(
            status: answer.status, code: parsed?.error.code ?? "http_\(answer.status)",
            message: parsed?.error.message ?? "",
            retryable: parsed?.error.retryable ?? (answer.status >= 500 || answer.status == 408 || answer.status == 429)
        )
    }

    static func path(_ segment: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "/?#")
        return segment.addingPercentEncoding(withAllowedCharacters: allowed) ?? segment
    }

    public func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder {
        try await createOrder(
            accountId: accountId, productId: productId, quantity: quantity, offerId: nil, appTransactionId: nil)
    }

    public func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, appTransactionId: String?
    ) async throws -> ServerOrder {
        try await createOrder(
            accountId: accountId, productId: productId, quantity: quantity, offerId: offerId, winBackOfferId: nil,
            appTransactionId: appTransactionId)
    }

    public func createOrder(
        accountId: String, productId: String, quantity: Int, offerId: String?, winBackOfferId: String?,
        appTransactionId: String?
    ) async throws -> ServerOrder {
        struct Body: Encodable {
            var accountId: String
            var productId: String
            var quantity: Int
            var offerId: String?
            var winBackOfferId: String?
            var appTransactionId: String?
            var appId: String?
        }
        let answer = try await send(
            "POST", "v1/orders", accountId: accountId,
            body: try JSONEncoder().encode(
                Body(
                    accountId: accountId, productId: productId, quantity: quantity, offerId: offerId,
                    winBackOfferId: winBackOfferId, appTransactionId: appTransactionId, appId: appId)))
        guard answer.status == 201 || answer.status == 200 else { throw Self.error(answer) }
        do {
            return try JSONDecoder().decode(ServerOrder.self, from: answer.body)
        } catch {
            throw BackendError.malformed("order: \(error)")
        }
    }

    public func cancelOrder(accountId: String, orderId: String) async throws {
        let answer = try await send(
            "POST", "v1/orders/\(Self.path(orderId))/cancel", accountId: accountId, body: Data("{}".utf8))
        // 409: paid meanwhile (a late payment is still delivered); 404: already gone.
        guard answer.status == 200 || answer.status == 409 || answer.status == 404 else { throw Self.error(answer) }
    }

    public func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
        -> SubmissionVerdict
    {
        struct Body: Encodable {
            var accountId: String
            var orderId: String?
            var signedTransaction: String?
            var signedTransactions: [String]?
            var receipt: String?
            var transactionId: String?
            var appId: String?
        }
        var body = Body(accountId: accountId, orderId: orderId, appId: appId)
        switch proof {
        case .signedTransaction(let jws): body.signedTransaction = jws
        case .signedTransactions(let list):
            body.signedTransactions = list
            body.orderId = nil
        case .receipt(let receipt):
            body.receipt = receipt
            body.transactionId = transactionId
        case .transactionId(let id): body.transactionId = id
        }
        let answer: Answer
        do {
            answer = try await send(
                "POST", "v1/purchases", accountId: accountId, body: try JSONEncoder().encode(body), signed: true)
        } catch {
            // Cancelled here (URLSession honours task cancellation): not the network's answer.
            if Self.isCancellation(error) { return .cancelled }
            if error is UnsignedAnswer { return .retryable(status: nil, code: "unsigned_answer", retryAfter: nil) }
            return .retryable(status: nil, code: "network", retryAfter: nil)
        }
        if answer.unsignedUnavailable {
            return .retryable(status: 503, code: "unavailable", retryAfter: answer.retryAfter)
        }
        switch answer.status {
        case 200:
            guard let response = try? JSONDecoder().decode(PurchaseResponse.self, from: answer.body) else {
                // A 200 that is not the contract's: something between us and the server
                // (a captive portal) answered. Not a verdict.
                return .retryable(status: 200, code: "malformed_answer", retryAfter: nil)
            }
            return .accepted(response)
        case 202:
            struct Pending: Decodable { var retryAfterSeconds: Double? }
            let pending = try? JSONDecoder().decode(Pending.self, from: answer.body)
            return .pending(retryAfter: pending?.retryAfterSeconds ?? answer.retryAfter)
        default:
            let parsed = try? JSONDecoder().decode(ErrorBody.self, from: answer.body)
            // `retryable` as the server said it: a body that is not the server's envelope has none.
            return SubmissionVerdict.classify(
                status: answer.status, code: parsed?.error.code, message: parsed?.error.message,
                retryable: parsed?.error.retryable, retryAfter: answer.retryAfter)
                ?? .retryable(status: answer.status, code: nil, retryAfter: answer.retryAfter)
        }
    }

    /// `PUT /v1/accounts/{accountId}/consent`.
    public func setConsumptionDataConsent(accountId: String, granted: Bool) async throws {
        let answer = try await send(
            "PUT", "v1/accounts/\(Self.path(accountId))/consent", accountId: accountId,
            body: Data(#"{"consumptionData":\#(granted)}"#.utf8))
        guard answer.status == 200 else { throw Self.error(answer) }
    }

    /// `POST /v1/redemptions/{code}` with the account's client token: 409 `already_redeemed`,
    /// 410 `redemption_expired`, 404 for a code no paid purchase has.
    public func redeem(accountId: String, code: String) async throws {
        let answer = try await send(
            "POST", "v1/redemptions/\(Self.path(code))", accountId: accountId, body: Data("{}".utf8))
        guard answer.status == 200 else { throw Self.error(answer) }
    }

    public func customerInfo(accountId: String) async throws -> CustomerInfo {
        let answer: Answer
        do {
            answer = try await send(
                "GET", "v1/accounts/\(Self.path(accountId))", accountId: accountId, body: nil, signed: true)
        } catch let unsigned as UnsignedAnswer {
            // Not the server's answer: as good as none (the cached view stands), and said.
            throw BackendError.unverifiedAnswer(unsigned.problem)
        }
        guard answer.status == 200 else { throw Self.error(answer) }
        do {
            var info = try JSONDecoder().decode(CustomerInfo.self, from: answer.body)
            info.serverTime = answer.serverDate
            return info
        } catch {
            throw BackendError.malformed("account: \(error)")
        }
    }
}
