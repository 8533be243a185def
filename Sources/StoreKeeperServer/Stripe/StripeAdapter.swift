import Foundation
import GooglePlay
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Stripe
import Synchronization

/// A Stripe app at runtime: its configuration and API client.
public struct StripeApp: Sendable {
    public let configuration: StripeAppConfiguration
    public let client: StripeClient
    /// Billing portals opened, per account: a few a minute at most.
    let portalLimiter = SlidingWindowLimiter(limit: 5, window: 60)

    static func make(_ configuration: StripeAppConfiguration) throws -> StripeApp {
        StripeApp(
            configuration: configuration,
            client: StripeClient(
                secretKey: try ServerConfiguration.stripeSecretKey(configuration), apiVersion: configuration.apiVersion,
                baseURL: configuration.apiBaseURL))
    }
}

/// The metadata key that carries an order's token on the session, the payment intent and the
/// subscription (Stripe copies none of them from one to another).
let stripeTokenKey = "storekeeper_token"
/// Present on the objects of a checkout opened for nobody: its purchase waits for a redemption.
let stripeRedeemKey = "storekeeper_redeem"
/// The app (`apps[].id`) whose checkout made the objects: two apps sharing one Stripe account
/// receive each other's events; each payment is applied as the app that sold it.
let stripeAppKey = "storekeeper_app"
/// The stores' link-out tokens a checkout carries (Apple's external purchase token, Google Play's
/// external transaction token), on the same objects: every payment, renewal and refund of it is
/// reported to that store.
let stripeAppleTokenKey = "storekeeper_apple_token"
let stripeGoogleTokenKey = "storekeeper_google_token"

/// The link-out tokens an order gives its checkout.
struct StripeReportTokens: Sendable {
    var apple: String?
    var google: String?
}

/// What applying an event did; `recorded`: the event was recorded with its delivery.
struct StripeApplied: Sendable {
    var outcome: String
    var recorded = false

    init(_ outcome: String, recorded: Bool = false) {
        self.outcome = outcome
        self.recorded = recorded
    }
}

/// Stripe → the store-neutral core: what the adapter read of Stripe's objects, as
/// `StoreTransaction`s, subscription states and refunds. Stripe's types stop here.
enum StripeReading {
    /// Milliunits of `amount` in Stripe's smallest unit of `currency` (cents; whole yen).
    static func milliunits(_ amount: Int64?, currency: String?) -> Int64? {
        guard let amount, let currency else { return nil }
        let (value, overflow) = amount.multipliedReportingOverflow(by: StripeMoney.milliunitsPerUnit(currency))
        return overflow ? nil : value
    }

    /// The state a subscription's status gives access by (Stripe's `past_due`: billing retry).
    static func status(_ subscription: StripeSubscription) -> SubscriptionStatus? {
        switch subscription.status {
        case "active", "trialing": .active
        case "past_due", "unpaid": .billingRetry
        case "paused": .paused
        case "canceled", "incomplete_expired": .expired
        default: nil  // incomplete: never paid, nothing to change
        }
    }

    /// The proceeds of a charge, from its balance transaction's `net` and `currency` always, in
    /// milliunits of the price's currency (the unit every price and proceeds share here): its
    /// net when it settled in that currency; settled in another (a EUR charge paid out in USD),
    /// the price times the share Stripe's net keeps of its own gross (`net / amount`, both in the
    /// settlement currency) — Stripe's fee and conversion taken, never the gross. Nil until
    /// Stripe has a balance transaction.
    static func proceeds(_ charge: StripeCharge?, currency: String?, price: Int64?) -> Int64? {
        guard let balance = charge?.balanceTransaction?.object, let net = balance.net, let currency else { return nil }
        if balance.currency?.lowercased() == currency.lowercased() { return milliunits(net, currency: currency) }
        guard let gross = balance.amount, gross > 0, let price else { return nil }
        let kept = (Double(price) * Double(net) / Double(gross)).rounded(.down)
        return kept.isFinite ? Int64(kept) : nil
    }

    static func ms(_ seconds: Int64?) -> Int64? { seconds.map { $0 * 1000 } }

