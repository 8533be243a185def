import AppStoreModels
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// Client of the App Store Server API (Apple's App Store Server API documentation): ES256 token per request,
/// typed responses, Apple's error classes, `Retry-After` honoured, bounded retries.
public final class AppStoreServerAPIClient: Sendable {
    public struct Configuration: Sendable {
        public var credentials: ServerAPICredentials
        public var environment: AppStoreEnvironment
        /// Overrides Apple's host (the local App Store, tests).
        public var baseURL: String?
        /// Deadline of one HTTP exchange.
        public var timeout: Duration
        public var retryPolicy: RetryPolicy

        public init(
            credentials: ServerAPICredentials, environment: AppStoreEnvironment = .production, baseURL: String? = nil,
            timeout: Duration = .seconds(10), retryPolicy: RetryPolicy = RetryPolicy()
        ) {
            self.credentials = credentials
            self.environment = environment
            self.baseURL = baseURL
            self.timeout = timeout
            self.retryPolicy = retryPolicy
        }

        /// Apple's host for the environment (2026-05 domains).
        public var resolvedBaseURL: String {
            if let baseURL { return baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL }
            return environment == .sandbox ? "https://api.storekit-sandbox.apple.com" : "https://api.storekit.apple.com"
        }
    }

    public let configuration: Configuration
    private let httpClient: HTTPClient
    private let tokens: ServerAPITokenSigner

    /// - Parameter httpClient: shared by the caller, who also shuts it down.
    public init(configuration: Configuration, httpClient: HTTPClient = .shared) async throws {
        self.configuration = configuration
        self.httpClient = httpClient
        self.tokens = try await ServerAPITokenSigner(credentials: configuration.credentials)
    }

    // MARK: Endpoints

    /// Get Transaction Info — `GET /inApps/v1/transactions/{transactionId}`.
    public func getTransactionInfo(_ transactionId: String) async throws -> TransactionInfoResponse {
        try await send(.GET, "/inApps/v1/transactions/\(try pathSegment(transactionId))")
    }

    /// Get Transaction History (v2), one page — `GET /inApps/v2/history/{transactionId}`.
    public func getTransactionHistory(
        _ transactionId: String, revision: String? = nil, filter: TransactionHistoryFilter = .init()
    ) async throws -> HistoryResponse {
        var query = filter.queryItems
        if let revision { query.append(("revision", revision)) }
        return try await send(.GET, "/inApps/v2/history/\(try pathSegment(transactionId))", query: query)
    }

    /// Every page of the transaction history, following `revision` while `hasMore`.
    /// Stops after `maxPages` so a misbehaving server cannot loop forever.
    public func getAllTransactionHistory(
        _ transactionId: String, filter: TransactionHistoryFilter = .init(), maxPages: Int = 1000
    ) async throws -> [String] {
        var signed: [String] = []
        var revision: String?
        for _ in 0..<maxPages {
            let page = try await getTransactionHistory(transactionId, revision: revision, filter: filter)
            signed += page.signedTransactions ?? []
            guard page.hasMore == true, let next = page.revision, next != revision else { return signed }
            revision = next
        }
        throw AppStoreAPIError(
            kind: .malformedResponse, message: "history did not end after \(maxPages) pages", isRetryable: false)
    }

    /// Get All Subscription Statuses — `GET /inApps/v1/subscriptions/{transactionId}`.
    public func getAllSubscriptionStatuses(
        _ transactionId: String, status: [SubscriptionStatus] = []
    ) async throws -> StatusResponse {
        try await send(
            .GET, "/inApps/v1/subscriptions/\(try pathSegment(transactionId))",
            query: status.map { ("status", String($0.rawValue)) })
    }

    /// Get Refund History (v2), one page — `GET /inApps/v2/refund/lookup/{transactionId}`.
    public func getRefundHistory(_ transactionId: String, revision: String? = nil) async throws -> RefundHistoryResponse
    {
        try await send(
            .GET, "/inApps/v2/refund/lookup/\(try pathSegment(transactionId))",
            query: revision.map { [("revision", $0)] } ?? [])
    }

