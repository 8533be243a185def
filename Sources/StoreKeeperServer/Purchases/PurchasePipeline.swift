import AppStoreVerification
import Foundation
import Logging
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// The purchase pipeline: every store's proof in — a JWS or receipt verified offline, a
/// transaction id looked up at Apple (queued when Apple is slow), a Google Play token read from
/// Google, a web payment the backend reports — and delivered through the one delivery path,
/// exactly once. It owns what that takes; `PurchasesController` (`POST /v1/purchases`), the
/// job runner, re-verification, support and the dashboard use it, never the app.
struct PurchasePipeline: RequestHandling, CarriesAccountView, Sendable {
    let configuration: ServerConfiguration
    let database: Database
    let store: PurchaseStore
    let jobs: JobStore
    let notifications: NotificationStore
    let catalog: Catalog
    /// Where `transactionId` submissions are looked up; nil when no Apple key is configured.
    let transactionSource: (any TransactionSource)?
    /// How long a submission waits for Apple before the lookup becomes a durable job.
    let lookupDeadline: Duration
    let verifier: SignedDataVerifier
    let receiptVerifier: AppReceiptVerifier
    /// A batch of JWS is charged per entry.
    let limiter: RateLimiter
    let metrics: ServerMetrics
    let logger: Logger
    /// The last comparison of this server's clock with Apple's (after a 401).
    let clock: ClockState
    /// The Google Play apps, by id.
    let google: [String: GooglePlayApp]
    let rejectedProofs: RejectedProofStore
    /// Whether a rejected proof was signed by a trusted or Apple root.
    let provenance: (signedData: SignedDataVerifier, receipts: AppReceiptVerifier)?
    /// The account view every purchase answer carries.
    let accountBook: AccountBook
    let externalTokens: ExternalTokenRegistry
    /// How refunds are applied (a web payment's refund goes the one refund path).
    let notificationSettings: NotificationStore.Settings

    var maxBodyBytes: Int { configuration.maxBodyBytes }
}

extension StoreKeeperApp {
    /// The purchase pipeline, built from the app's parts (`PurchasePipeline`).
    var purchases: PurchasePipeline {
        PurchasePipeline(
            configuration: configuration, database: database, store: store, jobs: jobs,
            notifications: notifications, catalog: catalog, transactionSource: transactionSource,
            lookupDeadline: lookupDeadline, verifier: verifier, receiptVerifier: receiptVerifier, limiter: limiter,
            metrics: metrics, logger: logger, clock: clock, google: google, rejectedProofs: rejectedProofs,
            provenance: provenance, accountBook: accountBook, externalTokens: externalTokens,
            notificationSettings: notificationSettings())
    }

    /// Re-verifies the kept rejected proofs (`storekeeper reverify`, `POST /v1/rejected-proofs/reverify`).
    public func reverify(since: Date? = nil, code: String? = nil, actor: String = "operator") async throws
        -> ReverifySummary
    {
        try await purchases.reverify(since: since, code: code, actor: actor)
    }

    typealias PurchaseBody = PurchasePipeline.PurchaseBody
    typealias ExternalTokenBody = PurchasePipeline.ExternalTokenBody
    typealias Proof = PurchasePipeline.Proof
    typealias GoogleApplied = PurchasePipeline.GoogleApplied
    typealias GoogleReadFailure = PurchasePipeline.GoogleReadFailure
}
