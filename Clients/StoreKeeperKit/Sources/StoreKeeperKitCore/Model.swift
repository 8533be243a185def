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
    /// StoreKit 1 reported it `.restored` (a restore's copy, never a new purchase).
    public var isRestored: Bool?
    /// Bought by this Apple Account, or shared with it by a family member (StoreKit 2's
    /// `ownershipType`): an app tells Family Sharing apart from "owned by another account".
    public var ownership: Ownership?
    /// A newer transaction of a higher subscription level replaced this one.
    public var isUpgraded: Bool?
    /// The offer it was bought with (StoreKit 2's `offer`, or `offerID`/`offerType` before 17.2).
    public var offerId: String?
    public var offerType: OfferType?
    /// A first purchase or an automatic renewal (StoreKit 2's `reason`, iOS 17).
    public var reason: Reason?
    /// Where it was made (StoreKit 2's `environment`, iOS 16).
    public var environment: Environment?

    public enum Ownership: String, Codable, Sendable, Equatable { case purchased, familyShared }
    public enum OfferType: String, Codable, Sendable, Equatable { case introductory, promotional, code, winBack }
    public enum Reason: String, Codable, Sendable, Equatable { case purchase, renewal }
    public enum Environment: String, Codable, Sendable, Equatable { case production, sandbox, xcode }

    public init(
        id: String, originalId: String? = nil, productId: String, quantity: Int = 1, appAccountToken: UUID? = nil,
        purchaseDate: Date, signedTransaction: String? = nil, revocationDate: Date? = nil, isRestored: Bool? = nil,
        ownership: Ownership? = nil, isUpgraded: Bool? = nil, offerId: String? = nil, offerType: OfferType? = nil,
        reason: Reason? = nil, environment: Environment? = nil
    ) {
        self.id = id
        self.originalId = originalId
        self.productId = productId
        self.quantity = quantity
        self.appAccountToken = appAccountToken
        self.purchaseDate = purchaseDate
        self.signedTransaction = signedTransaction
        self.revocationDate = revocationDate
        self.isRestored = isRestored
        self.ownership = ownership
        self.isUpgraded = isUpgraded
        self.offerId = offerId
        self.offerType = offerType
        self.reason = reason
        self.environment = environment
    }

    /// Shared with this Apple Account by a family member (not bought by it).
    public var isFamilyShared: Bool { ownership == .familyShared }
}

/// What the server is given as proof of a purchase (docs/api.md `POST /v1/purchases`).
public enum Proof: Codable, Sendable, Equatable {
    case signedTransaction(String)
    /// 1…100 JWS of one account, each verified and delivered on its own (a restore, a replay).
    case signedTransactions([String])
    case receipt(String)
    case transactionId(String)
}

/// A purchase the customer started outside the app (a promoted in-app purchase on the App
/// Store, a `PurchaseIntent`, a win-back offer): the app decides when it starts.
public struct PromotedPurchase: Sendable, Equatable, Identifiable {
    /// The adapter's handle for the payment StoreKit offered (it carries Apple's offer).
    public var id: String
    public var productId: String
    public var quantity: Int
    /// The offer the App Store attached (a promotional or win-back offer), if any: told to the
    /// server with the order, so its offer policy decides as for any other purchase.
    public var offerId: String?
    public var offerKind: OfferKind?

    public enum OfferKind: String, Sendable, Equatable { case promotional, winBack }

    public init(
        id: String, productId: String, quantity: Int = 1, offerId: String? = nil, offerKind: OfferKind? = nil
    ) {
        self.id = id
        self.productId = productId
        self.quantity = quantity
        self.offerId = offerId
        self.offerKind = offerKind ?? (offerId == nil ? nil : .promotional)
    }
}

/// What the payment queue answers when a payment is added.
public enum PaymentResult: Sendable, Equatable {
    case purchased(StoreTransaction)
    /// Ask to Buy, or strong customer authentication: no money moved yet.
    case deferred
    case cancelled
    case failed(StoreKitFailure)
    /// StoreKit 1: the outcome arrives later through the observer (`updates`).
    case enqueued
}

