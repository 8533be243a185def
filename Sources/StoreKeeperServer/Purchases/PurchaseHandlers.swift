import AppStoreAdapter
import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// `POST /v1/purchases`: verify a proof (or look a transaction id up at Apple, queueing it
/// when Apple is slow), then deliver it through the batcher — exactly once.
extension PurchasePipeline {
    struct PurchaseBody: RequestBody, FastDecodable {
        var accountId: String
        var orderId: String?
        var signedTransaction: String?
        /// 1…100 JWS of one account, each verified and delivered on its own.
        var signedTransactions: [String]?
        var receipt: String?
        /// Alone: look the transaction up at Apple. With `receipt`: the transaction the device
        /// reports, which the verified receipt must contain (422 `transaction_not_in_proof`).
        var transactionId: String?
        /// `app_store` (the default) or `web`: a payment the app's backend took on its own web
        /// checkout (secret key only), delivered through the same path, once per `paymentId`.
        var store: String?
        var productId: String?
        var paymentId: String?
        var price: FlexibleDecimal?
        var currency: String?
        var quantity: Int?
        /// Tax included in `price` (default 0), and the country it was charged in.
        var taxAmount: FlexibleDecimal?
        var taxCountry: String?
        var externalPurchaseToken: String?
        /// Web subscriptions (auto-renewable products): the end of the period this payment paid
        /// for (ISO 8601 or ms since 1970), and the payment that started the subscription (a
        /// renewal or a change of plan; absent on the first payment).
        var expiresAt: FlexibleInstant?
        var originalPaymentId: String?
        /// Google Play: the app (required when several are configured) and the purchase token.
        var appId: String?
        var purchaseToken: String?

        /// Read by the hand-written JSON reader (every purchase's body; `JSONDecoder` was about
        /// 1.4 % of the server's CPU per purchase). A web payment's amounts and dates, and any
        /// field of an unexpected shape, hand the body to `JSONDecoder`, whose answers (and
        /// errors) are the contract.
        init(fast f: FastJSON.Fields) throws {
            guard let accountId = try f.string("accountId") else { throw FastJSON.Fields.Unsupported() }
            for key in ["price", "taxAmount", "expiresAt"] { try f.absent(key) }
            self.accountId = accountId
            orderId = try f.string("orderId")
            signedTransaction = try f.string("signedTransaction")
            signedTransactions = try f.strings("signedTransactions")
            receipt = try f.string("receipt")
            transactionId = try f.string("transactionId")
            store = try f.string("store")
            productId = try f.string("productId")
            paymentId = try f.string("paymentId")
            currency = try f.string("currency")
            if let count = try f.int64("quantity") {
                guard let narrow = Int(exactly: count) else { throw FastJSON.Fields.Unsupported() }
                quantity = narrow
            }
            taxCountry = try f.string("taxCountry")
            externalPurchaseToken = try f.string("externalPurchaseToken")
            originalPaymentId = try f.string("originalPaymentId")
            appId = try f.string("appId")
            purchaseToken = try f.string("purchaseToken")
        }

        static let oneOf =
            "exactly one of 'signedTransaction', 'signedTransactions', 'receipt', 'transactionId' is required ('transactionId' may go with 'receipt')"

        var proofs: [Proof] {
            [
                signedTransaction.map(Proof.signedTransaction), receipt.map(Proof.receipt),
                receipt == nil ? transactionId.map(Proof.transactionId) : nil,
            ]
            .compactMap { $0 }
        }

        func validate() throws {
            try StoreKeeperApp.validateAccountId(accountId)
            switch store {
            case nil, "app_store": break
            case "web": return try validateWeb()
            case "google_play": return try validateGoogle()
            default: throw APIError.badRequest("field 'store' must be app_store, google_play or web")
            }
            if let orderId {
                guard orderId.unicodeScalars.count <= 200 else {
                    throw APIError.badRequest("field 'orderId' must be 1…200 characters")
                }
                try StoreKeeperApp.validateText(orderId, field: "orderId")
            }
            if let signedTransactions {
                guard proofs.isEmpty, transactionId == nil else { throw APIError.badRequest(Self.oneOf) }
                // Each JWS names its own order by its token; one order for many transactions would
                // pay it with the first and bind the rest to it as mismatches.
                guard orderId == nil else {
                    throw APIError.badRequest("field 'orderId' does not go with 'signedTransactions'")
                }
                guard (1...100).contains(signedTransactions.count) else {
                    throw APIError.badRequest("field 'signedTransactions' must hold 1…100 signed transactions")
                }
                guard signedTransactions.allSatisfy({ !$0.isEmpty }) else {
                    throw APIError.badRequest("field 'signedTransactions' must not hold an empty string")
                }
                return
            }
            guard proofs.count == 1 else { throw APIError.badRequest(Self.oneOf) }
            if receipt != nil, let transactionId, !StoreKeeperApp.isAppleNumericId(transactionId) {
                throw APIError.badRequest("field 'transactionId' must be an App Store transaction id (digits)")
            }
        }
    }

