import Foundation
import StoreKeeperSupport

/// A payload with a hand-written decoder from `FastJSON`, used on the verification hot path.
///
/// The contract: whenever `init(fast:)` succeeds, the result equals what `JSONDecoder` would
/// produce; for anything unusual (a type mismatch, a fractional number, a nested object it
/// does not model) it throws and the caller decodes with `JSONDecoder` instead, which also
/// produces the precise error. Tests check both decoders agree on mutated payloads.
public protocol FastDecodable: Decodable {
    init(fast object: FastJSON.Fields) throws
}

extension FastDecodable {
    /// Decodes with the fast reader, falling back to `JSONDecoder`.
    public static func decode(json bytes: [UInt8]) throws -> Self {
        if case .object(let fields)? = try? FastJSON.parse(bytes), let value = try? Self(fast: FastJSON.Fields(fields))
        {
            return value
        }
        return try JSONDecoder().decode(Self.self, from: Data(bytes))
    }
}

/// The reader lives in StoreKeeperSupport (every store's hot path uses it); Apple's enums read
/// through it here.
public typealias FastJSON = StoreKeeperSupport.FastJSON

extension FastJSON.Fields {
    public func `enum`<E: AppleEnum>(_ key: String) throws -> E? where E.RawValue == String {
        try string(key).map(E.init(rawValue:))
    }

    public func `enum`<E: AppleEnum>(_ key: String) throws -> E? where E.RawValue == Int32 {
        try int32(key).map(E.init(rawValue:))
    }
}

extension JWSTransactionDecodedPayload: FastDecodable {
    public init(fast f: FastJSON.Fields) throws {
        try f.absent("advancedCommerceInfo")
        self.init(
            transactionId: try f.string("transactionId"), originalTransactionId: try f.string("originalTransactionId"),
            webOrderLineItemId: try f.string("webOrderLineItemId"),
            previousOriginalTransactionId: try f.string("previousOriginalTransactionId"),
            bundleId: try f.string("bundleId"), productId: try f.string("productId"),
            subscriptionGroupIdentifier: try f.string("subscriptionGroupIdentifier"),
            purchaseDate: try f.int64("purchaseDate"), originalPurchaseDate: try f.int64("originalPurchaseDate"),
            expiresDate: try f.int64("expiresDate"), quantity: try f.int32("quantity"), type: try f.enum("type"),
            appAccountToken: try f.string("appAccountToken"), inAppOwnershipType: try f.enum("inAppOwnershipType"),
            signedDate: try f.int64("signedDate"), revocationReason: try f.enum("revocationReason"),
            revocationDate: try f.int64("revocationDate"), revocationType: try f.enum("revocationType"),
            revocationPercentage: try f.int32("revocationPercentage"), isUpgraded: try f.bool("isUpgraded"),
            offerType: try f.enum("offerType"), offerIdentifier: try f.string("offerIdentifier"),
            offerDiscountType: try f.enum("offerDiscountType"), offerPeriod: try f.string("offerPeriod"),
            environment: try f.enum("environment"), storefront: try f.string("storefront"),
            storefrontId: try f.string("storefrontId"), transactionReason: try f.enum("transactionReason"),
            currency: try f.string("currency"), price: try f.int64("price"),
            appTransactionId: try f.string("appTransactionId"), billingPlanType: try f.enum("billingPlanType"),
            commitmentInfo: try f.object("commitmentInfo").map {
                TransactionCommitmentInfo(
                    billingPeriodNumber: try $0.int32("billingPeriodNumber"),
                    totalBillingPeriods: try $0.int32("totalBillingPeriods"),
                    commitmentExpiresDate: try $0.int64("commitmentExpiresDate"),
                    commitmentPrice: try $0.int64("commitmentPrice"))
            })
    }
}

