import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// Offers at the local App Store, checked as the App Store checks them (docs/offers-and-retention.md):
/// promotional offers by their V1 signature or V2 JWS under the In-App Purchase key this store
/// issued; introductory offers once per Apple Account and group unless an eligibility JWS says
/// otherwise; win-back offers for churned subscribers, by the catalog's rules.
extension LocalAppStore {
    /// What a purchase asks for, as StoreKit passes it.
    public struct OfferRequest: Codable, Sendable, Hashable {
        /// The offer id (StoreKit's `offerID`).
        public var id: String
        /// V1: `keyId`, `nonce`, `timestamp` (ms), `signature` (base64 DER).
        public var keyId: String?
        public var nonce: String?
        public var timestamp: Int64?
        public var signature: String?
        /// V2: the compact JWS (`promotionalOffer(_:compactJWS:)`).
        public var jws: String?

        public init(
            id: String, keyId: String? = nil, nonce: String? = nil, timestamp: Int64? = nil, signature: String? = nil,
            jws: String? = nil
        ) {
            self.id = id
            self.keyId = keyId
            self.nonce = nonce
            self.timestamp = timestamp
            self.signature = signature
            self.jws = jws
        }
    }

    /// A purchase's offer options.
    public struct PurchaseOffers: Sendable, Hashable {
        public var promotional: OfferRequest?
        /// `introductoryOfferEligibility(compactJWS:)`.
        public var introductoryEligibilityJWS: String?
        /// `winBackOffer(_:)`: an id from renewal info's `eligibleWinBackOfferIds`.
        public var winBackOfferId: String?
        /// An offer code redeemed in the App Store (also for one-time products since 2025-10):
        /// the code and the price it charges (nil: free).
        public var offerCode: OfferCode?

        public init(
            promotional: OfferRequest? = nil, introductoryEligibilityJWS: String? = nil, winBackOfferId: String? = nil,
            offerCode: OfferCode? = nil
        ) {
            self.promotional = promotional
            self.introductoryEligibilityJWS = introductoryEligibilityJWS
            self.winBackOfferId = winBackOfferId
            self.offerCode = offerCode
        }

        public var isEmpty: Bool {
            promotional == nil && introductoryEligibilityJWS == nil && winBackOfferId == nil && offerCode == nil
        }
    }

    public struct OfferCode: Sendable, Hashable {
        public var code: String
        public var price: Decimal?
        public var period: ISODuration?

        public init(code: String, price: Decimal? = nil, period: ISODuration? = nil) {
            self.code = code
            self.price = price
            self.period = period
        }
    }

    /// StoreKit's refusal, by its error name (`Product.PurchaseError` / `SKError`).
    public struct OfferRefusal: Error, Sendable, Hashable, CustomStringConvertible {
        public var code: String
        public var message: String
        public var description: String { "\(code): \(message)" }

        static func invalidSignature(_ message: String) -> Self { .init(code: "invalidSignature", message: message) }
        static func invalidOfferIdentifier(_ message: String) -> Self {
            .init(code: "invalidOfferIdentifier", message: message)
        }
        static func ineligible(_ message: String) -> Self { .init(code: "ineligibleForOffer", message: message) }
        static func missingParams(_ message: String) -> Self { .init(code: "missingOfferParams", message: message) }
    }

    /// The discount a purchase gets, decided before it is charged.
    struct Discount: Sendable, Hashable {
        var type: OfferType
        var id: String?
        var discountType: Offer.DiscountType
        var price: Decimal?
        var period: ISODuration?
    }

    static func offerChecker(_ configuration: Configuration) -> OfferSignatureChecker {
        var keys: [String: P256.Signing.PublicKey] = [:]
        for key in configuration.offerKeys {
            keys[key.keyId] = try? P256.Signing.PublicKey(pemRepresentation: key.publicKeyPEM)
        }
        return OfferSignatureChecker(keys: keys)
    }