    func submitPurchase(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let body = try await decode(PurchaseBody.self, request)
        try caller.require(body.accountId)
        if body.store == "web" {
            guard caller.isKey else {
                throw APIError.forbidden("web purchases are reported by the app's backend with a secret key")
            }
            return try await submitWebPurchase(body)
        }
        if body.store == "google_play" {
            return try await submitGooglePurchase(body)
        }
        if let batch = body.signedTransactions {
            // A batch is charged per entry: 100 entries cost what 100 requests cost.
            limiter.charge(caller, count: batch.count - 1)
            return try await submitBatch(batch, accountId: body.accountId)
        }
        guard let proof = body.proofs.first else { throw APIError.badRequest(PurchaseBody.oneOf) }

        let transactions: [StoreTransaction]
        do {
            if case .transactionId(let transactionId) = proof {
                switch try await lookUpOrQueue(transactionId, accountId: body.accountId, orderId: body.orderId) {
                case .found(let transaction): transactions = [transaction]
                case .queued(let retryAfter):
                    struct Pending: Encodable {
                        var status = "pending"
                        var retryAfterSeconds: Int
                    }
                    return try Self.json(Pending(retryAfterSeconds: retryAfter), status: .accepted)
                }
            } else {
                transactions = try await verifyOffline(proof)
            }
        } catch let failure as VerificationFailure {
            try await rejected(proof, failure: failure, accountId: body.accountId, orderId: body.orderId)
        }
        // The transaction the device reports must be in the receipt it sent: a receipt read before
        // StoreKit wrote the purchase into it must never be answered "nothing new" (the device
        // would finish the payment unseen). Nothing of the receipt is delivered then.
        if case .receipt = proof, let reported = body.transactionId,
            !transactions.contains(where: { $0.transactionId == reported })
        {
            throw APIError(
                .unprocessableContent, "transaction_not_in_proof",
                "the receipt does not contain transaction \(reported) yet: refresh the receipt and submit again",
                retryable: true)
        }

        var delivered = try await deliverVerified(
            transactions, accountId: body.accountId, orderId: body.orderId, evidence: proof.evidence,
            reported: proof.isReceipt ? body.transactionId : nil)
        // A single proof that cannot be delivered is an error; a receipt reports per transaction.
        if transactions.count == 1, let refusal = delivered.refusals.first { throw APIError.refusal(refusal) }
        if proof.isReceipt, let reported = body.transactionId {
            // The receipt's other entries that were left for their own reports are not listed.
            delivered.results.removeAll { $0.transactionId != reported && $0.outcome == "unattributed" }
        }
        let results = delivered.results
        // "already_delivered" when nothing in the proof is new: delivered earlier (or refunded since).
        let nothingNew =
            !results.isEmpty && results.allSatisfy { $0.outcome == "already_delivered" || $0.outcome == "refunded" }
        return try Self.json(
            PurchaseJSON(
                status: nothingNew ? "already_delivered" : "delivered", transactions: results,
                account: try await account(body.accountId, state: delivered.account)))
    }

    /// A proof that failed verification: counted, logged, kept when it may verify later, answered.
    func rejected(_ proof: Proof, failure: VerificationFailure, accountId: String, orderId: String?) async throws
        -> Never
    {
        metrics.verificationFailure(failure.code)
        logger.warning(
            "proof rejected",
            metadata: ["code": "\(failure.code)", "reason": "\(failure.reason)", "account": "\(accountId)"])
        if !failure.isRetryable {
            await keepRejected(proof, failure: failure, accountId: accountId, orderId: orderId)
        }
        throw APIError.verification(failure)
    }