    /// Look Up Order ID — `GET /inApps/v1/lookup/{orderId}` (production only).
    public func lookUpOrderId(_ orderId: String) async throws -> OrderLookupResponse {
        try await send(.GET, "/inApps/v1/lookup/\(try pathSegment(orderId))")
    }

    /// Get App Transaction Info — `GET /inApps/v1/transactions/appTransactions/{transactionId}`.
    public func getAppTransactionInfo(_ transactionId: String) async throws -> AppTransactionInfoResponse {
        try await send(.GET, "/inApps/v1/transactions/appTransactions/\(try pathSegment(transactionId))")
    }

    /// Get Notification History, one page — `POST /inApps/v1/notifications/history`.
    /// Send the same request on every page.
    public func getNotificationHistory(
        _ request: NotificationHistoryRequest, paginationToken: String? = nil
    ) async throws -> NotificationHistoryResponse {
        try await send(
            .POST, "/inApps/v1/notifications/history", query: paginationToken.map { [("paginationToken", $0)] } ?? [],
            body: request)
    }

    /// Every page of the notification history.
    public func getAllNotificationHistory(
        _ request: NotificationHistoryRequest, maxPages: Int = 1000
    ) async throws -> [NotificationHistoryResponseItem] {
        var items: [NotificationHistoryResponseItem] = []
        var token: String?
        for _ in 0..<maxPages {
            let page = try await getNotificationHistory(request, paginationToken: token)
            items += page.notificationHistory ?? []
            guard page.hasMore == true, let next = page.paginationToken, next != token else { return items }
            token = next
        }
        throw AppStoreAPIError(
            kind: .malformedResponse, message: "notification history did not end after \(maxPages) pages",
            isRetryable: false)
    }

    /// Send Consumption Information (v2) — `PUT /inApps/v2/transactions/consumption/{transactionId}`; 202.
    public func sendConsumptionInformation(_ transactionId: String, _ request: ConsumptionRequest) async throws {
        try await sendExpectingNoBody(
            .PUT, "/inApps/v2/transactions/consumption/\(try pathSegment(transactionId))", body: request)
    }

    /// Send Consumption Information V1 — `PUT /inApps/v1/transactions/consumption/{transactionId}`.
    public func sendConsumptionInformationV1(_ transactionId: String, _ request: ConsumptionRequestV1) async throws {
        try await sendExpectingNoBody(
            .PUT, "/inApps/v1/transactions/consumption/\(try pathSegment(transactionId))", body: request)
    }

    /// Extend a Subscription Renewal Date — `PUT /inApps/v1/subscriptions/extend/{originalTransactionId}`.
    public func extendSubscriptionRenewalDate(
        _ originalTransactionId: String, _ request: ExtendRenewalDateRequest
    ) async throws -> ExtendRenewalDateResponse {
        try await send(.PUT, "/inApps/v1/subscriptions/extend/\(try pathSegment(originalTransactionId))", body: request)
    }

    /// Extend Subscription Renewal Dates for All Active Subscribers — `POST /inApps/v1/subscriptions/extend/mass`.
    public func extendRenewalDatesForAllActiveSubscribers(
        _ request: MassExtendRenewalDateRequest
    ) async throws -> MassExtendRenewalDateResponse {
        try await send(.POST, "/inApps/v1/subscriptions/extend/mass", body: request)
    }

    /// Get Status of Subscription Renewal Date Extensions.
    public func getStatusOfSubscriptionRenewalDateExtensions(
        productId: String, requestIdentifier: String
    ) async throws -> MassExtendRenewalDateStatusResponse {
        try await send(
            .GET,
            "/inApps/v1/subscriptions/extend/mass/\(try pathSegment(productId))/\(try pathSegment(requestIdentifier))")
    }

    /// Set App Account Token — `PUT /inApps/v1/transactions/{originalTransactionId}/appAccountToken`.
    public func setAppAccountToken(_ originalTransactionId: String, appAccountToken: UUID) async throws {
        try await sendExpectingNoBody(
            .PUT, "/inApps/v1/transactions/\(try pathSegment(originalTransactionId))/appAccountToken",
            body: UpdateAppAccountTokenRequest(appAccountToken: appAccountToken.uuidString.lowercased()))
    }

