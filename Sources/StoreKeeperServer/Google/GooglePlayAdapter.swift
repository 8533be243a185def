import Crypto
import Foundation
import GooglePlay
import Hummingbird
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import StoreKeeperSupport

/// A Google Play app at runtime: its Developer API client and its push verifier.
public struct GooglePlayApp: Sendable {
    public let configuration: GooglePlayAppConfiguration
    public let client: GooglePlayClient
    let verifier: PushVerifier?

    static func make(_ configuration: GooglePlayAppConfiguration) async throws -> GooglePlayApp {
        let key: ServiceAccountKey
        if let given = configuration.serviceAccountKey {
            key = given
        } else if let file = configuration.serviceAccountKeyFile {
            key = try ServiceAccountKey.load(path: file)
        } else {
            throw ServerConfiguration.Invalid(
                key: "apps[\(configuration.id)].serviceAccountKeyFile", "is required to read purchases from Google")
        }
        let client = GooglePlayClient(
            packageName: configuration.packageName, baseURL: configuration.apiBaseURL,
            tokens: try await AccessTokenSource(key: key))
        var verifier: PushVerifier?
        if let audience = configuration.pushAudience, let account = configuration.pushServiceAccount {
            verifier = PushVerifier(
                audience: audience, serviceAccount: account, certificatesURL: configuration.pushCertificatesURL)
        }
        return GooglePlayApp(configuration: configuration, client: client, verifier: verifier)
    }
}

/// What the adapter read of one purchase token, in store-neutral terms.
struct GoogleReading: Sendable {
    var appId: String
    var token: String
    var kind: String
    var googleProductId: String
    var product: Product
    var readiness: GooglePlayPlanner.Readiness
    var state: String
    var orderId: String?
    var quantity: Int
    var obfuscatedAccountId: String?
    var paidAt: Date?
    var expiresAt: Date?
    var autoRenew: Bool
    var linkedPurchaseToken: String?
    var test: Bool
    var acknowledged: Bool
    var priceMilli: Int64?
    var currency: String?
    var status: StoreKeeperCore.SubscriptionStatus?
    /// The app's package name: the purchase's store identity (`AppDirectory`).
    var packageName: String = ""
    /// The buyer's country as Google names it (ISO 3166-1 alpha-2).
    var regionCode: String?
    /// A one-time purchase's units not refunded yet (Google leaves a voided purchase
    /// `PURCHASED`: this is what says it was refunded).
    var refundableQuantity: Int? = nil
    /// A resubscription made in the Play Store after this token expired (Google's
    /// `outOfAppPurchaseContext`, present until the new token is acknowledged).
    var expiredPurchaseToken: String? = nil
    /// The token this one continues: the one it replaces, or the expired one it resubscribes.
    var previousToken: String? { linkedPurchaseToken ?? expiredPurchaseToken }
    /// A subscription's identity across Google's chain of linked tokens (an upgrade, a
    /// downgrade, a re-signup keep the first token's, as Apple keeps an original transaction
    /// id); nil: this token's own.
    var chainOriginalId: String? = nil
    /// The subscription's identity: the chain's, else this token's own.
    var subscriptionOriginalId: String {
        chainOriginalId ?? GooglePlayPlanner.originalTransactionId(tokenDigest: tokenDigest)
    }

    /// The token's digest: stored ids never hold Google's long opaque tokens.
    var tokenDigest: String { GoogleReading.digest(token) }

    static func digest(_ token: String) -> String {
        GooglePlayStore.tokenDigest(token)
    }

