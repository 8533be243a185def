import AppStoreModels
import Foundation

extension LocalAppStore {
    func finishedConsumables(of appleId: String) -> Set<String> {
        customers[appleId]?.finished ?? []
    }

    /// What Apple's verifyReceipt answers for a receipt this store signed: the receipt as sent,
    /// and for receipts of a customer with subscriptions the latest state of everything.
    func legacyResponse(for receipt: AppReceipt, excludeOldTransactions: Bool) -> VerifyReceiptResponse {
        var info = receipt.receiptInfo
        (info.requestDate, info.requestDateMs, info.requestDatePst) = LegacyDateFormat.triplet(clock.now())
        var response = VerifyReceiptResponse(status: 0, environment: configuration.environment, receipt: info)
        let owner = receipt.inAppPurchases.lazy.compactMap { $0.transactionId }.compactMap { self.owner(of: $0) }.first
        guard let owner else { return response }
        let ownedSubscriptions = subscriptions(of: owner)
        guard !ownedSubscriptions.isEmpty else { return response }
        let finished = finishedConsumables(of: owner)
        var latest = history(of: owner).filter { !finished.contains($0.payload.transactionId ?? "") }.map(\.payload)
        if excludeOldTransactions {
            let lastIds = Set(ownedSubscriptions.map(\.lastTransactionId))
            latest.removeAll { $0.type == .autoRenewable && !lastIds.contains($0.transactionId ?? "") }
        }
        response.latestReceiptInfo = latest.map(Self.legacyItem)
        response.pendingRenewalInfo = ownedSubscriptions.map { subscription in
            var info = PendingRenewalInfo(
                autoRenewProductId: subscription.autoRenewProductId,
                autoRenewStatus: .string(subscription.autoRenew ? "1" : "0"),
                originalTransactionId: subscription.originalTransactionId, productId: subscription.productId)
            if subscription.status == .expired, let intent = subscription.expirationIntent {
                info.expirationIntent = .string(String(intent.rawValue))
            }
            if subscription.status == .billingRetry || subscription.status == .billingGracePeriod {
                info.isInBillingRetryPeriod = "1"
            }
            (info.gracePeriodExpiresDate, info.gracePeriodExpiresDateMs, info.gracePeriodExpiresDatePst) =
                LegacyDateFormat.triplet(subscription.gracePeriodExpires)
            return info
        }
        if let signer = pki.receiptSigner, let latestReceipt = try? signer.sign(appReceipt(for: owner)) {
            response.latestReceipt = Data(latestReceipt).base64EncodedString()
        }
        return response
    }

    static func legacyItem(_ payload: JWSTransactionDecodedPayload) -> ReceiptInApp {
        var item = ReceiptInApp(
            originalTransactionId: payload.originalTransactionId, productId: payload.productId,
            quantity: .string(String(payload.quantity ?? 1)), transactionId: payload.transactionId,
            webOrderLineItemId: payload.webOrderLineItemId, appAccountToken: payload.appAccountToken,
            inAppOwnershipType: payload.inAppOwnershipType,
            subscriptionGroupIdentifier: payload.subscriptionGroupIdentifier)
        (item.purchaseDate, item.purchaseDateMs, item.purchaseDatePst) =
            LegacyDateFormat.triplet(payload.purchaseDate.map(Date.init(milliseconds:)))
        (item.originalPurchaseDate, item.originalPurchaseDateMs, item.originalPurchaseDatePst) =
            LegacyDateFormat.triplet(payload.originalPurchaseDate.map(Date.init(milliseconds:)))
        (item.expiresDate, item.expiresDateMs, item.expiresDatePst) =
            LegacyDateFormat.triplet(payload.expiresDate.map(Date.init(milliseconds:)))
        (item.cancellationDate, item.cancellationDateMs, item.cancellationDatePst) =
            LegacyDateFormat.triplet(payload.revocationDate.map(Date.init(milliseconds:)))
        if payload.revocationDate != nil {
            item.cancellationReason = .string(String(payload.revocationReason?.rawValue ?? 0))
        }
        item.isTrialPeriod = "false"
        item.isInIntroOfferPeriod = "false"
        if payload.isUpgraded == true { item.isUpgraded = "true" }
        return item
    }
}
