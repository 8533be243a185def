import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// The local App Store's values: configuration, customers, transactions, subscriptions,
/// notifications, purchases and errors.
extension LocalAppStore {
    public struct Configuration: Sendable {
        public var bundleId: String
        public var appAppleId: Int64
        /// The environment stamped on everything this store signs.
        public var environment: AppStoreEnvironment
        public var catalog: Catalog
        /// Billing Grace Period, or nil when the app has it off.
        public var gracePeriod: TimeInterval?
        /// How long the App Store retries billing before `EXPIRED` / `BILLING_RETRY`.
        public var billingRetryPeriod: TimeInterval
        /// Where notifications go; nil keeps them in the history only.
        public var notificationURL: String?
        /// Apple retries failed notifications only in Production; this applies the schedule in
        /// Sandbox too, so a test can watch it.
        public var retryNotificationsInSandbox: Bool
        /// The App Store Connect key (PEM public key, key id, issuer) whose tokens the Server API accepts.
        public var serverAPIKey: ServerAPIKey?
        /// The app's shared secret for verifyReceipt; nil accepts any password.
        public var sharedSecret: String?
        /// In-App Purchase keys whose offer signatures purchases accept (default: the Server API key).
        public var offerKeys: [ServerAPIKey]

        public init(
            bundleId: String = "com.example.app", appAppleId: Int64 = 1_234_567_890,
            environment: AppStoreEnvironment = .production, catalog: Catalog,
            gracePeriod: TimeInterval? = 16 * 86_400, billingRetryPeriod: TimeInterval = 60 * 86_400,
            notificationURL: String? = nil, retryNotificationsInSandbox: Bool = false,
            serverAPIKey: ServerAPIKey? = nil,
            sharedSecret: String? = nil, offerKeys: [ServerAPIKey]? = nil
        ) {
            self.offerKeys = offerKeys ?? serverAPIKey.map { [$0] } ?? []
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environment = environment
            self.catalog = catalog
            self.gracePeriod = gracePeriod
            self.billingRetryPeriod = billingRetryPeriod
            self.notificationURL = notificationURL
            self.retryNotificationsInSandbox = retryNotificationsInSandbox
            self.serverAPIKey = serverAPIKey
            self.sharedSecret = sharedSecret
        }
    }

    /// The public half of an App Store Connect In-App Purchase key.
    public struct ServerAPIKey: Sendable {
        public var issuerId: String
        public var keyId: String
        public var publicKeyPEM: String

        public init(issuerId: String, keyId: String, publicKeyPEM: String) {
            self.issuerId = issuerId
            self.keyId = keyId
            self.publicKeyPEM = publicKeyPEM
        }
    }

    /// A simulated Apple Account on a device in a storefront.
    public struct Customer: Sendable, Hashable {
        public var appleId: String
        public var storefront: String
        public var deviceId: UUID
        public var appTransactionId: String
        /// Renewals fail while set (an expired card).
        public var billingFails = false
        /// Transactions in purchase order, as the device's receipt lists them.
        public var transactionIds: [String] = []
        /// Consumables the app has finished: they drop out of the receipt.
        public var finished: Set<String> = []
    }

    public struct StoredTransaction: Sendable, Hashable {
        public var payload: JWSTransactionDecodedPayload
        public var appleId: String
        /// When Apple last changed it (history v2 sorts by this).
        public var modified: Date
        public var consumptionRequested = false
        /// What the developer sent with Send Consumption Information, last first-come.
        public var consumptionReceived: [ConsumptionRequest] = []
    }

    public struct Subscription: Sendable, Hashable {
        public var originalTransactionId: String
        public var appleId: String
        public var group: String
        public var productId: String
        public var autoRenewProductId: String
        public var autoRenew: Bool
        public var expires: Date
        public var status: SubscriptionStatus
        public var gracePeriodExpires: Date?
        public var billingRetrySince: Date?
        public var expirationIntent: ExpirationIntent?
        public var lastTransactionId: String
        public var appAccountToken: String?
        public var extensions: [Date] = []
        /// A promotional offer redeemed while subscribed: applied at the next renewal.
        public var pendingOffer: PendingOffer? = nil
        /// Set while billed monthly with a 12-month commitment.
        public var commitment: Commitment? = nil
    }

    public struct PendingOffer: Sendable, Hashable {
        public var type: OfferType?
        public var id: String?
        public var discountType: OfferDiscountType?
        public var period: String?
        public var price: Int64?
    }

    /// A notification and what happened to it.
    public struct SentNotification: Sendable, Hashable {
        public var payload: ResponseBodyV2DecodedPayload
        public var signedPayload: String
        public var attempts: [SendAttemptItem] = []
        /// Store time of the next attempt; nil when delivered or out of retries.
        public var nextAttempt: Date?
        public var delivered: Bool { attempts.last?.sendAttemptResult == .success }
    }

    public struct PendingPurchase: Sendable, Hashable {
        public var id: String
        public var appleId: String
        public var items: [PurchaseItem]
        public var appAccountToken: UUID?
        var discount: Discount? = nil
    }

    public struct PurchaseItem: Sendable, Hashable, Codable {
        public var productId: String
        public var quantity: Int32
        /// `MONTHLY`: a 1-year product billed monthly with a 12-month commitment.
        public var billingPlan: String?
        public init(productId: String, quantity: Int32 = 1, billingPlan: String? = nil) {
            self.productId = productId
            self.quantity = quantity
            self.billingPlan = billingPlan
        }
    }

    /// A monthly plan's 12-month commitment.
    public struct Commitment: Sendable, Hashable {
        public var period: Int
        public var periods = 12
        public var expires: Date
        /// Whether a new commitment starts after this one (the customer cancels only that).
        public var renews = true
        /// One period's price, milliunits.
        public var monthlyPrice: Int64
    }

    /// What a purchase returns to the simulated device.
    public struct PurchaseResult: Sendable {
        /// Signed transactions, one per item (merged payments: several).
        public var signedTransactions: [String]
        public var transactions: [JWSTransactionDecodedPayload]
        /// The device's app receipt after the purchase (PKCS#7, DER).
        public var receipt: [UInt8]
        /// Set for Ask to Buy: nothing was charged yet.
        public var pendingId: String?
        /// Apple's Order ID of the charge, as the customer's receipt e-mail shows it.
        public var orderId: String? = nil
    }

    public enum StoreError: Error, Hashable, Sendable, CustomStringConvertible {
        case unknownProduct(String)
        case unknownTransaction(String)
        case unknownSubscription(String)
        case unknownPending(String)
        case invalid(String)

        public var description: String {
            switch self {
            case .unknownProduct(let id): "unknown product '\(id)'"
            case .unknownTransaction(let id): "unknown transaction '\(id)'"
            case .unknownSubscription(let id): "unknown subscription '\(id)'"
            case .unknownPending(let id): "unknown pending purchase '\(id)'"
            case .invalid(let reason): reason
            }
        }
    }
}