    /// Signatures or chains that fail in one batch before its remaining entries go unchecked.
    static let forgeriesBeforeGivingUp = 3

    /// `signedTransactions`: each JWS verified and delivered on its own, every entry's outcome in
    /// the answer in the order submitted; one that fails verification is `rejected` with its
    /// code, one refused is `not_delivered` with its code — never a 4xx for the batch.
    func submitBatch(_ batch: [String], accountId: String) async throws -> Response {
        var results: [TransactionJSON] = []
        var state: PurchaseStore.AccountState?
        // Forged entries: after `forgeriesBeforeGivingUp` signatures or chains that do not verify,
        // the rest are not checked (`not_verified`), kept or logged; one log line per batch.
        var forgeries = 0
        var rejectedCodes: [String: Int] = [:]
        for jws in batch {
            if forgeries >= Self.forgeriesBeforeGivingUp {
                results.append(.rejected(jws, code: "not_verified"))
                rejectedCodes["not_verified", default: 0] += 1
                continue
            }
            let proof = Proof.signedTransaction(jws)
            let transaction: StoreTransaction
            do {
                transaction = StoreTransaction(apple: try await verifier.verifyTransaction(jws))
            } catch let failure as VerificationFailure {
                guard !failure.isRetryable else { throw APIError.verification(failure) }
                metrics.verificationFailure(failure.code)
                await keepRejected(proof, failure: failure, accountId: accountId, orderId: nil)
                let code = APIError.verification(failure).code
                results.append(.rejected(jws, code: code))
                rejectedCodes[code, default: 0] += 1
                if failure.code == "invalid_chain" || failure.code == "invalid_signature" { forgeries += 1 }
                continue
            }
            let delivered = try await deliverVerified(
                [transaction], accountId: accountId, orderId: nil, evidence: .device)
            state = delivered.account ?? state
            guard var result = delivered.results.first else { continue }
            if let refusal = delivered.refusals.first { result.code = APIError.refusal(refusal).code }
            results.append(result)
        }
        if !rejectedCodes.isEmpty {
            logger.warning(
                "batch entries rejected",
                metadata: [
                    "account": "\(accountId)", "entries": "\(batch.count)",
                    "rejected":
                        "\(rejectedCodes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ","))",
                ])
        }
        // "delivered" when this request delivered something; each entry says what became of it.
        let deliveredNow = results.contains { $0.outcome == "delivered" }
        return try Self.json(
            PurchaseJSON(
                status: deliveredNow ? "delivered" : "already_delivered", transactions: results,
                account: try await account(accountId, state: state)))
    }

    /// A proof of purchase as submitted: one of the three fields of `POST /v1/purchases`.
    enum Proof: Sendable {
        case signedTransaction(String)
        case receipt(String)
        case transactionId(String)

        var kind: RejectedProofStore.Kind {
            switch self {
            case .signedTransaction: .signedTransaction
            case .receipt: .receipt
            case .transactionId: .transactionId
            }
        }

        /// A bare transaction id proves nothing about who paid (docs/api.md); a JWS or receipt does.
        var evidence: DeliveryPlanner.Evidence {
            if case .transactionId = self { return .lookup }
            return .device
        }

        var isReceipt: Bool {
            if case .receipt = self { return true }
            return false
        }

        var text: String {
            switch self {
            case .signedTransaction(let text), .receipt(let text), .transactionId(let text): text
            }
        }

        init(kind: RejectedProofStore.Kind, text: String) {
            switch kind {
            case .signedTransaction: self = .signedTransaction(text)
            case .receipt: self = .receipt(text)
            case .transactionId: self = .transactionId(text)
            }
        }
    }

    /// The transactions a JWS or receipt proves, verified offline under the trust policy.
    func verifyOffline(_ proof: Proof) async throws -> [StoreTransaction] {
        switch proof {
        case .signedTransaction(let signed):
            return [StoreTransaction(apple: try await verifier.verifyTransaction(signed))]
        case .receipt(let receipt):
            let verified = try await receiptVerifier.verify(base64: receipt)
            return verified.inAppPurchases.map { Self.transaction(from: $0, receipt: verified) }
        case .transactionId(let transactionId):
            return [try await fetchTransaction(transactionId)]
        }
    }