    /// The one delivery path's view of this charge: ids `gp:<orderId>` (the subscription's
    /// `gp:s.<token digest>`), the catalog's product, the order's token as `appAccountToken`,
    /// Sandbox for a test purchase.
    var transaction: StoreTransaction {
        let id = GooglePlayPlanner.transactionId(orderId: orderId, tokenDigest: tokenDigest)
        let original = kind == "subscription" ? subscriptionOriginalId : id
        let now = Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
        var transaction = StoreTransaction(
            store: .googlePlay, transactionId: id, originalTransactionId: original, storeIdentity: packageName,
            productId: product.id,
            purchaseDate: Int64(((paidAt ?? Date()).timeIntervalSince1970 * 1000).rounded(.down)),
            expiresDate: expiresAt.map { Int64(($0.timeIntervalSince1970 * 1000).rounded(.down)) },
            quantity: Int32(clamping: quantity), kind: .init(product.type),
            appAccountToken: obfuscatedAccountId.flatMap { UUID(uuidString: $0) }.map { $0.uuidString.lowercased() },
            ownership: .purchased, signedDate: now, environment: test ? .sandbox : .production,
            // The App Store's form (alpha-3): one storefront column and `country` filter for both.
            storefront: RegionCode.alpha3(regionCode), currency: currency, price: priceMilli)
        if kind == "one_time", refundableQuantity == 0 {
            // Every unit refunded: Google's word that it is voided.
            transaction.revocationDate = now
            transaction.revocationReason = 0
        }
        return transaction
    }

    var record: GooglePlayStore.Purchase {
        GooglePlayStore.Purchase(
            purchaseToken: token, appId: appId, kind: kind, productId: googleProductId, catalogProductId: product.id,
            accountId: nil, orderId: orderId, quantity: quantity, state: state, test: test, paidAt: paidAt,
            acknowledgedAt: acknowledged ? (paidAt ?? Date()) : nil, linkedPurchaseToken: linkedPurchaseToken,
            originalTransactionId: kind == "subscription"
                ? subscriptionOriginalId : nil,
            expiresAt: expiresAt)
    }
}

extension PurchasePipeline {
    /// The Google Play app `appId` names (or the only one), else 400 naming the problem.
    func googleApp(_ appId: String?) throws -> GooglePlayApp {
        guard !google.isEmpty else {
            throw APIError(.badRequest, "store_not_configured", "no Google Play app is configured on this server")
        }
        if let appId {
            guard let app = google[appId] else {
                throw APIError(.badRequest, "unknown_app", "no Google Play app '\(appId.prefix(64))' is configured")
            }
            return app
        }
        guard google.count == 1, let only = google.values.first else {
            throw APIError.badRequest("field 'appId' is required: several Google Play apps are configured")
        }
        return only
    }