    /// Whether the subscription renews: not when cancelled at the period's end, nor with a
    /// `cancel_at` (a date the customer chose in the portal) at or before the period's end.
    static func renews(_ subscription: StripeSubscription) -> Bool {
        if subscription.cancelAtPeriodEnd == true { return false }
        if let cancelAt = subscription.cancelAt {
            guard let end = subscription.currentPeriodEnd else { return false }
            return cancelAt > end
        }
        return true
    }
}

extension StripePayments {
    /// The Stripe app `appId` names (or the only one), else 400 naming the problem.
    func stripeApp(_ appId: String?) throws -> StripeApp { try checkouts.app(appId) }

    static func stripeAPIError(_ error: StripeError) -> APIError {
        switch error.kind {
        case .notFound, .refused:
            APIError(.unprocessableContent, "stripe_refused", "Stripe refused: \(error.message.prefix(300))")
        case .unauthorized, .unavailable, .malformed:
            {
                var answer = APIError(
                    .serviceUnavailable, "stripe_unavailable",
                    "Stripe cannot be asked now (\(error.kind.rawValue)); try again", retryable: true)
                answer.headers[.retryAfter] = "30"
                return answer
            }()
        }
    }

    // MARK: Orders open a Checkout Session

    struct CheckoutJSON: Encodable {
        var sessionId: String
        var url: String?
        var expiresAt: String
    }

    // MARK: Events, applied by re-reading what they are about

    /// Applies one recorded event: the objects it names are read again from Stripe (events
    /// arrive twice, late and out of order; the API says what is true now). Returns what it did.
    /// `recording`: the webhook's event, not recorded yet — a delivery records it in its own
    /// database transaction (`recorded` true); otherwise the caller records it.
    func applyStripeEvent(_ event: StripeStore.Event, app: StripeApp, now: Date, recording: StripeStore.Event? = nil)
        async throws -> StripeApplied
    {
        guard let object = event.objectId else { return StripeApplied("no object: nothing to do") }
        switch event.type {
        case "checkout.session.completed", "checkout.session.async_payment_succeeded":
            return try await applyStripeSession(object, app: app, now: now, recording: recording)
        case "invoice.paid", "invoice.payment_succeeded":
            return try await applyStripeInvoice(object, app: app, now: now, recording: recording)
        default:
            return StripeApplied(try await applyStripeChange(event, object: object, app: app, now: now))
        }
    }

    /// What changes no delivery: failures, subscription states, refunds, disputes.
    func applyStripeChange(_ event: StripeStore.Event, object: String, app: StripeApp, now: Date) async throws
        -> String
    {
        switch event.type {
        case "checkout.session.async_payment_failed":
            return "the delayed payment failed: nothing delivered"
        case "checkout.session.expired":
            return "the session expired unpaid: nothing delivered"
        case "invoice.payment_failed":
            let invoice = try await app.client.invoice(object)
            guard let subscription = invoice.subscriptionId else { return "an invoice of no subscription" }
            return try await applyStripeSubscription(subscription, app: app, now: now)
        case let type where type.hasPrefix("customer.subscription."):
            return try await applyStripeSubscription(object, app: app, now: now)
        case "charge.refunded", "charge.refund.updated", "refund.created", "refund.updated", "refund.failed":
            let charge: String
            if event.type.hasPrefix("charge.refunded") {
                charge = object
            } else {
                guard let id = try await app.client.refund(object).charge?.id else { return "a refund of no charge" }
                charge = id
            }
            return try await applyStripeRefunds(charge: charge, app: app, now: now)
        case let type where type.hasPrefix("charge.dispute."):
            return try await applyStripeDispute(object, app: app, now: now)
        default:
            return "\(event.type): nothing to do"
        }
    }

