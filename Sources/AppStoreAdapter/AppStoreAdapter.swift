import AppStoreModels
import Foundation
import StoreKeeperCatalog
import StoreKeeperCore

// The App Store's adapter: what Apple signed, read into the core's store-neutral values. Apple's
// types stop here; the core, storage and every decision see `StoreTransaction`,
// `StoreRenewal`, `StoreNotice` and `NotificationRecord` only.

extension StoreTransaction {
    /// A transaction Apple signed (JWSTransaction), as the core decides on it.
    public init(apple payload: JWSTransactionDecodedPayload) {
        self.init(
            store: .appStore, transactionId: payload.transactionId,
            originalTransactionId: payload.originalTransactionId, storeIdentity: payload.bundleId,
            productId: payload.productId, subscriptionGroup: payload.subscriptionGroupIdentifier,
            purchaseDate: payload.purchaseDate, originalPurchaseDate: payload.originalPurchaseDate,
            expiresDate: payload.expiresDate, quantity: payload.quantity,
            kind: payload.type.map { ProductKind(rawValue: $0.rawValue) }, appAccountToken: payload.appAccountToken,
            ownership: payload.inAppOwnershipType.map { Ownership(rawValue: $0.rawValue) },
            signedDate: payload.signedDate, revocationReason: payload.revocationReason?.rawValue,
            revocationDate: payload.revocationDate,
            revocationType: payload.revocationType.map { RevocationKind(rawValue: $0.rawValue) },
            revocationPercentage: payload.revocationPercentage, isUpgraded: payload.isUpgraded,
            offerType: payload.offerType.map { OfferKind(rawValue: $0.rawValue) },
            offerIdentifier: payload.offerIdentifier,
            offerDiscountType: payload.offerDiscountType.map { DiscountKind(rawValue: $0.rawValue) },
            offerPeriod: payload.offerPeriod,
            environment: payload.environment.map { StoreEnvironment(rawValue: $0.rawValue) },
            storefront: payload.storefront, transactionReason: payload.transactionReason?.rawValue,
            currency: payload.currency, price: payload.price, appTransactionId: payload.appTransactionId,
            billingPlan: payload.billingPlanType.map { BillingPlan(rawValue: $0.rawValue) },
            commitment: payload.commitmentInfo.map {
                Commitment(
                    billingPeriodNumber: $0.billingPeriodNumber, totalBillingPeriods: $0.totalBillingPeriods,
                    commitmentExpiresDate: $0.commitmentExpiresDate, commitmentPrice: $0.commitmentPrice)
            })
    }
}

extension StoreRenewal {
    /// Apple's signed renewal info (JWSRenewalInfo).
    public init(apple info: JWSRenewalInfoDecodedPayload) {
        self.init(
            autoRenew: info.autoRenewStatus.map { $0 == .on }, nextProductId: info.autoRenewProductId,
            renewalPrice: info.renewalPrice, currency: info.currency,
            gracePeriodExpiresDate: info.gracePeriodExpiresDate,
            commitmentRenews: info.commitmentInfo?.commitmentAutoRenewStatus.map { $0 == .on },
            signedDate: info.signedDate)
    }
}

extension StoreNotice {
    /// What an App Store Server Notification V2 type and subtype mean.
    public init(apple type: NotificationType, _ subtype: NotificationSubtype?) {
        switch type {
        case .subscribed, .didRenew, .offerRedeemed, .renewalExtended: self = .newPeriod
        case .oneTimeCharge: self = .oneTimePurchase
        case .didFailToRenew: self = .renewalFailed(gracePeriod: subtype == .gracePeriod)
        case .gracePeriodExpired: self = .gracePeriodEnded
        case .expired: self = .expired
        case .didChangeRenewalStatus:
            self = .autoRenewChanged(
                subtype == .autoRenewEnabled ? true : subtype == .autoRenewDisabled ? false : nil)
        case .didChangeRenewalPref: self = .planChanged(immediate: subtype == .upgrade)
        case .priceIncrease: self = .priceIncrease
        case .refund: self = .refunded(revoke: false)
        case .revoke: self = .refunded(revoke: true)
        case .refundReversed: self = .refundReversed
        case .refundDeclined: self = .refundDeclined
        case .consumptionRequest: self = .consumptionRequest
        case .renewalExtension: self = .extensionSummary
        case .test: self = .test
        case .externalPurchaseToken: self = .externalPurchaseToken(unreported: subtype == .unreported)
        case .rescindConsent: self = .consentRescinded
        case .metadataUpdate, .migration, .priceChange: self = .other("Advanced Commerce API only")
        default: self = .unknown
        }
    }
}

