import Foundation

// The Retention Messaging API's models (docs/offers-and-retention.md §5), field names as Apple's library.

/// `DecodedRealtimeRequestBody`: what Apple signs when it asks for a retention message.
public struct DecodedRealtimeRequestBody: Codable, Hashable, Sendable {
    public var originalTransactionId: String?
    public var appAppleId: Int64?
    public var productId: String?
    public var userLocale: String?
    public var requestIdentifier: String?
    public var signedDate: Int64?
    public var environment: AppStoreEnvironment?

    public init(
        originalTransactionId: String? = nil, appAppleId: Int64? = nil, productId: String? = nil,
        userLocale: String? = nil, requestIdentifier: String? = nil, signedDate: Int64? = nil,
        environment: AppStoreEnvironment? = nil
    ) {
        self.originalTransactionId = originalTransactionId
        self.appAppleId = appAppleId
        self.productId = productId
        self.userLocale = userLocale
        self.requestIdentifier = requestIdentifier
        self.signedDate = signedDate
        self.environment = environment
    }
}

/// `RealtimeRequestBody`.
public struct RealtimeRequestBody: Codable, Hashable, Sendable {
    public var signedPayload: String?
    public init(signedPayload: String? = nil) { self.signedPayload = signedPayload }
}

/// `RealtimeResponseBody`: exactly one of its keys, or none (`{}`: Apple's default message).
public struct RealtimeResponseBody: Codable, Hashable, Sendable {
    public struct Message: Codable, Hashable, Sendable {
        public var messageIdentifier: String?
        public init(messageIdentifier: String? = nil) { self.messageIdentifier = messageIdentifier }
    }

    public struct AlternateProduct: Codable, Hashable, Sendable {
        public var messageIdentifier: String?
        public var productId: String?
        public init(messageIdentifier: String? = nil, productId: String? = nil) {
            self.messageIdentifier = messageIdentifier
            self.productId = productId
        }
    }

    public struct PromotionalOfferSignatureV1: Codable, Hashable, Sendable {
        public var encodedSignature: String?
        public var productId: String?
        public var nonce: String?
        public var timestamp: Int64?
        public var keyId: String?
        public var offerIdentifier: String?
        public var appAccountToken: String?
    }

    public struct PromotionalOffer: Codable, Hashable, Sendable {
        public var messageIdentifier: String?
        public var promotionalOfferSignatureV2: String?
        public var promotionalOfferSignatureV1: PromotionalOfferSignatureV1?
        public init(
            messageIdentifier: String? = nil, promotionalOfferSignatureV2: String? = nil,
            promotionalOfferSignatureV1: PromotionalOfferSignatureV1? = nil
        ) {
            self.messageIdentifier = messageIdentifier
            self.promotionalOfferSignatureV2 = promotionalOfferSignatureV2
            self.promotionalOfferSignatureV1 = promotionalOfferSignatureV1
        }
    }

    public var message: Message?
    public var alternateProduct: AlternateProduct?
    public var promotionalOffer: PromotionalOffer?

    public init(
        message: Message? = nil, alternateProduct: AlternateProduct? = nil, promotionalOffer: PromotionalOffer? = nil
    ) {
        self.message = message
        self.alternateProduct = alternateProduct
        self.promotionalOffer = promotionalOffer
    }

    /// How many of the mutually exclusive keys are set (Apple wants exactly one, or none).
    public var answers: Int { [message != nil, alternateProduct != nil, promotionalOffer != nil].filter { $0 }.count }
}

/// `RealtimeUrlRequest` / `RealtimeUrlResponse`.
public struct RealtimeUrl: Codable, Hashable, Sendable {
    public var realtimeURL: String?
    public init(realtimeURL: String? = nil) { self.realtimeURL = realtimeURL }
}

/// `UploadMessageRequestBody` (text fields only; images are not modelled by the local store).
public struct UploadMessageRequestBody: Codable, Hashable, Sendable {
    public var header: String?
    public var body: String?
    public init(header: String? = nil, body: String? = nil) {
        self.header = header
        self.body = body
    }
}

/// One entry of `GetMessageListResponse`.
public struct MessageListItem: Codable, Hashable, Sendable {
    public var messageIdentifier: String?
    public var messageState: String?
    public init(messageIdentifier: String? = nil, messageState: String? = nil) {
        self.messageIdentifier = messageIdentifier
        self.messageState = messageState
    }
}

/// `DefaultConfigurationRequest` / `GetDefaultMessageResponse`.
public struct DefaultMessage: Codable, Hashable, Sendable {
    public var messageIdentifier: String?
    public init(messageIdentifier: String? = nil) { self.messageIdentifier = messageIdentifier }
}

/// `PerformanceTestRequest`.
public struct PerformanceTestRequest: Codable, Hashable, Sendable {
    public var originalTransactionId: String?
    public init(originalTransactionId: String? = nil) { self.originalTransactionId = originalTransactionId }
}

/// `PerformanceTestConfig`.
public struct PerformanceTestConfig: Codable, Hashable, Sendable {
    public var maxConcurrentRequests: Int64?
    public var totalRequests: Int64?
    public var totalDuration: Int64?
    public var responseTimeThreshold: Int64?
    public var successRateThreshold: Int32?

    public init(
        maxConcurrentRequests: Int64? = nil, totalRequests: Int64? = nil, totalDuration: Int64? = nil,
        responseTimeThreshold: Int64? = nil, successRateThreshold: Int32? = nil
    ) {
        self.maxConcurrentRequests = maxConcurrentRequests
        self.totalRequests = totalRequests
        self.totalDuration = totalDuration
        self.responseTimeThreshold = responseTimeThreshold
        self.successRateThreshold = successRateThreshold
    }
}

/// `PerformanceTestResponse`.
public struct PerformanceTestResponse: Codable, Hashable, Sendable {
    public var config: PerformanceTestConfig?
    public var requestId: String?
    public init(config: PerformanceTestConfig? = nil, requestId: String? = nil) {
        self.config = config
        self.requestId = requestId
    }
}

/// `PerformanceTestResultResponse`.
public struct PerformanceTestResultResponse: Codable, Hashable, Sendable {
    public struct ResponseTimes: Codable, Hashable, Sendable {
        public var average: Int64?
        public var p50: Int64?
        public var p90: Int64?
        public var p95: Int64?
        public var p99: Int64?
        public init(average: Int64? = nil, p50: Int64? = nil, p90: Int64? = nil, p95: Int64? = nil, p99: Int64? = nil) {
            self.average = average
            self.p50 = p50
            self.p90 = p90
            self.p95 = p95
            self.p99 = p99
        }
    }

    public var config: PerformanceTestConfig?
    public var target: String?
    /// `PENDING`, `PASS` or `FAIL`.
    public var result: String?
    public var successRate: Int32?
    public var numPending: Int32?
    public var responseTimes: ResponseTimes?
    /// `SendAttemptResult` → count.
    public var failures: [String: Int32]?

    public init(
        config: PerformanceTestConfig? = nil, target: String? = nil, result: String? = nil, successRate: Int32? = nil,
        numPending: Int32? = nil, responseTimes: ResponseTimes? = nil, failures: [String: Int32]? = nil
    ) {
        self.config = config
        self.target = target
        self.result = result
        self.successRate = successRate
        self.numPending = numPending
        self.responseTimes = responseTimes
        self.failures = failures
    }
}
