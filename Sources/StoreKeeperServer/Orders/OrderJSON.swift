import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of API.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct OrderJSON: Encodable {
    var orderId: String
    var appAccountToken: String
    var accountId: String
    var productId: String
    var quantity: Int
    var status: String
    var createdAt: String
    var transactionId: String?
    var deliveredAt: String?

    init(_ order: Order) {
        orderId = order.orderId
        appAccountToken = order.appAccountToken.uuidString.lowercased()
        accountId = order.accountId
        productId = order.productId
        quantity = order.quantity
        status = order.status.rawValue
        createdAt = StoreKeeperApp.iso(order.createdAt)
        transactionId = order.transactionId
        deliveredAt = order.deliveredAt.map(StoreKeeperApp.iso)
    }
}
