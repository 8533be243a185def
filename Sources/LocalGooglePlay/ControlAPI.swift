import Foundation
import GooglePlay
import Hummingbird
import NIOCore

/// The local Google Play's control API (docs/local-google-play.md): what a customer or Google
/// does — buy, pay a pending purchase, cancel, restart, fail billing, pause, upgrade, refund,
/// dispute — and the clock.
extension LocalGooglePlayServer {
    struct BuyBody: Decodable {
        var productId: String
        var obfuscatedAccountId: String?
        var quantity: Int?
        var pending: Bool?
        /// An upgrade, downgrade or re-signup replacing this subscription token.
        var linkedPurchaseToken: String?
        /// The buyer's country, ISO 3166-1 alpha-2 (default `US`): the catalog's price of its
        /// storefront is charged.
        var regionCode: String?
    }

    struct TokenBody: Decodable {
        var purchaseToken: String
        var quantity: Int?
        var paid: Bool?
        var fails: Bool?
        var seconds: Double?
    }

    struct AdvanceBody: Decodable { var seconds: Double }
    struct ExternalListing: Encodable { var externalTransactions: [ExternalTransaction] }
    struct FaultsBody: Decodable {
        var failAPICalls: Int?
        var failAcknowledgements: Int?
        var outage: Bool?
    }

    struct Row: Encodable {
        var purchaseToken: String
        var productId: String
        var state: String
        var acknowledged: Bool
        var consumed: Bool
        var voided: Bool
        var obfuscatedAccountId: String?
        var orders: [String]
    }

    public func addControl<Context: RequestContext>(to control: some RouterMethods<Context>) {
        control.post("purchases") { request, context in
            guard let body = try? await request.decode(as: BuyBody.self, context: context) else {
                return Self.googleError(400, "invalidValue", "productId is required")
            }
            do {
                let token = try await self.store.buy(
                    body.productId, obfuscatedAccountId: body.obfuscatedAccountId, quantity: body.quantity ?? 1,
                    pending: body.pending ?? false, linkedPurchaseToken: body.linkedPurchaseToken,
                    regionCode: body.regionCode ?? "US")
                let purchase = await self.store.purchase(token)
                return Self.json([
                    "purchaseToken": token, "orderId": purchase?.orders.last ?? "",
                    "productId": body.productId, "packageName": self.store.configuration.packageName,
                ])
            } catch {
                return Self.refusal(error)
            }
        }
        for action in ["complete", "cancel", "restart", "billing", "pause", "refund", "review", "resubscribe"] {
            control.post("purchases/\(action)") { request, context in
                guard let body = try? await request.decode(as: TokenBody.self, context: context) else {
                    return Self.googleError(400, "invalidValue", "purchaseToken is required")
                }
                do {
                    var answer = ["purchaseToken": body.purchaseToken]
                    switch action {
                    case "complete": try await self.store.completePending(body.purchaseToken, paid: body.paid ?? true)
                    case "cancel": try await self.store.cancel(body.purchaseToken)
                    case "restart": try await self.store.restart(body.purchaseToken)
                    case "billing": try await self.store.setBillingFails(body.purchaseToken, body.fails ?? true)
                    case "pause": try await self.store.pause(body.purchaseToken, for: body.seconds ?? 30 * 86_400)
                    case "refund": try await self.store.refund(body.purchaseToken, quantity: body.quantity)
                    case "resubscribe":
                        answer["newPurchaseToken"] = try await self.store.resubscribeInPlayStore(body.purchaseToken)
                    default: answer["pendingRefundToken"] = try await self.store.requestRefundReview(body.purchaseToken)
                    }
                    return Self.json(answer)
                } catch {
                    return Self.refusal(error)
                }
            }
        }
        control.post("advance") { request, context in
            guard let body = try? await request.decode(as: AdvanceBody.self, context: context), body.seconds > 0,
                body.seconds <= 400 * 86_400
            else { return Self.googleError(400, "invalidValue", "seconds must be 0…400 days") }
            await self.store.advance(by: body.seconds)
            return Self.json(["now": GoogleTime.format(self.store.clock.now())])
        }
        control.post("faults") { request, context in
            guard let body = try? await request.decode(as: FaultsBody.self, context: context),
                (0...1_000_000).contains(body.failAPICalls ?? 0),
                (0...1_000_000).contains(body.failAcknowledgements ?? 0)
            else {
                return Self.googleError(400, "invalidValue", "failAPICalls and failAcknowledgements are 0…1000000")
            }
            if let count = body.failAPICalls { self.store.failNextAPICalls(count) }
            if let count = body.failAcknowledgements { self.store.failNextAcknowledgements(count) }
            if let outage = body.outage { self.store.setOutage(outage) }
            return Self.json(["outage": String(self.store.outage)])
        }
        // The token Play Billing gives the app before it links out (external content links).
        control.post("external-transaction-tokens") { _, _ in
            Self.json(["externalTransactionToken": await self.store.issueExternalTransactionToken()])
        }
        control.get("external-transactions") { _, _ in
            Self.json(ExternalListing(externalTransactions: await self.store.externalTransactions()))
        }
        control.post("test-notification") { _, _ in
            await self.store.sendTestNotification()
            return Self.json(["sent": "true"])
        }
        control.get("purchases") { _, _ in
            let rows = await self.store.allPurchases().map {
                Row(
                    purchaseToken: $0.token, productId: $0.productId,
                    state: $0.kind == .subscription ? $0.subscriptionState : $0.purchaseState,
                    acknowledged: $0.acknowledged, consumed: $0.consumed, voided: $0.voided,
                    obfuscatedAccountId: $0.obfuscatedAccountId, orders: $0.orders)
            }
            return Self.json(["purchases": rows])
        }
    }
}
