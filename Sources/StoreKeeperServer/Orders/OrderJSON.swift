import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of docs/api.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct OrderJSON: Encodable {
    var orderId: String
    var appAccountToken: String
    /// Nil for a Stripe checkout opened for a buyer without an account yet.
    var accountId: String?
    var productId: String
    var quantity: Int
    var status: String
    var createdAt: String
    /// When an unpaid order stops being open (`createdAt` + the order TTL): the device's intent
    /// for it ends then too. A payment that arrives later is still delivered.
    var expiresAt: String
    var transactionId: String?
    var deliveredAt: String?
    var offerId: String?
    var offerRedeemed: Bool?
    var appTransactionId: String?
    /// The app the order is for (when the deployment names apps).
    var appId: String?
    /// Only in the 201 answer: what StoreKit needs to apply the offer.
    var offer: SignedOffer?
    var introductoryOfferEligibility: IntroductoryEligibility?
    /// The win-back offer the order asked for, allowed by the catalog's policy (Apple applies
    /// it; nothing is signed).
    var winBackOffer: WinBackOfferJSON?
    /// A Stripe app's order: the Checkout Session it opened (`url`: the hosted page).
    var checkout: StripePayments.CheckoutJSON?
    /// A paid Stripe checkout for nobody: the code that binds it to an account.
    var redemptionCode: String?

    struct WinBackOfferJSON: Encodable {
        var id: String
    }

    struct SignedOffer: Encodable {
        var id: String
        var keyId: String
        var nonce: String
        var timestamp: Int64
        var signature: String
        var jws: String
    }

    struct IntroductoryEligibility: Encodable {
        var allowed: Bool
        var jws: String
    }

    init(_ order: Order, ttl: TimeInterval) {
        expiresAt = StoreKeeperApp.iso(order.createdAt.addingTimeInterval(ttl))
        offerId = order.offerId
        offerRedeemed = order.offerId == nil ? nil : order.offerRedeemed
        appTransactionId = order.appTransactionId
        appId = order.appId
        orderId = order.orderId
        appAccountToken = order.appAccountToken.uuidString.lowercased()
        accountId = order.accountId.isEmpty ? nil : order.accountId
        productId = order.productId
        quantity = order.quantity
        status = order.status.rawValue
        createdAt = StoreKeeperApp.iso(order.createdAt)
        transactionId = order.transactionId
        deliveredAt = order.deliveredAt.map(StoreKeeperApp.iso)
    }
}
