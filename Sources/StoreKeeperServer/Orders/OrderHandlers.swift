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

/// Orders before payment: `POST /v1/orders`, `GET /v1/orders/{orderId}`.
extension StoreKeeperApp {
    struct CreateOrderBody: Decodable {
        var accountId: String
        var productId: String
        var quantity: Int?
    }

    func createOrder(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let body = try await decode(CreateOrderBody.self, request)
        try Self.validateAccountId(body.accountId)
        try caller.require(body.accountId)
        let quantity = body.quantity ?? 1
        guard (1...10).contains(quantity) else { throw APIError.badRequest("field 'quantity' must be 1…10") }
        guard catalog.product(body.productId) != nil else {
            throw APIError(.notFound, "unknown_product", "no product '\(body.productId.prefix(100))' in the catalog")
        }
        let order: Order
        do {
            order = try await store.createOrder(
                accountId: body.accountId, productId: body.productId, quantity: quantity,
                maxOpen: configuration.maxOpenOrdersPerAccount, ttl: configuration.orderTTL, now: Date())
        } catch let error as PurchaseStore.TooManyOpenOrders {
            throw APIError(
                .conflict, "too_many_open_orders",
                "the account has \(error.limit) unpaid orders; pay or let them expire before creating more")
        }
        return try Self.json(OrderJSON(order), status: .created)
    }

    func getOrder(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let orderId = try Self.parameter(context, "orderId")
        guard let order = try await store.order(orderId) else {
            throw APIError.notFound("no order '\(orderId.prefix(64))'")
        }
        try caller.require(order.accountId)
        return try Self.json(OrderJSON(order))
    }
}

struct OrdersController {
    let app: StoreKeeperApp

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.post("orders") { request, context in try await app.createOrder(request, context) }
        v1.get("orders/:orderId") { request, context in try await app.getOrder(request, context) }
    }
}