    /// Decides the discount of a one-product purchase, or refuses it as StoreKit would.
    func discount(
        for product: Product, appleId: String, token: UUID?, offers: PurchaseOffers, at now: Date
    ) throws -> Discount? {
        let group = product.group ?? ""
        let history = subscriptions.values.filter { $0.appleId == appleId && $0.group == group }
        if let request = offers.promotional {
            guard product.type == .autoRenewable, let offer = product.offers?.first(where: { $0.id == request.id })
            else {
                throw OfferRefusal.invalidOfferIdentifier("'\(request.id)' is not an offer of '\(product.id)'")
            }
            try checkPromotional(request, product: product, appleId: appleId, token: token, at: now)
            // Apple's only eligibility rule for promotional offers: a current or past subscriber.
            guard !history.isEmpty else {
                throw OfferRefusal.ineligible("promotional offers are for current or past subscribers of the group")
            }
            return Discount(
                type: .promotionalOffer, id: offer.id, discountType: offer.discountType ?? .payAsYouGo,
                price: offer.price, period: offer.period)
        }
        if let code = offers.offerCode {
            // One-time products: ONE_TIME at the code's price; subscriptions: the code's period
            // paid up front (free without a price).
            let discountType: Offer.DiscountType =
                product.type == .autoRenewable ? (code.price == nil ? .freeTrial : .payUpFront) : .oneTime
            return Discount(
                type: .offerCode, id: code.code, discountType: discountType, price: code.price ?? 0,
                period: product.type == .autoRenewable ? code.period ?? ISODuration(months: 1) : nil)
        }
        if let winBack = offers.winBackOfferId {
            guard let offer = product.winBackOffers?.first(where: { $0.id == winBack }) else {
                throw OfferRefusal.invalidOfferIdentifier("'\(winBack)' is not a win-back offer of '\(product.id)'")
            }
            guard let subscription = history.first, eligibleWinBackOffers(subscription, at: now).contains(offer.id)
            else { throw OfferRefusal.ineligible("not eligible for win-back offer '\(winBack)'") }
            return Discount(
                type: .winBackOffer, id: offer.id, discountType: offer.discountType, price: offer.price,
                period: offer.period)
        }
        guard product.type == .autoRenewable, let intro = product.introductoryOffer else {
            if offers.introductoryEligibilityJWS != nil, product.type != .autoRenewable {
                throw OfferRefusal.invalidOfferIdentifier("'\(product.id)' is not an auto-renewable subscription")
            }
            return nil
        }
        // Apple's rule: once per Apple Account and group, never while subscribed in the group.
        var eligible =
            !introductoryUsed.contains("\(appleId)|\(group)")
            && !history.contains { $0.status == .active || $0.status == .billingGracePeriod }
        if let jws = offers.introductoryEligibilityJWS {
            guard let claims = offerChecker.verifyV2(jws), claims.aud == "introductory-offer-eligibility" else {
                throw OfferRefusal.invalidSignature("the introductory-offer eligibility JWS does not verify")
            }
            try checkV2Common(claims, product: product, appleId: appleId, at: now)
            guard let allowed = claims.allowIntroductoryOffer, claims.transactionId != nil else {
                throw OfferRefusal.invalidSignature("allowIntroductoryOffer and transactionId are required")
            }
            eligible = allowed
        }
        guard eligible else { return nil }
        return Discount(
            type: .introductoryOffer, id: nil, discountType: intro.discountType, price: intro.price,
            period: intro.period)
    }

    private func checkPromotional(
        _ request: OfferRequest, product: Product, appleId: String, token: UUID?, at now: Date
    ) throws {
        if let jws = request.jws {
            guard let claims = offerChecker.verifyV2(jws), claims.aud == "promotional-offer" else {
                throw OfferRefusal.invalidSignature("the promotional offer JWS does not verify under a known key")
            }
            guard claims.offerIdentifier == request.id else {
                throw OfferRefusal.invalidOfferIdentifier("the JWS is for offer '\(claims.offerIdentifier ?? "")'")
            }
            try checkV2Common(claims, product: product, appleId: appleId, at: now)
            return
        }
        guard let keyId = request.keyId, let nonceText = request.nonce, let timestamp = request.timestamp,
            let signature = request.signature
        else { throw OfferRefusal.missingParams("a V1 offer needs keyId, nonce, timestamp and signature") }
        guard let nonce = UUID(uuidString: nonceText) else {
            throw OfferRefusal.invalidSignature("nonce must be a UUID")
        }
        let payload = OfferSigner.v1Payload(
            bundleId: configuration.bundleId, keyId: keyId, productId: product.id, offerId: request.id,
            appAccountToken: token?.uuidString, nonce: nonce, timestamp: timestamp)
        guard offerChecker.verifyV1(payload, keyId: keyId, signatureBase64: signature) else {
            throw OfferRefusal.invalidSignature(
                "the signature does not verify for this bundle, key, product, offer, appAccountToken, nonce and timestamp"
            )
        }
        try checkFresh(Date(timeIntervalSince1970: Double(timestamp) / 1000), at: now)
        try useNonce(nonce.uuidString.lowercased())
    }