    /// Delivers verified transactions to `accountId` (and its order), one by one through the
    /// store's delivery path; the single path for submissions and re-verification.
    /// `reported`: with a receipt, the transaction the device reports — the order applies to it
    /// alone, and the receipt's other entries are companions (`DeliveryPlanner.Evidence`).
    func deliverVerified(
        _ transactions: [StoreTransaction], accountId: String, orderId: String?,
        evidence: DeliveryPlanner.Evidence, reported: String? = nil
    ) async throws -> (
        results: [TransactionJSON], refusals: [DeliveryPlanner.Refusal], account: PurchaseStore.AccountState?
    ) {
        var results: [TransactionJSON] = []
        var refusals: [DeliveryPlanner.Refusal] = []
        var committed: PurchaseStore.AccountState?
        let now = Date()
        for transaction in transactions {
            let companion = reported != nil && transaction.transactionId != reported
            let result = try await store.deliver(
                transaction, submittingAccount: accountId, requestedOrderId: companion ? nil : orderId,
                catalog: catalog, policy: configuration.ownershipPolicy,
                evidence: companion ? .receiptCompanion : evidence, now: now)
            if let refusal = result.plan.refusal { refusals.append(refusal) }
            committed = result.account
            switch result.plan.outcome {
            case .delivered: metrics.deliveries.increment()
            // A receipt's other entry left for its own report is no unattributed payment.
            case .unattributed where !companion: metrics.unattributed.increment()
            case .unattributed: break
            case .alreadyDelivered: metrics.duplicatesSuppressed.increment()
            case .refunded, .notDelivered: break
            }
            results.append(
                TransactionJSON(
                    transaction, result: result, submitter: accountId, apps: store.apps))
        }
        return (results, refusals, committed)
    }

    enum Lookup {
        case found(StoreTransaction)
        case queued(retryAfterSeconds: Int)
    }

    /// `transactionId` submissions: ask Apple with a short deadline; if Apple is slow, down or
    /// rate-limiting, the lookup becomes a durable job and the client gets 202 (invariant 5).
    func lookUpOrQueue(_ transactionId: String, accountId: String, orderId: String?) async throws -> Lookup {
        guard Self.isAppleNumericId(transactionId) else {
            throw APIError.badRequest("field 'transactionId' must be an App Store transaction id (digits)")
        }
        guard transactionSource != nil else {
            throw APIError.badRequest("transactionId submissions need apple.serverAPI credentials on this server")
        }
        do {
            let deadline = lookupDeadline
            return .found(try await withDeadline(deadline) { try await self.fetchTransaction(transactionId) })
        } catch let error as AppStoreAPIError where error.isRetryable {
            try await queueLookup(transactionId, accountId: accountId, orderId: orderId, reason: error.description)
            let wait =
                error.retryAfter.map { max(1, Int($0.timeIntervalSinceNow.rounded(FloatingPointRoundingRule.up))) } ?? 2
            return .queued(retryAfterSeconds: wait)
        } catch let failure as VerificationFailure where failure.isRetryable {
            try await queueLookup(transactionId, accountId: accountId, orderId: orderId, reason: failure.description)
            return .queued(retryAfterSeconds: 2)
        } catch let error as AppStoreAPIError {
            if error.errorCode == AppStoreAPIError.transactionIdNotFound {
                throw APIError.notFound("the App Store does not know transaction '\(transactionId)'")
            }
            if error.kind == .unauthorized {
                // A wrong key, or a clock Apple does not believe: either way the purchase waits in
                // the job queue (202) until it is fixed, and the log says which.
                noteAppleRefusal(error)
                try await queueLookup(transactionId, accountId: accountId, orderId: orderId, reason: error.description)
                return .queued(retryAfterSeconds: 60)
            }
            throw APIError.badRequest("the App Store refused the lookup: \(error.message)")
        }
    }

