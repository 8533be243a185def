import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import Logging
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// `POST /v1/retention/apple`: Apple's Get Retention Message, answered within Apple's 700 ms
/// from our own records — verify, one indexed read (plus the offer history only when an offer
/// rule is reached), an optional signature, one insert. `GET /v1/retention/report` measures
/// what the answers saved against each rule's holdout.
struct RetentionController: RequestHandling {
    let support: SupportStore
    let offers: OfferStore
    let catalog: Catalog
    /// Verifies Apple's signed requests under the server's trust policy.
    let verifier: SignedDataVerifier
    /// Signs a promotional offer an answer makes (nil: no In-App Purchase key).
    let offerSigner: OfferSigner?
    let configuration: ServerConfiguration
    let metrics: ServerMetrics
    let logger: Logger
    var maxBodyBytes: Int { configuration.maxBodyBytes }

    /// Outside `/v1`'s authentication: Apple signs the body, it sends no credentials.
    func addRoutes(to router: some RouterMethods<StoreKeeperContext>) {
        router.post("v1/retention/apple") { request, context in try await retentionMessage(request, context) }
    }

    func addAPIRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("retention/report") { request, context in try await retentionReport(request, context) }
    }

    func retentionMessage(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let body = try await decode(RealtimeRequestBody.self, request)
        guard let signedPayload = body.signedPayload else {
            throw APIError.badRequest("field 'signedPayload' is required")
        }
        let decoded: DecodedRealtimeRequestBody
        do {
            decoded = try await verifier.verifyRealtimeRequest(signedPayload)
        } catch let failure as VerificationFailure {
            // Never answer for another app, or for a payload Apple did not sign.
            metrics.verificationFailure(failure.code)
            logger.warning(
                "security: retention request rejected",
                metadata: ["code": "\(failure.code)", "reason": "\(failure.reason)"])
            throw APIError.verification(failure, status: .badRequest)
        }
        // Apple's rule: a request for another app is never answered — in Sandbox too, where the
        // verifier (like Apple's library) checks appAppleId only when it is Production.
        let known = ([configuration.appAppleId] + configuration.otherAppStoreApps.map(\.appAppleId)).compactMap { $0 }
        if let mine = configuration.appAppleId, let theirs = decoded.appAppleId, !known.contains(theirs) {
            metrics.verificationFailure("wrong_app")
            logger.warning("security: retention request for another app", metadata: ["appAppleId": "\(theirs)"])
            throw APIError.verification(.wrongApp(expected: mine, actual: theirs), status: .badRequest)
        }
        guard let original = decoded.originalTransactionId, !original.isEmpty, original.unicodeScalars.count <= 64,
            let productId = decoded.productId, !productId.isEmpty, productId.unicodeScalars.count <= 255,
            let requestIdentifier = decoded.requestIdentifier, !requestIdentifier.isEmpty,
            requestIdentifier.unicodeScalars.count <= 128
        else {
            throw APIError.badRequest("the request has no originalTransactionId, productId or requestIdentifier")
        }
        for (value, field) in [
            (original, "originalTransactionId"), (productId, "productId"), (requestIdentifier, "requestIdentifier"),
        ] {
            try Self.validateText(value, field: field)
        }
        let now = Date()
        // When an offer rule may match this product, the offer history comes with the one read.
        let group = catalog.product(productId)?.group
        let offerRuleMayMatch = catalog.retention.contains {
            $0.promotionalOffer != nil && ($0.when?.productId == nil || $0.when?.productId == productId)
        }
        let stored = try await support.retentionContext(
            originalTransactionId: original, requestIdentifier: requestIdentifier,
            historyOf: offerRuleMayMatch ? group.map { catalog.group($0).map(\.id) } : nil,
            offerIds: Array(Set(catalog.retention.compactMap(\.promotionalOffer).map(\.offerId))).sorted())
        if let prior = stored.priorAnswer { return Self.rawJSON(prior) }

        // Offer eligibility is read only when the decision reaches a promotional-offer rule (its
        // answer or its holdout: both arms of a rule must be eligible for the measure to be
        // fair); a refused offer makes that rule not match, and the next one is tried.
        var refused: Set<String> = []
        var checked = false
        var decision: RetentionPolicy.Decision
        let request = RetentionPolicy.Request(
            productId: productId, paidTenure: stored.paidTenure, draw: RetentionPolicy.draw(requestIdentifier))
        while true {
            decision = RetentionPolicy.decide(
                request, rules: catalog.retention, now: now, offerAllowed: { !refused.contains($0) })
            let reached: Int? =
                switch decision {
                case .answer(let rule), .holdout(let rule): rule
                case .none: nil
                }
            guard let rule = reached, catalog.retention[rule].promotionalOffer != nil, !checked else { break }
            checked = true
            refused = try await refusedOffers(
                productId: productId, accountId: stored.accountId, history: stored.history, now: now)
            if refused.isEmpty { break }
        }
        var answer = RealtimeResponseBody()
        var ruleName: String?
        var holdout = false
        switch decision {
        case .none: break
        case .holdout(let index):
            ruleName = catalog.retentionRuleName(index)
            holdout = true
        case .answer(let index):
            ruleName = catalog.retentionRuleName(index)
            let rule = catalog.retention[index]
            if let message = rule.message {
                answer.message = .init(messageIdentifier: message.messageId)
            } else if let alternate = rule.alternateProduct {
                answer.alternateProduct = .init(messageIdentifier: alternate.messageId, productId: alternate.productId)
            } else if let offer = rule.promotionalOffer, var signer = offerSigner {
                // For the app the request is about (the signature covers its bundle id).
                if let other = configuration.otherAppStoreApps.first(where: {
                    $0.appAppleId != nil && $0.appAppleId == decoded.appAppleId
                }) {
                    signer = signer.forBundle(other.bundleId)
                }
                // V2, with the request's original transaction (required inside Retention Messaging).
                answer.promotionalOffer = .init(
                    messageIdentifier: offer.messageId,
                    promotionalOfferSignatureV2: try signer.promotionalOfferJWS(
                        productId: productId, offerId: offer.offerId, transactionId: original, nonce: UUID(),
                        issuedAt: now))
            }
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let json = String(decoding: try encoder.encode(answer), as: UTF8.self)
        let recorded = try await support.recordRetention(
            .init(
                requestIdentifier: requestIdentifier, originalTransactionId: original, accountId: stored.accountId,
                productId: productId, ruleName: ruleName, holdout: holdout, answer: json,
                environment: decoded.environment?.rawValue),
            now: now)
        return Self.rawJSON(recorded)
    }

    /// The retention rules' offers this account may not have (all of them when the
    /// subscription belongs to no account: eligibility cannot be shown).
    func refusedOffers(
        productId: String, accountId: String?, history: OfferStore.OfferHistory?, now: Date
    ) async throws -> Set<String> {
        let offerIds = Set(catalog.retention.compactMap(\.promotionalOffer).map(\.offerId))
        guard let accountId, let group = catalog.product(productId)?.group else { return offerIds }
        var history = history
        if history == nil {
            history = try await offers.offerHistory(
                account: accountId, groupProducts: catalog.group(group).map(\.id), latestTransaction: false)
        }
        guard let history else { return offerIds }
        return offerIds.filter { offerId in
            guard let offer = catalog.offer(offerId, of: productId) else { return true }
            return OfferEligibility.refusal(
                offer,
                history: .init(subscriptions: history.subscriptions, redemptions: history.redemptions[offerId] ?? 0),
                now: now) != nil
        }
    }

    static func rawJSON(_ text: String) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    struct RetentionReportJSON: Encodable {
        struct Figures: Encodable {
            var requests = 0
            var saved = 0
            var offerRedeemed = 0
            var planSwitched = 0
            var cancelled = 0
            var stayed = 0
            var pending = 0

            init() {}

            init(_ figures: SupportStore.RetentionFigures?) {
                guard let figures else { return }
                requests = figures.requests
                saved = figures.saved
                offerRedeemed = figures.offerRedeemed
                planSwitched = figures.planSwitched
                cancelled = figures.cancelled
                stayed = figures.stayed
                pending = figures.pending
            }
        }

        struct Rule: Encodable {
            var rule: String
            var answer: String
            var sample: Double?
            /// The requests answered by the rule.
            var answered: Figures
            /// The requests the rule matched and left unanswered (its holdout).
            var holdout: Figures
        }

        var since: String?
        var rules: [Rule]
        /// Requests no rule matched (answered `{}`).
        var unmatched: Figures
    }

    func retentionReport(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.read)
        try context.caller().requireEveryApp("the retention report")
        var since: Date?
        if let text = request.uri.queryParameters["since"].map(String.init) {
            guard let date = StoreKeeperApp.parseDate(text) else {
                throw APIError.badRequest("'since' must be an ISO 8601 date or date-time")
            }
            since = date
        }
        let figures = try await support.retentionReport(since: since, now: Date())
        func find(_ rule: String?, holdout: Bool) -> SupportStore.RetentionFigures? {
            figures.first { $0.rule == rule && $0.holdout == holdout }
        }
        var rules: [RetentionReportJSON.Rule] = []
        var named = Set<String>()
        for (index, rule) in catalog.retention.enumerated() {
            let name = catalog.retentionRuleName(index)
            named.insert(name)
            let answer =
                rule.message != nil ? "message" : rule.alternateProduct != nil ? "alternateProduct" : "promotionalOffer"
            rules.append(
                .init(
                    rule: name, answer: answer, sample: rule.when?.sample,
                    answered: .init(find(name, holdout: false)), holdout: .init(find(name, holdout: true))))
        }
        // Rules since removed from the catalog keep their history.
        for entry in figures where entry.rule.map({ !named.contains($0) }) ?? false && !entry.holdout {
            rules.append(
                .init(
                    rule: entry.rule!, answer: "removed", sample: nil, answered: .init(entry),
                    holdout: .init(find(entry.rule, holdout: true))))
            named.insert(entry.rule!)
        }
        return try Self.json(
            RetentionReportJSON(
                since: since.map(Self.iso), rules: rules, unmatched: .init(find(nil, holdout: false))))
    }
}

extension StoreKeeperApp {
    var retentionController: RetentionController {
        RetentionController(
            support: store.support, offers: store.offers, catalog: catalog, verifier: verifier,
            offerSigner: offerSigner, configuration: configuration, metrics: metrics, logger: logger)
    }
}