    /// The transaction of a paid payment-mode session, or of a subscription's invoice.
    func applyStripeSession(_ id: String, app received: StripeApp, now: Date, recording: StripeStore.Event? = nil)
        async throws -> StripeApplied
    {
        let session = try await received.client.checkoutSession(id)
        let app = owningApp(session.metadata, received: received)
        guard session.isPaid else {
            return StripeApplied(
                "not paid yet (status \(session.status ?? "?"), payment_status \(session.paymentStatus ?? "?")): nothing delivered"
            )
        }
        if session.mode == "subscription" {
            var subscription = session.subscription?.object
            if subscription == nil, let id = session.subscription?.id {
                subscription = try await app.client.subscription(id)
            }
            guard let invoice = subscription?.latestInvoice?.id ?? session.invoice?.id else {
                return StripeApplied("a subscription session without an invoice yet")
            }
            return try await applyStripeInvoice(invoice, app: app, now: now, recording: recording)
        }
        guard let intent = session.paymentIntent?.object, let priceId = session.lineItems?.data.first?.price?.id
        else { return StripeApplied("a session without its payment or price: nothing delivered") }
        // A price the catalog does not sell: the paid purchase goes to the core as the price it
        // is, which raises it as an `unknown_product` anomaly for an operator (never dropped).
        let product = catalog.product(store: "stripe", storeProductId: priceId)
        let charge = intent.latestCharge?.object
        let currency = session.currency ?? intent.currency
        let token = intent.metadata?[stripeTokenKey] ?? session.metadata?[stripeTokenKey]
        let transaction = StoreTransaction(
            store: .stripe, transactionId: "stripe:\(intent.id)", originalTransactionId: "stripe:\(intent.id)",
            storeIdentity: ServerConfiguration.stripeIdentity(app.configuration.id),
            productId: product?.id ?? "stripe price \(priceId)",
            purchaseDate: StripeReading.ms(intent.created ?? session.created),
            quantity: Int32(
                clamping: session.lineItems?.data.first?.quantity ?? 1),
            kind: product.map { .init($0.type) } ?? .consumable,
            appAccountToken: token, ownership: .purchased, signedDate: now.stripeMilliseconds,
            environment: (session.livemode ?? false) ? .production : .sandbox,
            storefront: nil, currency: currency?.uppercased(),
            price: StripeReading.milliunits(intent.amountReceived ?? session.amountTotal, currency: currency))
        var priced = transaction
        priced.proceeds = StripeReading.proceeds(charge, currency: currency, price: priced.price)
        let address = session.customerDetails?.address ?? charge?.billingDetails?.address
        return try await deliverStripe(
            priced, paymentIntent: intent.id, charge: charge, customer: session.customer?.id ?? intent.customer?.id,
            redeemable: (intent.metadata ?? session.metadata)?[stripeRedeemKey] != nil, app: app, now: now,
            event: nil, recording: recording,
            reports: StripeReports(
                metadata: intent.metadata ?? session.metadata, firstPayment: true,
                taxMilli: StripeReading.milliunits(session.totalDetails?.amountTax, currency: currency) ?? 0,
                country: address?.country, area: address?.state))
    }

