import Foundation
import StoreKeeperCatalog

/// A value of a store's small vocabulary (a product kind, an environment…) that keeps values it
/// does not know: a store adds one, it decodes, survives storage unchanged and can be logged.
/// The raw values are the stored spelling.
public protocol OpenVocabulary: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible
where RawValue: Codable & Hashable & Sendable {
    init(rawValue: RawValue)
}

extension OpenVocabulary {
    public init(from decoder: any Decoder) throws {
        self.init(rawValue: try decoder.singleValueContainer().decode(RawValue.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    public var description: String { "\(rawValue)" }
}

/// One verified purchase or subscription period, from any store, as the core decides on it.
///
/// Each store's adapter builds it from what that store signed or answered (an App Store signed
/// transaction, a Google Play purchase read from the Developer API, a web payment the app's
/// backend reported); no store's wire type goes further. Dates are milliseconds since 1970.
/// Ids keep the store's prefix for uniqueness (`gp:…`, `web:…`); which store it came from is
/// `store`, never parsed out of an id.
public struct StoreTransaction: Codable, Sendable, Hashable {
    public var storeCode: Store?
    /// The store that sold it.
    public var store: Store {
        get { storeCode ?? .appStore }
        set { storeCode = newValue }
    }
    public var transactionId: String?
    /// The first transaction of a subscription's chain (Apple's original transaction id, the
    /// first token of a Google replacement chain): one subscription, one identity.
    public var originalTransactionId: String?
    /// The store's identity of the app it was bought in (a bundle id, a package name).
    public var storeIdentity: String?
    public var productId: String?
    public var subscriptionGroup: String?
    public var purchaseDate: Int64?
    public var originalPurchaseDate: Int64?
    public var expiresDate: Int64?
    public var quantity: Int32?
    public var kind: ProductKind?
    /// The order token the purchase carries (Apple's `appAccountToken`, Google's obfuscated
    /// account id as this server set it, the web order's token).
    public var appAccountToken: String?
    public var ownership: Ownership?
    /// When the store signed or answered it.
    public var signedDate: Int64?
    public var revocationReason: Int32?
    public var revocationDate: Int64?
    public var revocationType: RevocationKind?
    /// The share refunded, in thousandths of a percent (100 000 = all).
    public var revocationPercentage: Int32?
    public var isUpgraded: Bool?
    public var offerType: OfferKind?
    public var offerIdentifier: String?
    public var offerDiscountType: DiscountKind?
    public var offerPeriod: String?
    public var environment: StoreEnvironment?
    public var storefront: String?
    /// A renewal or a first purchase, when the store says.
    public var transactionReason: String?
    public var currency: String?
    /// The price in milliunits of `currency`.
    public var price: Int64?
    /// The store account's stable id for the app (Apple's `appTransactionId`).
    public var appTransactionId: String?
    public var billingPlan: BillingPlan?
    public var commitment: Commitment?
    /// What the developer received, in milliunits of `currency`, when the store says (Stripe's
    /// balance transaction `net`: its fee taken); nil: derived from `price` by `Proceeds`.
    public var proceeds: Int64?

    enum CodingKeys: String, CodingKey {
        // The stored spelling (older rows hold these keys).
        case storeCode = "store"
        case transactionId, originalTransactionId, productId, purchaseDate, originalPurchaseDate, expiresDate
        case quantity, appAccountToken, signedDate, revocationReason, revocationDate, revocationType
        case revocationPercentage, isUpgraded, offerType, offerIdentifier, offerDiscountType, offerPeriod
        case environment, storefront, transactionReason, currency, price, appTransactionId, proceeds
        case storeIdentity = "bundleId"
        case subscriptionGroup = "subscriptionGroupIdentifier"
        case kind = "type"
        case ownership = "inAppOwnershipType"
        case billingPlan = "billingPlanType"
        case commitment = "commitmentInfo"
    }

    public init(
        store: Store, transactionId: String? = nil, originalTransactionId: String? = nil,
        storeIdentity: String? = nil, productId: String? = nil, subscriptionGroup: String? = nil,
        purchaseDate: Int64? = nil, originalPurchaseDate: Int64? = nil, expiresDate: Int64? = nil,
        quantity: Int32? = nil, kind: ProductKind? = nil, appAccountToken: String? = nil,
        ownership: Ownership? = nil, signedDate: Int64? = nil, revocationReason: Int32? = nil,
        revocationDate: Int64? = nil, revocationType: RevocationKind? = nil, revocationPercentage: Int32? = nil,
        isUpgraded: Bool? = nil, offerType: OfferKind? = nil, offerIdentifier: String? = nil,
        offerDiscountType: DiscountKind? = nil, offerPeriod: String? = nil, environment: StoreEnvironment? = nil,
        storefront: String? = nil, transactionReason: String? = nil, currency: String? = nil, price: Int64? = nil,
        appTransactionId: String? = nil, billingPlan: BillingPlan? = nil, commitment: Commitment? = nil
    ) {
        self.storeCode = store
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.storeIdentity = storeIdentity
        self.productId = productId
        self.subscriptionGroup = subscriptionGroup
        self.purchaseDate = purchaseDate
        self.originalPurchaseDate = originalPurchaseDate
        self.expiresDate = expiresDate
        self.quantity = quantity
        self.kind = kind
        self.appAccountToken = appAccountToken
        self.ownership = ownership
        self.signedDate = signedDate
        self.revocationReason = revocationReason
        self.revocationDate = revocationDate
        self.revocationType = revocationType
        self.revocationPercentage = revocationPercentage
        self.isUpgraded = isUpgraded
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.offerDiscountType = offerDiscountType
        self.offerPeriod = offerPeriod
        self.environment = environment
        self.storefront = storefront
        self.transactionReason = transactionReason
        self.currency = currency
        self.price = price
        self.appTransactionId = appTransactionId
        self.billingPlan = billingPlan
        self.commitment = commitment
    }

    /// Refunded or revoked: the store dated its revocation.
    public var isRevoked: Bool { revocationDate != nil }

    /// A payment the app's backend reported from its own web checkout (no store to tell: no
    /// account token to set, no transaction to finish, no store commission).
    public var isWebPurchase: Bool { store == .web }

    /// A transaction Apple's APIs may be asked about (Set App Account Token, Finish Transaction,
    /// history, extensions).
    public var isAppStoreTransaction: Bool { store == .appStore && transactionId != nil }

    /// The transaction id of a web payment (`web:<paymentId>`).
    public static func webTransactionId(paymentId: String) -> String { "web:" + paymentId }

    /// What kind of product was bought.
    public struct ProductKind: OpenVocabulary {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let autoRenewable = Self(rawValue: "Auto-Renewable Subscription")
        public static let nonConsumable = Self(rawValue: "Non-Consumable")
        public static let consumable = Self(rawValue: "Consumable")
        public static let nonRenewing = Self(rawValue: "Non-Renewing Subscription")

        /// The kind the catalog gives a product.
        public init(_ kind: Product.Kind) {
            switch kind {
            case .consumable: self = .consumable
            case .nonConsumable: self = .nonConsumable
            case .nonRenewing: self = .nonRenewing
            case .autoRenewable: self = .autoRenewable
            }
        }
    }

    /// Bought by the account, or shared with it by a family member.
    public struct Ownership: OpenVocabulary {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let purchased = Self(rawValue: "PURCHASED")
        public static let familyShared = Self(rawValue: "FAMILY_SHARED")
    }

    /// How a refund or revocation took it back: everything, a prorated share, or a family
    /// member's access withdrawn.
    public struct RevocationKind: OpenVocabulary {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let refundFull = Self(rawValue: "REFUND_FULL")
        public static let refundProrated = Self(rawValue: "REFUND_PRORATED")
        public static let familyRevoke = Self(rawValue: "FAMILY_REVOKE")
    }

    /// The offer a period was bought with.
    public struct OfferKind: OpenVocabulary {
        public var rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }
        public static let introductory = Self(rawValue: 1)
        public static let promotional = Self(rawValue: 2)
        public static let offerCode = Self(rawValue: 3)
        public static let winBack = Self(rawValue: 4)
    }

    /// How an offer discounts: a free trial, a reduced price each period, paid up front, once.
    public struct DiscountKind: OpenVocabulary {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let freeTrial = Self(rawValue: "FREE_TRIAL")
        public static let payAsYouGo = Self(rawValue: "PAY_AS_YOU_GO")
        public static let payUpFront = Self(rawValue: "PAY_UP_FRONT")
        public static let oneTime = Self(rawValue: "ONE_TIME")
    }

    /// A plan billed up front, or monthly within a commitment.
    public struct BillingPlan: OpenVocabulary {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let billedUpfront = Self(rawValue: "BILLED_UPFRONT")
        public static let monthly = Self(rawValue: "MONTHLY")
    }

    /// A monthly plan's commitment: this period's number, how many it has, when it ends.
    public struct Commitment: Codable, Sendable, Hashable {
        public var billingPeriodNumber: Int32?
        public var totalBillingPeriods: Int32?
        public var commitmentExpiresDate: Int64?
        public var commitmentPrice: Int64?

        public init(
            billingPeriodNumber: Int32? = nil, totalBillingPeriods: Int32? = nil,
            commitmentExpiresDate: Int64? = nil, commitmentPrice: Int64? = nil
        ) {
            self.billingPeriodNumber = billingPeriodNumber
            self.totalBillingPeriods = totalBillingPeriods
            self.commitmentExpiresDate = commitmentExpiresDate
            self.commitmentPrice = commitmentPrice
        }
    }
}

/// Where a store says a purchase was made: real money (production) or a test environment.
public struct StoreEnvironment: OpenVocabulary {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public static let production = Self(rawValue: "Production")
    public static let sandbox = Self(rawValue: "Sandbox")
    public static let xcode = Self(rawValue: "Xcode")
    public static let localTesting = Self(rawValue: "LocalTesting")

    /// No money changed hands (sandbox, Xcode, local testing).
    public var isTest: Bool { self != .production }
}

/// What a store says about a subscription's next renewal, with the store's words left at its
/// adapter.
public struct StoreRenewal: Sendable, Hashable {
    /// Whether it renews (nil: not said).
    public var autoRenew: Bool?
    /// The product it renews into (another one after a downgrade, at the next renewal).
    public var nextProductId: String?
    public var renewalPrice: Int64?
    public var currency: String?
    public var gracePeriodExpiresDate: Int64?
    /// Whether a commitment plan starts a new commitment at its end (nil: not said).
    public var commitmentRenews: Bool?
    public var signedDate: Int64?

    public init(
        autoRenew: Bool? = nil, nextProductId: String? = nil, renewalPrice: Int64? = nil, currency: String? = nil,
        gracePeriodExpiresDate: Int64? = nil, commitmentRenews: Bool? = nil, signedDate: Int64? = nil
    ) {
        self.autoRenew = autoRenew
        self.nextProductId = nextProductId
        self.renewalPrice = renewalPrice
        self.currency = currency
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.commitmentRenews = commitmentRenews
        self.signedDate = signedDate
    }
}

/// What a store's notification about a subscription or purchase means, in the core's terms:
/// each store's adapter reads its own notification types into one of these, so the machine and
/// the planners never see a store's vocabulary.
public enum StoreNotice: Sendable, Hashable {
    /// A new period: first buy, resubscription, renewal, billing recovered, an offer redeemed,
    /// an extension.
    case newPeriod
    /// A one-time product bought (delivered; no subscription changes).
    case oneTimePurchase
    /// A renewal payment failed: in a grace period (access kept) or in billing retry.
    case renewalFailed(gracePeriod: Bool)
    case gracePeriodEnded
    case expired
    /// The customer turned auto-renew on (true) or off (false).
    case autoRenewChanged(Bool?)
    /// The customer changed plan: at once (an upgrade) or at the next renewal.
    case planChanged(immediate: Bool)
    case priceIncrease
    /// A refund (or a family member's access withdrawn: `revoke`).
    case refunded(revoke: Bool)
    case refundReversed
    case refundDeclined
    /// The store asks what was consumed before it decides a refund.
    case consumptionRequest
    /// A mass extension's summary (each subscription gets its own `newPeriod`).
    case extensionSummary
    /// The customer withdrew consent to share data.
    case consentRescinded
    /// A token for a purchase made outside the store.
    case externalPurchaseToken(unreported: Bool)
    case test
    /// A type that changes nothing here (`why`: what it is for).
    case other(String)
    /// A type the adapter does not know yet: stored and ignored.
    case unknown
}

/// A token the store issued for a purchase made outside it (Apple's external purchase token):
/// recorded, and reported to the store when it asks.
public struct ExternalToken: Sendable, Hashable {
    public var externalPurchaseId: String?
    public var createdAt: Int64?
    public var expiresAt: Int64?
    public var storeIdentity: String?
    public var tokenType: String?
    public var environment: String?

    public init(
        externalPurchaseId: String?, createdAt: Int64? = nil, expiresAt: Int64? = nil, storeIdentity: String? = nil,
        tokenType: String? = nil, environment: String? = nil
    ) {
        self.externalPurchaseId = externalPurchaseId
        self.createdAt = createdAt
        self.expiresAt = expiresAt
        self.storeIdentity = storeIdentity
        self.tokenType = tokenType
        self.environment = environment
    }
}
