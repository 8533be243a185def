import Foundation
import StoreKeeperCatalog

/// Decides what a verified transaction delivers, to whom, and what else must be recorded —
/// a pure function. The caller loads the `Context` and commits the `Plan` (order update,
/// grants, ledger entries, ownership binding, anomalies, outbox, audit) in one database
/// transaction, so a delivery happens entirely or not at all (docs/architecture.md invariant 1).
public enum DeliveryPlanner {
    /// What storage knows that bears on one transaction.
    public struct Context: Sendable {
        /// The verified transaction (never the client's claims).
        public var transaction: StoreTransaction
        /// The account submitting it; nil when it comes from Apple (notification, job).
        public var submittingAccount: String?
        /// The order whose appAccountToken the transaction carries.
        public var orderByToken: Order?
        /// The order the client named (`orderId` in the request).
        public var requestedOrder: Order?
        /// The oldest open order of the submitting account for the transaction's product.
        public var oldestOpenOrder: Order?
        /// The delivery already recorded for this transactionId, if any.
        public var existingDelivery: Delivery?
        /// The account this originalTransactionId is bound to, if any.
        public var boundAccount: String?
        /// For non-renewing subscriptions: the account's current access end for the entitlement.
        public var currentEntitlementExpiry: Date?
        public var catalog: Catalog
        public var policy: OwnershipPolicy
        /// What the submission proves about who paid.
        public var evidence: Evidence
        /// The store the transaction comes from (its adapter says so).
        public var store: Store = .appStore
        /// The deployment's app the transaction is of (its bundle id), when configured.
        public var transactionAppId: String? = nil
        /// The store refunded this transaction before anyone claimed it (recorded by the one
        /// refund path): whole, it is never delivered; partial, it is delivered and the same
        /// refund applied to it in the same database transaction.
        public var refundedBeforeDelivery: RefundPlanner.Revocation? = nil
        /// The deployment's apps now: an order of an app no longer configured (a renamed
        /// bundle id) is not compared.
        public var configuredAppIds: Set<String> = []
        /// The environments the deployment accepts payments from (`Production`, `Sandbox`);
        /// nil: any. One policy for every store (a Stripe test-mode payment, a Google license
        /// tester's, an App Store Sandbox purchase are each `Sandbox`).
        public var acceptedEnvironments: Set<String>? = nil

        public init(
            transaction: StoreTransaction, submittingAccount: String?, orderByToken: Order? = nil,
            requestedOrder: Order? = nil, oldestOpenOrder: Order? = nil, existingDelivery: Delivery? = nil,
            boundAccount: String? = nil, currentEntitlementExpiry: Date? = nil, catalog: Catalog,
            policy: OwnershipPolicy = .firstBinder, evidence: Evidence = .device
        ) {
            self.evidence = evidence
            self.transaction = transaction
            self.submittingAccount = submittingAccount
            self.orderByToken = orderByToken
            self.requestedOrder = requestedOrder
            self.oldestOpenOrder = oldestOpenOrder
            self.existingDelivery = existingDelivery
            self.boundAccount = boundAccount
            self.currentEntitlementExpiry = currentEntitlementExpiry
            self.catalog = catalog
            self.policy = policy
        }
    }

    /// What a submission proves about who paid.
    public enum Evidence: Hashable, Sendable {
        /// A signed transaction or receipt from the device (or from Apple): holding it is the proof.
        case device
        /// A bare `transactionId`, looked up at Apple: anyone can send one, so it proves nothing
        /// about who paid. It delivers only to the submitter whose order token it carries, or who
        /// already owns its `originalTransactionId`.
        case lookup
        /// Another entry of an app receipt sent to report one transaction (`receipt` +
        /// `transactionId`): the device reports each of its transactions on its own, for its
        /// own account — on a device several app accounts share, the receipt holds the others'
        /// unfinished ones too, and nothing in a receipt says whose they are. Left alone (no
        /// delivery, no anomaly) unless already delivered to the submitter; a receipt sent
        /// without `transactionId` (a restore) delivers every entry as before.
        case receiptCompanion
    }

    /// A recorded delivery: what a repeated submission answers with.
    public struct Delivery: Hashable, Sendable {
        public var transactionId: String
        public var accountId: String
        public var orderId: String?
        public var productId: String
        public var quantity: Int
        /// Apple's refund of it was applied (the refund path took back what it gave).
        public var refunded = false

        public init(
            transactionId: String, accountId: String, orderId: String?, productId: String, quantity: Int,
            refunded: Bool = false
        ) {
            self.transactionId = transactionId
            self.accountId = accountId
            self.orderId = orderId
            self.productId = productId
            self.quantity = quantity
            self.refunded = refunded
        }
    }