    /// Reads `token` from Google: a subscription when the notification said so (`kind`), or
    /// what is recorded, or the catalog's product; else a one-time purchase.
    func readGoogle(_ app: GooglePlayApp, token: String, productId: String?, kind: String? = nil) async throws
        -> GoogleReading
    {
        // What is recorded of the token decides only when neither the notification nor the
        // catalog's product says which kind it is (a device names its product: no read).
        let hint = productId.flatMap { catalog.product(store: "google_play", storeProductId: $0) }
        let known =
            kind == nil && hint == nil ? try await GooglePlayStore(database: database).purchase(token) : nil
        let googleId = productId ?? known?.productId
        let hinted = hint ?? googleId.flatMap { catalog.product(store: "google_play", storeProductId: $0) }
        let subscription =
            kind.map { $0 == "subscription" } ?? known.map { $0.kind == "subscription" }
            ?? (hinted?.type == .autoRenewable)
        let appId = app.configuration.id
        if subscription {
            let resource = try await app.client.subscriptionPurchase(token: token)
            guard let item = resource.lineItems?.first, let id = item.productId,
                let product = catalog.product(store: "google_play", storeProductId: id)
            else {
                throw GoogleReadFailure.unknownProduct(resource.lineItems?.first?.productId ?? "?")
            }
            // A replaced token never grants again, whatever Google still says of it.
            let retired = known?.retired == true
            return GoogleReading(
                appId: appId, token: token, kind: "subscription", googleProductId: id, product: product,
                readiness: GooglePlayPlanner.readiness(subscriptionState: resource.subscriptionState),
                state: resource.subscriptionState ?? "SUBSCRIPTION_STATE_UNSPECIFIED",
                orderId: item.latestSuccessfulOrderId ?? resource.latestOrderId, quantity: 1,
                obfuscatedAccountId: resource.externalAccountIdentifiers?.obfuscatedExternalAccountId,
                paidAt: GoogleTime.parse(resource.startTime), expiresAt: GoogleTime.parse(item.expiryTime),
                autoRenew: item.autoRenewingPlan?.autoRenewEnabled ?? false,
                linkedPurchaseToken: resource.linkedPurchaseToken, test: resource.testPurchase != nil,
                acknowledged: resource.acknowledgementState == AcknowledgementState.acknowledged,
                priceMilli: item.autoRenewingPlan?.recurringPrice?.milliunits,
                currency: item.autoRenewingPlan?.recurringPrice?.currencyCode,
                status: retired ? .expired : GooglePlayPlanner.status(subscriptionState: resource.subscriptionState),
                packageName: app.configuration.packageName, regionCode: resource.regionCode,
                expiredPurchaseToken: resource.outOfAppPurchaseContext?.expiredPurchaseToken)
        }
        let resource = try await app.client.productPurchase(token: token)
        guard let item = resource.productLineItem?.first, let id = item.productId,
            let product = catalog.product(store: "google_play", storeProductId: id)
        else {
            throw GoogleReadFailure.unknownProduct(resource.productLineItem?.first?.productId ?? "?")
        }
        guard product.type != .autoRenewable else { throw GoogleReadFailure.unknownProduct(id) }
        let state = resource.purchaseStateContext?.purchaseState
        return GoogleReading(
            appId: appId, token: token, kind: "one_time", googleProductId: id, product: product,
            readiness: GooglePlayPlanner.readiness(purchaseState: state), state: state ?? "UNSPECIFIED",
            orderId: resource.orderId, quantity: max(1, item.productOfferDetails?.quantity ?? 1),
            obfuscatedAccountId: resource.obfuscatedExternalAccountId,
            paidAt: GoogleTime.parse(resource.purchaseCompletionTime), expiresAt: nil, autoRenew: false,
            linkedPurchaseToken: nil, test: resource.testPurchaseContext?.fopType == "TEST",
            acknowledged: resource.acknowledgementState == AcknowledgementState.acknowledged, priceMilli: nil,
            currency: nil, status: nil, packageName: app.configuration.packageName, regionCode: resource.regionCode,
            refundableQuantity: item.productOfferDetails?.refundableQuantity)
    }

    enum GoogleReadFailure: Error {
        case unknownProduct(String)
    }

    /// What applying a reading did.
    enum GoogleApplied {
        case delivered(PurchaseStore.DeliveryResult, StoreTransaction)
        case pending
        case notPaid(String)
        case retired
        /// A license tester's purchase on a server that does not accept Sandbox: nothing
        /// recorded, nothing delivered, by every path (submission, notification, reconciliation).
        case wrongEnvironment
    }