    /// A paid invoice: the subscription's period, delivered once (first purchase and renewals).
    func applyStripeInvoice(_ id: String, app received: StripeApp, now: Date, recording: StripeStore.Event? = nil)
        async throws -> StripeApplied
    {
        let invoice = try await received.client.invoice(id)
        let app = owningApp(invoice.subscriptionMetadata, received: received)
        guard invoice.status == "paid" else {
            return StripeApplied("invoice \(invoice.status ?? "?"): nothing delivered")
        }
        guard let subscriptionId = invoice.subscriptionId else { return StripeApplied("an invoice of no subscription") }
        let subscription = try await app.client.subscription(subscriptionId)
        // The product the invoice bills: a plan change's invoice carries a credit line for the
        // old price (negative) and a charge for the new one; the period's price is the latest
        // line that charges, else the subscription's current price.
        let lines = invoice.lines?.data ?? []
        let charging = lines.last { ($0.amount ?? 0) > 0 && $0.pricing?.priceDetails?.price != nil }
        let priceId =
            charging?.pricing?.priceDetails?.price ?? subscription.price?.id
            ?? lines.compactMap { $0.pricing?.priceDetails?.price }.last
        guard let priceId else { return StripeApplied("an invoice without a price: nothing delivered") }
        // A price the catalog does not sell: to the core as the price it is (an `unknown_product`
        // anomaly for an operator, never dropped).
        guard let product = catalog.product(store: "stripe", storeProductId: priceId) else {
            let unknown = StoreTransaction(
                store: .stripe, transactionId: "stripe:\(invoice.id)",
                originalTransactionId: "stripe:\(subscription.id)",
                storeIdentity: ServerConfiguration.stripeIdentity(app.configuration.id),
                productId: "stripe price \(priceId)", purchaseDate: StripeReading.ms(invoice.created), quantity: 1,
                kind: .autoRenewable,
                appAccountToken: invoice.subscriptionMetadata?[stripeTokenKey]
                    ?? subscription.metadata?[stripeTokenKey],
                ownership: .purchased, signedDate: now.stripeMilliseconds,
                environment: (invoice.livemode ?? false) ? .production : .sandbox,
                currency: invoice.currency?.uppercased(),
                price: StripeReading.milliunits(invoice.amountPaid, currency: invoice.currency))
            return try await deliverStripe(
                unknown, paymentIntent: invoice.paymentIntentId, charge: nil, customer: nil, redeemable: false,
                app: app, now: now, event: nil, recording: recording)
        }
        var charge: StripeCharge?
        var intentId: String?
        if let pi = invoice.paymentIntentId {
            let intent = try await app.client.paymentIntent(pi)
            charge = intent.latestCharge?.object
            intentId = intent.id
        }
        let token = invoice.subscriptionMetadata?[stripeTokenKey] ?? subscription.metadata?[stripeTokenKey]
        var transaction = StoreTransaction(
            store: .stripe, transactionId: "stripe:\(invoice.id)", originalTransactionId: "stripe:\(subscription.id)",
            storeIdentity: ServerConfiguration.stripeIdentity(app.configuration.id), productId: product.id,
            purchaseDate: StripeReading.ms(invoice.periodStart ?? invoice.statusTransitions?.paidAt ?? invoice.created),
            originalPurchaseDate: StripeReading.ms(subscription.startDate ?? subscription.created),
            expiresDate: StripeReading.ms(invoice.periodEnd ?? subscription.currentPeriodEnd), quantity: 1,
            kind: .autoRenewable, appAccountToken: token, ownership: .purchased, signedDate: now.stripeMilliseconds,
            environment: (invoice.livemode ?? false) ? .production : .sandbox,
            transactionReason: invoice.billingReason == "subscription_create" ? "PURCHASE" : "RENEWAL",
            currency: invoice.currency?.uppercased(),
            price: StripeReading.milliunits(invoice.amountPaid, currency: invoice.currency))
        transaction.subscriptionGroup = product.group
        transaction.proceeds = StripeReading.proceeds(charge, currency: invoice.currency, price: transaction.price)
        let event = StripeReading.status(subscription).map {
            SubscriptionEvent(
                .storeState($0, autoRenew: StripeReading.renews(subscription)), signedDate: now,
                transaction: transaction)
        }
        let metadata = invoice.subscriptionMetadata ?? subscription.metadata
        let address = invoice.customerAddress ?? charge?.billingDetails?.address
        return try await deliverStripe(
            transaction, paymentIntent: intentId, charge: charge,
            customer: invoice.customer?.id ?? subscription.customer?.id,
            redeemable: metadata?[stripeRedeemKey] != nil, app: app, now: now, event: event, recording: recording,
            reports: StripeReports(
                metadata: metadata, firstPayment: invoice.billingReason == "subscription_create",
                taxMilli: StripeReading.milliunits(invoice.taxAmount, currency: invoice.currency) ?? 0,
                country: address?.country, area: address?.state))
    }

    /// The app a Stripe object belongs to: the one its checkout named (`storekeeper_app`) when
    /// it is configured here, else the app whose endpoint received it.
    func owningApp(_ metadata: [String: String]?, received: StripeApp) -> StripeApp {
        guard let named = metadata?[stripeAppKey], named != received.configuration.id, let owner = stripe[named] else {
            return received
        }
        return owner
    }

