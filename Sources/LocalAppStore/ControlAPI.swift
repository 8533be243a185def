import AppStoreModels
import Foundation
import Hummingbird
import NIOCore

/// The control API: what a test (or the demo) does as the customer, the parent, Apple's
/// billing or Apple's refund desk, plus the clock and faults. JSON in, JSON out.
extension LocalAppStoreServer {
    struct PurchaseBody: Codable {
        var appleId: String
        var storefront: String?
        var items: [LocalAppStore.PurchaseItem]?
        var productId: String?
        var quantity: Int32?
        var appAccountToken: UUID?
        var askToBuy: Bool?
        /// A promotional offer: V1 (`id`, `keyId`, `nonce`, `timestamp`, `signature`) or V2 (`id`, `jws`).
        var offer: LocalAppStore.OfferRequest?
        /// An introductory-offer eligibility JWS.
        var introductoryOfferEligibility: String?
        var winBackOfferId: String?
        /// `MONTHLY`: a 1-year subscription billed monthly with a 12-month commitment.
        var billingPlan: String?
        /// An offer code redeemed in the App Store (no token): `{"code", "price"?}`.
        var offerCode: OfferCodeBody?
    }

    struct OfferCodeBody: Codable {
        var code: String
        var price: Decimal?
    }

    struct PurchaseReply: Codable {
        var signedTransactions: [String]
        var transactions: [JWSTransactionDecodedPayload]
        var receipt: String
        var pendingId: String?
        /// Apple's Order ID of the charge (the customer's receipt e-mail): Look Up Order ID takes it.
        var orderId: String?
    }

    struct Refund: Codable { var percentage: Int32? }
    struct Change: Codable { var productId: String }
    struct Billing: Codable { var fails: Bool }
    struct CancelFlow: Codable { var locale: String? }
    struct Advance: Codable { var seconds: Double }
    struct NotificationItem: Codable {
        var notificationUUID: String?
        var notificationType: String?
        var subtype: String?
        var signedPayload: String
        var sendAttempts: [SendAttemptItem]
    }

    struct ControlError: Codable {
        struct Body: Codable {
            var code: String
            var message: String
        }
        var error: Body
    }

