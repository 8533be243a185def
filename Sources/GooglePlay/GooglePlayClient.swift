import Foundation
import NIOCore
import NIOHTTP1

/// The Google Play Developer API for one app (`packageName`): purchases read, acknowledged,
/// consumed; voided purchases listed; refund reviews answered (google-play.md §3–§6). Every
/// call has a deadline; a 401 is retried once with a new access token; errors are classified
/// (`GooglePlayError.Kind`).
public struct GooglePlayClient: Sendable {
    public let packageName: String
    /// The Android Publisher root (`https://androidpublisher.googleapis.com`).
    public let baseURL: String
    let tokens: AccessTokenSource
    let connections: HTTP1Connections
    let timeout: Duration
    /// `baseURL`'s scheme, host and port (nil: not an http(s) address — every call fails).
    let origin: HTTP1Connections.Origin?
    /// `baseURL`'s path, before every call's.
    let basePath: String

    public init(
        packageName: String, baseURL: String = "https://androidpublisher.googleapis.com", tokens: AccessTokenSource,
        connections: HTTP1Connections = .shared, timeout: Duration = .seconds(10)
    ) {
        self.packageName = packageName
        let base = baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL
        self.baseURL = base
        self.tokens = tokens
        self.connections = connections
        self.timeout = timeout
        origin = HTTP1Connections.Origin(url: base)
        let afterScheme = base.firstRange(of: "://").map { base[$0.upperBound...] } ?? ""
        basePath = afterScheme.firstIndex(of: "/").map { String(afterScheme[$0...]) } ?? ""
    }

    /// Percent-encodes a path segment (tokens and order ids are opaque).
    public static func segment(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }

    var applicationPath: String { "/androidpublisher/v3/applications/\(Self.segment(packageName))" }

    // MARK: Purchases

    public func productPurchase(token: String) async throws -> ProductPurchaseV2 {
        try await decode(
            ProductPurchaseV2.self,
            try await call(.GET, "\(applicationPath)/purchases/productsv2/tokens/\(Self.segment(token))"))
    }

    public func subscriptionPurchase(token: String) async throws -> SubscriptionPurchaseV2 {
        try await decode(
            SubscriptionPurchaseV2.self,
            try await call(.GET, "\(applicationPath)/purchases/subscriptionsv2/tokens/\(Self.segment(token))"))
    }

    public func acknowledgeProduct(productId: String, token: String) async throws {
        _ = try await call(
            .POST,
            "\(applicationPath)/purchases/products/\(Self.segment(productId))/tokens/\(Self.segment(token)):acknowledge",
            body: Data("{}".utf8))
    }

    public func consumeProduct(productId: String, token: String) async throws {
        _ = try await call(
            .POST,
            "\(applicationPath)/purchases/products/\(Self.segment(productId))/tokens/\(Self.segment(token)):consume")
    }

    public func acknowledgeSubscription(productId: String, token: String) async throws {
        _ = try await call(
            .POST,
            "\(applicationPath)/purchases/subscriptions/\(Self.segment(productId))/tokens/\(Self.segment(token)):acknowledge",
            body: Data("{}".utf8))
    }

    /// One page of voided purchases (one-time and subscriptions, with partial refunds).
    public func voidedPurchases(startTime: Date?, pageToken: String?, maxResults: Int = 1000) async throws
        -> VoidedPurchasesListResponse
    {
        var query = ["type=1", "includeQuantityBasedPartialRefund=true", "maxResults=\(maxResults)"]
        if let pageToken {
            query.append("token=\(Self.segment(pageToken))")
        } else if let startTime {
            query.append("startTime=\(Int64(startTime.timeIntervalSince1970 * 1000))")
        }
        return try await decode(
            VoidedPurchasesListResponse.self,
            try await call(.GET, "\(applicationPath)/purchases/voidedpurchases?\(query.joined(separator: "&"))"))
    }

    /// `orders.get`: what an order charged (the Orders API needs the service account's
    /// "View financial data" permission).
    public func order(orderId: String) async throws -> GoogleOrder {
        try await decode(GoogleOrder.self, try await call(.GET, "\(applicationPath)/orders/\(Self.segment(orderId))"))
    }

    /// `orders.batchGet`: up to 1,000 distinct orders in one call (one unknown id fails it:
    /// `.notFound`), in no promised order.
    public func orders(orderIds: [String]) async throws -> [GoogleOrder] {
        precondition(!orderIds.isEmpty && orderIds.count <= 1000, "orders.batchGet takes 1 to 1000 order ids")
        let query = orderIds.map { "orderIds=\(Self.segment($0))" }.joined(separator: "&")
        return try await decode(
            GoogleOrders.self, try await call(.GET, "\(applicationPath)/orders:batchGet?\(query)")
        ).orders ?? []
    }

    /// `orders.reviewrefund`: Google records the first answer per review.
    public func reviewRefund(orderId: String, _ request: ReviewRefundRequest) async throws {
        _ = try await call(
            .POST, "\(applicationPath)/orders/\(Self.segment(orderId)):reviewrefund",
            body: try JSONEncoder().encode(request))
    }