    /// Request a Test Notification — `POST /inApps/v1/notifications/test`.
    public func requestTestNotification() async throws -> SendTestNotificationResponse {
        try await send(.POST, "/inApps/v1/notifications/test")
    }

    /// Get Test Notification Status — `GET /inApps/v1/notifications/test/{testNotificationToken}`.
    public func getTestNotificationStatus(_ token: String) async throws -> CheckTestNotificationResponse {
        try await send(.GET, "/inApps/v1/notifications/test/\(try pathSegment(token))")
    }

    /// Finish Transaction — `POST /inApps/v1/transactions/{transactionId}/finish`.
    public func finishTransaction(_ transactionId: String) async throws {
        try await sendExpectingNoBody(.POST, "/inApps/v1/transactions/\(try pathSegment(transactionId))/finish")
    }

    /// Send External Purchase Report — `PUT /externalPurchase/v1/reports` (External Purchase
    /// Server API, same hosts and token). A 400 means nothing of the report was accepted.
    public func sendExternalPurchaseReport(_ report: ExternalPurchaseReport) async throws {
        let _: SendExternalPurchaseReportResponse = try await send(.PUT, "/externalPurchase/v1/reports", body: report)
    }

    /// Retrieve External Purchase Report — `GET /externalPurchase/v1/reports/{requestIdentifier}`.
    public func retrieveExternalPurchaseReport(_ requestIdentifier: String) async throws -> ExternalPurchaseReport {
        try await send(.GET, "/externalPurchase/v1/reports/\(try pathSegment(requestIdentifier))")
    }

    // MARK: Transport

    private struct Empty: Encodable {}

    private func send<Response: Decodable>(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = []
    ) async throws -> Response {
        try await send(method, path, query: query, body: Optional<Empty>.none)
    }

    private func send<Response: Decodable, Body: Encodable>(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = [], body: Body?
    ) async throws -> Response {
        let bytes = try await exchange(method, path, query: query, body: body)
        do {
            return try JSONDecoder().decode(Response.self, from: Data(bytes))
        } catch {
            throw AppStoreAPIError(
                kind: .malformedResponse, httpStatus: 200, message: "response is not a valid \(Response.self)",
                isRetryable: true)
        }
    }

    private func sendExpectingNoBody<Body: Encodable>(
        _ method: HTTPMethod, _ path: String, body: Body? = Optional<Empty>.none
    ) async throws {
        _ = try await exchange(method, path, query: [], body: body)
    }

    /// One logical call: attempts with backoff per the retry policy.
    private func exchange<Body: Encodable>(
        _ method: HTTPMethod, _ path: String, query: [(String, String)], body: Body?
    ) async throws -> [UInt8] {
        let url = configuration.resolvedBaseURL + path + Self.encode(query)
        // Sorted keys: the same request encodes to the same bytes on every page, as Apple asks.
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let bodyBytes = try body.map { try encoder.encode($0) }
        var attempt = 1
        while true {
            do {
                return try await attemptOnce(method, url: url, body: bodyBytes)
            } catch let error as AppStoreAPIError {
                guard let delay = configuration.retryPolicy.delay(after: error, attempt: attempt) else { throw error }
                try await Task.sleep(for: delay)
                attempt += 1
            }
        }
    }

    private func attemptOnce(_ method: HTTPMethod, url: String, body: Data?) async throws -> [UInt8] {
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(try await tokens.token())")
        request.headers.add(name: "Accept", value: "application/json")
        request.headers.add(name: "User-Agent", value: "StoreKeeper")
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let answer = try await AppleHTTP.exchange(
            httpClient, request, timeout: configuration.timeout, maxBody: 16 * 1024 * 1024)
        if answer.isSuccess { return answer.body }
        throw Self.classify(status: answer.status, headers: answer.headers, body: answer.body)
    }

