import Foundation
import GooglePlay
import JWTKit
import LocalAppStore
import StoreKeeperCatalog

/// What the local Google Play answers for its Developer API: each purchase as Google's v2
/// resources, and the voided purchases list.
extension LocalGooglePlay {
    // MARK: Reads (Google's resources)

    public func purchase(_ token: String) -> Purchase? { purchases[token] }
    public func allPurchases() -> [Purchase] { purchases.values.sorted { $0.purchaseTime < $1.purchaseTime } }

    public func productPurchaseV2(_ token: String) -> ProductPurchaseV2? {
        guard let purchase = purchases[token], purchase.kind == .oneTime else { return nil }
        var resource = ProductPurchaseV2()
        resource.kind = "androidpublisher#productPurchaseV2"
        resource.productLineItem = [
            .init(
                productId: purchase.productId,
                productOfferDetails: .init(
                    purchaseOptionId: "buy", quantity: purchase.quantity,
                    refundableQuantity: purchase.refundableQuantity,
                    consumptionState: purchase.consumed ? ConsumptionState.consumed : ConsumptionState.yetToBeConsumed))
        ]
        resource.purchaseStateContext = .init(purchaseState: purchase.purchaseState)
        if purchase.test { resource.testPurchaseContext = .init(fopType: "TEST") }
        resource.orderId = purchase.orders.last
        resource.obfuscatedExternalAccountId = purchase.obfuscatedAccountId
        resource.regionCode = purchase.regionCode
        resource.purchaseCompletionTime = purchase.paidAt.map(GoogleTime.format)
        resource.acknowledgementState =
            purchase.acknowledged ? AcknowledgementState.acknowledged : AcknowledgementState.pending
        return resource
    }

    public func subscriptionPurchaseV2(_ token: String) -> SubscriptionPurchaseV2? {
        guard let purchase = purchases[token], purchase.kind == .subscription else { return nil }
        var resource = SubscriptionPurchaseV2()
        resource.kind = "androidpublisher#subscriptionPurchaseV2"
        resource.regionCode = purchase.regionCode
        resource.startTime = purchase.paidAt.map(GoogleTime.format)
        resource.subscriptionState = purchase.subscriptionState
        resource.linkedPurchaseToken = purchase.linkedPurchaseToken
        if let expired = purchase.expiredPurchaseToken, !purchase.acknowledged {
            resource.outOfAppPurchaseContext = .init(
                expiredExternalAccountIdentifiers: purchases[expired]?.obfuscatedAccountId.map {
                    .init(obfuscatedExternalAccountId: $0)
                }, expiredPurchaseToken: expired)
        }
        resource.latestOrderId = purchase.orders.last
        resource.acknowledgementState =
            purchase.acknowledged ? AcknowledgementState.acknowledged : AcknowledgementState.pending
        resource.externalAccountIdentifiers = purchase.obfuscatedAccountId.map {
            .init(obfuscatedExternalAccountId: $0)
        }
        if let until = purchase.pausedUntil {
            resource.pausedStateContext = .init(autoResumeTime: GoogleTime.format(until))
        }
        if let cancellation = purchase.cancellation,
            [SubscriptionState.canceled, SubscriptionState.expired].contains(purchase.subscriptionState)
        {
            var context = SubscriptionPurchaseV2.CanceledStateContext()
            switch cancellation {
            case "userInitiatedCancellation": context.userInitiatedCancellation = .init(cancelTime: nil)
            case "systemInitiatedCancellation": context.systemInitiatedCancellation = .init()
            case "developerInitiatedCancellation": context.developerInitiatedCancellation = .init()
            default: context.replacementCancellation = .init()
            }
            resource.canceledStateContext = context
        }
        if purchase.test { resource.testPurchase = .init() }
        resource.lineItems = [
            .init(
                productId: purchase.productId,
                expiryTime: purchase.subscriptionState == SubscriptionState.pending
                    ? nil : GoogleTime.format(purchase.expiry),
                latestSuccessfulOrderId: purchase.orders.last,
                autoRenewingPlan: .init(
                    autoRenewEnabled: purchase.autoRenew,
                    recurringPrice: GoogleMoney(currencyCode: purchase.currency, milliunits: purchase.priceMilli)),
                offerDetails: .init(basePlanId: "base"))
        ]
        resource.etag =
            "etag-\(purchase.orders.count)-\(purchase.subscriptionState.count)-\(Int64(purchase.expiry.timeIntervalSince1970))"
        return resource
    }

    /// `voidedpurchases.list`: the last 30 days from `startTime`, `maxResults` a page, paged by
    /// an opaque token.
    public func voidedPurchases(startTime: Date?, pageToken: String?, maxResults: Int) throws(Refusal)
        -> VoidedPurchasesListResponse
    {
        let now = clock.now()
        let oldest = now.addingTimeInterval(-30 * 86_400)
        let start: Date
        var offset = 0
        if let pageToken {
            guard let data = Data(base64URL: pageToken), let text = String(data: data, encoding: .utf8),
                let parts = Optional(text.split(separator: "|")), parts.count == 2, let ms = Int64(parts[0]),
                let index = Int(parts[1])
            else { throw .invalid("invalid page token") }
            start = Date(timeIntervalSince1970: Double(ms) / 1000)
            offset = index
        } else {
            start = startTime ?? oldest
            guard start >= oldest.addingTimeInterval(-60) else {
                throw .invalid("startTime must be within the last 30 days")
            }
        }
        let size = max(1, min(maxResults, 1000))
        let matching = voided.filter { $0.recordedAt >= start }.map(\.purchase)
        let page = Array(matching.dropFirst(offset).prefix(size))
        let next =
            offset + page.count < matching.count
            ? Data("\(Int64(start.timeIntervalSince1970 * 1000))|\(offset + page.count)".utf8).base64URLEncodedString()
            : nil
        return VoidedPurchasesListResponse(
            pageInfo: .init(totalResults: matching.count, resultPerPage: size, startIndex: offset),
            tokenPagination: next.map { .init(nextPageToken: $0) }, voidedPurchases: page)
    }
}
