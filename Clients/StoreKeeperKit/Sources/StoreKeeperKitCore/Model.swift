import Foundation

/// A transaction as the payment queue hands it over (StoreKit 2 `Transaction`, StoreKit 1
/// `SKPaymentTransaction`, or the simulator's scripted queue), mapped and nothing decided.
public struct StoreTransaction: Codable, Sendable, Equatable {
    public var id: String
    public var originalId: String?
    public var productId: String
    public var quantity: Int
    /// The token StoreKit returned with the callback; nil when it came back without one
    /// (StoreKit 1's `applicationUsername` is known to).
    public var appAccountToken: UUID?
    public var purchaseDate: Date
    /// StoreKit 2's JWS (`VerificationResult.jwsRepresentation`); nil for StoreKit 1.
    public var signedTransaction: String?
    /// Set when Apple revoked it (refund, Family Sharing ended): a hint forwarded to the server.
    public var revocationDate: Date?

    public init(
        id: String, originalId: String? = nil, productId: String, quantity: Int = 1, appAccountToken: UUID? = nil,
        purchaseDate: Date, signedTransaction: String? = nil, revocationDate: Date? = nil
    ) {
        self.id = id
        self.originalId = originalId
        self.productId = productId
        self.quantity = quantity
        self.appAccountToken = appAccountToken
        self.purchaseDate = purchaseDate
        self.signedTransaction = signedTransaction
        self.revocationDate = revocationDate
    }
}

/// What the server is given as proof of a purchase (API.md `POST /v1/purchases`).
public enum Proof: Codable, Sendable, Equatable {
    case signedTransaction(String)
    case receipt(String)
    case transactionId(String)
}

/// What the payment queue answers when a payment is added.
public enum PaymentResult: Sendable, Equatable {
    case purchased(StoreTransaction)
    /// Ask to Buy, or strong customer authentication: no money moved yet.
    case deferred
    case cancelled
    case failed(String)
    /// StoreKit 1: the outcome arrives later through the observer (`updates`).
    case enqueued
}

/// Everything the payment queue reports on its own: new and re-delivered transactions,
/// restores, revocations, deferred and failed payments, purchases started on the App Store.
public enum PaymentUpdate: Sendable, Equatable {
    case transaction(StoreTransaction)
    case restored(StoreTransaction)
    case deferred(productId: String)
    /// A payment that failed or was cancelled; StoreKit 1 hands a transaction to finish.
    case failed(productId: String, transactionId: String?, cancelled: Bool)
    /// A purchase the customer started outside the app (promoted in-app purchase, win-back).
    case promoted(productId: String, quantity: Int)
}

/// An order created on the server before paying (API.md `POST /v1/orders`).
public struct ServerOrder: Codable, Sendable, Equatable {
    public var orderId: String
    public var appAccountToken: UUID
    public var accountId: String
    public var productId: String
    public var quantity: Int
    /// The promotional offer the server signed for this order (asked with `offerId`).
    public var offer: SignedOffer?
    /// The server's introductory-offer decision (`offers.introductoryOffers: once_per_account`).
    public var introductoryOfferEligibility: IntroductoryOfferEligibility?

    public init(
        orderId: String, appAccountToken: UUID, accountId: String, productId: String, quantity: Int,
        offer: SignedOffer? = nil, introductoryOfferEligibility: IntroductoryOfferEligibility? = nil
    ) {
        self.orderId = orderId
        self.appAccountToken = appAccountToken
        self.accountId = accountId
        self.productId = productId
        self.quantity = quantity
        self.offer = offer
        self.introductoryOfferEligibility = introductoryOfferEligibility
    }
}

/// A promotional offer signed by the server for one order (API.md "Offers on POST /v1/orders"):
/// the V1 fields and the V2 JWS; StoreKit takes either.
public struct SignedOffer: Codable, Sendable, Equatable {
    public var id: String
    public var keyId: String
    /// Lower-case UUID.
    public var nonce: String
    /// Milliseconds since 1970.
    public var timestamp: Int64
    /// Base64 of the DER signature (V1).
    public var signature: String
    /// The compact JWS (V2, `promotional-offer`).
    public var jws: String

    public init(id: String, keyId: String, nonce: String, timestamp: Int64, signature: String, jws: String) {
        self.id = id
        self.keyId = keyId
        self.nonce = nonce
        self.timestamp = timestamp
        self.signature = signature
        self.jws = jws
    }

    /// The V1 signature's bytes, as StoreKit 2's `promotionalOffer(offerID:keyID:nonce:signature:timestamp:)` takes them.
    public var signatureBytes: Data? { Data(base64Encoded: signature) }
}

