import AppStoreModels
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// Client of Apple's legacy `verifyReceipt` (Apple's receipt documentation §1–3): production first,
/// 21007 → sandbox, 21008 → production, every status classified.
public final class VerifyReceiptClient: Sendable {
    public struct Configuration: Sendable {
        public var productionURL: String
        public var sandboxURL: String
        /// The app's shared secret (`password`); required for auto-renewable subscriptions.
        public var sharedSecret: String?
        public var excludeOldTransactions: Bool
        public var timeout: Duration
        /// Retries of 21002 / 21005 / 21009 / retryable 211xx / 5xx / timeouts.
        public var retryPolicy: RetryPolicy

        public init(
            productionURL: String = "https://buy.itunes.apple.com/verifyReceipt",
            sandboxURL: String = "https://sandbox.itunes.apple.com/verifyReceipt",
            sharedSecret: String? = nil, excludeOldTransactions: Bool = false, timeout: Duration = .seconds(10),
            retryPolicy: RetryPolicy = RetryPolicy()
        ) {
            self.productionURL = productionURL
            self.sandboxURL = sandboxURL
            self.sharedSecret = sharedSecret
            self.excludeOldTransactions = excludeOldTransactions
            self.timeout = timeout
            self.retryPolicy = retryPolicy
        }
    }

    /// A receipt Apple accepted (status 0, or 21006 for an expired iOS 6 subscription receipt).
    public struct Result: Sendable, Hashable {
        public var response: VerifyReceiptResponse
        /// The endpoint that answered.
        public var environment: AppStoreEnvironment
    }

    public let configuration: Configuration
    private let httpClient: HTTPClient

    public init(configuration: Configuration = .init(), httpClient: HTTPClient = .shared) {
        self.configuration = configuration
        self.httpClient = httpClient
    }

    /// Verifies a base64 receipt, starting at production (Apple's recommendation).
    public func verify(receiptData: String, startingAt environment: AppStoreEnvironment = .production) async throws
        -> Result
    {
        let body = try JSONEncoder().encode(
            VerifyReceiptRequest(
                receiptData: receiptData, password: configuration.sharedSecret,
                excludeOldTransactions: configuration.excludeOldTransactions ? true : nil))
        var current = environment == .sandbox ? AppStoreEnvironment.sandbox : .production
        var switched = false
        var attempt = 1
        while true {
            do {
                let response = try await post(body, to: current)
                let status = response.status ?? -1
                switch status {
                case 0, 21006:
                    return Result(response: response, environment: current)
                case 21007 where current == .production && !switched, 21008 where current == .sandbox && !switched:
                    // The receipt belongs to the other environment: resend the identical body once.
                    current = current == .production ? .sandbox : .production
                    switched = true
                    continue
                default:
                    throw Self.classify(status: status, response: response)
                }
            } catch let error as AppStoreAPIError {
                guard let delay = configuration.retryPolicy.delay(after: error, attempt: attempt) else { throw error }
                try await Task.sleep(for: delay)
                attempt += 1
            }
        }
    }

    /// receipts.md §3.1, status by status.
    static func classify(status: Int64, response: VerifyReceiptResponse) -> AppStoreAPIError {
        let (message, retryable): (String, Bool) =
            switch status {
            case 21000: ("the request was not a well-formed POST", false)
            case 21001: ("status 21001 is no longer sent by Apple", false)
            case 21002: ("receipt-data malformed or a temporary Apple problem", true)
            case 21003: ("the receipt could not be authenticated", false)
            case 21004: ("the shared secret does not match the app's", false)
            case 21005: ("Apple's receipt server is temporarily unavailable", true)
            case 21007: ("a sandbox receipt, and sandbox did not accept it either", false)
            case 21008: ("a production receipt, and production did not accept it either", false)
            case 21009: ("Apple internal data access error", true)
            case 21010: ("the user account cannot be found or was deleted", false)
            case 21100...21199: ("Apple internal data access error", response.isRetryable?.boolValue ?? false)
            default: ("unknown verifyReceipt status \(status)", false)
            }
        return AppStoreAPIError(
            kind: .apple, httpStatus: 200, errorCode: status, message: message, isRetryable: retryable)
    }

    private func post(_ body: Data, to environment: AppStoreEnvironment) async throws -> VerifyReceiptResponse {
        var request = HTTPClientRequest(
            url: environment == .sandbox ? configuration.sandboxURL : configuration.productionURL)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "StoreKeeper")
        request.body = .bytes(ByteBuffer(bytes: body))
        let answer = try await AppleHTTP.exchange(
            httpClient, request, timeout: configuration.timeout, maxBody: 64 * 1024 * 1024)
        guard answer.isSuccess else {
            throw AppStoreAPIError(
                kind: .httpStatus, httpStatus: answer.status, message: "verifyReceipt answered HTTP \(answer.status)",
                isRetryable: answer.status >= 500 || answer.status == 429)
        }
        guard let decoded = try? JSONDecoder().decode(VerifyReceiptResponse.self, from: Data(answer.body)),
            decoded.status != nil
        else {
            throw AppStoreAPIError(
                kind: .malformedResponse, httpStatus: answer.status,
                message: "verifyReceipt answer is not Apple's JSON",
                isRetryable: true)
        }
        return decoded
    }
}