    /// A V2 JWS's bundle, product, age, nonce and transaction.
    private func checkV2Common(
        _ claims: OfferSignatureChecker.V2Claims, product: Product, appleId: String, at now: Date
    ) throws {
        guard claims.bid == configuration.bundleId else {
            throw OfferRefusal.invalidSignature("signed for bundle '\(claims.bid ?? "")'")
        }
        guard claims.productId == product.id else {
            throw OfferRefusal.invalidOfferIdentifier("signed for product '\(claims.productId ?? "")'")
        }
        let issuerKnown = configuration.offerKeys.contains { $0.issuerId == claims.iss && $0.keyId == claims.keyId }
        guard issuerKnown else {
            throw OfferRefusal.invalidSignature("iss is not the issuer of key '\(claims.keyId ?? "")'")
        }
        guard let iat = claims.iat, claims.exp == nil else {
            throw OfferRefusal.invalidSignature("iat (seconds) is required and exp is not allowed")
        }
        try checkFresh(Date(timeIntervalSince1970: Double(iat)), at: now)
        guard let nonce = claims.nonce, let uuid = UUID(uuidString: nonce) else {
            throw OfferRefusal.invalidSignature("nonce must be a UUID")
        }
        try useNonce(uuid.uuidString.lowercased())
        if let transactionId = claims.transactionId {
            // Any transaction or app transaction this store issued: whether Apple also requires
            // the purchasing Apple Account's own is unconfirmed (offers.md §2), and an app
            // account may name its latest transaction, made under another Apple Account.
            let known =
                transactions[transactionId] != nil || customers.values.contains { $0.appTransactionId == transactionId }
            guard known else { throw OfferRefusal.invalidSignature("transactionId \(transactionId) is unknown") }
        }
    }

    private func checkFresh(_ signed: Date, at now: Date) throws {
        guard now.timeIntervalSince(signed) <= 24 * 3600, signed.timeIntervalSince(now) <= 300 else {
            throw OfferRefusal.invalidSignature("signed more than 24 hours ago (or in the future)")
        }
    }

    private func useNonce(_ nonce: String) throws {
        guard usedOfferNonces.insert(nonce).inserted else {
            throw OfferRefusal.invalidSignature("nonce \(nonce) was already used")
        }
    }

    /// Renewal info's `eligibleWinBackOfferIds`: churned (expired, auto-renew off), paid at
    /// least and lapsed at least as each offer asks; best (catalog order) first.
    func eligibleWinBackOffers(_ subscription: Subscription, at now: Date) -> [String] {
        guard subscription.status == .expired else { return [] }
        let products = configuration.catalog.group(subscription.group)
        let started = transactions[subscription.originalTransactionId]?.payload.purchaseDate.map(
            Date.init(milliseconds:))
        let paid = subscription.expires.timeIntervalSince(started ?? subscription.expires)
        var ids: [String] = []
        for product in products {
            for offer in product.winBackOffers ?? [] {
                let epoch = Date(timeIntervalSince1970: 0)
                if let atLeast = offer.paidAtLeast, paid < atLeast.added(to: epoch).timeIntervalSince(epoch) {
                    continue
                }
                if let atLeast = offer.churnedAtLeast, atLeast.added(to: subscription.expires) > now { continue }
                ids.append(offer.id)
            }
        }
        return ids
    }

    /// Applies the decided discount to a transaction about to be issued.
    func apply(
        _ discount: Discount, to payload: inout JWSTransactionDecodedPayload, product: Product, appleId: String,
        at now: Date
    ) {
        payload.offerType = discount.type
        payload.offerIdentifier = discount.id
        payload.offerDiscountType = OfferDiscountType(rawValue: discount.discountType.appleValue)
        if let period = discount.period { payload.offerPeriod = period.description }
        switch discount.discountType {
        case .freeTrial: payload.price = 0
        case .payAsYouGo, .payUpFront, .oneTime:
            if let price = discount.price {
                payload.price = Product.Price(currency: payload.currency ?? "USD", price: price).milliunits
            }
        }
        if product.type == .autoRenewable, discount.discountType != .payAsYouGo, let period = discount.period {
            // A free trial or a pay-up-front offer covers its whole period with this transaction.
            payload.expiresDate = period.added(to: now).milliseconds
        }
        if discount.type == .introductoryOffer { introductoryUsed.insert("\(appleId)|\(product.group ?? "")") }
    }
}