extension SubscriptionEvent.Source {
    /// An App Store notification of `type` (and `subtype`).
    public static func apple(_ type: NotificationType, _ subtype: NotificationSubtype? = nil) -> Self {
        .notification(StoreNotice(apple: type, subtype), label: type.rawValue)
    }
}

extension SubscriptionEvent {
    /// An event with Apple's signed transaction and renewal info.
    public init(
        _ source: Source, signedDate: Date, apple transaction: JWSTransactionDecodedPayload?,
        renewalInfo: JWSRenewalInfoDecodedPayload? = nil
    ) {
        self.init(
            source, signedDate: signedDate, transaction: transaction.map(StoreTransaction.init(apple:)),
            renewalInfo: renewalInfo.map(StoreRenewal.init(apple:)))
    }
}

extension NotificationRecord {
    /// The record of a verified App Store Server Notification (and the signed objects in it);
    /// nil without the fields every notification has.
    public init?(
        payload: ResponseBodyV2DecodedPayload, transaction: JWSTransactionDecodedPayload?,
        renewalInfo: JWSRenewalInfoDecodedPayload?, appTransaction: AppTransaction? = nil
    ) {
        guard let uuid = payload.notificationUUID, !uuid.isEmpty, let type = payload.notificationType,
            let signedDate = payload.signedDate
        else { return nil }
        let token = payload.externalPurchaseToken
        self.init(
            notificationUUID: uuid, type: type.rawValue, subtype: payload.subtype?.rawValue,
            notice: StoreNotice(apple: type, payload.subtype), signedDate: signedDate,
            environment: payload.data?.environment?.rawValue ?? payload.summary?.environment?.rawValue
                ?? payload.appData?.environment?.rawValue ?? token?.environment.rawValue,
            storeStatus: payload.data?.status.map { Int($0.rawValue) },
            consumptionRequestReason: payload.data?.consumptionRequestReason?.rawValue,
            transaction: transaction.map(StoreTransaction.init(apple:)),
            renewalInfo: renewalInfo.map(StoreRenewal.init(apple:)), appTransactionId: appTransaction?.appTransactionId,
            appBundleId: appTransaction?.bundleId ?? payload.appData?.bundleId,
            externalToken: token.map {
                ExternalToken(
                    externalPurchaseId: $0.externalPurchaseId, createdAt: $0.tokenCreationDate,
                    expiresAt: $0.tokenExpirationDate, storeIdentity: $0.bundleId, tokenType: $0.tokenType,
                    environment: $0.environment.rawValue)
            })
    }
}

extension ConsumptionPlanner.Answer {
    /// Send Consumption Information V2's body for this answer.
    public var appleRequest: ConsumptionRequest {
        var request = ConsumptionRequest(
            customerConsented: true, sampleContentProvided: sampleContentProvided,
            deliveryStatus: delivered ? .delivered : .undeliveredOther)
        request.consumptionPercentage = consumedShare
        request.refundPreference = preference.map { RefundPreference(rawValue: $0.apple) }
        return request
    }
}