/// Everything the payment queue reports on its own: new and re-delivered transactions,
/// restores, revocations, deferred and failed payments, purchases started on the App Store.
public enum PaymentUpdate: Sendable, Equatable {
    case transaction(StoreTransaction)
    case restored(StoreTransaction)
    /// Ask to Buy: `appAccountToken` the payment's `applicationUsername` when StoreKit kept it.
    case deferred(productId: String, appAccountToken: UUID? = nil)
    /// A payment that failed or was cancelled; StoreKit 1 hands a transaction to finish.
    /// `appAccountToken`: the payment's order token when StoreKit kept it (it names the intent).
    /// `failure`: what StoreKit said, typed.
    case failed(
        productId: String, transactionId: String?, cancelled: Bool, appAccountToken: UUID? = nil,
        failure: StoreKitFailure? = nil)
    /// A purchase the customer started outside the app (promoted in-app purchase, win-back).
    case promoted(PromotedPurchase)
}

/// An order created on the server before paying (docs/api.md `POST /v1/orders`).
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
    /// When the server stops holding the order open; the device's intent expires with it.
    public var expiresAt: Date?

    public init(
        orderId: String, appAccountToken: UUID, accountId: String, productId: String, quantity: Int,
        offer: SignedOffer? = nil, introductoryOfferEligibility: IntroductoryOfferEligibility? = nil,
        expiresAt: Date? = nil
    ) {
        self.orderId = orderId
        self.appAccountToken = appAccountToken
        self.accountId = accountId
        self.productId = productId
        self.quantity = quantity
        self.offer = offer
        self.introductoryOfferEligibility = introductoryOfferEligibility
        self.expiresAt = expiresAt
    }

    enum CodingKeys: String, CodingKey {
        case orderId, appAccountToken, accountId, productId, quantity, offer, introductoryOfferEligibility, expiresAt
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        orderId = try container.decode(String.self, forKey: .orderId)
        appAccountToken = try container.decode(UUID.self, forKey: .appAccountToken)
        accountId = try container.decode(String.self, forKey: .accountId)
        productId = try container.decode(String.self, forKey: .productId)
        quantity = try container.decodeIfPresent(Int.self, forKey: .quantity) ?? 1
        offer = try container.decodeIfPresent(SignedOffer.self, forKey: .offer)
        introductoryOfferEligibility = try container.decodeIfPresent(
            IntroductoryOfferEligibility.self, forKey: .introductoryOfferEligibility)
        expiresAt = try container.decodeIfPresent(String.self, forKey: .expiresAt).flatMap(ISODate.parse)
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(orderId, forKey: .orderId)
        try container.encode(appAccountToken, forKey: .appAccountToken)
        try container.encode(accountId, forKey: .accountId)
        try container.encode(productId, forKey: .productId)
        try container.encode(quantity, forKey: .quantity)
        try container.encodeIfPresent(offer, forKey: .offer)
        try container.encodeIfPresent(introductoryOfferEligibility, forKey: .introductoryOfferEligibility)
        try container.encodeIfPresent(expiresAt.map(ISODate.format), forKey: .expiresAt)
    }
}

/// The server's timestamps (RFC 3339, with or without fractional seconds), as typed dates.
public enum ISODate {
    public static func parse(_ text: String) -> Date? {
        let fractional = ISO8601DateFormatter()
        fractional.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = fractional.date(from: text) { return date }
        let whole = ISO8601DateFormatter()
        whole.formatOptions = [.withInternetDateTime]
        return whole.date(from: text)
    }

    public static func format(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }
}

