import AppStoreModels
import Foundation
import Hummingbird
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// A decimal given as a JSON number or string ("9.99").
struct FlexibleDecimal: Decodable, Hashable {
    var value: Decimal

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let text = try? container.decode(String.self) {
            // Digits, at most one point: "1.2.3", "1e3", "-1" or " 1" are not amounts.
            let parts = text.split(separator: ".", omittingEmptySubsequences: false)
            guard text.count <= 24, (1...2).contains(parts.count),
                parts.allSatisfy({ !$0.isEmpty && $0.allSatisfy { $0.isASCII && $0.isNumber } }),
                let value = Decimal(string: text, locale: Locale(identifier: "en_US_POSIX"))
            else { throw DecodingError.dataCorruptedError(in: container, debugDescription: "not a decimal") }
            self.value = value
        } else {
            value = try container.decode(Decimal.self)
        }
    }

    /// Milliunits, rounded half-up; nil when negative or beyond 10^12 units.
    var milliunits: Int64? {
        guard value >= 0, value <= 1_000_000_000_000 else { return nil }
        var scaled = value * 1000
        var rounded = Decimal()
        NSDecimalRound(&rounded, &scaled, 0, .plain)
        return Int64(truncating: rounded as NSDecimalNumber)
    }
}

/// An instant given as an ISO 8601 string ("2026-12-24T10:00:00Z") or milliseconds since 1970.
struct FlexibleInstant: Decodable, Hashable {
    var milliseconds: Int64

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let text = try? container.decode(String.self) {
            guard text.unicodeScalars.count <= 40, let date = StoreKeeperApp.parseDate(text) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "not an ISO 8601 instant")
            }
            milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        } else {
            milliseconds = try container.decode(Int64.self)
        }
    }
}

extension StoreKeeperApp.PurchaseBody {
    func validateWeb() throws {
        guard orderId == nil, signedTransaction == nil, signedTransactions == nil, receipt == nil, transactionId == nil
        else {
            throw APIError.badRequest(
                "a web purchase takes productId, paymentId, price, currency, not an App Store proof")
        }
        for (name, value, limit) in [("paymentId", paymentId, 200), ("productId", productId, 255)] {
            guard let value, !value.isEmpty, value.count <= limit else {
                throw APIError.badRequest("field '\(name)' is required (1…\(limit) characters)")
            }
            try StoreKeeperApp.validateText(value, field: name)
        }
        guard let price, price.milliunits != nil else {
            throw APIError.badRequest("field 'price' is required: the amount paid, tax included, ≥ 0 (e.g. 9.99)")
        }
        guard let currency, currency.count == 3, currency.allSatisfy({ $0.isASCII && $0.isUppercase }) else {
            throw APIError.badRequest("field 'currency' must be an ISO 4217 code (e.g. EUR)")
        }
        guard (1...1000).contains(quantity ?? 1) else { throw APIError.badRequest("field 'quantity' must be 1…1000") }
        if let taxAmount {
            guard let tax = taxAmount.milliunits, let paid = price.milliunits, tax <= paid else {
                throw APIError.badRequest("field 'taxAmount' must be 0…price")
            }
        }
        if let taxCountry {
            guard taxCountry.count == 3, taxCountry.allSatisfy({ $0.isASCII && $0.isUppercase }) else {
                throw APIError.badRequest("field 'taxCountry' must be an ISO 3166-1 alpha-3 code (e.g. DEU)")
            }
        }
        if let original = originalPaymentId {
            guard !original.isEmpty, original.unicodeScalars.count <= 200 else {
                throw APIError.badRequest("field 'originalPaymentId' must be 1…200 characters")
            }
            try StoreKeeperApp.validateText(original, field: "originalPaymentId")
        }
        if let token = externalPurchaseToken {
            guard !token.isEmpty, token.unicodeScalars.count <= 128 else {
                throw APIError.badRequest("field 'externalPurchaseToken' must be 1…128 characters")
            }
            try StoreKeeperApp.validateText(token, field: "externalPurchaseToken")
        }
    }
}

extension PurchasePipeline {
    /// `POST /v1/purchases` with `"store": "web"`: recorded (idempotent by `paymentId`), then
    /// delivered through the one delivery path as transaction `web:<paymentId>`.
    func submitWebPurchase(_ body: PurchaseBody) async throws -> Response {
        guard let productId = body.productId, let product = catalog.product(productId) else {
            throw APIError(
                .unprocessableContent, "unknown_product", "product '\(body.productId ?? "")' is not in the catalog")
        }
        let external = ExternalPurchaseStore(database: database)
        let subscription = try await webSubscriptionPeriod(body, product: product, external: external)
        let payment = ExternalPurchaseStore.WebPayment(
            paymentId: body.paymentId ?? "", accountId: body.accountId, productId: productId,
            quantity: body.quantity ?? 1, amountMilli: body.price?.milliunits ?? 0,
            taxMilli: body.taxAmount?.milliunits ?? 0, currency: body.currency ?? "", taxCountry: body.taxCountry,
            externalPurchaseId: body.externalPurchaseToken, originalPaymentId: subscription?.original,
            expiresAt: subscription?.expiresAt)
        let purchasedAt: Date
        switch try await external.record(payment, reporting: configuration.externalPurchaseReporting, now: Date()) {
        case .recorded(let at): purchasedAt = at
        case .conflict:
            throw APIError(
                .conflict, "idempotency_conflict",
                "paymentId '\(payment.paymentId)' was recorded with another account, product, quantity, price or token")
        case .tokenOfAnotherAccount:
            throw APIError(
                .conflict, "token_of_another_account",
                "external purchase token '\(payment.externalPurchaseId ?? "")' belongs to another account")
        }
        let transaction = Self.webTransaction(payment, type: product.type, purchasedAt: purchasedAt)
        let delivered = try await deliverVerified(
            [transaction], accountId: body.accountId, orderId: nil, evidence: .device, reported: nil)
        if let refusal = delivered.refusals.first { throw APIError.refusal(refusal) }
        let results = delivered.results
        let nothingNew = !results.isEmpty && results.allSatisfy { $0.outcome == "already_delivered" }
        return try Self.json(
            PurchaseJSON(
                status: nothingNew ? "already_delivered" : "delivered", transactions: results,
                account: try await account(body.accountId, state: delivered.account)))
    }

