import Foundation

/// A failed call to Apple (App Store Server API or verifyReceipt), classified so callers know
/// whether to retry, when, or to give up (Apple's App Store Server API documentation §3, receipts.md §3.1).
public struct AppStoreAPIError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        /// 401: the token was refused (key, issuer, bundle id, clock). Fix configuration.
        case unauthorized
        /// 429 with Apple's `Retry-After`.
        case rateLimited
        /// An Apple error code in the JSON body (`errorCode`), or a verifyReceipt status.
        case apple
        /// An HTTP status with no usable body.
        case httpStatus
        /// No answer in time.
        case timeout
        /// Connection refused, reset, DNS, TLS…
        case network
        /// A 2xx answer whose body is not what Apple documents.
        case malformedResponse
    }

    public var kind: Kind
    public var httpStatus: Int?
    /// Apple's numeric `errorCode` (Server API) or `status` (verifyReceipt).
    public var errorCode: Int64?
    public var message: String
    /// When Apple allows the next call (429), if it said.
    public var retryAfter: Date?
    public var isRetryable: Bool
    /// Apple's clock, from the answer's `Date` header (a 401 may mean our clock is off).
    public var appleDate: Date?

    public init(
        kind: Kind, httpStatus: Int? = nil, errorCode: Int64? = nil, message: String, retryAfter: Date? = nil,
        isRetryable: Bool
    ) {
        self.kind = kind
        self.httpStatus = httpStatus
        self.errorCode = errorCode
        self.message = message
        self.retryAfter = retryAfter
        self.isRetryable = isRetryable
    }

    /// An HTTP-date (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110).
    public static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.date(from: text.trimmingCharacters(in: .whitespaces))
    }

    public var description: String {
        var parts = ["\(kind)"]
        if let httpStatus { parts.append("HTTP \(httpStatus)") }
        if let errorCode { parts.append("code \(errorCode)") }
        parts.append(message)
        if let retryAfter { parts.append("retry after \(retryAfter.timeIntervalSince1970)") }
        parts.append(isRetryable ? "retryable" : "permanent")
        return parts.joined(separator: ", ")
    }

    /// Apple's Server API error codes that Apple itself lists as "retry".
    public static let retryableServerAPICodes: Set<Int64> = [
        4_040_002, 4_040_004, 4_040_006, 5_000_000, 5_000_001, 4_290_000,
    ]

    /// `TransactionIdNotFoundError`: usually the id belongs to the other environment.
    public static let transactionIdNotFound: Int64 = 4_040_010
    /// `OriginalTransactionIdNotFoundError`.
    public static let originalTransactionIdNotFound: Int64 = 4_040_005
}