/// `introductoryOfferEligibility`: whether the account may have the introductory offer, and
/// the JWS that tells StoreKit so.
public struct IntroductoryOfferEligibility: Codable, Sendable, Equatable {
    public var allowed: Bool
    public var jws: String

    public init(allowed: Bool, jws: String) {
        self.allowed = allowed
        self.jws = jws
    }
}

/// What a payment carries besides the order's token: a signed promotional offer, the
/// server's introductory-offer decision, or a win-back offer from renewal info.
public struct PurchaseOptions: Sendable, Equatable {
    public var promotionalOffer: SignedOffer?
    public var introductoryOfferEligibilityJWS: String?
    public var winBackOfferId: String?

    public init(
        promotionalOffer: SignedOffer? = nil, introductoryOfferEligibilityJWS: String? = nil,
        winBackOfferId: String? = nil
    ) {
        self.promotionalOffer = promotionalOffer
        self.introductoryOfferEligibilityJWS = introductoryOfferEligibilityJWS
        self.winBackOfferId = winBackOfferId
    }

    public var isEmpty: Bool {
        promotionalOffer == nil && introductoryOfferEligibilityJWS == nil && winBackOfferId == nil
    }
}

/// The account as the server sees it (API.md `GET /v1/accounts/{accountId}`).
public struct CustomerInfo: Codable, Sendable, Equatable {
    public struct Entitlement: Codable, Sendable, Equatable {
        public var id: String
        public var active: Bool
        public var productId: String?
        public var expiresAt: String?
        public var originalTransactionId: String?
    }
    public struct Subscription: Codable, Sendable, Equatable {
        public var originalTransactionId: String
        public var productId: String
        public var status: String
        public var expiresAt: String?
        public var autoRenew: Bool?
    }
    public var accountId: String
    public var entitlements: [Entitlement]
    public var balances: [String: Int64]
    public var subscriptions: [Subscription]

    public init(
        accountId: String, entitlements: [Entitlement] = [], balances: [String: Int64] = [:],
        subscriptions: [Subscription] = []
    ) {
        self.accountId = accountId
        self.entitlements = entitlements
        self.balances = balances
        self.subscriptions = subscriptions
    }

    enum CodingKeys: String, CodingKey { case accountId, entitlements, balances, subscriptions }
    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        accountId = try container.decode(String.self, forKey: .accountId)
        entitlements = try container.decodeIfPresent([Entitlement].self, forKey: .entitlements) ?? []
        balances = try container.decodeIfPresent([String: Int64].self, forKey: .balances) ?? [:]
        subscriptions = try container.decodeIfPresent([Subscription].self, forKey: .subscriptions) ?? []
    }

    /// Whether the entitlement is active now.
    public func isActive(_ entitlement: String) -> Bool {
        entitlements.contains { $0.id == entitlement && $0.active }
    }
}

/// The server's 200 answer to a submitted proof.
public struct PurchaseResponse: Codable, Sendable, Equatable {
    public struct Transaction: Codable, Sendable, Equatable {
        public var transactionId: String
        public var originalTransactionId: String?
        public var productId: String?
        public var quantity: Int?
        public var orderId: String?
        public var outcome: String

        public init(
            transactionId: String, originalTransactionId: String? = nil, productId: String? = nil, quantity: Int? = nil,
            orderId: String? = nil, outcome: String
        ) {
            self.transactionId = transactionId
            self.originalTransactionId = originalTransactionId
            self.productId = productId
            self.quantity = quantity
            self.orderId = orderId
            self.outcome = outcome
        }
    }
    /// `delivered` or `already_delivered`.
    public var status: String
    public var transactions: [Transaction]
    public var account: CustomerInfo?

    public init(status: String, transactions: [Transaction], account: CustomerInfo?) {
        self.status = status
        self.transactions = transactions
        self.account = account
    }
}

/// What the server said about a submitted proof, sorted by what the device must do with the
/// StoreKit transaction: finish it (a final verdict) or keep it and try again.
public enum SubmissionVerdict: Sendable, Equatable {
    /// 200: `delivered` / `already_delivered`.
    case accepted(PurchaseResponse)
    /// A permanent rejection of the proof itself: the server's own error envelope, a proof-final
    /// code (`proofFinalCodes`) and `retryable: false` — nothing else.
    case rejected(status: Int, code: String, message: String)
    /// 202: the server has the proof and asks Apple on its own; the device keeps it until a
    /// later submission gets a verdict.
    case pending(retryAfter: TimeInterval?)
    /// Network failure, timeout, 5xx, 408, 429, or credentials the app could not renew.
    case retryable(status: Int?, code: String?, retryAfter: TimeInterval?)