    /// Delivers through the one path: to the order's account (its token), to the account that
    /// redeemed its code, or — bought without an account — to nobody, its code then valid.
    /// Stripe's own records (the payment, the event, the customer) commit with the delivery.
    func deliverStripe(
        _ transaction: StoreTransaction, paymentIntent: String?, charge: StripeCharge?, customer: String?,
        redeemable: Bool, app: StripeApp, now: Date, event: SubscriptionEvent?, recording: StripeStore.Event?,
        reports: StripeReports? = nil
    ) async throws -> StripeApplied {
        let stripeStore = StripeStore(database: database)
        var transaction = transaction
        // What Stripe already took back of this payment (a refund, a chargeback), stated before
        // the claim through the one refund path: the delivery path then honours it, as for every
        // store (a whole refund is never delivered, a partial one delivers what was not refunded).
        if let charge, let id = transaction.transactionId, let original = transaction.originalTransactionId,
            let product = transaction.productId,
            (charge.amountRefunded ?? 0) > 0 || charge.refunded == true || charge.disputed == true
        {
            let target = StripeTarget(
                transactionId: id, originalTransactionId: original, productId: product, delivered: false)
            _ = try await applyStripeRefunds(charge: charge.id, app: app, now: now, target: target)
            if charge.disputed == true {
                for dispute in try await app.client.disputes(charge: charge.id).data {
                    _ = try await applyStripeDispute(dispute.id, app: app, now: now, target: target)
                }
            }
        }
        var submitter: String?
        if redeemable, let token = transaction.appAccountToken,
            let checkout = try await stripeStore.checkout(token: token),
            checkout.accountId == nil
        {
            guard let redeemer = checkout.redeemedBy else {
                let issued = try await stripeStore.issueRedemption(
                    session: checkout.sessionId, transactionId: transaction.transactionId ?? "",
                    code: Self.redemptionCode(),
                    expiresAt: now.addingTimeInterval(Double(app.configuration.redemptionMinutes) * 60))
                return StripeApplied(
                    "paid without an account: held for redemption code \(issued?.redemptionCode?.prefix(4) ?? "?")…")
            }
            // Redeemed: the redeemer's, never the placeholder order's.
            submitter = redeemer
            transaction.appAccountToken = nil
        }
        // The payer's Stripe customer is theirs: recorded for the account a first payment goes to
        // (its order's, or its redeemer), never for one a renewal reaches after a transfer — the
        // new holder never opens the previous holder's billing portal.
        var writes = StripeStore.Writes(
            event: recording, paymentIntent: paymentIntent, appId: app.configuration.id,
            customer: (reports?.firstPayment ?? true) ? customer : nil)
        if let reports {
            writes.applePayment = reports.applePayment(transaction)
            writes.appleReporting = configuration.externalPurchaseReporting
            writes.googleTransaction = reports.googleTransaction(transaction, app: app.configuration)
        }
        let result = try await store.deliver(
            transaction, submittingAccount: submitter, requestedOrderId: nil, catalog: catalog,
            policy: configuration.ownershipPolicy, evidence: .device, event: event, sideWrites: writes, now: now)
        if let refusal = result.plan.refusal {
            return StripeApplied(
                "\(transaction.transactionId ?? "?"): refused (\(APIError.refusal(refusal).code): \(APIError.refusal(refusal).message))",
                recorded: recording != nil)
        }
        return StripeApplied(
            "\(transaction.transactionId ?? "?"): \(result.plan.outcome.rawValue)", recorded: recording != nil)
    }

