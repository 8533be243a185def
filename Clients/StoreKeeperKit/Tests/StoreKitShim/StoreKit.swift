// The StoreKit API surface StoreKeeperKit's adapters use, declared with Apple's signatures
// (developer.apple.com/documentation/storekit), so that the adapters type-check on Linux: a
// renamed call or a wrong type fails the build. Each declaration carries Apple's availability
// (introduced, deprecated: StoreKit 1 since iOS 18) as Xcode sees it; Swift checks platform
// availability only when compiling for that platform, so on Linux these annotations document and
// the adapters' own `#available` guards are what the iOS build checks. Test-only: nothing here
// runs; every body traps. Linux only — elsewhere the real StoreKit is imported.
#if os(Linux)
    import Foundation

    private func unavailable() -> Never { fatalError("StoreKit shim: declarations only") }

    // MARK: StoreKit 2

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public struct Product: Sendable, Identifiable, Hashable {
        public typealias ID = String
        public let id: Product.ID
        public let displayName: String
        public let displayPrice: String

        public static func products<Identifiers: Collection>(for identifiers: Identifiers) async throws -> [Product]
        where Identifiers.Element == Product.ID { unavailable() }

        @MainActor
        public func purchase(options: Set<Product.PurchaseOption> = []) async throws -> Product.PurchaseResult {
            unavailable()
        }

        public let subscription: Product.SubscriptionInfo?

        public struct PurchaseOption: Hashable, Sendable {
            public static func appAccountToken(_ token: UUID) -> Product.PurchaseOption { unavailable() }
            public static func quantity(_ quantity: Int) -> Product.PurchaseOption { unavailable() }
            // @backDeployed(before: iOS 26.0, …): an array, not one option.
            public static func promotionalOffer(_ offerID: String, compactJWS: String) -> [Product.PurchaseOption] {
                unavailable()
            }
            public static func promotionalOffer(
                offerID: String, keyID: String, nonce: UUID, signature: Data, timestamp: Int
            ) -> Product.PurchaseOption { unavailable() }
            // @backDeployed(before: iOS 18.4, …)
            public static func introductoryOfferEligibility(compactJWS: String) -> Product.PurchaseOption {
                unavailable()
            }
            @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
            public static func winBackOffer(_ offer: Product.SubscriptionOffer) -> Product.PurchaseOption {
                unavailable()
            }
        }

        public struct SubscriptionInfo: Hashable, Sendable {
            @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
            public var winBackOffers: [Product.SubscriptionOffer] { unavailable() }
            let _winBackOffers: [Product.SubscriptionOffer]
        }

        public struct SubscriptionOffer: Hashable, Sendable {
            public let id: String?
            public let type: Product.SubscriptionOffer.OfferType

            public struct OfferType: Hashable, Sendable {
                public static let introductory = OfferType()
                public static let promotional = OfferType()
                @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
                public static let winBack = OfferType()
            }
        }

        public enum PurchaseError: Error, Sendable {
            case invalidQuantity, productUnavailable, purchaseNotAllowed, ineligibleForOffer, invalidOfferIdentifier
            case invalidOfferPrice, invalidOfferSignature, missingOfferParameters
        }

        public enum PurchaseResult: Sendable {
            case success(VerificationResult<Transaction>)
            case userCancelled
            case pending
        }
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public enum VerificationResult<SignedType: Sendable>: Sendable {
        public enum VerificationError: Error, Sendable {
            case revokedCertificate, invalidCertificateChain, invalidDeviceVerification, invalidEncoding,
                invalidSignature, missingRequiredProperties
        }
        case unverified(SignedType, VerificationResult<SignedType>.VerificationError)
        case verified(SignedType)

        public var jwsRepresentation: String { unavailable() }
        public var unsafePayloadValue: SignedType { unavailable() }
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public struct Transaction: Sendable, Identifiable, Hashable {
        public let id: UInt64
        public let originalID: UInt64
        public let productID: String
        public let purchasedQuantity: Int
        public let appAccountToken: UUID?
        public let purchaseDate: Date
        public let revocationDate: Date?
        public let ownershipType: Transaction.OwnershipType
        public let isUpgraded: Bool
        @available(iOS, introduced: 15.0, deprecated: 17.2, message: "Use the offer property instead")
        public let offerID: String?
        @available(iOS, introduced: 15.0, deprecated: 17.2, message: "Use the offer property instead")
        public let offerType: Transaction.OfferType?
        @available(iOS 17.2, macOS 14.2, tvOS 17.2, watchOS 10.2, visionOS 1.1, *)
        public var offer: Transaction.Offer? { unavailable() }
        @available(iOS 17.0, macOS 14.0, tvOS 17.0, watchOS 10.0, visionOS 1.0, *)
        public var reason: Transaction.Reason { unavailable() }
        @available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0, *)
        public var environment: AppStore.Environment { unavailable() }

        public struct OwnershipType: Equatable, Hashable, Sendable {
            public static let purchased = OwnershipType()
            public static let familyShared = OwnershipType()
        }
        public struct OfferType: Equatable, Hashable, Sendable {
            public static let introductory = OfferType()
            public static let promotional = OfferType()
            public static let code = OfferType()
            @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
            public static let winBack = OfferType()
        }
        @available(iOS 17.2, macOS 14.2, tvOS 17.2, watchOS 10.2, visionOS 1.1, *)
        public struct Offer: Hashable, Sendable {
            public let id: String?
            public let type: Transaction.OfferType
        }
        @available(iOS 17.0, macOS 14.0, tvOS 17.0, watchOS 10.0, visionOS 1.0, *)
        public struct Reason: Equatable, Hashable, Sendable {
            public static let purchase = Reason()
            public static let renewal = Reason()
        }

        public func finish() async { unavailable() }

        public static var updates: Transaction.Transactions { unavailable() }
        public static var unfinished: Transaction.Transactions { unavailable() }
        public static var currentEntitlements: Transaction.Transactions { unavailable() }
        public static var all: Transaction.Transactions { unavailable() }

        public struct Transactions: AsyncSequence, Sendable {
            public typealias Element = VerificationResult<Transaction>
            public struct AsyncIterator: AsyncIteratorProtocol {
                public mutating func next() async -> VerificationResult<Transaction>? { unavailable() }
            }
            public func makeAsyncIterator() -> AsyncIterator { unavailable() }
        }
    }

    @available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0, *)
    public struct AppTransaction: Sendable {
        // iOS 16.0: `static var shared: VerificationResult<AppTransaction> { get async throws }`
        public static var shared: VerificationResult<AppTransaction> {
            get async throws { unavailable() }
        }
        // Back-deployed to iOS 16.0.
        public let appTransactionID: String
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public enum AppStore {
        public static func sync() async throws { unavailable() }

        @available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0, *)
        public struct Environment: Equatable, Hashable, Sendable {
            public static let production = Environment()
            public static let sandbox = Environment()
            public static let xcode = Environment()
        }
    }

    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public enum StoreKitError: Error, Sendable {
        case unknown
        case userCancelled
        case networkError(URLError)
        case systemError(any Error)
        case notAvailableInStorefront
        case notEntitled
    }

    @available(iOS 16.4, macOS 14.4, visionOS 1.0, *)
    @available(tvOS, unavailable)
    @available(watchOS, unavailable)
    public struct PurchaseIntent: Sendable {
        public let product: Product
        // The offer the App Store attached (a promotional or win-back offer).
        @available(iOS 18.0, macOS 15.0, visionOS 2.0, *)
        public var offer: Product.SubscriptionOffer? { unavailable() }
        let _offer: Product.SubscriptionOffer?
        public var id: Product.ID { unavailable() }
        public static var intents: PurchaseIntent.PurchaseIntents { unavailable() }

        public struct PurchaseIntents: AsyncSequence, Sendable {
            public typealias Element = PurchaseIntent
            public struct AsyncIterator: AsyncIteratorProtocol {
                public mutating func next() async -> PurchaseIntent? { unavailable() }
            }
            public func makeAsyncIterator() -> AsyncIterator { unavailable() }
        }
    }

    // MARK: StoreKit 1

    // StoreKit 1: @available(iOS, introduced: 3.0, deprecated: 18.0) throughout (the adapter is
    // for apps that still ship it; StoreKit 2 is the default).
    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKPayment: NSObject {
        open var productIdentifier: String { unavailable() }
        open var quantity: Int { unavailable() }
        open var applicationUsername: String? { unavailable() }
        // iOS 12.2
        open var paymentDiscount: SKPaymentDiscount? { unavailable() }
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKRequest: NSObject {
        open weak var delegate: SKRequestDelegate?
        open func start() { unavailable() }
        open func cancel() { unavailable() }
    }

    /// In StoreKit an Objective-C protocol with optional methods; here the ones the adapter implements.
    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    public protocol SKRequestDelegate: NSObjectProtocol {
        func requestDidFinish(_ request: SKRequest)
        func request(_ request: SKRequest, didFailWithError error: Error)
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKReceiptRefreshRequest: SKRequest {
        public init(receiptProperties properties: [String: Any]?) { unavailable() }
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKPaymentDiscount: NSObject {
        public init(identifier: String, keyIdentifier: String, nonce: UUID, signature: String, timestamp: NSNumber) {
            unavailable()
        }
        open var identifier: String { unavailable() }
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKMutablePayment: SKPayment {
        public override init() { super.init() }
        public init(product: SKProduct) { unavailable() }
        open override var paymentDiscount: SKPaymentDiscount? {
            get { unavailable() }
            set { unavailable() }
        }
        open override var productIdentifier: String {
            get { unavailable() }
            set { unavailable() }
        }
        open override var quantity: Int {
            get { unavailable() }
            set { unavailable() }
        }
        open override var applicationUsername: String? {
            get { unavailable() }
            set { unavailable() }
        }
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKProduct: NSObject {
        open var productIdentifier: String { unavailable() }
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    public enum SKPaymentTransactionState: Int, @unchecked Sendable {
        case purchasing, purchased, failed, restored, deferred
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKPaymentTransaction: NSObject {
        open var error: Error? { unavailable() }
        open var original: SKPaymentTransaction? { unavailable() }
        open var payment: SKPayment { unavailable() }
        open var transactionDate: Date? { unavailable() }
        open var transactionIdentifier: String? { unavailable() }
        open var transactionState: SKPaymentTransactionState { unavailable() }
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    public struct SKError: Error {
        public enum Code: Int, Sendable {
            case unknown, clientInvalid, paymentCancelled, paymentInvalid, paymentNotAllowed
            case storeProductNotAvailable, cloudServicePermissionDenied, cloudServiceNetworkConnectionFailed
            case cloudServiceRevoked, privacyAcknowledgementRequired, unauthorizedRequestData, invalidOfferIdentifier
            case invalidSignature, missingOfferParams, invalidOfferPrice, overlayCancelled
            case overlayInvalidConfiguration, overlayTimeout, ineligibleForOffer, unsupportedPlatform
            case overlayPresentedInBackgroundScene
        }
        public var code: SKError.Code { unavailable() }
    }

    /// In StoreKit an Objective-C protocol with optional methods; here each method the adapter
    /// implements is required, so a signature that differs from Apple's fails to conform.
    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    public protocol SKPaymentTransactionObserver: NSObjectProtocol {
        func paymentQueue(_ queue: SKPaymentQueue, updatedTransactions transactions: [SKPaymentTransaction])
        func paymentQueue(_ queue: SKPaymentQueue, shouldAddStorePayment payment: SKPayment, for product: SKProduct)
            -> Bool
        func paymentQueueRestoreCompletedTransactionsFinished(_ queue: SKPaymentQueue)
        func paymentQueue(_ queue: SKPaymentQueue, restoreCompletedTransactionsFailedWithError error: Error)
    }

    @available(iOS, introduced: 3.0, deprecated: 18.0, message: "Use StoreKit 2")
    @available(macOS, introduced: 10.7, deprecated: 15.0, message: "Use StoreKit 2")
    @available(tvOS, introduced: 9.0, deprecated: 18.0, message: "Use StoreKit 2")
    open class SKPaymentQueue: NSObject {
        open class func `default`() -> SKPaymentQueue { unavailable() }
        open var transactions: [SKPaymentTransaction] { unavailable() }
        open func add(_ observer: SKPaymentTransactionObserver) { unavailable() }
        open func remove(_ observer: SKPaymentTransactionObserver) { unavailable() }
        open func add(_ payment: SKPayment) { unavailable() }
        open func finishTransaction(_ transaction: SKPaymentTransaction) { unavailable() }
        open func restoreCompletedTransactions() { unavailable() }
    }
#endif
