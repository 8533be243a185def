import Foundation
import StoreKeeperCatalog

/// An order, created before payment so a payment always has somewhere to land (docs/api.md).
public struct Order: Codable, Hashable, Sendable {
    public enum Status: String, Codable, Hashable, Sendable {
        case created, pending, delivered, cancelled, refunded, failed
        /// A prorated refund took back part of what was delivered (`revocationPercentage`).
        case partiallyRefunded = "partially_refunded"

        /// Still waiting for its payment. A cancelled order (TTL passed) still takes a late
        /// verified payment: money that arrived is never turned away.
        public var isOpen: Bool { self == .created || self == .pending || self == .cancelled }
    }

    public var orderId: String
    public var appAccountToken: UUID
    public var accountId: String
    public var productId: String
    public var quantity: Int
    public var status: Status
    public var createdAt: Date
    public var transactionId: String?
    public var deliveredAt: Date?
    /// The promotional offer signed for this order, and whether the transaction that paid it
    /// redeemed that offer (Apple signed `offerType` 2 with this `offerIdentifier`).
    public var offerId: String?
    public var offerRedeemed = false
    /// StoreKit's `AppTransaction.appTransactionID`, as the app gave it.
    public var appTransactionId: String?
    /// The app the order is for (`apps` id).
    public var appId: String?

    public init(
        orderId: String, appAccountToken: UUID, accountId: String, productId: String, quantity: Int, status: Status,
        createdAt: Date, transactionId: String? = nil, deliveredAt: Date? = nil, offerId: String? = nil,
        offerRedeemed: Bool = false, appTransactionId: String? = nil, appId: String? = nil
    ) {
        self.appId = appId
        self.offerId = offerId
        self.offerRedeemed = offerRedeemed
        self.appTransactionId = appTransactionId
        self.orderId = orderId
        self.appAccountToken = appAccountToken
        self.accountId = accountId
        self.productId = productId
        self.quantity = quantity
        self.status = status
        self.createdAt = createdAt
        self.transactionId = transactionId
        self.deliveredAt = deliveredAt
    }
}

/// What a delivery gives an account.
public enum Grant: Hashable, Sendable {
    /// `amount` units of a consumable currency, credited through the ledger.
    case currency(code: String, amount: Int64)
    /// An entitlement, until `expiresAt` (nil: forever).
    case entitlement(id: String, expiresAt: Date?)
}

/// One credit or debit of a consumable currency; `key` is unique, so replaying it is a no-op.
public struct LedgerEntry: Hashable, Sendable {
    public var key: String
    public var accountId: String
    public var currency: String
    public var amount: Int64

    public init(key: String, accountId: String, currency: String, amount: Int64) {
        self.key = key
        self.accountId = accountId
        self.currency = currency
        self.amount = amount
    }
}

/// Where a purchase was made: each store's adapter says so, and storage records it in a
/// `store` column (never parsed back out of an id). A new store is one case here.
public enum Store: String, Sendable, Hashable, Codable, CaseIterable {
    case appStore = "app_store"
    case googlePlay = "google_play"
    /// Payments the app's backend reports (`POST /v1/purchases {"store": "web"}`).
    case web
    /// Web checkout through Stripe (its adapter reads Stripe's objects).
    case stripe
}

/// Something an operator must look at (docs/api.md anomaly kinds).
public struct AnomalyDraft: Hashable, Sendable {
    public enum Kind: String, Hashable, Sendable {
        case unattributedTransaction = "unattributed_transaction"
        case productMismatch = "product_mismatch"
        case ownershipConflict = "ownership_conflict"
        case verificationStuck = "verification_stuck"
        case refundedAfterDelivery = "refunded_after_delivery"
        case unknownProduct = "unknown_product"
        /// A grant whose arithmetic overflows (amount × quantity, or a balance): never a crash.
        case grantOverflow = "grant_overflow"
        /// One Apple Account (appTransactionId) on more app accounts than configured.
        case sharedAppleId = "shared_apple_id"
        /// An offer code or win-back offer redeemed past the catalog's `maxPerAccount`.
        case offerLimitExceeded = "offer_limit_exceeded"
        /// A Google Play purchase unacknowledged for 48 hours (Google refunds it at 72).
        case acknowledgementOverdue = "acknowledgement_overdue"
        /// A payment of one app carrying (or naming) an order created for another app of the
        /// deployment: never delivered to that order.
        case appMismatch = "app_mismatch"
    }

    public var kind: Kind
    public var transactionId: String?
    public var orderId: String?
    public var accountId: String?
    public var detail: String
    /// The store of the purchase it is about, when the path that raised it knows.
    public var store: Store? = nil
    /// The app (`apps[].id`) of the purchase it is about, when the path that raised it knows:
    /// a purchase nobody holds has no delivery or order to say it.
    public var appId: String? = nil

    public init(kind: Kind, transactionId: String?, orderId: String?, accountId: String?, detail: String) {
        self.kind = kind
        self.transactionId = transactionId
        self.orderId = orderId
        self.accountId = accountId
        self.detail = detail
    }
}

/// Who owns a non-consumable or subscription: the first account it was delivered to.
public enum OwnershipPolicy: String, Codable, Hashable, Sendable {
    /// Another account submitting it is refused (`owned_by_other_account`). The default.
    case firstBinder = "first_binder"
    /// It moves to the account that submits it last.
    case transfer
}