extension StoreTransaction {
    /// An App Store transaction written by hand with Apple's field names (tools and tests):
    /// the same reading as a signed one.
    public static func appStore(
        transactionId: String? = nil, originalTransactionId: String? = nil, webOrderLineItemId: String? = nil,
        bundleId: String? = nil, productId: String? = nil, subscriptionGroupIdentifier: String? = nil,
        purchaseDate: Int64? = nil, originalPurchaseDate: Int64? = nil, expiresDate: Int64? = nil,
        quantity: Int32? = nil, type: ProductType? = nil, appAccountToken: String? = nil,
        inAppOwnershipType: InAppOwnershipType? = nil, signedDate: Int64? = nil,
        revocationReason: RevocationReason? = nil, revocationDate: Int64? = nil, revocationType: RevocationType? = nil,
        revocationPercentage: Int32? = nil, isUpgraded: Bool? = nil, offerType: OfferType? = nil,
        offerIdentifier: String? = nil, offerDiscountType: OfferDiscountType? = nil, offerPeriod: String? = nil,
        environment: AppStoreEnvironment? = nil, storefront: String? = nil, storefrontId: String? = nil,
        transactionReason: TransactionReason? = nil, currency: String? = nil, price: Int64? = nil,
        appTransactionId: String? = nil, billingPlanType: BillingPlanType? = nil,
        commitmentInfo: TransactionCommitmentInfo? = nil
    ) -> StoreTransaction {
        StoreTransaction(
            apple: JWSTransactionDecodedPayload(
                transactionId: transactionId, originalTransactionId: originalTransactionId,
                webOrderLineItemId: webOrderLineItemId, bundleId: bundleId, productId: productId,
                subscriptionGroupIdentifier: subscriptionGroupIdentifier, purchaseDate: purchaseDate,
                originalPurchaseDate: originalPurchaseDate, expiresDate: expiresDate, quantity: quantity, type: type,
                appAccountToken: appAccountToken, inAppOwnershipType: inAppOwnershipType, signedDate: signedDate,
                revocationReason: revocationReason, revocationDate: revocationDate, revocationType: revocationType,
                revocationPercentage: revocationPercentage, isUpgraded: isUpgraded, offerType: offerType,
                offerIdentifier: offerIdentifier, offerDiscountType: offerDiscountType, offerPeriod: offerPeriod,
                environment: environment, storefront: storefront, storefrontId: storefrontId,
                transactionReason: transactionReason, currency: currency, price: price,
                appTransactionId: appTransactionId, billingPlanType: billingPlanType, commitmentInfo: commitmentInfo))
    }
}

extension ExternalPurchaseReport {
    /// The External Purchase Server API's body for a report storage built.
    public init(_ report: ExternalSalesReport) {
        self.init(
            requestIdentifier: report.requestIdentifier, externalPurchaseId: report.externalPurchaseId,
            status: report.status, lineItems: report.lineItems?.map(ExternalPurchaseLineItem.init))
    }
}

extension ExternalPurchaseLineItem {
    public init(_ item: ExternalSalesReport.LineItem) {
        self.init(
            lineItemId: item.lineItemId, creationDate: item.creationDate, eventType: item.eventType,
            productType: item.productType, productIdentifier: item.productIdentifier, quantity: item.quantity,
            pricingCurrency: item.pricingCurrency, reportingCurrency: item.reportingCurrency,
            amountTaxInclusive: item.amountTaxInclusive, amountTaxExclusive: item.amountTaxExclusive,
            taxAmount: item.taxAmount, netAmountTaxExclusive: item.netAmountTaxExclusive, taxCountry: item.taxCountry,
            referenceLineItemId: item.referenceLineItemId)
        exchangeRate = item.exchangeRate
        restatement = item.restatement
        erroneouslySubmitted = item.erroneouslySubmitted
        subscriptionEvent = item.subscriptionEvent
        subscriptionStartDate = item.subscriptionStartDate
        subscriptionEndDate = item.subscriptionEndDate
        subscriptionDaysOfPaidService = item.subscriptionDaysOfPaidService
    }
}