    /// The per-transaction outcome of docs/api.md.
    public enum Outcome: String, Hashable, Sendable {
        case delivered
        case alreadyDelivered = "already_delivered"
        case unattributed
        case refunded
        case notDelivered = "not_delivered"
    }

    /// Why nothing may be delivered; each maps to an API error code.
    public enum Refusal: Hashable, Sendable {
        /// The transaction is refunded or revoked (`revoked`).
        case revoked
        /// Bound to another account under the first-binder policy (`owned_by_other_account`).
        case ownedByOtherAccount(owner: String)
        /// The order named in the request belongs to someone else (`forbidden`).
        case orderOfAnotherAccount
        /// The order the payment carries or names was created for another app
        /// (`order_of_another_app`).
        case orderOfAnotherApp(order: String, transaction: String)
        /// A payment of an environment the deployment does not accept (`wrong_environment`).
        case wrongEnvironment(String)

        /// The API's error code for it.
        public var code: String {
            switch self {
            case .revoked: "revoked"
            case .ownedByOtherAccount: "owned_by_other_account"
            case .orderOfAnotherAccount: "forbidden"
            case .orderOfAnotherApp: "order_of_another_app"
            case .wrongEnvironment: "wrong_environment"
            }
        }
    }

    public struct Plan: Hashable, Sendable {
        public var outcome: Outcome
        public var refusal: Refusal?
        /// Who receives the grants.
        public var accountId: String?
        /// The order to save (delivered), if the transaction paid one.
        public var order: Order?
        public var grants: [Grant] = []
        public var ledger: [LedgerEntry] = []
        /// Bind (or re-bind, under transfer) the originalTransactionId to this account.
        public var binding: String?
        public var anomalies: [AnomalyDraft] = []
        /// The delivery to record, keyed by transactionId.
        public var delivery: Delivery?

        /// Nothing planned (a store's purchase recorded, not paid or replaced).
        public static let notPlanned = Plan(outcome: .notDelivered, accountId: nil)
    }

    /// The FIFO rule for a payment that names no order (its token matches none, no order id
    /// was sent): the submitting account's oldest unpaid order for the product — created or
    /// pending, never a cancelled one (those take only payments that name them). Storage
    /// hands over the candidates it read; the choice is made here, once.
    public static func oldestOpenOrder(
        of account: String, product: String?, among orders: some Sequence<Order>
    ) -> Order? {
        orders.filter {
            Identifiers.same($0.accountId, account) && $0.productId == product
                && ($0.status == .created || $0.status == .pending)
        }.min { ($0.createdAt, $0.orderId) < ($1.createdAt, $1.orderId) }
    }

