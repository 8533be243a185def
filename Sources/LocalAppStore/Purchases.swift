import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// Customers and purchases: buying (with Ask to Buy), charging, issuing signed transactions.
extension LocalAppStore {
    // MARK: Customers

    @discardableResult
    public func customer(_ appleId: String, storefront: String = "USA") -> Customer {
        if let existing = customers[appleId] { return existing }
        let customer = Customer(
            appleId: appleId, storefront: storefront, deviceId: UUID(), appTransactionId: TransactionIds.next())
        customers[appleId] = customer
        return customer
    }

    public func setBillingFails(_ appleId: String, _ fails: Bool) {
        customer(appleId)
        customers[appleId]?.billingFails = fails
    }

    // MARK: Purchases

    /// A customer buys `items` in one payment (several items: a merged payment, one receipt
    /// holding them all). With `askToBuy` nothing is charged until `approve`.
    public func buy(
        _ appleId: String, items: [PurchaseItem], appAccountToken: UUID? = nil, askToBuy: Bool = false,
        offers: PurchaseOffers = .init()
    ) throws -> PurchaseResult {
        guard !items.isEmpty else { throw StoreError.invalid("a purchase needs at least one product") }
        for item in items {
            guard let product = configuration.catalog.product(item.productId) else {
                throw StoreError.unknownProduct(item.productId)
            }
            guard (1...10).contains(item.quantity) else { throw StoreError.invalid("quantity must be 1…10") }
            if product.type != .consumable && item.quantity != 1 {
                throw StoreError.invalid("only consumables can be bought in quantity")
            }
        }
        customer(appleId)
        var discount: Discount?
        if !offers.isEmpty {
            guard items.count == 1 else { throw StoreError.invalid("an offer applies to a purchase of one product") }
        }
        if items.count == 1, let product = configuration.catalog.product(items[0].productId) {
            discount = try self.discount(
                for: product, appleId: appleId, token: appAccountToken, offers: offers, at: clock.now())
        }
        if askToBuy {
            let id = UUID().uuidString.lowercased()
            pending[id] = PendingPurchase(
                id: id, appleId: appleId, items: items, appAccountToken: appAccountToken, discount: discount)
            return PurchaseResult(
                signedTransactions: [], transactions: [], receipt: try receipt(for: appleId), pendingId: id)
        }
        return try charge(appleId, items: items, appAccountToken: appAccountToken, discount: discount)
    }

    /// A parent approves an Ask to Buy request: now the purchase happens.
    public func approve(_ pendingId: String) throws -> PurchaseResult {
        guard let request = pending.removeValue(forKey: pendingId) else { throw StoreError.unknownPending(pendingId) }
        return try charge(
            request.appleId, items: request.items, appAccountToken: request.appAccountToken, discount: request.discount)
    }

    /// A parent declines: nothing is ever charged.
    public func decline(_ pendingId: String) throws {
        guard pending.removeValue(forKey: pendingId) != nil else { throw StoreError.unknownPending(pendingId) }
    }

    func charge(
        _ appleId: String, items: [PurchaseItem], appAccountToken: UUID?, discount: Discount? = nil
    ) throws -> PurchaseResult {
        let now = clock.now()
        var payloads: [JWSTransactionDecodedPayload] = []
        for item in items {
            let product = configuration.catalog.product(item.productId)!
            var payload = issue(product, quantity: item.quantity, appleId: appleId, token: appAccountToken, at: now)
            if let discount { apply(discount, to: &payload, product: product, appleId: appleId, at: now) }
            var commitment: Commitment?
            if item.billingPlan == BillingPlanType.monthly.rawValue {
                guard product.type == .autoRenewable, product.period?.years == 1 else {
                    throw StoreError.invalid(
                        "a monthly plan with a commitment is a billing plan of a 1-year subscription")
                }
                let yearly = payload.price ?? 0
                commitment = Commitment(
                    period: 1, expires: ISODuration(years: 1).added(to: now), monthlyPrice: yearly / 12)
                commit(&payload, commitment!, at: now)
            }
            if product.type == .autoRenewable {
                payload = try subscribe(product, payload: payload, appleId: appleId, at: now)
                if let commitment, let original = payload.originalTransactionId {
                    subscriptions[original]?.commitment = commitment
                }
            } else {
                store(payload, appleId: appleId, at: now)
                notify(.oneTimeCharge, subtype: nil, transaction: payload, at: now)
            }
            payloads.append(payload)
        }
        let orderId = Self.newOrderId()
        orders[orderId] = payloads.compactMap(\.transactionId)
        var result = PurchaseResult(
            signedTransactions: try payloads.map { try signer.sign(signed($0, at: now)) }, transactions: payloads,
            receipt: try receipt(for: appleId), pendingId: nil)
        result.orderId = orderId
        return result
    }