    /// A web subscription's period: auto-renewable products need `expiresAt` (in the future,
    /// at most 400 days ahead); a renewal or change of plan names the first payment
    /// (`originalPaymentId`: the same account's, an auto-renewable product of the same group).
    /// Other products take neither. Nil for a one-time product.
    func webSubscriptionPeriod(
        _ body: PurchaseBody, product: Product, external: ExternalPurchaseStore
    ) async throws -> (original: String?, expiresAt: Int64)? {
        guard product.type == .autoRenewable else {
            guard body.expiresAt == nil, body.originalPaymentId == nil else {
                throw APIError.badRequest(
                    "'expiresAt' and 'originalPaymentId' are for auto-renewable products; '\(product.id)' is not one")
            }
            return nil
        }
        guard (body.quantity ?? 1) == 1 else {
            throw APIError.badRequest("a subscription's payment has quantity 1")
        }
        let now = Date().webMilliseconds
        guard let expiresAt = body.expiresAt?.milliseconds, expiresAt > now, expiresAt <= now + 400 * 86_400_000
        else {
            throw APIError.badRequest(
                "field 'expiresAt' is required for auto-renewable products: the end of the paid period, in the future and at most 400 days ahead"
            )
        }
        guard let original = body.originalPaymentId, original != body.paymentId else { return (nil, expiresAt) }
        guard let first = try await external.payment(original), first.accountId == body.accountId,
            first.originalPaymentId == nil, first.expiresAt != nil,
            let firstProduct = catalog.product(first.productId), firstProduct.group == product.group
        else {
            throw APIError(
                .unprocessableContent, "invalid_original_payment",
                "originalPaymentId '\(original.prefix(200))' is not the first payment of this account's web subscription in the product's group"
            )
        }
        return (original, expiresAt)
    }

    /// What a web payment is to the delivery path: a transaction this server vouches for.
    static func webTransaction(_ payment: ExternalPurchaseStore.WebPayment, type: Product.Kind, purchasedAt: Date)
        -> StoreTransaction
    {
        StoreTransaction(
            store: .web, transactionId: payment.transactionId, originalTransactionId: payment.originalTransactionId,
            productId: payment.productId, purchaseDate: payment.purchasedAt ?? purchasedAt.webMilliseconds,
            expiresDate: payment.expiresAt, quantity: Int32(payment.quantity), kind: .init(type),
            ownership: .purchased, signedDate: purchasedAt.webMilliseconds,
            environment: (payment.externalPurchaseId ?? "").hasPrefix("SANDBOX") ? .sandbox : .production,
            currency: payment.currency, price: payment.amountMilli)
    }

    /// `POST /v1/purchases/web/{paymentId}/refund` (secret key): the provider refunded a web
    /// payment; reversed through the one refund path, its refund line item reported.
    func refundWebPurchase(_ paymentId: String) async throws -> Response {
        let external = ExternalPurchaseStore(database: database)
        guard
            let payment = try await external.markRefunded(
                paymentId, reporting: configuration.externalPurchaseReporting, now: Date())
        else { throw APIError(.notFound, "not_found", "no web payment '\(paymentId)'") }
        let transaction = Self.webTransaction(
            payment, type: catalog.product(payment.productId)?.type ?? .consumable, purchasedAt: Date())
        // The backend's word: the whole payment refunded.
        let id = transaction.transactionId ?? ""
        var refund = RefundEvent(
            kind: .refund, store: .web, key: "web-refund:\(paymentId)", transactionId: id,
            originalTransactionId: transaction.originalTransactionId, productId: transaction.productId,
            revocation: RefundPlanner.Revocation(type: .refundFull, percentage: nil))
        refund.environment = transaction.environment?.rawValue
        refund.revocationType = StoreTransaction.RevocationKind.refundFull.rawValue
        refund.purchasedAt = transaction.purchaseDate
        refund.periodEnd = transaction.expiresDate
        let settings = notificationSettings
        let outcome = try await notifications.applyRefund(refund, settings: settings, now: Date())
        return try Self.json(["paymentId": paymentId, "status": outcome.0, "detail": outcome.1])
    }
}

extension Date {
    fileprivate var webMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }
}
