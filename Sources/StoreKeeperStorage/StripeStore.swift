import Foundation
import SQLKit
import StoreKeeperCore
import StoreKeeperSupport

/// Stripe's records beside the one delivery path: webhook events (durable before Stripe hears
/// 2xx, once per event id, each queueing its job in the same transaction), the Checkout Sessions
/// orders opened, redemption codes of purchases made before the buyer had an account, and each
/// account's Stripe customer.
public struct StripeStore: Sendable {
    public static let eventJobKind = "stripe_event"
    public static let reconcileJobKind = "stripe_reconcile"

    public let database: Database

    public init(database: Database) { self.database = database }

    public enum Recorded: Sendable, Hashable {
        case new
        case duplicate
    }

    /// An event, durably, once per id; a new one queues its job (payload: the event id), due at
    /// once. `applied` (with its outcome): already applied by the caller, no job.
    public func recordEvent(
        id: String, appId: String, type: String, objectId: String?, created: Int64?, now: Date,
        applied: String? = nil
    ) async throws -> Recorded {
        try await database.transaction { sql in
            let inserted = try await sql.raw(
                """
                INSERT INTO stripe_events (event_id, app_id, type, object_id, created, status, outcome, received_at,
                                           applied_at)
                VALUES (\(bind: id), \(bind: appId), \(bind: type), \(bind: objectId), \(bind: created),
                        \(bind: applied == nil ? "pending" : "applied"), \(bind: applied.map { String($0.prefix(1000)) }),
                        \(bind: now.milliseconds), \(bind: applied == nil ? nil : now.milliseconds))
                ON CONFLICT (event_id) DO NOTHING RETURNING event_id
                """
            ).first()
            guard inserted != nil else { return .duplicate }
            guard applied == nil else { return .new }
            try await JobStore.insert(
                kind: Self.eventJobKind, dedupeKey: "\(Self.eventJobKind)|\(id)", payload: id, sql: sql, now: now)
            return .new
        }
    }

    public struct Event: Sendable, Hashable {
        public var id: String
        public var appId: String
        public var type: String
        public var objectId: String?
        public var created: Int64?
        public var status: String
        public var outcome: String?

        public init(
            id: String, appId: String, type: String, objectId: String?, created: Int64?, status: String,
            outcome: String?
        ) {
            self.id = id
            self.appId = appId
            self.type = type
            self.objectId = objectId
            self.created = created
            self.status = status
            self.outcome = outcome
        }
    }