    /// Maps a non-2xx answer to Apple's retry classes (server-api.md §3).
    static func classify(status: Int, headers: HTTPHeaders, body: [UInt8]) -> AppStoreAPIError {
        if status == 401 {
            var error = AppStoreAPIError(
                kind: .unauthorized, httpStatus: 401,
                message: "Apple refused the API token (key, issuer, bundle id, clock?)",
                isRetryable: false)
            error.appleDate = headers.first(name: "Date").flatMap(AppStoreAPIError.httpDate)
            return error
        }
        let payload = try? JSONDecoder().decode(ServerAPIErrorPayload.self, from: Data(body))
        let message = payload?.errorMessage ?? "HTTP \(status)"
        if status == 429 {
            // Apple's Retry-After is a UNIX time in milliseconds; accept seconds-to-wait too.
            var retryAfter: Date?
            if let value = headers.first(name: "Retry-After").flatMap({ Int64($0.trimmingCharacters(in: .whitespaces)) }
            ) {
                retryAfter =
                    value > 1_000_000_000_000
                    ? Date(timeIntervalSince1970: Double(value) / 1000) : Date().addingTimeInterval(Double(value))
            }
            return AppStoreAPIError(
                kind: .rateLimited, httpStatus: 429, errorCode: payload?.errorCode ?? 4_290_000, message: message,
                retryAfter: retryAfter, isRetryable: true)
        }
        if let code = payload?.errorCode {
            return AppStoreAPIError(
                kind: .apple, httpStatus: status, errorCode: code, message: message,
                isRetryable: AppStoreAPIError.retryableServerAPICodes.contains(code) || status >= 500)
        }
        return AppStoreAPIError(kind: .httpStatus, httpStatus: status, message: message, isRetryable: status >= 500)
    }

    private func pathSegment(_ value: String) throws -> String {
        guard !value.isEmpty, value.count <= 256,
            let encoded = value.addingPercentEncoding(withAllowedCharacters: Self.unreserved)
        else {
            throw AppStoreAPIError(kind: .apple, httpStatus: nil, message: "invalid identifier", isRetryable: false)
        }
        return encoded
    }

    private static let unreserved = CharacterSet(
        charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

    static func encode(_ query: [(String, String)]) -> String {
        guard !query.isEmpty else { return "" }
        return "?"
            + query.map { name, value in
                "\(name)=\(value.addingPercentEncoding(withAllowedCharacters: unreserved) ?? "")"
            }.joined(separator: "&")
    }
}

/// Query filters of Get Transaction History (v2). Repeated values are OR-ed, filters AND-ed.
public struct TransactionHistoryFilter: Sendable, Hashable {
    public enum Sort: String, Sendable {
        case ascending = "ASCENDING"
        case descending = "DESCENDING"
    }
    public var startDate: Int64?
    public var endDate: Int64?
    public var productIds: [String]
    public var productTypes: [HistoryProductType]
    public var subscriptionGroupIdentifiers: [String]
    public var inAppOwnershipType: InAppOwnershipType?
    public var sort: Sort?
    public var revoked: Bool?

    public init(
        startDate: Int64? = nil, endDate: Int64? = nil, productIds: [String] = [],
        productTypes: [HistoryProductType] = [], subscriptionGroupIdentifiers: [String] = [],
        inAppOwnershipType: InAppOwnershipType? = nil, sort: Sort? = nil, revoked: Bool? = nil
    ) {
        self.startDate = startDate
        self.endDate = endDate
        self.productIds = productIds
        self.productTypes = productTypes
        self.subscriptionGroupIdentifiers = subscriptionGroupIdentifiers
        self.inAppOwnershipType = inAppOwnershipType
        self.sort = sort
        self.revoked = revoked
    }

    var queryItems: [(String, String)] {
        var items: [(String, String)] = []
        if let startDate { items.append(("startDate", String(startDate))) }
        if let endDate { items.append(("endDate", String(endDate))) }
        items += productIds.map { ("productId", $0) }
        items += productTypes.map { ("productType", $0.rawValue) }
        items += subscriptionGroupIdentifiers.map { ("subscriptionGroupIdentifier", $0) }
        if let inAppOwnershipType { items.append(("inAppOwnershipType", inAppOwnershipType.rawValue)) }
        if let sort { items.append(("sort", sort.rawValue)) }
        if let revoked { items.append(("revoked", revoked ? "true" : "false")) }
        return items
    }
}