    /// Applies what Google says about a token — the one path for a device's submission, a
    /// notification, the sweeper and reconciliation: a retired token grants nothing; a paid
    /// one is delivered exactly once (to the order its obfuscated account id names, else the
    /// submitter, else held as unattributed), a subscription's state follows the snapshot,
    /// the token it replaced is retired, and the acknowledgement is queued while Google waits.
    func applyGoogle(_ reading: GoogleReading, submittingAccount: String?, orderId: String?, now: Date)
        async throws -> GoogleApplied
    {
        if reading.test, !configuration.environments.contains(.sandbox) { return .wrongEnvironment }
        let store = GooglePlayStore(database: database)
        var reading = reading
        var replaced: GooglePlayStore.Purchase?
        if let linked = reading.previousToken {
            // One subscription across the chain: the replacement carries the identity of the
            // token it replaces (recorded with it, else that token's own), so it reaches the
            // account holding the chain — with or without an obfuscated account id — and
            // analytics see a change of product, not a churn and a new subscription.
            replaced = try await store.purchase(linked)
            let own = try await store.purchase(reading.token)?.originalTransactionId
            reading.chainOriginalId =
                own ?? replaced?.originalTransactionId
                ?? GooglePlayPlanner.originalTransactionId(tokenDigest: GoogleReading.digest(linked))
        }
        let paid: Bool
        switch reading.readiness {
        case .paid: paid = true
        case .pending, .notPaid: paid = false
        }
        if paid, let old = replaced, !old.retired, let original = old.originalTransactionId,
            original != reading.subscriptionOriginalId,
            let state = try await SubscriptionStore.state(original, database: database)
        {
            // A replaced token of another identity (recorded before a chain was one
            // subscription): its subscription ends now.
            var ended = reading.transaction
            ended.transactionId = state.latestTransactionId
            ended.originalTransactionId = original
            ended.productId = state.productId
            ended.expiresDate = state.expiresAt.map { Int64(($0.timeIntervalSince1970 * 1000).rounded(.down)) }
            _ = try await self.store.applyStoreSnapshot(
                ended, event: SubscriptionEvent(.storeState(.expired, autoRenew: false), signedDate: now),
                submittingAccount: nil, requestedOrderId: nil, catalog: catalog,
                policy: configuration.ownershipPolicy, now: now)
        }
        let transaction = reading.transaction
        // Units Google refunded before anyone claimed them (its refundableQuantity): delivered
        // only what is left.
        var refunded: RefundPlanner.Revocation?
        if reading.kind == "one_time", let refundable = reading.refundableQuantity, refundable > 0,
            refundable < reading.quantity
        {
            refunded = RefundPlanner.Revocation(
                unitsRefunded: Int64(reading.quantity - refundable), of: Int64(reading.quantity))
        }
        let event = reading.status.map {
            SubscriptionEvent(.storeState($0, autoRenew: reading.autoRenew), signedDate: now, transaction: transaction)
        }
        // One database transaction through the group-commit batcher, as every store's purchase:
        // recorded, the replaced token retired once this one is paid (a pending replacement
        // leaves it running), delivered, acknowledged once an account has it.
        let result = try await self.store.deliver(
            transaction, submittingAccount: submittingAccount, requestedOrderId: orderId, catalog: catalog,
            policy: configuration.ownershipPolicy, evidence: .device,
            event: reading.kind == "subscription" ? event : nil,
            sideWrites: GooglePlayStore.Writes(
                purchase: reading.record, paid: paid,
                needsAcknowledgement: GooglePlayPlanner.needsAcknowledgement(
                    paid: paid, acknowledgementState: reading.acknowledged ? AcknowledgementState.acknowledged : nil),
                retires: reading.previousToken, refundedBeforeDelivery: refunded,
                refundKey:
                    "gp-read:\(reading.tokenDigest):\(reading.quantity - (reading.refundableQuantity ?? reading.quantity))"
            ), now: now)
        switch result.held {
        case .unpaid:
            if case .notPaid(let why) = reading.readiness { return .notPaid(why) }
            return .pending
        case .retired:
            return .retired
        case nil:
            return .delivered(result, transaction)
        }
    }

    /// A paid Google purchase of a product the catalog does not sell: an `unknown_product`
    /// anomaly for an operator (once per token), as for every store — never only a refusal.
    func raiseUnknownGoogleProduct(
        _ productId: String, token: String, app: GooglePlayApp, account: String?, now: Date
    ) async throws {
        var draft = AnomalyDraft(
            kind: .unknownProduct, transactionId: nil, orderId: nil, accountId: account,
            detail:
                "Google Play purchase (token \(GooglePlayStore.tokenDigest(token))) of product '\(productId.prefix(100))', which is not in the catalog (storeProducts.google_play): paid, not delivered"
        )
        draft.store = Store.googlePlay
        draft.appId = app.configuration.id
        try await store.anomalies.raiseAnomaly(
            draft,
            dedupeKey: AnomalyStore.dedupeKey("unknown_product", "google_play", GooglePlayStore.tokenDigest(token)),
            now: now)
    }

    // MARK: POST /v1/purchases {"store": "google_play"}