    public func event(_ id: String) async throws -> Event? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM stripe_events WHERE event_id = \(bind: id)").first().map(Self.event)
        }
    }

    public func events(limit: Int = 100) async throws -> [Event] {
        try await database.read { sql in
            try await sql.raw(
                "SELECT * FROM stripe_events ORDER BY received_at DESC, event_id LIMIT \(bind: max(1, min(limit, 1000)))"
            ).all().map(Self.event)
        }
    }

    static func event(_ row: any SQLRow) throws -> Event {
        Event(
            id: try row.decode(column: "event_id", as: String.self),
            appId: try row.decode(column: "app_id", as: String.self),
            type: try row.decode(column: "type", as: String.self),
            objectId: try row.decode(column: "object_id", as: String?.self),
            created: try row.decode(column: "created", as: Int64?.self),
            status: try row.decode(column: "status", as: String.self),
            outcome: try row.decode(column: "outcome", as: String?.self))
    }

    public func finishEvent(_ id: String, status: String, outcome: String, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE stripe_events SET status = \(bind: status), outcome = \(bind: String(outcome.prefix(1000))),
                applied_at = \(bind: now.milliseconds) WHERE event_id = \(bind: id)
                """
            ).run()
        }
    }

    /// Deletes up to `limit` events received before `cutoff` that are done with (applied or
    /// ignored; a pending one waits for its job). Stripe retries a webhook for 3 days and the
    /// reconciler looks back as far: an event deleted 30 days on is never seen again.
    public func pruneEvents(receivedBefore cutoff: Date, limit: Int = 1_000) async throws -> Int {
        try await database.transaction { sql in
            try await sql.raw(
                """
                DELETE FROM stripe_events WHERE event_id IN (
                    SELECT event_id FROM stripe_events
                    WHERE received_at < \(bind: cutoff.milliseconds) AND status <> 'pending'
                    LIMIT \(bind: limit))
                RETURNING event_id
                """
            ).all().count
        }
    }

    // MARK: Checkout Sessions

    public struct Checkout: Sendable, Hashable {
        public var sessionId: String
        public var appId: String
        public var orderId: String
        public var accountId: String?
        public var productId: String
        public var appAccountToken: String
        public var url: String?
        public var expiresAt: Int64
        public var createdAt: Int64
        public var transactionId: String?
        public var redemptionCode: String?
        public var redemptionExpiresAt: Int64?
        public var redeemedBy: String?

        public init(
            sessionId: String, appId: String, orderId: String, accountId: String?, productId: String,
            appAccountToken: String, url: String?, expiresAt: Int64, createdAt: Int64
        ) {
            self.sessionId = sessionId
            self.appId = appId
            self.orderId = orderId
            self.accountId = accountId
            self.productId = productId
            self.appAccountToken = appAccountToken
            self.url = url
            self.expiresAt = expiresAt
            self.createdAt = createdAt
        }
    }

    /// Records the session an order opened (the same order again: the first one stays).
    public func recordCheckout(_ checkout: Checkout) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO stripe_checkouts (session_id, app_id, order_id, account_id, product_id, app_account_token,
                    url, expires_at, created_at, redemption_code)
                VALUES (\(bind: checkout.sessionId), \(bind: checkout.appId), \(bind: checkout.orderId),
                    \(bind: checkout.accountId), \(bind: checkout.productId), \(bind: checkout.appAccountToken),
                    \(bind: checkout.url), \(bind: checkout.expiresAt), \(bind: checkout.createdAt),
                    \(bind: checkout.redemptionCode))
                ON CONFLICT (session_id) DO NOTHING
                """
            ).run()
        }
    }

    public func checkout(session: String) async throws -> Checkout? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM stripe_checkouts WHERE session_id = \(bind: session)").first().map(
                Self.checkout)
        }
    }

    public func checkout(order: String) async throws -> Checkout? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM stripe_checkouts WHERE order_id = \(bind: order)").first().map(
                Self.checkout)
        }
    }

    public func checkout(token: String) async throws -> Checkout? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM stripe_checkouts WHERE app_account_token = \(bind: token)").first().map(
                Self.checkout)
        }
    }

    public func checkout(redemptionCode code: String) async throws -> Checkout? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM stripe_checkouts WHERE redemption_code = \(bind: code)").first().map(
                Self.checkout)
        }
    }

    static func checkout(_ row: any SQLRow) throws -> Checkout {
        var checkout = Checkout(
            sessionId: try row.decode(column: "session_id", as: String.self),
            appId: try row.decode(column: "app_id", as: String.self),
            orderId: try row.decode(column: "order_id", as: String.self),
            accountId: try row.decode(column: "account_id", as: String?.self),
            productId: try row.decode(column: "product_id", as: String.self),
            appAccountToken: try row.decode(column: "app_account_token", as: String.self),
            url: try row.decode(column: "url", as: String?.self),
            expiresAt: try row.decode(column: "expires_at", as: Int64.self),
            createdAt: try row.decode(column: "created_at", as: Int64.self))
        checkout.transactionId = try row.decode(column: "transaction_id", as: String?.self)
        checkout.redemptionCode = try row.decode(column: "redemption_code", as: String?.self)
        checkout.redemptionExpiresAt = try row.decode(column: "redemption_expires_at", as: Int64?.self)
        checkout.redeemedBy = try row.decode(column: "redeemed_by", as: String?.self)
        return checkout
    }

    /// A paid checkout for nobody: its transaction and a single-use code (kept if one exists).
    public func issueRedemption(session: String, transactionId: String, code: String, expiresAt: Date) async throws
        -> Checkout?
    {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE stripe_checkouts SET transaction_id = \(bind: transactionId),
                    redemption_code = COALESCE(redemption_code, \(bind: code)),
                    redemption_expires_at = COALESCE(redemption_expires_at, \(bind: expiresAt.milliseconds))
                WHERE session_id = \(bind: session) AND account_id IS NULL
                """
            ).run()
            return try await sql.raw("SELECT * FROM stripe_checkouts WHERE session_id = \(bind: session)").first().map(
                Self.checkout)
        }
    }

    public enum Claim: Sendable, Hashable {
        case claimed(Checkout)
        case alreadyRedeemed(by: String)
        case expired
        case unknown
    }

    /// Binds a code to `account`, once: a second account (or the same code again) is refused.
    public func claim(code: String, account: String, now: Date) async throws -> Claim {
        try await database.transaction { sql in
            guard
                let row = try await sql.raw("SELECT * FROM stripe_checkouts WHERE redemption_code = \(bind: code)")
                    .first()
            else { return .unknown }
            let checkout = try Self.checkout(row)
            // The same account again (its first redemption's delivery did not finish): claimed
            // again, so the delivery is retried; any other account is refused.
            if let by = checkout.redeemedBy {
                return by.utf8.elementsEqual(account.utf8) ? .claimed(checkout) : .alreadyRedeemed(by: by)
            }
            guard (checkout.redemptionExpiresAt ?? 0) > now.milliseconds else { return .expired }
            let updated = try await sql.raw(
                """
                UPDATE stripe_checkouts SET redeemed_by = \(bind: account), redeemed_at = \(bind: now.milliseconds)
                WHERE session_id = \(bind: checkout.sessionId) AND redeemed_by IS NULL RETURNING session_id
                """
            ).first()
            guard updated != nil else { return .alreadyRedeemed(by: "another account") }
            return .claimed(checkout)
        }
    }

    /// Support renews an expired, unredeemed code.
    public func renewRedemption(code: String, expiresAt: Date) async throws -> Bool {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE stripe_checkouts SET redemption_expires_at = \(bind: expiresAt.milliseconds)
                WHERE redemption_code = \(bind: code) AND redeemed_by IS NULL RETURNING session_id
                """
            ).first() != nil
        }
    }

    // MARK: Customers

    public func customer(appId: String, accountId: String) async throws -> String? {
        try await database.read { sql in
            try await sql.raw(
                "SELECT customer_id FROM stripe_customers WHERE app_id = \(bind: appId) AND account_id = \(bind: accountId)"
            ).first()?.decode(column: "customer_id", as: String.self)
        }
    }
}

