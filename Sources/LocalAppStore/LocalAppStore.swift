import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// A faithful fake of the App Store: customers buy, subscriptions renew on a controllable
/// clock, refunds happen, and every event is signed with the local App Store's own
/// Apple-shaped certificate authority and queued as a Server Notification V2.
///
/// The state lives in memory; the keys live in the data directory (`PKIStore`). The HTTP
/// face (`LocalAppStoreServer`) serves Apple's paths on top of this actor.
public actor LocalAppStore {
    nonisolated public let configuration: Configuration
    nonisolated public let pki: ApplePKI
    nonisolated public let clock: StoreClock
    nonisolated let signer: JWSSigner
    /// The In-App Purchase keys' public halves, for offer signatures.
    nonisolated let offerChecker: OfferSignatureChecker

    var customers: [String: Customer] = [:]
    var transactions: [String: StoredTransaction] = [:]
    var subscriptions: [String: Subscription] = [:]
    var pending: [String: PendingPurchase] = [:]
    /// Apple's Order ID of each charge (what the receipt e-mail shows the customer) → the
    /// transactions it paid: what Look Up Order ID answers.
    var orders: [String: [String]] = [:]
    /// External purchase tokens issued, and the reports accepted (by requestIdentifier).
    var externalTokens: [String: ExternalToken] = [:]
    var externalReports: [String: ExternalPurchaseReport] = [:]
    public internal(set) var notifications: [SentNotification] = []
    /// Faults injected through the control API.
    public var faults = Faults()
    var modificationCounter = 0
    /// Offer nonces already redeemed (V1 and V2): each is good for one purchase.
    var usedOfferNonces: Set<String> = []
    /// `appleId|group` pairs that had their introductory offer.
    var introductoryUsed: Set<String> = []
    /// Renewal-date extensions answered, by `originalTransactionId|requestIdentifier`.
    var extensionAnswers: [String: ExtendRenewalDateResponse] = [:]
    /// Mass extensions, by request identifier.
    var massExtensions: [String: MassExtendRenewalDateStatusResponse] = [:]
    /// Retention Messaging: the realtime URL, messages (auto-approved), defaults per product and locale.
    var realtimeURL: String?
    var retentionMessages: [String: StoredMessage] = [:]
    var defaultMessages: [String: String] = [:]
    var performanceTests: [String: PerformanceTestResultResponse] = [:]
    var runningPerformanceTest: String?

    public init(configuration: Configuration, pki: ApplePKI, clock: StoreClock = StoreClock()) {
        self.configuration = configuration
        self.pki = pki
        self.clock = clock
        self.signer = pki.jwsSigner
        self.offerChecker = Self.offerChecker(configuration)
    }
}