/// A promotional offer signed by the server for one order (docs/api.md "Offers on POST /v1/orders"):
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
    /// The promoted purchase (`PromotedPurchase.id`) this payment completes: the adapter adds
    /// the payment StoreKit offered, with Apple's offer and quantity, and the order's token.
    public var promotedPurchaseId: String?

    public init(
        promotionalOffer: SignedOffer? = nil, introductoryOfferEligibilityJWS: String? = nil,
        winBackOfferId: String? = nil, promotedPurchaseId: String? = nil
    ) {
        self.promotionalOffer = promotionalOffer
        self.introductoryOfferEligibilityJWS = introductoryOfferEligibilityJWS
        self.winBackOfferId = winBackOfferId
        self.promotedPurchaseId = promotedPurchaseId
    }

    public var isEmpty: Bool {
        promotionalOffer == nil && introductoryOfferEligibilityJWS == nil && winBackOfferId == nil
            && promotedPurchaseId == nil
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
        /// Why a batch entry was `rejected` or `not_delivered`.
        public var code: String?

        public init(
            transactionId: String, originalTransactionId: String? = nil, productId: String? = nil, quantity: Int? = nil,
            orderId: String? = nil, outcome: String, code: String? = nil
        ) {
            self.transactionId = transactionId
            self.originalTransactionId = originalTransactionId
            self.productId = productId
            self.quantity = quantity
            self.orderId = orderId
            self.outcome = outcome
            self.code = code
        }

        /// An outcome the device may finish on: the server holds the transaction for good
        /// (delivered now or before, refunded, recorded as an anomaly for the operator), or
        /// refused its proof with a proof-final code.
        public var isFinal: Bool {
            switch outcome {
            case "delivered", "already_delivered", "refunded", "not_delivered", "unattributed": true
            case "rejected": code.map(SubmissionVerdict.proofFinalCodes.contains) ?? false
            default: false
            }
        }
    }

    /// This answer's entry for a transaction (by its id, or its original id for StoreKit 1's
    /// "restored for free" copies).
    public func entry(for transaction: StoreTransaction) -> Transaction? {
        transactions.first { $0.transactionId == transaction.id }
            ?? transactions.first { entry in
                transaction.originalId.map { $0 != transaction.id && entry.transactionId == $0 } ?? false
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

    /// The codes on which a device may finish a paid transaction (docs/api.md, "Proof-final codes"):
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
/// Decoded tolerantly: a field added later is optional, a state from a newer SDK reads as
/// `.created` (open), so a downgrade loses nothing.
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
    /// The server order's end; no token-less transaction is attributed to it afterwards.
    public var expiresAt: Date?
    /// The process that wrote `.paying` (a later launch re-checks what an earlier one left).
    public var launch: String?
    /// Bound to a transaction that came back without a token, by product, quantity and time —
    /// a guess: it may have been another purchase of the account's (an offer code), and this
    /// intent's own payment (an Ask to Buy approved later) may still come, carrying its token.
    /// Kept as long as a deferred intent, so that payment still finds its account.
    public var boundByGuess: Bool = false

    public init(
        orderId: String, appAccountToken: UUID, productId: String, quantity: Int, accountId: String, createdAt: Date,
        state: State, transactionId: String? = nil, expiresAt: Date? = nil, launch: String? = nil
    ) {
        self.orderId = orderId
        self.appAccountToken = appAccountToken
        self.productId = productId
        self.quantity = quantity
        self.accountId = accountId
        self.createdAt = createdAt
        self.state = state
        self.transactionId = transactionId
        self.expiresAt = expiresAt
        self.launch = launch
    }

    enum CodingKeys: String, CodingKey {
        case orderId, appAccountToken, productId, quantity, accountId, createdAt, state, transactionId, expiresAt,
            launch, boundByGuess
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        orderId = try container.decode(String.self, forKey: .orderId)
        appAccountToken = try container.decode(UUID.self, forKey: .appAccountToken)
        productId = try container.decode(String.self, forKey: .productId)
        quantity = try container.decodeIfPresent(Int.self, forKey: .quantity) ?? 1
        accountId = try container.decode(String.self, forKey: .accountId)
        createdAt = try container.decode(Date.self, forKey: .createdAt)
        let raw = try container.decodeIfPresent(String.self, forKey: .state) ?? "created"
        state = State(rawValue: raw) ?? .created
        transactionId = try container.decodeIfPresent(String.self, forKey: .transactionId)
        expiresAt = try container.decodeIfPresent(Date.self, forKey: .expiresAt)
        launch = try container.decodeIfPresent(String.self, forKey: .launch)
        boundByGuess = try container.decodeIfPresent(Bool.self, forKey: .boundByGuess) ?? false
    }

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
    /// The delays behind `nextAttemptAt` and `notBefore`, as stated: both are clamped to
    /// now + these at launch and at every drive, so a clock set back never holds an item longer.
    public var backoff: TimeInterval?
    public var retryAfter: TimeInterval?
    /// The next submission refreshes the app receipt first (it did not list the transaction).
    public var refreshProof: Bool
    /// Handed in by a `Transaction.updates` replay, not a purchase of this run: batched, and
    /// never ahead of a new purchase.
    public var replayed: Bool

    public init(
        transaction: StoreTransaction, reason: Reason, accountId: String?, orderId: String?, attempts: Int = 0,
        nextAttemptAt: Date, notBefore: Date? = nil, lastError: String? = nil, backoff: TimeInterval? = nil,
        retryAfter: TimeInterval? = nil, refreshProof: Bool = false, replayed: Bool = false
    ) {
        self.transaction = transaction
        self.reason = reason
        self.accountId = accountId
        self.orderId = orderId
        self.attempts = attempts
        self.nextAttemptAt = nextAttemptAt
        self.notBefore = notBefore
        self.lastError = lastError
        self.backoff = backoff
        self.retryAfter = retryAfter
        self.refreshProof = refreshProof
        self.replayed = replayed
    }

    enum CodingKeys: String, CodingKey {
        case transaction, reason, accountId, orderId, attempts, nextAttemptAt, notBefore, lastError, backoff,
            retryAfter, refreshProof, replayed
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        transaction = try container.decode(StoreTransaction.self, forKey: .transaction)
        let raw = try container.decodeIfPresent(String.self, forKey: .reason) ?? "purchase"
        reason = Reason(rawValue: raw) ?? .purchase
        accountId = try container.decodeIfPresent(String.self, forKey: .accountId)
        orderId = try container.decodeIfPresent(String.self, forKey: .orderId)
        attempts = try container.decodeIfPresent(Int.self, forKey: .attempts) ?? 0
        nextAttemptAt = try container.decodeIfPresent(Date.self, forKey: .nextAttemptAt) ?? Date()
        notBefore = try container.decodeIfPresent(Date.self, forKey: .notBefore)
        lastError = try container.decodeIfPresent(String.self, forKey: .lastError)
        backoff = try container.decodeIfPresent(TimeInterval.self, forKey: .backoff)
        retryAfter = try container.decodeIfPresent(TimeInterval.self, forKey: .retryAfter)
        refreshProof = try container.decodeIfPresent(Bool.self, forKey: .refreshProof) ?? false
        replayed = try container.decodeIfPresent(Bool.self, forKey: .replayed) ?? false
    }

    var key: String { PendingSubmission.key(transaction, reason) }
    static func key(_ transaction: StoreTransaction, _ reason: Reason) -> String {
        reason == .revocation ? transaction.id + "#revoked" : transaction.id
    }

    /// When it may be submitted: the later of backoff and Retry-After.
    var dueAt: Date { max(nextAttemptAt, notBefore ?? nextAttemptAt) }
}

/// A transaction with a final verdict: finished (or about to be), never submitted again
/// unless StoreKit reports it revoked.
public struct SettledTransaction: Codable, Sendable, Equatable {
    public var key: String
    public var accountId: String?
    public var verdict: String
    public var at: Date

    public init(key: String, accountId: String?, verdict: String, at: Date) {
        self.key = key
        self.accountId = accountId
        self.verdict = verdict
        self.at = at
    }
}

/// Everything the device must not forget. Stored as one record per item (`PendingRecords`).
public struct PendingState: Sendable, Equatable {
    public var intents: [PurchaseIntent] = []
    public var pending: [PendingSubmission] = []
    public var settled: [SettledTransaction] = []
    public var customerInfo: [String: CustomerInfo] = [:]
    /// Records this SDK could not read (damaged, or from a newer version): kept as they are,
    /// never overwritten nor removed.
    public var unreadable: [String] = []

    public init() {}
}