extension JWSRenewalInfoDecodedPayload: FastDecodable {
    public init(fast f: FastJSON.Fields) throws {
        try f.absent("advancedCommerceInfo")
        self.init(
            originalTransactionId: try f.string("originalTransactionId"), productId: try f.string("productId"),
            autoRenewProductId: try f.string("autoRenewProductId"), autoRenewStatus: try f.enum("autoRenewStatus"),
            expirationIntent: try f.enum("expirationIntent"),
            isInBillingRetryPeriod: try f.bool("isInBillingRetryPeriod"),
            gracePeriodExpiresDate: try f.int64("gracePeriodExpiresDate"),
            priceIncreaseStatus: try f.enum("priceIncreaseStatus"), offerType: try f.enum("offerType"),
            offerIdentifier: try f.string("offerIdentifier"), offerDiscountType: try f.enum("offerDiscountType"),
            offerPeriod: try f.string("offerPeriod"), signedDate: try f.int64("signedDate"),
            environment: try f.enum("environment"),
            recentSubscriptionStartDate: try f.int64("recentSubscriptionStartDate"),
            renewalDate: try f.int64("renewalDate"), renewalPrice: try f.int64("renewalPrice"),
            currency: try f.string("currency"), eligibleWinBackOfferIds: try f.strings("eligibleWinBackOfferIds"),
            appAccountToken: try f.string("appAccountToken"), appTransactionId: try f.string("appTransactionId"),
            renewalBillingPlanType: try f.enum("renewalBillingPlanType"),
            commitmentInfo: try f.object("commitmentInfo").map {
                RenewalCommitmentInfo(
                    commitmentAutoRenewProductId: try $0.string("commitmentAutoRenewProductId"),
                    commitmentAutoRenewStatus: try $0.enum("commitmentAutoRenewStatus"),
                    commitmentRenewalBillingPlanType: try $0.enum("commitmentRenewalBillingPlanType"),
                    commitmentRenewalDate: try $0.int64("commitmentRenewalDate"),
                    commitmentRenewalPrice: try $0.int64("commitmentRenewalPrice"))
            })
    }
}

extension ResponseBodyV2DecodedPayload: FastDecodable {
    /// The common shape — `data` — by hand; a summary, an external purchase token or app data
    /// (rare) fall back to `JSONDecoder`.
    public init(fast f: FastJSON.Fields) throws {
        try f.absent("summary")
        try f.absent("externalPurchaseToken")
        try f.absent("appData")
        self.init(
            notificationType: try f.enum("notificationType"), subtype: try f.enum("subtype"),
            notificationUUID: try f.string("notificationUUID"), version: try f.string("version"),
            signedDate: try f.int64("signedDate"),
            data: try f.object("data").map {
                NotificationData(
                    appAppleId: try $0.int64("appAppleId"), bundleId: try $0.string("bundleId"),
                    bundleVersion: try $0.string("bundleVersion"), environment: try $0.enum("environment"),
                    signedTransactionInfo: try $0.string("signedTransactionInfo"),
                    signedRenewalInfo: try $0.string("signedRenewalInfo"), status: try $0.enum("status"),
                    consumptionRequestReason: try $0.enum("consumptionRequestReason"))
            })
    }
}

extension DecodedRealtimeRequestBody: FastDecodable {
    public init(fast f: FastJSON.Fields) throws {
        self.init(
            originalTransactionId: try f.string("originalTransactionId"), appAppleId: try f.int64("appAppleId"),
            productId: try f.string("productId"), userLocale: try f.string("userLocale"),
            requestIdentifier: try f.string("requestIdentifier"), signedDate: try f.int64("signedDate"),
            environment: try f.enum("environment"))
    }
}

/// `{"signedPayload": "…"}`: the body of a notification and of a Get Retention Message request,
/// ~10 KB of JWS that `JSONDecoder` scanned in 3 % of a notification's CPU.
extension RealtimeRequestBody: FastDecodable {
    public init(fast f: FastJSON.Fields) throws {
        self.init(signedPayload: try f.string("signedPayload"))
    }
}