    /// On Apple's 401: compares Apple's `Date` with this clock and logs loudly — a skew makes
    /// every token look expired or not yet valid. `/v1/status` shows the last measurement.
    func noteAppleRefusal(_ error: AppStoreAPIError) {
        guard let appleDate = error.appleDate else {
            logger.error("Apple refused the Server API key (no Date header to compare clocks)")
            return
        }
        let skew = Date().timeIntervalSince(appleDate)
        clock.withLock { $0 = ClockCheck(skewSeconds: skew, measuredAt: Date()) }
        if abs(skew) > 60 {
            logger.critical(
                "Apple refused the Server API token and this server's clock is \(Int(skew)) s \(skew > 0 ? "ahead of" : "behind") Apple's: fix the clock (NTP); lookups wait in the job queue until then",
                metadata: ["skewSeconds": "\(Int(skew))"])
        } else {
            logger.error(
                "Apple refused the Server API key (clocks agree within a minute: check apple.serverAPI.keyId, issuerId, privateKeyFile and the bundle id)",
                metadata: ["skewSeconds": "\(Int(skew))"])
        }
    }

    func queueLookup(_ transactionId: String, accountId: String, orderId: String?, reason: String) async throws {
        let payload = String(
            decoding: try JSONEncoder().encode(
                LookupJob(transactionId: transactionId, accountId: accountId, orderId: orderId)),
            as: UTF8.self)
        let now = Date()
        try await jobs.enqueue(
            kind: "lookup_transaction",
            dedupeKey: AnomalyStore.dedupeKey("lookup_transaction", transactionId, accountId), payload: payload,
            runAt: now.addingTimeInterval(1), now: now)
        logger.info(
            "Apple unavailable; lookup queued", metadata: ["transactionId": "\(transactionId)", "reason": "\(reason)"])
    }

    /// The verified transaction, from Apple (or the local App Store).
    func fetchTransaction(_ transactionId: String) async throws -> StoreTransaction {
        guard let transactionSource else {
            throw APIError.badRequest("no App Store Server API configured")
        }
        return StoreTransaction(
            apple: try await verifier.verifyTransaction(try await transactionSource.signedTransaction(transactionId)))
    }

    /// A receipt's in-app entry as a transaction payload (receipts carry no appAccountToken).
    static func transaction(from item: AppReceiptInAppPurchase, receipt: AppReceipt) -> StoreTransaction {
        func milliseconds(_ date: Date?) -> Int64? {
            date.map { Int64(($0.timeIntervalSince1970 * 1000).rounded(.down)) }
        }
        return StoreTransaction(
            store: .appStore, transactionId: item.transactionId,
            originalTransactionId: item.originalTransactionId ?? item.transactionId, storeIdentity: receipt.bundleId,
            productId: item.productId, purchaseDate: milliseconds(item.purchaseDate),
            originalPurchaseDate: milliseconds(item.originalPurchaseDate),
            expiresDate: milliseconds(item.subscriptionExpirationDate), quantity: Int32(clamping: item.quantity ?? 1),
            revocationDate: milliseconds(item.cancellationDate),
            environment: StoreEnvironment(rawValue: (receipt.environment ?? .production).rawValue))
    }
}

/// `POST /v1/purchases`, web refunds and Apple's external purchase tokens, over the pipeline.
struct PurchasesController {
    let purchases: PurchasePipeline

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.post("purchases") { request, context in try await purchases.submitPurchase(request, context) }
        v1.post("purchases/web/:paymentId/refund") { _, context in
            try context.caller().requireSecretKey()
            let paymentId = try StoreKeeperApp.parameter(context, "paymentId")
            guard !paymentId.isEmpty, paymentId.unicodeScalars.count <= 200 else {
                throw APIError.badRequest("paymentId must be 1…200 characters")
            }
            try StoreKeeperApp.validateText(paymentId, field: "paymentId")
            return try await purchases.refundWebPurchase(paymentId)
        }
        v1.get("external-purchases/tokens") { request, context in
            try context.caller().requireSecretKey()
            let unreported = request.uri.queryParameters.get("unreported") == "true"
            let tokens = try await ExternalPurchaseStore(database: purchases.database).tokens(
                unreportedOnly: unreported)
            return try StoreKeeperApp.json(["tokens": tokens.map(ExternalTokenJSON.init)])
        }
        v1.post("external-purchases/tokens") { request, context in
            try await purchases.registerExternalToken(request, context)
        }
    }
}

/// `POST /v1/external-purchases/tokens`: a token StoreKit gave the app (or the web checkout)
/// for an account, recorded before anything is bought with it, so its report is right:
/// NO_LINE_ITEM when nothing was bought, DUPLICATE_TOKEN for a second custom-link token of the
/// same type while the first is active.
extension PurchasePipeline {
    struct ExternalTokenBody: RequestBody {
        var accountId: String
        var externalPurchaseId: String
        /// `ACQUISITION`, `SERVICES` (custom-link tokens), `IN_APP`, `LINK_OUT`; absent when unknown.
        var tokenType: String?