    /// An Order ID as Apple's receipt e-mails print them: ten capital letters and digits.
    static func newOrderId() -> String {
        let alphabet = Array("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789")
        var generator = SystemRandomNumberGenerator()
        return String((0..<10).map { _ in alphabet[Int(generator.next(upperBound: UInt32(alphabet.count)))] })
    }

    /// Look Up Order ID: the transactions an Order ID paid (nil: no such order).
    public func transactions(ofOrder orderId: String) -> [String]? { orders[orderId.uppercased()] }

    func issue(
        _ product: Product, quantity: Int32, appleId: String, token: UUID?, at now: Date,
        original: String? = nil, originalPurchase: Date? = nil, reason: TransactionReason = .purchase
    ) -> JWSTransactionDecodedPayload {
        let storefront = customers[appleId]?.storefront ?? "USA"
        let price = product.price(in: storefront)
        let purchase = TransactionIssuer.Purchase(
            bundleId: configuration.bundleId, productId: product.id, type: product.type.appleType, quantity: quantity,
            appAccountToken: token, environment: configuration.environment, storefront: storefront,
            currency: price.currency, unitPrice: price.milliunits, subscriptionGroupIdentifier: product.group)
        var payload = TransactionIssuer().transaction(for: purchase, at: now, id: TransactionIds.next())
        if let original { payload.originalTransactionId = original }
        if let originalPurchase { payload.originalPurchaseDate = originalPurchase.milliseconds }
        payload.transactionReason = reason
        payload.appTransactionId = customers[appleId]?.appTransactionId
        if product.type == .autoRenewable {
            payload.expiresDate = (product.period ?? ISODuration(months: 1)).added(to: now).milliseconds
        }
        return payload
    }

    func store(_ payload: JWSTransactionDecodedPayload, appleId: String, at now: Date) {
        let id = payload.transactionId!
        transactions[id] = StoredTransaction(payload: payload, appleId: appleId, modified: now)
        customers[appleId]?.transactionIds.append(id)
    }

    /// The app finished a transaction: consumables leave the device's receipt.
    public func finish(_ transactionId: String) throws {
        guard let stored = transactions[transactionId] else { throw StoreError.unknownTransaction(transactionId) }
        customers[stored.appleId]?.finished.insert(transactionId)
    }

    /// Whether the app (or the server, Finish Transaction) finished the transaction.
    public func isFinished(_ transactionId: String) -> Bool {
        guard let stored = transactions[transactionId] else { return false }
        return customers[stored.appleId]?.finished.contains(transactionId) == true
    }
}

extension LocalAppStore {
    /// One monthly period of a commitment: a month of service at the monthly price.
    func commit(_ payload: inout JWSTransactionDecodedPayload, _ commitment: Commitment, at start: Date) {
        payload.billingPlanType = .monthly
        payload.price = commitment.monthlyPrice
        payload.purchaseDate = start.milliseconds
        payload.expiresDate = ISODuration(months: 1).added(to: start).milliseconds
        payload.commitmentInfo = TransactionCommitmentInfo(
            billingPeriodNumber: Int32(commitment.period), totalBillingPeriods: Int32(commitment.periods),
            commitmentExpiresDate: commitment.expires.milliseconds,
            commitmentPrice: commitment.monthlyPrice * Int64(commitment.periods))
    }
}