    /// A code a player types or a link carries: 12 characters of an alphabet without 0/O, 1/I.
    static func redemptionCode() -> String {
        let alphabet = Array("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
        var generator = SystemRandomNumberGenerator()
        return String((0..<12).map { _ in alphabet[Int(generator.next(upperBound: UInt32(alphabet.count)))] })
    }

    /// A subscription's state as Stripe says it now: billing retry, cancellation at period end,
    /// pause, end — applied like every store's snapshot, its current product (a plan change).
    func applyStripeSubscription(_ id: String, app: StripeApp, now: Date) async throws -> String {
        let subscription = try await app.client.subscription(id)
        let original = "stripe:\(subscription.id)"
        guard let status = StripeReading.status(subscription) else {
            return "subscription \(subscription.status ?? "?"): nothing to change"
        }
        guard let state = try await SubscriptionStore.state(original, database: database) else {
            return "subscription \(subscription.status ?? "?") not delivered here yet: its invoice will be"
        }
        let product =
            subscription.price.flatMap { catalog.product(store: "stripe", storeProductId: $0.id) }?.id
            ?? state.productId
        let end =
            status == .expired ? (subscription.endedAt ?? subscription.currentPeriodEnd) : subscription.currentPeriodEnd
        var transaction = StoreTransaction(
            store: .stripe, transactionId: state.latestTransactionId, originalTransactionId: original,
            storeIdentity: ServerConfiguration.stripeIdentity(app.configuration.id), productId: product,
            expiresDate: StripeReading.ms(end), quantity: 1, kind: .autoRenewable, ownership: .purchased,
            signedDate: now.stripeMilliseconds, environment: (subscription.livemode ?? false) ? .production : .sandbox)
        transaction.subscriptionGroup = catalog.product(product)?.group
        _ = try await store.applyStoreSnapshot(
            transaction,
            event: SubscriptionEvent(
                .storeState(status, autoRenew: StripeReading.renews(subscription)), signedDate: now,
                transaction: transaction),
            submittingAccount: nil, requestedOrderId: nil, catalog: catalog, policy: configuration.ownershipPolicy,
            now: now)
        return
            "subscription \(subscription.status ?? "?")\(subscription.cancelAtPeriodEnd == true ? ", canceled at period end" : ""): \(status.rawValue)"
    }

    /// A charge's refunds: each succeeded Refund object takes back its own amount, once (the
    /// charge's `amount_refunded` is only a running total), through the one refund path.
    func applyStripeRefunds(charge id: String, app: StripeApp, now: Date, target given: StripeTarget? = nil)
        async throws -> String
    {
        let charge = try await app.client.charge(id)
        var found = given
        if found == nil { found = try await stripeTarget(paymentIntent: charge.paymentIntent?.id, app: app) }
        guard let payment = found else {
            return
                "a refund of a payment not claimed here yet: recorded when its payment is (its delivery reads the charge)"
        }
        // The charge's own list when it carries it whole, else Stripe's list of its refunds.
        var listed = charge.refunds.flatMap { $0.hasMore == true ? nil : $0.data }
        if listed == nil { listed = try await app.client.refunds(charge: id).data }
        let refunds = (listed ?? []).filter { $0.status == "succeeded" }
            .sorted { ($0.created ?? 0, $0.id) < ($1.created ?? 0, $1.id) }
        guard let total = charge.amount, total > 0 else { return "a charge of nothing" }
        var cumulative: Int64 = 0
        var outcomes: [String] = []
        for refund in refunds {
            cumulative += refund.amount ?? 0
            var event = RefundEvent(
                kind: .refund, store: .stripe, key: "stripe-refund:\(refund.id)", transactionId: payment.transactionId,
                originalTransactionId: payment.originalTransactionId, productId: payment.productId,
                revocation: RefundPlanner.Revocation(unitsRefunded: cumulative, of: total))
            event.revocationType =
                (cumulative >= total ? StoreTransaction.RevocationKind.refundFull : .refundProrated).rawValue
            event.storeIdentity = ServerConfiguration.stripeIdentity(app.configuration.id)
            event.environment = (charge.livemode ?? false) ? "Production" : "Sandbox"
            let outcome = try await notifications.applyRefund(event, settings: notificationSettings, now: now)
            outcomes.append("\(refund.id): \(outcome.0)")
            // The stores this payment was reported to learn of the refund (once per refund).
            guard payment.delivered else { continue }
            try await StripeStore(database: database).recordReportedRefund(
                transactionId: payment.transactionId, refundId: refund.id,
                amountMilli: StripeReading.milliunits(refund.amount, currency: charge.currency) ?? 0,
                grossMilli: StripeReading.milliunits(total, currency: charge.currency) ?? 0,
                appleReporting: configuration.externalPurchaseReporting, now: now)
        }
        // A refund that failed after it succeeded (`refund.failed`: the money came back to the
        // developer): what it took is given back — the refunds are reversed and those still
        // succeeded taken again, once, whichever event says so first.
        let failed = (listed ?? []).filter { $0.status == "failed" || $0.status == "canceled" }
        let succeededShare = RefundPlanner.Revocation(unitsRefunded: cumulative, of: total).share
        if !failed.isEmpty,
            let recorded = try await StripeStore(database: database).refundedShare(payment.transactionId),
            recorded > (cumulative > 0 ? succeededShare : 0)
        {
            let tag = failed.map(\.id).sorted().joined(separator: ",")
            var reversal = RefundEvent(
                kind: .reversal, store: .stripe, key: "stripe-refund-failed:\(tag)",
                transactionId: payment.transactionId, originalTransactionId: payment.originalTransactionId,
                productId: payment.productId, revocation: RefundPlanner.Revocation(type: .refundFull, percentage: nil))
            reversal.storeIdentity = ServerConfiguration.stripeIdentity(app.configuration.id)
            let undone = try await notifications.applyRefund(reversal, settings: notificationSettings, now: now)
            outcomes.append("failed \(tag): \(undone.0)")
            if cumulative > 0 {
                var again = RefundEvent(
                    kind: .refund, store: .stripe, key: "stripe-refund-after-failed:\(tag)",
                    transactionId: payment.transactionId, originalTransactionId: payment.originalTransactionId,
                    productId: payment.productId,
                    revocation: RefundPlanner.Revocation(unitsRefunded: cumulative, of: total))
                again.revocationType = StoreTransaction.RevocationKind.refundProrated.rawValue
                again.storeIdentity = ServerConfiguration.stripeIdentity(app.configuration.id)
                let redone = try await notifications.applyRefund(again, settings: notificationSettings, now: now)
                outcomes.append("still refunded: \(redone.0)")
            }
        }
        return outcomes.isEmpty ? "no succeeded refund" : outcomes.joined(separator: "; ")
    }

    /// A dispute by the app's policy: a lost chargeback revokes (and an opened one when
    /// `revoke_when_opened`); an inquiry (`warning_…`) never does; a won one after an early
    /// revocation gives back.
    func applyStripeDispute(_ id: String, app: StripeApp, now: Date, target given: StripeTarget? = nil)
        async throws -> String
    {
        let dispute = try await app.client.dispute(id)
        guard !dispute.isInquiry else { return "inquiry \(dispute.status ?? "?"): nothing revoked" }
        var payment = given
        if payment == nil {
            var intentId = dispute.paymentIntent?.id
            if intentId == nil, let charge = dispute.charge?.id {
                intentId = try await app.client.charge(charge).paymentIntent?.id
            }
            payment = try await stripeTarget(paymentIntent: intentId, app: app)
        }
        guard let payment else {
            return
                "a dispute of a payment not claimed here yet: recorded when its payment is (its delivery reads the charge)"
        }
        let opened = ["needs_response", "under_review"].contains(dispute.status ?? "")
        let policy =
            app.configuration.disputePolicy
            ?? (catalog.refunds.disputes ?? .revokeWhenLost).rawValue
        let revoke = dispute.status == "lost" || (opened && policy == "revoke_when_opened")
        var event = RefundEvent(
            kind: revoke ? .refund : .reversal, store: .stripe,
            key: "stripe-dispute:\(dispute.id):\(revoke ? "revoke" : "restore")", transactionId: payment.transactionId,
            originalTransactionId: payment.originalTransactionId, productId: payment.productId,
            revocation: RefundPlanner.Revocation(type: .refundFull, percentage: nil))
        event.revocationType = StoreTransaction.RevocationKind.refundFull.rawValue
        event.storeIdentity = ServerConfiguration.stripeIdentity(app.configuration.id)
        if revoke {
            let outcome = try await notifications.applyRefund(event, settings: notificationSettings, now: now)
            if dispute.status == "lost", payment.delivered {
                // A lost chargeback returned the money: reported as a refund of what it disputed.
                let amount = StripeReading.milliunits(dispute.amount, currency: dispute.currency) ?? 0
                try await StripeStore(database: database).recordReportedRefund(
                    transactionId: payment.transactionId, refundId: dispute.id, amountMilli: amount,
                    grossMilli: try await StripeStore(database: database).reportedGross(payment.transactionId)
                        ?? amount,
                    appleReporting: configuration.externalPurchaseReporting, now: now)
            }
            return "dispute \(dispute.status ?? "?"): revoked (\(outcome.0))"
        }
        if dispute.status == "won", policy == "revoke_when_opened" {
            let outcome = try await notifications.applyRefund(event, settings: notificationSettings, now: now)
            // Held back before its claim while the dispute was open: claimable again, and claimed
            // now (its checkout applied again) — unless this is that claim's own reading.
            if !payment.delivered, given == nil, let session = payment.sessionId {
                let delivered = try await applyStripeSession(session, app: app, now: now)
                return "dispute won: restored (\(outcome.0)); \(delivered.outcome)"
            }
            return "dispute won: restored (\(outcome.0))"
        }
        return "dispute \(dispute.status ?? "?"): nothing revoked by policy \(policy)"
    }
}

extension Date {
    var stripeMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }
}