        func validate() throws {
            try StoreKeeperApp.validateAccountId(accountId)
            guard !externalPurchaseId.isEmpty, externalPurchaseId.unicodeScalars.count <= 128 else {
                throw APIError.badRequest("field 'externalPurchaseId' must be 1…128 characters")
            }
            try StoreKeeperApp.validateText(externalPurchaseId, field: "externalPurchaseId")
            if let tokenType {
                guard ["ACQUISITION", "SERVICES", "IN_APP", "LINK_OUT"].contains(tokenType) else {
                    throw APIError.badRequest("field 'tokenType' must be ACQUISITION, SERVICES, IN_APP or LINK_OUT")
                }
            }
        }
    }

    func registerExternalToken(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let body = try await decode(ExternalTokenBody.self, request)
        try caller.require(body.accountId)
        try await externalTokens.register(
            body.externalPurchaseId, accountId: body.accountId, type: body.tokenType)
        guard let token = try await ExternalPurchaseStore(database: database).token(body.externalPurchaseId) else {
            throw APIError.notFound("no external purchase token '\(body.externalPurchaseId)'")
        }
        return try Self.json(ExternalTokenJSON(token))
    }

}

/// `GET /v1/external-purchases/tokens`: Apple's external purchase tokens as recorded.
struct ExternalTokenJSON: Encodable {
    var externalPurchaseId: String
    var accountId: String?
    var tokenType: String?
    var environment: String
    var createdAt: String?
    var expiresAt: String?
    var lastNotice: String?
    var unreportedNotices: Int
    var reportedAt: String?
    var unreportedLineItems: Int

    init(_ token: ExternalPurchaseStore.Token) {
        externalPurchaseId = token.externalPurchaseId
        accountId = token.accountId
        tokenType = token.tokenType
        environment = token.environment
        createdAt = token.createdAt.map(StoreKeeperApp.iso)
        expiresAt = token.expiresAt.map(StoreKeeperApp.iso)
        lastNotice = token.lastNotice
        unreportedNotices = token.unreportedNotices
        reportedAt = token.reportedAt.map(StoreKeeperApp.iso)
        unreportedLineItems = token.unreportedLineItems
    }
}

/// Apple's external purchase tokens (and a web checkout's) bound to accounts before anything is
/// bought with them, within the unconfirmed-token budgets (`limits.maxUnconfirmedExternalTokens*`).
struct ExternalTokenRegistry: Sendable {
    let database: Database
    let perAccount: Int
    let total: Int

    /// Binds Apple's external purchase token to the account, within the unconfirmed-token
    /// limits: 409 `token_of_another_account`, 429/503 over the limits.
    func register(_ id: String, accountId: String, type: String?) async throws {
        let store = ExternalPurchaseStore(database: database)
        let registered: Bool
        do {
            registered = try await store.registerToken(
                id, accountId: accountId, tokenType: type,
                limits: .init(
                    perAccount: perAccount,
                    total: total),
                now: Date())
        } catch let error as ExternalPurchaseStore.TooManyTokens {
            var refusal =
                error.global
                ? APIError(
                    .serviceUnavailable, "external_token_budget",
                    "the server holds \(error.limit) external purchase tokens Apple has not reported (limits.maxUnconfirmedExternalTokens)",
                    retryable: true)
                : APIError(
                    .tooManyRequests, "too_many_external_tokens",
                    "the account holds \(error.limit) external purchase tokens Apple has not reported (limits.maxUnconfirmedExternalTokensPerAccount)",
                    retryable: true)
            refusal.headers[.retryAfter] = "3600"
            throw refusal
        }
        guard registered else {
            throw APIError(
                .conflict, "token_of_another_account", "external purchase token '\(id)' belongs to another account")
        }
    }
}

extension StoreKeeperApp {
    /// The external purchase tokens an account binds, within `limits`' budgets.
    var externalTokens: ExternalTokenRegistry {
        ExternalTokenRegistry(
            database: database, perAccount: configuration.maxUnconfirmedExternalTokensPerAccount,
            total: configuration.maxUnconfirmedExternalTokens)
    }
}