    func addControl<Context: RequestContext>(to router: some RouterMethods<Context>) {
        let control = router.group("control")
        control.post("purchases") { request, context in
            try await self.control {
                let body = try await request.decode(as: PurchaseBody.self, context: context)
                let items =
                    body.items ?? body.productId.map {
                        [
                            LocalAppStore.PurchaseItem(
                                productId: $0, quantity: body.quantity ?? 1, billingPlan: body.billingPlan)
                        ]
                    }
                    ?? []
                // One payment carries a handful of products (merged payments), never thousands.
                guard items.count <= 20 else { throw LocalAppStore.StoreError.invalid("at most 20 items per purchase") }
                await self.store.customer(body.appleId, storefront: body.storefront ?? "USA")
                return Self.reply(
                    try await self.store.buy(
                        body.appleId, items: items, appAccountToken: body.appAccountToken,
                        askToBuy: body.askToBuy ?? false,
                        offers: .init(
                            promotional: body.offer, introductoryEligibilityJWS: body.introductoryOfferEligibility,
                            winBackOfferId: body.winBackOfferId,
                            offerCode: body.offerCode.map { .init(code: $0.code, price: $0.price) })))
            }
        }
        control.post("pending/:id/approve") { _, context in
            try await self.control { Self.reply(try await self.store.approve(context.parameters.get("id") ?? "")) }
        }
        control.post("pending/:id/decline") { _, context in
            try await self.control {
                try await self.store.decline(context.parameters.get("id") ?? "")
                return Response(status: .noContent)
            }
        }
        control.post("transactions/:id/:action") { request, context in
            try await self.control {
                let id = context.parameters.get("id") ?? ""
                switch context.parameters.get("action") ?? "" {
                case "finish": try await self.store.finish(id)
                case "refund":
                    let body = try? await request.decode(as: Refund.self, context: context)
                    try await self.store.refund(id, percentage: body?.percentage)
                case "request-refund": try await self.store.requestRefund(id)
                case "decline-refund": try await self.store.declineRefund(id)
                case "reverse-refund": try await self.store.reverseRefund(id)
                case "revoke": try await self.store.revokeFamilySharing(id)
                default:
                    throw LocalAppStore.StoreError.unknownTransaction("\(id)/\(context.parameters.get("action") ?? "")")
                }
                return Self.json(["transactionId": id, "signedTransaction": try await self.store.signTransaction(id)])
            }
        }
        control.post("subscriptions/:id/:action") { request, context in
            try await self.control {
                let id = context.parameters.get("id") ?? ""
                switch context.parameters.get("action") ?? "" {
                case "cancel-flow":
                    // The customer taps Cancel: Apple asks the realtime URL (700 ms), else the default.
                    let body = try? await request.decode(as: CancelFlow.self, context: context)
                    return Self.json(
                        try await self.retentionCaller.cancelFlow(id, locale: body?.locale ?? "en-US"))
                case "cancel": try await self.store.setAutoRenew(id, false)
                case "resume": try await self.store.setAutoRenew(id, true)
                case "change":
                    let body = try await request.decode(as: Change.self, context: context)
                    try await self.store.changeProduct(id, to: body.productId)
                default:
                    throw LocalAppStore.StoreError.unknownSubscription(
                        "\(id)/\(context.parameters.get("action") ?? "")")
                }
                return Self.json([
                    "originalTransactionId": id, "signedRenewalInfo": try await self.store.signRenewalInfo(id),
                ])
            }
        }
        control.post("customers/:appleId/billing") { request, context in
            try await self.control {
                let body = try await request.decode(as: Billing.self, context: context)
                await self.store.setBillingFails(context.parameters.get("appleId") ?? "", body.fails)
                return Response(status: .noContent)
            }
        }
        control.post("customers/:appleId/rescind-consent") { _, context in
            try await self.control {
                try await self.store.rescindConsent(context.parameters.get("appleId") ?? "")
                return Response(status: .noContent)
            }
        }
        control.get("customers/:appleId/app-transaction") { _, context in
            try await self.control {
                guard let signed = try await self.store.signAppTransaction(for: context.parameters.get("appleId") ?? "")
                else { throw LocalAppStore.StoreError.invalid("unknown customer") }
                return Self.json(["signedAppTransactionInfo": signed])
            }
        }
        control.post("external-tokens") { request, context in
            try await self.control {
                let body = try? await request.decode(as: ExternalTokenBody.self, context: context)
                let id = await self.store.issueExternalPurchaseToken(tokenType: body?.tokenType)
                return Self.json(["externalPurchaseId": id])
            }
        }
        control.post("external-tokens/:id/notify") { request, context in
            try await self.control {
                let body = try await request.decode(as: ExternalTokenBody.self, context: context)
                try await self.store.notifyExternalPurchaseToken(
                    context.parameters.get("id") ?? "",
                    subtype: NotificationSubtype(rawValue: body.subtype ?? "UNREPORTED"))
                return Response(status: .noContent)
            }
        }
        control.get("customers/:appleId/receipt") { _, context in
            try await self.control {
                let receipt = try await self.store.receipt(for: context.parameters.get("appleId") ?? "")
                return Self.json(["receipt": Data(receipt).base64EncodedString()])
            }
        }
        control.get("customers/:appleId/purchases") { _, context in
            Self.json(await self.store.paidRecord(for: context.parameters.get("appleId") ?? ""))
        }
        control.get("catalog") { _, _ in
            Self.json(["products": self.store.configuration.catalog.products])
        }
        control.get("clock") { _, _ in
            Self.json(["now": self.store.clock.now().milliseconds])
        }
        control.post("clock/advance") { request, context in
            try await self.control {
                let body = try await request.decode(as: Advance.self, context: context)
                guard body.seconds >= 0, body.seconds <= 10 * 365 * 86_400 else {
                    throw LocalAppStore.StoreError.invalid("seconds must be 0…315360000")
                }
                await self.store.advance(by: body.seconds)
                return Self.json(["now": self.store.clock.now().milliseconds])
            }
        }
        control.put("faults") { request, context in
            try await self.control {
                let faults = try await request.decode(as: Faults.self, context: context)
                await self.store.setFaults(faults)
                return Self.json(faults)
            }
        }
        control.delete("faults") { _, _ in
            await self.store.setFaults(Faults())
            return Response(status: .noContent)
        }
        control.get("notifications") { _, _ in
            return Self.json(
                await self.store.notifications.map {
                    NotificationItem(
                        notificationUUID: $0.payload.notificationUUID,
                        notificationType: $0.payload.notificationType?.rawValue,
                        subtype: $0.payload.subtype?.rawValue, signedPayload: $0.signedPayload,
                        sendAttempts: $0.attempts)
                })
        }
        control.get("root-certificate") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/x-pem-file"],
                body: .init(byteBuffer: ByteBuffer(string: try PKIStore.rootsPEM(self.store.pki))))
        }
    }

    static func reply(_ result: LocalAppStore.PurchaseResult) -> Response {
        json(
            PurchaseReply(
                signedTransactions: result.signedTransactions, transactions: result.transactions,
                receipt: Data(result.receipt).base64EncodedString(), pendingId: result.pendingId,
                orderId: result.orderId))
    }

    /// Store errors become 404/400 with a code; malformed bodies 400.
    func control(_ body: () async throws -> Response) async throws -> Response {
        do {
            return try await body()
        } catch let error as LocalAppStore.StoreError {
            let (status, code): (HTTPResponse.Status, String) =
                switch error {
                case .unknownProduct: (.notFound, "unknown_product")
                case .unknownTransaction, .unknownSubscription, .unknownPending: (.notFound, "not_found")
                case .invalid: (.badRequest, "bad_request")
                }
            return Self.json(ControlError(error: .init(code: code, message: error.description)), status: status)
        } catch let refusal as LocalAppStore.OfferRefusal {
            // StoreKit's error name, as the app would see it.
            return Self.json(
                ControlError(error: .init(code: refusal.code, message: refusal.message)), status: .badRequest)
        } catch let error as DecodingError {
            // The field at fault, not the decoder's internals.
            let field: String
            switch error {
            case .keyNotFound(let key, let context):
                field = (context.codingPath + [key]).map(\.stringValue).joined(separator: ".")
            case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
                field = context.codingPath.map(\.stringValue).joined(separator: ".")
            @unknown default: field = ""
            }
            let message = field.isEmpty ? "malformed body" : "malformed body: field '\(field.prefix(100))'"
            return Self.json(ControlError(error: .init(code: "bad_request", message: message)), status: .badRequest)
        } catch let error as HTTPError where error.status == .badRequest || error.status == .contentTooLarge {
            return Self.json(
                ControlError(error: .init(code: "bad_request", message: "malformed body")), status: error.status)
        }
    }
}

/// `POST /control/external-tokens` and `…/:id/notify`.
struct ExternalTokenBody: Decodable {
    var tokenType: String?
    var subtype: String?
}