/// What a Stripe payment reports to the stores whose link-out sent the buyer: Apple's External
/// Purchase Server API (its token) and Google Play's `externalTransactions` (its token, the
/// Stripe app's `googlePlayAppId`).
struct StripeReports: Sendable {
    var metadata: [String: String]?
    /// A one-time payment or a subscription's first invoice; else a renewal or a plan change.
    var firstPayment: Bool
    var taxMilli: Int64
    /// The buyer's country (alpha-2) and state, as Stripe collected them.
    var country: String?
    var area: String?

    /// A subscription's first payment is keyed by the subscription (renewals name it).
    func paymentKey(_ transaction: StoreTransaction) -> String {
        let id = transaction.transactionId ?? ""
        return firstPayment ? (transaction.originalTransactionId ?? id) : id
    }

    func applePayment(_ transaction: StoreTransaction) -> ExternalPurchaseStore.WebPayment? {
        guard let token = metadata?[stripeAppleTokenKey], let id = transaction.transactionId else { return nil }
        let subscription = transaction.kind == .autoRenewable
        return ExternalPurchaseStore.WebPayment(
            paymentId: paymentKey(transaction), accountId: "", productId: transaction.productId ?? "",
            quantity: Int(transaction.quantity ?? 1), amountMilli: transaction.price ?? 0, taxMilli: taxMilli,
            currency: transaction.currency ?? "USD", taxCountry: RegionCode.alpha3(country), externalPurchaseId: token,
            originalPaymentId: subscription && !firstPayment ? transaction.originalTransactionId : nil,
            expiresAt: subscription ? transaction.expiresDate : nil, transactionId: id)
    }

    func googleTransaction(_ transaction: StoreTransaction, app: StripeAppConfiguration)
        -> ExternalTransactionStore.Transaction?
    {
        guard let googleApp = app.googlePlayAppId, let token = metadata?[stripeGoogleTokenKey],
            let id = transaction.transactionId
        else { return nil }
        let recurring = transaction.kind == .autoRenewable
        let price = transaction.price ?? 0
        return ExternalTransactionStore.Transaction(
            id: ExternalTransactionStore.externalId(paymentKey(transaction)), googleAppId: googleApp, sourceId: id,
            accountId: nil,
            initialId: recurring && !firstPayment
                ? ExternalTransactionStore.externalId(transaction.originalTransactionId ?? id) : nil,
            token: firstPayment ? token : nil, recurring: recurring, preTaxMicros: max(0, price - taxMilli) * 1000,
            taxMicros: taxMilli * 1000, currency: transaction.currency ?? "USD",
            transactionTime: transaction.purchaseDate ?? 0, regionCode: country?.uppercased() ?? "",
            administrativeArea: area)
    }
}
