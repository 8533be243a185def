import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// Reads and signing: transactions, subscriptions, history, signed JWS on demand.
extension LocalAppStore {
    // MARK: Reads

    public func transaction(_ id: String) -> StoredTransaction? { transactions[id] }

    public func subscription(_ originalTransactionId: String) -> Subscription? { subscriptions[originalTransactionId] }

    public func pendingPurchase(_ id: String) -> PendingPurchase? { pending[id] }

    /// The customer owning any transaction id, original transaction id or app transaction id.
    public func owner(of anyTransactionId: String) -> String? {
        if let stored = transactions[anyTransactionId] { return stored.appleId }
        return customers.values.first { $0.appTransactionId == anyTransactionId }?.appleId
    }

    /// Every transaction of a customer, oldest change first (history v2 order).
    public func history(of appleId: String) -> [StoredTransaction] {
        (customers[appleId]?.transactionIds ?? []).compactMap { transactions[$0] }
            .sorted { ($0.modified, $0.payload.transactionId ?? "") < ($1.modified, $1.payload.transactionId ?? "") }
    }

    public func subscriptions(of appleId: String) -> [Subscription] {
        subscriptions.values.filter { $0.appleId == appleId }.sorted {
            $0.originalTransactionId < $1.originalTransactionId
        }
    }

    /// The payload as Apple would sign it now (fresh `signedDate`, faults applied).
    nonisolated func signed(_ payload: JWSTransactionDecodedPayload, at now: Date, dropToken: Bool = false)
        -> JWSTransactionDecodedPayload
    {
        var payload = payload
        payload.signedDate = now.milliseconds
        if dropToken { payload.appAccountToken = nil }
        return payload
    }

    public func signTransaction(_ id: String) throws -> String {
        guard let stored = transactions[id] else { throw StoreError.unknownTransaction(id) }
        return try signer.sign(signed(stored.payload, at: clock.now(), dropToken: faults.dropAppAccountToken))
    }

    public func signRenewalInfo(_ originalTransactionId: String) throws -> String {
        guard let subscription = subscriptions[originalTransactionId] else {
            throw StoreError.unknownSubscription(originalTransactionId)
        }
        return try signer.sign(renewalInfo(subscription, at: clock.now()))
    }

    func renewalInfo(_ subscription: Subscription, at now: Date) -> JWSRenewalInfoDecodedPayload {
        let product = configuration.catalog.product(subscription.autoRenewProductId)
        let price = product?.price(in: customers[subscription.appleId]?.storefront ?? "USA")
        return JWSRenewalInfoDecodedPayload(
            originalTransactionId: subscription.originalTransactionId, productId: subscription.productId,
            autoRenewProductId: subscription.autoRenewProductId, autoRenewStatus: subscription.autoRenew ? .on : .off,
            expirationIntent: subscription.status == .expired ? subscription.expirationIntent : nil,
            isInBillingRetryPeriod: subscription.status == .billingRetry || subscription.status == .billingGracePeriod
                ? true : nil,
            gracePeriodExpiresDate: subscription.gracePeriodExpires?.milliseconds, signedDate: now.milliseconds,
            environment: configuration.environment,
            recentSubscriptionStartDate: transactions[subscription.originalTransactionId]?.payload.purchaseDate,
            renewalDate: subscription.expires.milliseconds, renewalPrice: price?.milliunits, currency: price?.currency,
            eligibleWinBackOfferIds: eligibleWinBackOffers(subscription, at: now).nilIfEmpty,
            appAccountToken: subscription.appAccountToken,
            appTransactionId: customers[subscription.appleId]?.appTransactionId,
            renewalBillingPlanType: subscription.commitment == nil ? nil : .monthly,
            commitmentInfo: subscription.commitment.map { commitment in
                RenewalCommitmentInfo(
                    commitmentAutoRenewProductId: subscription.autoRenewProductId,
                    commitmentAutoRenewStatus: commitment.renews ? .on : .off,
                    commitmentRenewalBillingPlanType: .monthly,
                    commitmentRenewalDate: commitment.expires.milliseconds,
                    commitmentRenewalPrice: commitment.monthlyPrice)
            })
    }
}

extension Array {
    var nilIfEmpty: Self? { isEmpty ? nil : self }
}
