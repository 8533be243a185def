import Foundation

/// What `purchase` ended with.
public enum PurchaseOutcome: Sendable, Equatable {
    /// The server delivered it (or had already): the transaction is finished.
    case delivered(PurchaseResponse)
    /// Paid — StoreKit returned the transaction — and being delivered: the server has not given
    /// its verdict yet (offline, busy, Apple slow). The device holds it and delivers it by
    /// itself; the app says "Payment received — your purchase will appear shortly".
    case processing
    /// StoreKit has not answered within `purchaseTimeout` (a slow sheet, SCA or 3-D Secure in
    /// another app): nothing is known to be charged yet. If StoreKit later reports the payment
    /// it is delivered without the user doing anything; the app says "Waiting for the App Store
    /// — we'll add it as soon as it confirms".
    case waitingForStore
    /// Ask to Buy: a parent must approve; it is delivered when they do, even days later.
    case deferred
    case cancelled
    /// StoreKit failed the payment (nothing charged), with what it said, typed.
    case failed(StoreKitFailure)
    /// The server refused the proof for good (for example `owned_by_other_account`).
    case rejected(code: String, message: String)
    /// StoreKit answered this payment with a transaction paid earlier (StoreKit 1's "restored
    /// for free", an unfinished one resurfacing): nothing was charged for this order, which is
    /// closed; the old transaction is submitted on its own.
    case notCharged(transactionId: String)

    /// Either of the two "not finished yet" outcomes (`processing`, `waitingForStore`).
    public var isPending: Bool { self == .processing || self == .waitingForStore }
}

/// What StoreKit threw or failed a payment with, kept typed: `kind` for the app's decision,
/// `code` naming Apple's error (`StoreKitError.networkError`,
/// `Product.PurchaseError.invalidOfferSignature`, `SKError.paymentNotAllowed`…) as the adapter
/// mapped it case by case, `underlying` the error itself.
public struct StoreKitFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable {
        case userCancelled, network, paymentNotAllowed, productUnavailable, invalidOffer, ineligibleForOffer
        case notAvailableInStorefront, notEntitled, systemError, unknown
    }
    public var kind: Kind
    public var code: String
    public var message: String
    public let underlying: (any Error & Sendable)?

    /// An error StoreKit threw: mapped by the adapter (`StoreKitFailureConvertible`) when it
    /// knows the type; otherwise `kind` unknown and `code` the error's type and NSError code.
    public init(_ error: Error) {
        if let failure = error as? StoreKitFailure {
            self = failure
            return
        }
        if let convertible = error as? StoreKitFailureConvertible {
            self = convertible.storeKitFailure
            return
        }
        let bridged = error as NSError
        kind = .unknown
        code = "\(type(of: error))(\(bridged.code))"
        message = String(describing: error)
        underlying = error as? any Error & Sendable
    }

    public init(
        kind: Kind = .unknown, code: String, message: String, underlying: (any Error & Sendable)? = nil
    ) {
        self.kind = kind
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public static func == (lhs: StoreKitFailure, rhs: StoreKitFailure) -> Bool {
        lhs.kind == rhs.kind && lhs.code == rhs.code && lhs.message == rhs.message
    }
    public var description: String { message }
}

/// An error type an adapter maps to a `StoreKitFailure` case by case (StoreKit's own errors).
public protocol StoreKitFailureConvertible: Error {
    var storeKitFailure: StoreKitFailure { get }
}

public enum PurchaseError: Error, Equatable, Sendable {
    case notConfigured
    case notLoggedIn
    /// One purchase in flight per account: a second tap gets this, and no second payment.
    case alreadyInProgress
    /// The server order could not be created; nothing was charged.
    case order(BackendError)
    /// The intent could not be written durably (or the storage cannot be read yet: a Keychain
    /// before the first unlock); the payment was not added.
    case storage(String)
    /// StoreKit threw before any payment happened.
    case storeKit(StoreKitFailure)
    /// No promoted purchase with this id is waiting.
    case unknownPromotedPurchase
}

/// What `restore()` found: the account afterwards, and each restored transaction's outcome, so
/// the app can say "nothing to restore" or "owned by another account".
public struct RestoreResult: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        public var transactionId: String
        public var productId: String
        /// The server's outcome (`delivered`, `already_delivered`, `not_delivered`, `rejected`,
        /// …), or `held` when no verdict came yet (it is retried in the background).
        public var outcome: String
        public var code: String?
    }
    public var customerInfo: CustomerInfo?
    public var transactions: [Entry]

    public var nothingToRestore: Bool { transactions.isEmpty }
    public var ownedByOtherAccount: [Entry] { transactions.filter { $0.code == "owned_by_other_account" } }
    public var held: [Entry] { transactions.filter { $0.outcome == "held" } }
}

/// Where the app notes that it was installed: a file in its own container, which an uninstall
/// removes while the Keychain survives — so a reinstall is told apart from an update.
public protocol InstallationMarker: Sendable {
    func isMarked() -> Bool
    func mark()
}

public struct FileInstallationMarker: InstallationMarker {
    public let url: URL
    public init(url: URL) { self.url = url }
    public func isMarked() -> Bool { FileManager.default.fileExists(atPath: url.path) }
    public func mark() {
        try? FileManager.default.createDirectory(
            at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: url.path, contents: Data())
    }
}