    /// `orders.refund`: refunds an order; with `revoke` Google also takes back what it bought
    /// (a subscription ends at once) and reports it as a voided purchase.
    public func refundOrder(orderId: String, revoke: Bool) async throws {
        _ = try await call(.POST, "\(applicationPath)/orders/\(Self.segment(orderId)):refund?revoke=\(revoke)")
    }

    /// How `purchases.subscriptionsv2.revoke` refunds: the whole latest charge, or what is left of
    /// its period.
    public enum Revocation: String, Sendable, CaseIterable {
        case fullRefund, proratedRefund
    }

    /// `purchases.subscriptionsv2.revoke`: refunds the subscription's latest charge (in full or
    /// prorated) and ends its access and renewals now; Google notifies `SUBSCRIPTION_REVOKED`.
    public func revokeSubscription(token: String, _ revocation: Revocation) async throws {
        let body = #"{"revocationContext":{"\#(revocation.rawValue)":{}}}"#
        _ = try await call(
            .POST, "\(applicationPath)/purchases/subscriptionsv2/tokens/\(Self.segment(token)):revoke",
            body: Data(body.utf8))
    }

    /// `purchases.subscriptionsv2.defer`: moves the subscription's next billing date (and its
    /// access) by `seconds` (1 day to 1 year), guarded by the `etag` of the state it was read in.
    public func deferSubscription(token: String, seconds: Int, etag: String?) async throws {
        struct Body: Encodable {
            struct Context: Encodable {
                var deferDuration: String
                var etag: String?
            }
            var deferralContext: Context
        }
        _ = try await call(
            .POST, "\(applicationPath)/purchases/subscriptionsv2/tokens/\(Self.segment(token)):defer",
            body: try JSONEncoder().encode(Body(deferralContext: .init(deferDuration: "\(seconds)s", etag: etag))))
    }

    // MARK: External transactions (US programs: payments taken outside Google Play)

    /// `externaltransactions.createexternaltransaction`: reports one payment (an initial one
    /// with the app's token, a renewal with the first report's id) under `id`.
    public func createExternalTransaction(id: String, _ transaction: ExternalTransaction) async throws
        -> ExternalTransaction
    {
        try await decode(
            ExternalTransaction.self,
            try await call(
                .POST, "\(applicationPath)/externalTransactions?externalTransactionId=\(Self.segment(id))",
                body: try JSONEncoder().encode(transaction)))
    }

    /// `externaltransactions.getexternaltransaction`.
    public func externalTransaction(id: String) async throws -> ExternalTransaction {
        try await decode(
            ExternalTransaction.self,
            try await call(.GET, "\(applicationPath)/externalTransactions/\(Self.segment(id))"))
    }

    /// `externaltransactions.refundexternaltransaction`: a full or partial refund.
    public func refundExternalTransaction(id: String, _ refund: ExternalTransactionRefund) async throws
        -> ExternalTransaction
    {
        try await decode(
            ExternalTransaction.self,
            try await call(
                .POST, "\(applicationPath)/externalTransactions/\(Self.segment(id)):refund",
                body: try JSONEncoder().encode(refund)))
    }

    // MARK: HTTP

    func call(_ method: HTTPMethod, _ path: String, body: Data? = nil) async throws -> [UInt8] {
        guard let origin else {
            throw GooglePlayError(
                .configuration, "the Developer API's address '\(baseURL.prefix(200))' is not an http(s) URL")
        }
        var retried = false
        while true {
            let token: String
            if let fresh = tokens.freshToken { token = fresh } else { token = try await tokens.token() }
            var headers = [("Authorization", "Bearer \(token)"), ("Accept", "application/json")]
            if body != nil { headers.append(("Content-Type", "application/json")) }
            let answer = try await GoogleHTTP.exchange(
                connections, method, origin: origin, target: basePath + path, headers: headers,
                body: body.map { Array($0) }, timeout: timeout, maxBody: 4 << 20)
            if answer.isSuccess { return answer.body }
            if answer.status == 401, !retried {
                retried = true
                await tokens.invalidate()
                continue
            }
            throw Self.error(status: answer.status, body: answer.body)
        }
    }

    static func error(status: Int, body: [UInt8]) -> GooglePlayError {
        let detail = (try? JSONDecoder().decode(GoogleErrorBody.self, from: Data(body)))?.error
        let reason = detail?.errors?.first?.reason
        let message = "Google Play answered \(status)\(detail?.message.map { ": \($0.prefix(200))" } ?? "")"
        let kind: GooglePlayError.Kind =
            switch status {
            case 404, 410: .notFound
            case 400 where reason == "invalidValue" || reason == "purchaseTokenNotFound": .notFound
            case 401, 403: .unauthorized
            case 409, 429, 500...: .unavailable
            default: .refused
            }
        return GooglePlayError(kind, message, status: status, reason: reason)
    }

    func decode<T: Decodable>(_ type: T.Type, _ body: [UInt8]) throws -> T {
        do {
            // A one-time purchase, read on every Google delivery, by hand (`JSONDecoder` else).
            if type == ProductPurchaseV2.self { return try ProductPurchaseV2.decode(json: body) as! T }
            return try JSONDecoder().decode(type, from: Data(body))
        } catch {
            throw GooglePlayError(.malformed, "Google Play answered a malformed \(type): \(error)")
        }
    }
}