extension StripeStore {
    public struct Payment: Sendable, Hashable {
        public var transactionId: String
        public var originalTransactionId: String
        public var productId: String
    }

    /// Where the app's last complete reconciliation ended (Unix seconds), if one ran.
    public func reconcileCursor(appId: String) async throws -> Int64? {
        try await database.read { sql in
            try await sql.raw("SELECT complete_through FROM stripe_reconcile_state WHERE app_id = \(bind: appId)")
                .first()?.decode(column: "complete_through", as: Int64.self)
        }
    }

    public func setReconcileCursor(appId: String, through: Int64) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO stripe_reconcile_state (app_id, complete_through) VALUES (\(bind: appId), \(bind: through))
                ON CONFLICT (app_id) DO UPDATE SET complete_through = excluded.complete_through
                """
            ).run()
        }
    }

    /// Whether `transactionId` was delivered (a payment refused before its claim is recorded
    /// here without a delivery).
    public func isDelivered(_ transactionId: String) async throws -> Bool {
        try await database.read { sql in
            try await sql.raw("SELECT 1 AS one FROM deliveries WHERE transaction_id = \(bind: transactionId)").first()
                != nil
        }
    }

    public func payment(paymentIntent: String) async throws -> Payment? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM stripe_payments WHERE payment_intent_id = \(bind: paymentIntent)").first()
                .map {
                    Payment(
                        transactionId: try $0.decode(column: "transaction_id", as: String.self),
                        originalTransactionId: try $0.decode(column: "original_transaction_id", as: String.self),
                        productId: try $0.decode(column: "product_id", as: String.self))
                }
        }
    }
}

extension StripeStore {
    /// The payment intent that paid a transaction (a support refund asks Stripe by it).
    public func paymentIntent(ofTransaction transactionId: String) async throws -> String? {
        try await database.read { sql in
            try await sql.raw(
                "SELECT payment_intent_id FROM stripe_payments WHERE transaction_id = \(bind: transactionId)"
            ).first()?.decode(column: "payment_intent_id", as: String.self)
        }
    }
}

extension StripeStore {
    /// What a Stripe delivery writes beside it, in its database transaction: the payment it
    /// was (refunds and disputes name payments), the webhook event that brought it (recorded
    /// applied with it: one write for a webhook), the account's Stripe customer.
    /// A refund (or a lost dispute) of a payment that was reported to Apple or Google Play:
    /// its refund queued for each, once per `refundId`, in one database transaction.
    public func recordReportedRefund(
        transactionId: String, refundId: String, amountMilli: Int64, grossMilli: Int64, appleReporting: Bool, now: Date
    ) async throws {
        try await database.transaction { sql in
            if let paymentId = try await sql.raw(
                "SELECT payment_id FROM web_purchases WHERE transaction_id = \(bind: transactionId)"
            ).first()?.decode(column: "payment_id", as: String.self) {
                try await ExternalPurchaseStore.recordRefund(
                    paymentId: paymentId, refundKey: "stripe:\(refundId)", amountMilli: amountMilli,
                    reporting: appleReporting, sql: sql, now: now)
            }
            try await ExternalTransactionStore.recordRefund(
                source: transactionId, refundId: refundId, refundedMicros: amountMilli * 1000,
                grossMicros: grossMilli * 1000, sql: sql, now: now)
        }
    }

    /// The share of a delivered payment its refunds took (nil: not refunded).
    public func refundedShare(_ transactionId: String) async throws -> Int32? {
        try await database.read { sql in
            guard
                let row = try await sql.raw(
                    "SELECT refunded_at, refund_share FROM deliveries WHERE transaction_id = \(bind: transactionId)"
                ).first(), try row.decode(column: "refunded_at", as: Int64?.self) != nil
            else { return nil }
            return try row.decode(column: "refund_share", as: Int32?.self) ?? RefundPlanner.wholeShare
        }
    }

    /// What a reported payment charged (milliunits, tax included), nil when it was not reported.
    public func reportedGross(_ transactionId: String) async throws -> Int64? {
        try await database.read { sql in
            if let amount = try await sql.raw(
                "SELECT amount_milli FROM web_purchases WHERE transaction_id = \(bind: transactionId)"
            ).first()?.decode(column: "amount_milli", as: Int64.self) {
                return amount
            }
            let micros = try await sql.raw(
                """
                SELECT pre_tax_micros + tax_micros AS gross FROM google_external_transactions
                WHERE source_id = \(bind: transactionId)
                """
            ).first()?.decode(column: "gross", as: Int64.self)
            return micros.map { $0 / 1000 }
        }
    }

    public struct Writes: StoreSideWrites {
        public var event: Event?
        public var paymentIntent: String?
        public var appId: String
        public var customer: String?
        /// The payment as Apple's external purchase token reports it (its account set at
        /// delivery), and whether reporting is on.
        public var applePayment: ExternalPurchaseStore.WebPayment?
        public var appleReporting = false
        /// The payment as Google Play's external transactions report it.
        public var googleTransaction: ExternalTransactionStore.Transaction?

        public init(event: Event?, paymentIntent: String?, appId: String, customer: String?) {
            self.event = event
            self.paymentIntent = paymentIntent
            self.appId = appId
            self.customer = customer
        }

        public func beforeDelivery(transaction: StoreTransaction, sql: any SQLDatabase, now: Date) async throws
            -> PurchaseStore.DeliveryResult.Held?
        {
            if let paymentIntent, let id = transaction.transactionId {
                try await sql.raw(
                    """
                    INSERT INTO stripe_payments (payment_intent_id, transaction_id, original_transaction_id, product_id)
                    VALUES (\(bind: paymentIntent), \(bind: id), \(bind: transaction.originalTransactionId ?? id),
                            \(bind: transaction.productId ?? ""))
                    ON CONFLICT (payment_intent_id) DO NOTHING
                    """
                ).run()
            }
            return nil
        }

        public func afterDelivery(result: PurchaseStore.DeliveryResult, sql: any SQLDatabase, now: Date) async throws {
            if let event {
                // Recorded with what the delivery did, in one statement (Stripe's purchases are
                // never held: `beforeDelivery` plans them all).
                try await sql.raw(
                    """
                    INSERT INTO stripe_events (event_id, app_id, type, object_id, created, status, outcome, received_at,
                                               applied_at)
                    VALUES (\(bind: event.id), \(bind: event.appId), \(bind: event.type), \(bind: event.objectId),
                            \(bind: event.created), 'applied',
                            \(bind: result.plan.outcome.rawValue + (result.plan.refusal.map { " (\($0.code))" } ?? "")),
                            \(bind: now.milliseconds), \(bind: now.milliseconds))
                    ON CONFLICT (event_id) DO NOTHING
                    """
                ).run()
            }
            if let customer, let account = result.plan.accountId ?? result.plan.delivery?.accountId {
                try await sql.raw(
                    """
                    INSERT INTO stripe_customers (app_id, account_id, customer_id)
                    VALUES (\(bind: appId), \(bind: account), \(bind: customer))
                    ON CONFLICT (app_id, account_id) DO NOTHING
                    """
                ).run()
            }
            // The stores' reports of a payment made outside them, with the delivery they report.
            guard result.plan.refusal == nil, let delivered = result.plan.delivery, !delivered.accountId.isEmpty
            else { return }
            if var payment = applePayment {
                payment.accountId = delivered.accountId
                let outcome = try await ExternalPurchaseStore.record(
                    payment, reporting: appleReporting, sql: sql, now: now)
                if case .recorded = outcome {
                } else {
                    try await PurchaseStore.audit(
                        sql, actor: "storekeeper", action: "external_report_skipped", subject: payment.paymentId,
                        detail:
                            "not reported under Apple's external purchase token \(payment.externalPurchaseId ?? ""): the token is another account's or the payment was recorded with other facts",
                        at: now.milliseconds)
                }
            }
            if var google = googleTransaction {
                google.accountId = delivered.accountId
                if try await !ExternalTransactionStore.record(google, sql: sql, now: now) {
                    try await PurchaseStore.audit(
                        sql, actor: "storekeeper", action: "google_external_skipped", subject: google.sourceId,
                        detail: "not reported to Google Play: the subscription's first payment was never reported",
                        at: now.milliseconds)
                }
            }
        }
    }
}