    /// The request was cancelled on this side before an answer came: not an attempt.
    public static let cancelled = SubmissionVerdict.retryable(status: nil, code: "cancelled", retryAfter: nil)

    public var wasCancelled: Bool { self == .cancelled }

    /// Whether the transaction may be finished now.
    public var isFinal: Bool {
        switch self {
        case .accepted, .rejected: true
        case .pending, .retryable: false
        }
    }

    /// The codes on which a device may finish a paid transaction (API.md, "Proof-final codes"):
    /// what the server says about the proof itself, never about its own configuration or the
    /// request's shape.
    public static let proofFinalCodes: Set<String> = [
        "invalid_signature", "invalid_chain", "wrong_bundle", "wrong_app", "wrong_environment", "revoked",
        "owned_by_other_account",
    ]

    /// Sorts an HTTP answer. Only a 4xx that is the server's error envelope (`code` and
    /// `retryable` were read from it) with a proof-final code and `retryable: false` is a
    /// rejection. Everything else — a proxy's, WAF's or CDN's HTML 400/404/405/413, the server's
    /// own configuration answers (400 "needs apple.serverAPI credentials"), 401/403 (the app's
    /// credentials, not the purchase), 408, 429, 5xx — keeps the transaction, to be tried again:
    /// finishing on them would lose a paid order for good.
    public static func classify(
        status: Int, code: String?, message: String?, retryable: Bool? = nil, retryAfter: TimeInterval?
    ) -> SubmissionVerdict? {
        switch status {
        case 200..<300:
            return nil
        case 400..<500:
            if let code, proofFinalCodes.contains(code), retryable == false {
                return .rejected(status: status, code: code, message: message ?? "")
            }
            return .retryable(status: status, code: code ?? "http_\(status)", retryAfter: retryAfter)
        default:
            return .retryable(status: status, code: code, retryAfter: retryAfter)
        }
    }
}

/// A purchase the app asked for, written durably before the payment is added: what ties a
/// StoreKit transaction back to an order and an account when its token comes back missing.
public struct PurchaseIntent: Codable, Sendable, Equatable {
    public enum State: String, Codable, Sendable {
        /// Written; the payment may or may not have been added (a crash in between).
        case created
        /// The payment was added; StoreKit has not answered.
        case paying
        /// Ask to Buy: waiting for a parent.
        case deferred
        /// A transaction paid it (`transactionId`).
        case bound
        /// Cancelled or failed: nothing was charged.
        case closed
    }
    public var orderId: String
    public var appAccountToken: UUID
    public var productId: String
    public var quantity: Int
    public var accountId: String
    public var createdAt: Date
    public var state: State
    public var transactionId: String?

    /// Open intents can still be paid by a transaction that comes back without its token.
    public var isOpen: Bool { state == .created || state == .paying || state == .deferred }
}

/// A transaction the device holds, unfinished, until the server gives a final verdict.
public struct PendingSubmission: Codable, Sendable, Equatable {
    public enum Reason: String, Codable, Sendable { case purchase, restore, revocation }
    public var transaction: StoreTransaction
    public var reason: Reason
    /// The account it is submitted for; nil while nobody is logged in and no intent names one.
    public var accountId: String?
    public var orderId: String?
    public var attempts: Int
    /// Backoff: when the next attempt is due (re-drive triggers bring it forward).
    public var nextAttemptAt: Date
    /// A server's Retry-After: no attempt before it, whatever triggers a re-drive.
    public var notBefore: Date?
    public var lastError: String?

    var key: String { PendingSubmission.key(transaction, reason) }
    static func key(_ transaction: StoreTransaction, _ reason: Reason) -> String {
        reason == .revocation ? transaction.id + "#revoked" : transaction.id
    }
}

/// A transaction with a final verdict: finished (or about to be), never submitted again
/// unless StoreKit reports it revoked.
public struct SettledTransaction: Codable, Sendable, Equatable {
    public var key: String
    public var accountId: String?
    public var verdict: String
    public var at: Date
}

/// Everything the device must not forget, in one durable document.
public struct PendingState: Codable, Sendable, Equatable {
    public var version = 1
    public var intents: [PurchaseIntent] = []
    public var pending: [PendingSubmission] = []
    public var settled: [SettledTransaction] = []
    public var customerInfo: [String: CustomerInfo] = [:]

    public init() {}
}