    func submitGooglePurchase(_ body: PurchaseBody) async throws -> Response {
        let app = try googleApp(body.appId)
        guard let token = body.purchaseToken else { throw APIError.badRequest("field 'purchaseToken' is required") }
        let reading: GoogleReading
        do {
            reading = try await readGoogle(app, token: token, productId: body.productId)
        } catch let failure as GoogleReadFailure {
            guard case .unknownProduct(let id) = failure else { throw failure }
            try await raiseUnknownGoogleProduct(id, token: token, app: app, account: body.accountId, now: Date())
            throw APIError(
                .unprocessableContent, "unknown_product",
                "Google Play's product '\(id.prefix(100))' is not in the catalog (storeProducts.google_play)")
        } catch let error as GooglePlayError {
            throw Self.googleAPIError(error)
        }
        if let claimed = body.productId, claimed != reading.googleProductId {
            throw APIError(
                .unprocessableContent, "product_mismatch",
                "the purchase is for '\(reading.googleProductId)', not '\(claimed.prefix(100))'")
        }
        switch try await applyGoogle(reading, submittingAccount: body.accountId, orderId: body.orderId, now: Date()) {
        case .wrongEnvironment:
            throw APIError(
                .unprocessableContent, "wrong_environment",
                "a test purchase (license tester): Sandbox is not accepted by this server")
        case .pending:
            struct Pending: Encodable {
                var status = "pending"
                var retryAfterSeconds = 60
            }
            return try Self.json(Pending(), status: .accepted)
        case .notPaid(let why):
            throw APIError(
                .unprocessableContent, "purchase_not_paid", "Google says the purchase was never paid (\(why))")
        case .retired:
            throw APIError(
                .unprocessableContent, "revoked",
                "this purchase token was replaced by a newer one (upgrade, downgrade or re-signup): it grants nothing")
        case .delivered(let result, let transaction):
            if let refusal = result.plan.refusal { throw APIError.refusal(refusal) }
            var json = TransactionJSON(transaction, result: result, submitter: body.accountId)
            json.appId = app.configuration.id
            return try Self.json(
                PurchaseJSON(
                    status: json.outcome == "already_delivered" ? "already_delivered" : "delivered",
                    transactions: [json], account: try await account(body.accountId, state: result.account)))
        }
    }

    static func googleAPIError(_ error: GooglePlayError) -> APIError {
        switch error.kind {
        case .notFound:
            APIError(
                .unprocessableContent, "invalid_purchase_token",
                "Google Play does not know this purchase token for this app (\(error.message))")
        case .refused:
            APIError(.unprocessableContent, "invalid_purchase_token", "Google Play refused: \(error.message)")
        case .unauthorized, .unavailable, .configuration, .malformed:
            {
                var answer = APIError(
                    .serviceUnavailable, "google_unavailable",
                    "Google Play cannot be asked now (\(error.kind.rawValue)); try again", retryable: true)
                answer.headers[.retryAfter] = "30"
                return answer
            }()
        }
    }
}

extension StoreKeeperApp.PurchaseBody {
    func validateGoogle() throws {
        guard signedTransaction == nil, signedTransactions == nil, receipt == nil, transactionId == nil,
            paymentId == nil
        else {
            throw APIError.badRequest(
                "a Google Play purchase takes appId, productId and purchaseToken, not an App Store proof")
        }
        guard let purchaseToken, !purchaseToken.isEmpty, purchaseToken.utf8.count <= 4096,
            purchaseToken.utf8.allSatisfy({ (0x21...0x7e).contains($0) })
        else {
            throw APIError.badRequest(
                "field 'purchaseToken' is required: Google's token, 1…4096 printable ASCII characters")
        }
        guard let productId, !productId.isEmpty, productId.unicodeScalars.count <= 255 else {
            throw APIError.badRequest("field 'productId' is required (Google Play's product id)")
        }
        try StoreKeeperApp.validateText(productId, field: "productId")
        if let appId {
            guard !appId.isEmpty, appId.unicodeScalars.count <= 64 else {
                throw APIError.badRequest("field 'appId' must be 1…64 characters")
            }
            try StoreKeeperApp.validateText(appId, field: "appId")
        }
        if let orderId {
            guard orderId.unicodeScalars.count <= 200 else {
                throw APIError.badRequest("field 'orderId' must be 1…200 characters")
            }
            try StoreKeeperApp.validateText(orderId, field: "orderId")
        }
    }
}