    public static func plan(_ context: Context, now: Date) -> Plan {
        let transaction = context.transaction
        let transactionId = transaction.transactionId ?? ""
        let productId = transaction.productId ?? ""

        if context.evidence == .receiptCompanion {
            // Left for its own report unless it is already this submitter's.
            guard let existing = context.existingDelivery, let submitter = context.submittingAccount,
                Identifiers.same(submitter, existing.accountId), !transaction.isRevoked
            else { return Plan(outcome: .unattributed, accountId: nil) }
        }

        if let existing = context.existingDelivery {
            if transaction.isRevoked {
                // Apple revoked what was delivered: say so. Reversing the grant is the refund
                // path's (Apple's REFUND notification); until it has run, an operator sees it.
                if existing.refunded { return Plan(outcome: .refunded, accountId: existing.accountId) }
                return Plan(
                    outcome: .refunded, accountId: existing.accountId,
                    anomalies: [
                        AnomalyDraft(
                            kind: .refundedAfterDelivery, transactionId: transactionId, orderId: existing.orderId,
                            accountId: existing.accountId,
                            detail:
                                "transaction \(transactionId), delivered to \(Identifiers.quoted(existing.accountId)), was revoked by Apple"
                        )
                    ])
            }
            if let submitter = context.submittingAccount, !Identifiers.same(submitter, existing.accountId) {
                // Never "already delivered" to someone else, and never their order.
                return Plan(
                    outcome: .notDelivered, refusal: .ownedByOtherAccount(owner: existing.accountId), accountId: nil,
                    anomalies: [
                        AnomalyDraft(
                            kind: .ownershipConflict, transactionId: transactionId, orderId: nil, accountId: submitter,
                            detail:
                                "account \(Identifiers.quoted(submitter)) submitted transaction \(transactionId), already delivered to account \(Identifiers.quoted(existing.accountId))"
                        )
                    ])
            }
            return Plan(outcome: .alreadyDelivered, accountId: existing.accountId, order: nil, delivery: nil)
        }
        if let accepted = context.acceptedEnvironments, let environment = transaction.environment?.rawValue,
            !accepted.contains(environment)
        {
            // A payment of an environment this deployment does not take (test money on a
            // production server): never delivered, whatever the store.
            return Plan(outcome: .notDelivered, refusal: .wrongEnvironment(environment), accountId: nil)
        }
        if transaction.isRevoked {
            return Plan(outcome: .refunded, refusal: .revoked, accountId: nil)
        }
        if let refunded = context.refundedBeforeDelivery, !refunded.isPartial {
            // Refunded (or auto-refunded, or revoked) by the store before anyone claimed it.
            return Plan(outcome: .refunded, refusal: .revoked, accountId: nil)
        }
        if let requested = context.requestedOrder, let submitter = context.submittingAccount,
            !Identifiers.same(requested.accountId, submitter)
        {
            return Plan(outcome: .notDelivered, refusal: .orderOfAnotherAccount, accountId: nil)
        }
        guard let product = context.catalog.product(productId) else {
            // Paid for something the catalog does not know: keep it for an operator.
            return Plan(
                outcome: .notDelivered, accountId: context.submittingAccount,
                anomalies: [
                    AnomalyDraft(
                        kind: .unknownProduct, transactionId: transactionId, orderId: context.orderByToken?.orderId,
                        accountId: context.orderByToken?.accountId ?? context.submittingAccount,
                        detail: "verified transaction for product '\(productId)', which is not in the catalog")
                ])
        }

        // Attribution: the signed appAccountToken, then the order named in the request, then
        // the oldest open order of the account for the product.
        var candidate = context.orderByToken ?? context.requestedOrder ?? context.oldestOpenOrder
        // One app's payment never pays another app's order: the token's or the named order is
        // refused (an operator sees it), the oldest open order of another app is passed over.
        if let transactionApp = context.transactionAppId {
            func ofAnotherApp(_ order: Order?) -> String? {
                guard let app = order?.appId, app != transactionApp, context.configuredAppIds.contains(app) else {
                    return nil
                }
                return app
            }
            for order in [context.orderByToken, context.requestedOrder] {
                guard let order, let orderApp = ofAnotherApp(order) else { continue }
                return Plan(
                    outcome: .notDelivered,
                    refusal: .orderOfAnotherApp(order: orderApp, transaction: transactionApp), accountId: nil,
                    anomalies: [
                        AnomalyDraft(
                            kind: .appMismatch, transactionId: transactionId, orderId: order.orderId,
                            accountId: order.accountId,
                            detail:
                                "transaction \(transactionId) of app '\(transactionApp)' carries or names order \(order.orderId) of app '\(orderApp)'"
                        )
                    ])
            }
            if candidate != nil, ofAnotherApp(candidate) != nil { candidate = nil }
        }
        if context.evidence == .lookup {
            let submitter = context.submittingAccount
            let carriesSubmittersToken =
                submitter != nil && Identifiers.same(context.orderByToken?.accountId, submitter)
            let submitterOwnsIt = submitter != nil && Identifiers.same(context.boundAccount, submitter)
            guard carriesSubmittersToken || submitterOwnsIt else {
                return Plan(
                    outcome: .unattributed, accountId: nil,
                    anomalies: [
                        AnomalyDraft(
                            kind: .unattributedTransaction, transactionId: transactionId, orderId: nil, accountId: nil,
                            detail:
                                "transaction \(transactionId) ('\(productId)') was submitted by id by account \(submitter.map(Identifiers.quoted) ?? "-"), but carries no token of its orders and is not owned by it"
                        )
                    ])
            }
            if !carriesSubmittersToken { candidate = context.requestedOrder ?? context.oldestOpenOrder }
        }
        var anomalies: [AnomalyDraft] = []
        var paidOrder: Order?
        var recipient: String?
        if let order = candidate {
            recipient = order.accountId
            if order.productId == productId {
                // An order paid by another transaction is not paid twice; the money still goes
                // to its account (P11: an old transaction resurfacing under a new order).
                paidOrder = order.status.isOpen ? order : nil
            } else if order.status == .delivered || order.status == .refunded || order.status == .partiallyRefunded {
                // The token of an order paid long ago: an upgrade or crossgrade carries its
                // subscription's original token, a merged payment's other half rides on its
                // first one. Delivered to that account; nothing claims this order now.
            } else {
                // Deliver what was paid for; the order stays open (P12).
                anomalies.append(
                    AnomalyDraft(
                        kind: .productMismatch, transactionId: transactionId, orderId: order.orderId,
                        accountId: order.accountId,
                        detail:
                            "order \(order.orderId) is for '\(order.productId)' but the payment was for '\(productId)'")
                )
            }
        } else {
            recipient = context.submittingAccount
        }

        // Ownership of what lasts: the first account keeps it (or it transfers, by policy).
        var binding: String?
        if product.type != .consumable {
            if let owner = context.boundAccount {
                if recipient == nil || context.submittingAccount == nil {
                    // What arrives from Apple (a renewal, a notification) goes to the owner,
                    // never to whichever order or account its token points at now.
                    if !Identifiers.same(recipient, owner) { paidOrder = nil }
                    recipient = owner
                } else if !Identifiers.same(recipient, owner) {
                    switch context.policy {
                    case .firstBinder:
                        return Plan(
                            outcome: .notDelivered, refusal: .ownedByOtherAccount(owner: owner), accountId: nil,
                            anomalies: [
                                AnomalyDraft(
                                    kind: .ownershipConflict, transactionId: transactionId, orderId: candidate?.orderId,
                                    accountId: recipient,
                                    detail:
                                        "original transaction \(transaction.originalTransactionId ?? "") belongs to account \(Identifiers.quoted(owner))"
                                )
                            ])
                    case .transfer:
                        binding = recipient
                    }
                }
            } else if let recipient {
                binding = recipient
            }
        }

        guard let account = recipient else {
            // Nobody to give it to (a notification for a purchase no order or account knows).
            return Plan(
                outcome: .unattributed, accountId: nil,
                anomalies: anomalies + [
                    AnomalyDraft(
                        kind: .unattributedTransaction, transactionId: transactionId, orderId: nil, accountId: nil,
                        detail: "verified '\(productId)' payment with no order and no account")
                ])
        }

        let quantity = product.type == .consumable ? max(1, Int(transaction.quantity ?? 1)) : 1
        var grants: [Grant] = []
        var ledger: [LedgerEntry] = []
        if let currency = product.grants.currency, let amount = product.grants.amount {
            let (total, overflow) = amount.multipliedReportingOverflow(by: Int64(quantity))
            guard !overflow else {
                return Plan(
                    outcome: .notDelivered, accountId: nil,
                    anomalies: anomalies + [
                        AnomalyDraft(
                            kind: .grantOverflow, transactionId: transactionId, orderId: candidate?.orderId,
                            accountId: account,
                            detail: "\(quantity) × \(amount) \(currency) does not fit in a 64-bit amount")
                    ])
            }
            grants.append(.currency(code: currency, amount: total))
            ledger.append(
                LedgerEntry(
                    key: "purchase:\(transactionId):\(currency)", accountId: account, currency: currency, amount: total)
            )
        }
        if let entitlement = product.grants.entitlement {
            grants.append(
                .entitlement(
                    id: entitlement, expiresAt: expiry(of: product, transaction: transaction, context: context)))
        }

        var order = paidOrder
        if order != nil {
            order?.status = .delivered
            order?.transactionId = transactionId
            order?.deliveredAt = now
        }
        return Plan(
            outcome: .delivered, refusal: nil,
            accountId: account,
            order: order, grants: grants, ledger: ledger, binding: binding, anomalies: anomalies,
            delivery: Delivery(
                transactionId: transactionId, accountId: account, orderId: order?.orderId, productId: productId,
                quantity: quantity))
    }

    /// Access end of an entitlement: Apple's expiresDate for auto-renewables; for
    /// non-renewing subscriptions the server's own window, extended from whichever is later
    /// of now-held access and the purchase date.
    public static func expiry(of product: Product, transaction: StoreTransaction, context: Context) -> Date? {
        expiry(
            of: product, purchasedAt: transaction.purchaseDate, periodEnd: transaction.expiresDate,
            currentExpiry: context.currentEntitlementExpiry)
    }

    /// The same from the purchase's neutral facts (epoch ms).
    public static func expiry(of product: Product, purchasedAt: Int64?, periodEnd: Int64?, currentExpiry: Date?)
        -> Date?
    {
        switch product.type {
        case .autoRenewable:
            return periodEnd.map { Date(timeIntervalSince1970: Double($0) / 1000) }
        case .nonRenewing:
            let purchased = Date(timeIntervalSince1970: Double(purchasedAt ?? 0) / 1000)
            let start = max(purchased, currentExpiry ?? purchased)
            return (product.duration ?? ISODuration(days: 30)).added(to: start)
        case .consumable, .nonConsumable:
            return nil
        }
    }
}
