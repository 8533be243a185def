import Foundation
import SQLKit
import StoreKeeperCore
import StoreKeeperSupport

/// External purchases: Apple's external purchase tokens (EXTERNAL_PURCHASE_TOKEN, or given by
/// the app or web checkout), the web checkout's purchases each token covers (delivered through
/// the one delivery path as `web:<paymentId>`), and the External Purchase Server API reports.
public struct ExternalPurchaseStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    public static let reportJobKind = "external_report"

    /// A token as recorded.
    public struct Token: Sendable, Hashable, Codable {
        public var externalPurchaseId: String
        public var accountId: String?
        public var tokenType: String?
        public var environment: String
        public var createdAt: Date?
        public var expiresAt: Date?
        public var lastNotice: String?
        public var unreportedNotices: Int
        public var reportedAt: Date?
        /// Web purchases (and refunds) attached and not reported yet.
        public var unreportedLineItems: Int
    }

    /// EXTERNAL_PURCHASE_TOKEN: the token recorded (or its notice counted); UNREPORTED queues
    /// its report now — with the line items of the purchases it covers, else as NO_LINE_ITEM
    /// (known to the app, nothing bought) or UNRECOGNIZED_TOKEN (never seen but in Apple's notice).
    static func record(_ record: NotificationRecord, sql: any SQLDatabase, now: Date) async throws -> (String, String) {
        guard let token = record.externalToken, let id = token.externalPurchaseId else {
            return ("ignored", "EXTERNAL_PURCHASE_TOKEN without an externalPurchaseId")
        }
        let at = now.milliseconds
        let subtype = record.subtype ?? "(none)"
        let unreported = record.notice == .externalPurchaseToken(unreported: true) ? 1 : 0
        try await sql.raw(
            """
            INSERT INTO external_tokens (external_purchase_id, token_type, environment, bundle_id, created_at, expires_at,
                                         first_seen_at, last_notice, last_notice_at, unreported_notices)
            VALUES (\(bind: id), \(bind: token.tokenType), \(bind: token.environment), \(bind: token.storeIdentity),
                    \(bind: token.createdAt), \(bind: token.expiresAt), \(bind: at), \(bind: subtype),
                    \(bind: at), \(bind: unreported))
            ON CONFLICT (external_purchase_id) DO UPDATE SET
                token_type = COALESCE(excluded.token_type, external_tokens.token_type),
                created_at = COALESCE(excluded.created_at, external_tokens.created_at),
                expires_at = COALESCE(excluded.expires_at, external_tokens.expires_at),
                bundle_id = COALESCE(excluded.bundle_id, external_tokens.bundle_id),
                last_notice = excluded.last_notice, last_notice_at = excluded.last_notice_at,
                unreported_notices = external_tokens.unreported_notices + excluded.unreported_notices
            """
        ).run()
        var detail = "external purchase token \(id) (\(token.environment ?? "?")): \(subtype) recorded"
        if unreported == 1 {
            try await JobStore.insert(
                kind: Self.reportJobKind, dedupeKey: "\(Self.reportJobKind)|\(id)|\(record.notificationUUID)",
                payload: id, sql: sql, now: now)
            detail += "; its report is queued"
        }
        try await PurchaseStore.audit(
            sql, actor: "apple", action: "external_purchase_token", subject: id, detail: detail, at: at)
        return ("applied", detail)
    }

    /// Records a token the app or web checkout received from StoreKit for `accountId`
    /// (idempotent; a token already tied to another account is refused).
    public func registerToken(
        _ id: String, accountId: String, tokenType: String?, limits: TokenLimits? = nil, now: Date
    ) async throws -> Bool {
        let postgres = database.kind == .postgres
        return try await database.transaction { sql in
            if let limits {
                if postgres {
                    // Counted and inserted under the account's lock, as orders are.
                    try await sql.raw("SELECT pg_advisory_xact_lock(hashtext(\(bind: "tokens|" + accountId)))").run()
                }
                let known = try await sql.raw(
                    "SELECT 1 AS k FROM external_tokens WHERE external_purchase_id = \(bind: id)"
                ).first()
                if known == nil {
                    // Tokens Apple has not reported yet (no notice) and no web purchase covers.
                    let unconfirmed: SQLQueryString = """
                        last_notice IS NULL AND NOT EXISTS (
                            SELECT 1 FROM web_purchases w WHERE w.external_purchase_id = external_tokens.external_purchase_id)
                        """
                    let mine =
                        try await sql.raw(
                            """
                            SELECT COUNT(*) AS n FROM (SELECT 1 FROM external_tokens WHERE account_id = \(bind: accountId)
                            AND \(unconfirmed) LIMIT \(unsafeRaw: String(limits.perAccount))) AS t
                            """
                        ).first()?.decode(column: "n", as: Int.self) ?? 0
                    if mine >= limits.perAccount { throw TooManyTokens(limit: limits.perAccount, global: false) }
                    let all =
                        try await sql.raw(
                            """
                            SELECT COUNT(*) AS n FROM (SELECT 1 FROM external_tokens WHERE \(unconfirmed)
                            LIMIT \(unsafeRaw: String(limits.total))) AS t
                            """
                        ).first()?.decode(column: "n", as: Int.self) ?? 0
                    if all >= limits.total { throw TooManyTokens(limit: limits.total, global: true) }
                }
            }
            return try await Self.register(
                id, accountId: accountId, tokenType: tokenType, sql: sql, at: now.milliseconds)
        }
    }

    /// Bounds on tokens the app registers that Apple has not reported (yet).
    public struct TokenLimits: Sendable {
        public var perAccount: Int
        public var total: Int
        public init(perAccount: Int, total: Int) {
            self.perAccount = perAccount
            self.total = total
        }
    }

    /// The account (or, `global`, the whole server) holds `limit` unconfirmed tokens.
    public struct TooManyTokens: Error, Sendable {
        public var limit: Int
        public var global: Bool
    }

    /// Deletes tokens registered before `cutoff` that Apple never reported and no web purchase
    /// covers (`limits.unconfirmedExternalTokenDays`); at most `limit` at a time.
    @discardableResult
    public func deleteUnconfirmedTokens(registeredBefore cutoff: Date, limit: Int = 1_000) async throws -> Int {
        try await database.transaction { sql in
            let ids = try await sql.raw(
                """
                SELECT external_purchase_id FROM external_tokens WHERE last_notice IS NULL
                AND first_seen_at < \(bind: cutoff.milliseconds)
                AND NOT EXISTS (SELECT 1 FROM web_purchases w WHERE w.external_purchase_id = external_tokens.external_purchase_id)
                LIMIT \(bind: limit)
                """
            ).all().map { try $0.decode(column: "external_purchase_id", as: String.self) }
            guard !ids.isEmpty else { return 0 }
            try await sql.raw("DELETE FROM external_tokens WHERE external_purchase_id IN (\(binds: ids))").run()
            return ids.count
        }
    }

    static func register(_ id: String, accountId: String, tokenType: String?, sql: any SQLDatabase, at: Int64)
        async throws -> Bool
    {
        let environment = id.hasPrefix("SANDBOX") ? "Sandbox" : "Production"
        try await sql.raw(
            """
            INSERT INTO external_tokens (external_purchase_id, account_id, token_type, environment, first_seen_at)
            VALUES (\(bind: id), \(bind: accountId), \(bind: tokenType), \(bind: environment), \(bind: at))
            ON CONFLICT (external_purchase_id) DO UPDATE SET
                account_id = COALESCE(external_tokens.account_id, excluded.account_id),
                token_type = COALESCE(external_tokens.token_type, excluded.token_type)
            """
        ).run()
        let owner = try await sql.raw(
            "SELECT account_id FROM external_tokens WHERE external_purchase_id = \(bind: id)"
        ).first()?.decode(column: "account_id", as: String?.self)
        return owner == accountId
    }

    /// One token as recorded, nil when unknown.
    public func token(_ id: String) async throws -> Token? {
        try await tokens(only: id).first
    }

    public func tokens(unreportedOnly: Bool = false, limit: Int = 200) async throws -> [Token] {
        try await tokens(unreportedOnly: unreportedOnly, only: nil, limit: limit)
    }

    func tokens(unreportedOnly: Bool = false, only: String?, limit: Int = 200) async throws -> [Token] {
        try await database.read { sql in
            let filter: SQLQueryString =
                if let only {
                    "WHERE t.external_purchase_id = \(bind: only)"
                } else if unreportedOnly {
                    "WHERE t.unreported_notices > 0 OR EXISTS (SELECT 1 FROM web_purchases w WHERE w.external_purchase_id = t.external_purchase_id AND (w.reported_buy = 0 OR (w.refunded_at IS NOT NULL AND w.reported_refund = 0)))"
                } else {
                    ""
                }
            return try await sql.raw(
                """
                SELECT t.*, (SELECT COUNT(*) FROM web_purchases w WHERE w.external_purchase_id = t.external_purchase_id
                             AND w.reported_buy = 0) +
                            (SELECT COUNT(*) FROM web_purchases w WHERE w.external_purchase_id = t.external_purchase_id
                             AND w.refunded_at IS NOT NULL AND w.reported_refund = 0) AS pending_items
                FROM external_tokens t \(filter)
                ORDER BY t.first_seen_at DESC LIMIT \(bind: max(1, min(limit, 1000)))
                """
            ).all().map { row in
                Token(
                    externalPurchaseId: try row.decode(column: "external_purchase_id", as: String.self),
                    accountId: try row.decode(column: "account_id", as: String?.self),
                    tokenType: try row.decode(column: "token_type", as: String?.self),
                    environment: try row.decode(column: "environment", as: String.self),
                    createdAt: try row.decode(column: "created_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    lastNotice: try row.decode(column: "last_notice", as: String?.self),
                    unreportedNotices: try row.decode(column: "unreported_notices", as: Int.self),
                    reportedAt: try row.decode(column: "reported_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    unreportedLineItems: try row.decode(column: "pending_items", as: Int.self))
            }
        }
    }
}

// MARK: Web purchases

extension ExternalPurchaseStore {
    /// A payment the app's backend took on its own web checkout.
    public struct WebPayment: Sendable, Hashable {
        public var paymentId: String
        public var accountId: String
        public var productId: String
        public var quantity: Int
        /// Milliunits of `currency`, tax included; the tax in it.
        public var amountMilli: Int64
        public var taxMilli: Int64
        public var currency: String
        public var taxCountry: String?
        public var externalPurchaseId: String?
        /// Subscriptions: the payment that started the subscription (nil: this one), and the end
        /// of the period this payment paid for (ms).
        public var originalPaymentId: String?
        public var expiresAt: Int64?
        /// When it was recorded (ms), as read back.
        public var purchasedAt: Int64?
        /// The delivery key: one delivery per payment (`web:<paymentId>`, or the store's own
        /// transaction id for a store's payment reported here).
        public var transactionId: String

        public init(
            paymentId: String, accountId: String, productId: String, quantity: Int, amountMilli: Int64,
            taxMilli: Int64, currency: String, taxCountry: String?, externalPurchaseId: String?,
            originalPaymentId: String? = nil, expiresAt: Int64? = nil, purchasedAt: Int64? = nil,
            transactionId: String? = nil
        ) {
            self.transactionId = transactionId ?? StoreTransaction.webTransactionId(paymentId: paymentId)
            self.originalPaymentId = originalPaymentId
            self.expiresAt = expiresAt
            self.purchasedAt = purchasedAt
            self.paymentId = paymentId
            self.accountId = accountId
            self.productId = productId
            self.quantity = quantity
            self.amountMilli = amountMilli
            self.taxMilli = taxMilli
            self.currency = currency
            self.taxCountry = taxCountry
            self.externalPurchaseId = externalPurchaseId
        }

        /// A subscription's key: its first payment's.
        public var originalTransactionId: String {
            StoreTransaction.webTransactionId(paymentId: originalPaymentId ?? paymentId)
        }

        init(row: some SQLRow) throws {
            self.init(
                paymentId: try row.decode(column: "payment_id", as: String.self),
                accountId: try row.decode(column: "account_id", as: String.self),
                productId: try row.decode(column: "product_id", as: String.self),
                quantity: try row.decode(column: "quantity", as: Int.self),
                amountMilli: try row.decode(column: "amount_milli", as: Int64.self),
                taxMilli: try row.decode(column: "tax_milli", as: Int64.self),
                currency: try row.decode(column: "currency", as: String.self),
                taxCountry: try row.decode(column: "tax_country", as: String?.self),
                externalPurchaseId: try row.decode(column: "external_purchase_id", as: String?.self),
                originalPaymentId: try row.decode(column: "original_payment_id", as: String?.self),
                expiresAt: try row.decode(column: "expires_at", as: Int64?.self),
                purchasedAt: try row.decode(column: "purchased_at", as: Int64.self),
                transactionId: try row.decode(column: "transaction_id", as: String.self))
        }
    }

    /// The web payment a delivered transaction is (`web:<paymentId>`), nil when none is.
    public func payment(ofTransaction transactionId: String) async throws -> WebPayment? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM web_purchases WHERE transaction_id = \(bind: transactionId)").first().map {
                try WebPayment(row: $0)
            }
        }
    }

    /// A recorded web payment, nil when unknown.
    public func payment(_ paymentId: String) async throws -> WebPayment? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM web_purchases WHERE payment_id = \(bind: paymentId)").first().map {
                try WebPayment(row: $0)
            }
        }
    }

    public enum RecordOutcome: Sendable, Hashable {
        /// Recorded now or before with the same facts: deliver (exactly once by its id).
        case recorded(purchasedAt: Date)
        /// The paymentId was recorded with other facts.
        case conflict
        /// The token is another account's.
        case tokenOfAnotherAccount
    }

    /// Records the payment (and its token, and the report that will carry it) before it is
    /// delivered: a retry with the same facts finds it and delivers what is missing.
    public func record(_ payment: WebPayment, reporting: Bool, now: Date) async throws -> RecordOutcome {
        try await database.transaction { sql in
            try await Self.record(payment, reporting: reporting, sql: sql, now: now)
        }
    }

    /// `record` inside the caller's database transaction (a store's delivery records the
    /// payment it reports with the delivery itself).
    public static func record(_ payment: WebPayment, reporting: Bool, sql: any SQLDatabase, now: Date) async throws
        -> RecordOutcome
    {
        do {
            if let row = try await sql.raw(
                "SELECT * FROM web_purchases WHERE payment_id = \(bind: payment.paymentId)"
            ).first() {
                let same =
                    try row.decode(column: "account_id", as: String.self) == payment.accountId
                    && row.decode(column: "product_id", as: String.self) == payment.productId
                    && row.decode(column: "quantity", as: Int.self) == payment.quantity
                    && row.decode(column: "amount_milli", as: Int64.self) == payment.amountMilli
                    && row.decode(column: "currency", as: String.self) == payment.currency
                    && row.decode(column: "external_purchase_id", as: String?.self) == payment.externalPurchaseId
                    && row.decode(column: "original_payment_id", as: String?.self) == payment.originalPaymentId
                    && row.decode(column: "expires_at", as: Int64?.self) == payment.expiresAt
                return same
                    ? .recorded(purchasedAt: Date(milliseconds: try row.decode(column: "purchased_at", as: Int64.self)))
                    : .conflict
            }
            var payment = payment
            if payment.taxCountry == nil, let original = payment.originalPaymentId {
                // A renewal's tax country is its subscription's first payment's.
                payment.taxCountry = try await sql.raw(
                    "SELECT tax_country FROM web_purchases WHERE payment_id = \(bind: original)"
                ).first()?.decode(column: "tax_country", as: String?.self)
            }
            if let token = payment.externalPurchaseId {
                guard
                    try await Self.register(
                        token, accountId: payment.accountId, tokenType: nil, sql: sql, at: now.milliseconds)
                else { return .tokenOfAnotherAccount }
            }
            try await sql.raw(
                """
                INSERT INTO web_purchases (payment_id, transaction_id, account_id, product_id, quantity, amount_milli,
                                           tax_milli, currency, tax_country, external_purchase_id, line_item_id,
                                           purchased_at, original_payment_id, expires_at)
                VALUES (\(bind: payment.paymentId), \(bind: payment.transactionId), \(bind: payment.accountId),
                        \(bind: payment.productId), \(bind: payment.quantity), \(bind: payment.amountMilli),
                        \(bind: payment.taxMilli), \(bind: payment.currency), \(bind: payment.taxCountry),
                        \(bind: payment.externalPurchaseId), \(bind: UUID().uuidString.lowercased()),
                        \(bind: now.milliseconds), \(bind: payment.originalPaymentId), \(bind: payment.expiresAt))
                """
            ).run()
            if reporting, let token = payment.externalPurchaseId {
                try await JobStore.insert(
                    kind: Self.reportJobKind, dedupeKey: "\(Self.reportJobKind)|\(token)|buy:\(payment.paymentId)",
                    payload: token, sql: sql, now: now)
            }
            try await PurchaseStore.audit(
                sql, actor: "backend", action: "web_purchase", subject: payment.transactionId,
                detail:
                    "web payment \(payment.paymentId): \(payment.quantity) × '\(payment.productId)' for account \(Identifiers.quoted(payment.accountId)), \(payment.amountMilli) milli-\(payment.currency)\(payment.externalPurchaseId.map { ", external purchase token \($0)" } ?? "")",
                at: now.milliseconds)
            return .recorded(purchasedAt: now)
        }
    }

    /// A refund of part (or the rest) of a recorded payment, `amountMilli` tax included: its
    /// own REFUND line item (its share of the tax), queued for the token's next report once
    /// per `refundKey`. False when the payment is not recorded (nothing was reported for it).
    @discardableResult
    public static func recordRefund(
        paymentId: String, refundKey: String, amountMilli: Int64, reporting: Bool, sql: any SQLDatabase, now: Date
    ) async throws -> Bool {
        guard
            let row = try await sql.raw("SELECT * FROM web_purchases WHERE payment_id = \(bind: paymentId)").first()
        else { return false }
        let payment = try WebPayment(row: row)
        let refunded =
            try await sql.raw(
                "SELECT CAST(COALESCE(SUM(amount_milli), 0) AS BIGINT) AS total FROM external_refunds WHERE payment_id = \(bind: paymentId)"
            ).first()?.decode(column: "total", as: Int64.self) ?? 0
        // Never more than what is left of the buy (Apple refuses a refund above it).
        let amount = min(max(0, amountMilli), max(0, payment.amountMilli - refunded))
        guard amount > 0 else { return true }
        let tax =
            payment.amountMilli > 0
            ? Int64((Double(payment.taxMilli) * Double(amount) / Double(payment.amountMilli)).rounded()) : 0
        let inserted =
            try await sql.raw(
                """
                INSERT INTO external_refunds (refund_key, payment_id, line_item_id, amount_milli, tax_milli, refunded_at)
                VALUES (\(bind: refundKey), \(bind: paymentId), \(bind: UUID().uuidString.lowercased()), \(bind: amount),
                        \(bind: tax), \(bind: now.milliseconds))
                ON CONFLICT (refund_key) DO NOTHING
                RETURNING refund_key
                """
            ).first() != nil
        if inserted, reporting, let token = payment.externalPurchaseId {
            try await JobStore.insert(
                kind: reportJobKind, dedupeKey: "\(reportJobKind)|\(token)|refund:\(refundKey)",
                payload: token, sql: sql, now: now)
        }
        return true
    }

    /// A web payment refunded by the backend's payment provider: marked, and its refund line
    /// item queued for the token's next report. Nil for an unknown payment.
    public func markRefunded(_ paymentId: String, reporting: Bool, now: Date) async throws -> WebPayment? {
        try await database.transaction { sql in
            guard
                let row = try await sql.raw("SELECT * FROM web_purchases WHERE payment_id = \(bind: paymentId)").first()
            else { return nil }
            let token = try row.decode(column: "external_purchase_id", as: String?.self)
            try await sql.raw(
                """
                UPDATE web_purchases SET refunded_at = \(bind: now.milliseconds),
                refund_line_item_id = \(bind: UUID().uuidString.lowercased())
                WHERE payment_id = \(bind: paymentId) AND refunded_at IS NULL
                """
            ).run()
            if reporting, let token {
                try await JobStore.insert(
                    kind: Self.reportJobKind, dedupeKey: "\(Self.reportJobKind)|\(token)|refund:\(paymentId)",
                    payload: token, sql: sql, now: now)
            }
            return try WebPayment(row: row)
        }
    }
}

// MARK: Reports

extension ExternalPurchaseStore {
    /// A subscription payment's line item fields: `SUBSCRIPTION_START` for the first payment,
    /// else `RENEWAL` (or `SUBSCRIPTION_CHANGE` when the product differs from the payment before
    /// it) referencing the first payment's line item; the paid period and its days.
    static func subscriptionLineItem(
        _ item: inout ExternalSalesReport.LineItem, _ payment: WebPayment, until expiresAt: Int64, sql: any SQLDatabase
    ) async throws {
        let start = payment.purchasedAt ?? expiresAt
        item.subscriptionStartDate = start
        item.subscriptionEndDate = expiresAt
        item.subscriptionDaysOfPaidService = max(1, (expiresAt - start + 86_399_999) / 86_400_000)
        guard let original = payment.originalPaymentId, original != payment.paymentId else {
            item.subscriptionEvent = "SUBSCRIPTION_START"
            return
        }
        item.referenceLineItemId = try await sql.raw(
            "SELECT line_item_id FROM web_purchases WHERE payment_id = \(bind: original)"
        ).first()?.decode(column: "line_item_id", as: String.self)
        let previous = try await sql.raw(
            """
            SELECT product_id FROM web_purchases
            WHERE (payment_id = \(bind: original) OR original_payment_id = \(bind: original))
              AND payment_id <> \(bind: payment.paymentId)
              AND (purchased_at < \(bind: start) OR (purchased_at = \(bind: start) AND payment_id < \(bind: payment.paymentId)))
            ORDER BY purchased_at DESC, payment_id DESC LIMIT 1
            """
        ).first()?.decode(column: "product_id", as: String.self)
        item.subscriptionEvent = previous.map { $0 == payment.productId } ?? true ? "RENEWAL" : "SUBSCRIPTION_CHANGE"
    }

    /// The report to send now for `token`: a report that failed for a retryable reason goes
    /// again with its own requestIdentifier and body; otherwise a new one with every line item
    /// not yet reported (a buy before its refund), or — for a token never reported — NO_LINE_ITEM
    /// (the app knew it) or UNRECOGNIZED_TOKEN (only Apple's notice named it). Nil: nothing to send.
    public func nextReport(_ token: String, now: Date) async throws -> (String, ExternalSalesReport)? {
        try await database.transaction { sql in
            if let pending = try await sql.raw(
                """
                SELECT request_identifier, payload FROM external_reports
                WHERE external_purchase_id = \(bind: token) AND state = 'pending' ORDER BY created_at LIMIT 1
                """
            ).first() {
                let report = try JSONDecoder().decode(
                    ExternalSalesReport.self, from: Data(try pending.decode(column: "payload", as: String.self).utf8)
                )
                return (try pending.decode(column: "request_identifier", as: String.self), report)
            }
            guard
                let tokenRow = try await sql.raw(
                    "SELECT * FROM external_tokens WHERE external_purchase_id = \(bind: token)"
                ).first()
            else { return nil }
            var items: [ExternalSalesReport.LineItem] = []
            for row in try await sql.raw(
                "SELECT * FROM web_purchases WHERE external_purchase_id = \(bind: token) ORDER BY purchased_at, payment_id"
            ).all() {
                let amount = try row.decode(column: "amount_milli", as: Int64.self)
                let tax = try row.decode(column: "tax_milli", as: Int64.self)
                let currency = try row.decode(column: "currency", as: String.self)
                let lineItemId = try row.decode(column: "line_item_id", as: String.self)
                let refunded = try row.decode(column: "refunded_at", as: Int64?.self)
                let payment = try WebPayment(row: row)
                let purchasedAt = payment.purchasedAt ?? 0
                func item(_ id: String, event: String, at: Int64, net: Int64, reference: String?) throws
                    -> ExternalSalesReport.LineItem
                {
                    ExternalSalesReport.LineItem(
                        lineItemId: id, creationDate: at, eventType: event,
                        productType: payment.expiresAt == nil
                            ? ExternalSalesReport.LineItem.oneTimeBuy : ExternalSalesReport.LineItem.subscription,
                        productIdentifier: payment.productId, quantity: Int64(payment.quantity),
                        pricingCurrency: currency, reportingCurrency: currency, amountTaxInclusive: amount,
                        amountTaxExclusive: amount - tax, taxAmount: tax, netAmountTaxExclusive: net,
                        taxCountry: payment.taxCountry, referenceLineItemId: reference)
                }
                // Partial refunds (a payment provider's), each its own REFUND line item.
                let partial = try await sql.raw(
                    "SELECT * FROM external_refunds WHERE payment_id = \(bind: payment.paymentId) ORDER BY refunded_at, refund_key"
                ).all()
                var partiallyRefunded: Int64 = 0
                for refund in partial {
                    partiallyRefunded +=
                        try refund.decode(column: "amount_milli", as: Int64.self)
                        - refund.decode(column: "tax_milli", as: Int64.self)
                }
                if try row.decode(column: "reported_buy", as: Int.self) == 0 {
                    var buy = try item(
                        lineItemId, event: "BUY", at: purchasedAt,
                        net: refunded == nil ? max(0, amount - tax - partiallyRefunded) : 0, reference: nil)
                    if let expiresAt = payment.expiresAt {
                        // A subscription's period: its start, a renewal or a change of product,
                        // each after the first pointing at the first payment's line item.
                        try await Self.subscriptionLineItem(&buy, payment, until: expiresAt, sql: sql)
                    }
                    items.append(buy)
                }
                if let refunded, try row.decode(column: "reported_refund", as: Int.self) == 0,
                    let refundId = try row.decode(column: "refund_line_item_id", as: String?.self)
                {
                    items.append(try item(refundId, event: "REFUND", at: refunded, net: 0, reference: lineItemId))
                }
                for refund in partial where try refund.decode(column: "reported", as: Int.self) == 0 {
                    var line = try item(
                        try refund.decode(column: "line_item_id", as: String.self), event: "REFUND",
                        at: try refund.decode(column: "refunded_at", as: Int64.self), net: 0, reference: lineItemId)
                    let refundAmount = try refund.decode(column: "amount_milli", as: Int64.self)
                    let refundTax = try refund.decode(column: "tax_milli", as: Int64.self)
                    line.amountTaxInclusive = refundAmount
                    line.taxAmount = refundTax
                    line.amountTaxExclusive = refundAmount - refundTax
                    items.append(line)
                }
            }
            let status: String
            if !items.isEmpty {
                status = ExternalSalesReport.lineItem
            } else if try tokenRow.decode(column: "reported_at", as: Int64?.self) != nil {
                return nil
            } else if let account = try tokenRow.decode(column: "account_id", as: String?.self) {
                // A custom-link token (ACQUISITION / SERVICES) of a customer who already had an
                // active one of the same type when it was created: Apple's DUPLICATE_TOKEN
                // (the purchases are reported under the other token).
                let type = try tokenRow.decode(column: "token_type", as: String?.self)
                let created =
                    try tokenRow.decode(column: "created_at", as: Int64?.self)
                    ?? tokenRow.decode(column: "first_seen_at", as: Int64.self)
                var duplicate = false
                if let type, ["ACQUISITION", "SERVICES"].contains(type) {
                    duplicate =
                        try await sql.raw(
                            """
                            SELECT 1 AS found FROM external_tokens
                            WHERE account_id = \(bind: account) AND token_type = \(bind: type)
                              AND external_purchase_id <> \(bind: token)
                              AND (COALESCE(created_at, first_seen_at) < \(bind: created)
                                   OR (COALESCE(created_at, first_seen_at) = \(bind: created)
                                       AND external_purchase_id < \(bind: token)))
                              AND (expires_at IS NULL OR expires_at > \(bind: created))
                            LIMIT 1
                            """
                        ).first() != nil
                }
                status = duplicate ? ExternalSalesReport.duplicateToken : ExternalSalesReport.noLineItem
            } else {
                status = ExternalSalesReport.unrecognizedToken
            }
            let requestId = UUID().uuidString.lowercased()
            let report = ExternalSalesReport(
                requestIdentifier: requestId, externalPurchaseId: token, status: status,
                lineItems: items.isEmpty ? nil : items)
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            try await sql.raw(
                """
                INSERT INTO external_reports (request_identifier, external_purchase_id, status, payload, state, created_at)
                VALUES (\(bind: requestId), \(bind: token), \(bind: status),
                        \(bind: String(decoding: try encoder.encode(report), as: UTF8.self)), 'pending', \(bind: now.milliseconds))
                """
            ).run()
            return (requestId, report)
        }
    }

    /// Apple accepted the report: its line items and the token are reported.
    public func reportSent(_ requestId: String, _ report: ExternalSalesReport, now: Date) async throws {
        try await database.transaction { sql in
            let at = now.milliseconds
            try await sql.raw(
                """
                UPDATE external_reports SET state = 'sent', sent_at = \(bind: at), attempts = attempts + 1
                WHERE request_identifier = \(bind: requestId)
                """
            ).run()
            for item in report.lineItems ?? [] {
                guard let id = item.lineItemId else { continue }
                if item.eventType == "REFUND" {
                    try await sql.raw(
                        "UPDATE web_purchases SET reported_refund = 1 WHERE refund_line_item_id = \(bind: id)"
                    )
                    .run()
                    try await sql.raw("UPDATE external_refunds SET reported = 1 WHERE line_item_id = \(bind: id)").run()
                } else {
                    try await sql.raw("UPDATE web_purchases SET reported_buy = 1 WHERE line_item_id = \(bind: id)")
                        .run()
                }
            }
            try await sql.raw(
                """
                UPDATE external_tokens SET reported_at = \(bind: at)
                WHERE external_purchase_id = \(bind: report.externalPurchaseId ?? "")
                """
            ).run()
            try await PurchaseStore.audit(
                sql, actor: "storekeeper", action: "external_report_sent", subject: report.externalPurchaseId,
                detail:
                    "External Purchase report \(requestId) (\(report.status ?? "?"), \(report.lineItems?.count ?? 0) line items) accepted",
                at: at)
        }
    }

    /// Apple refused the report for good (400: nothing accepted): kept for the operator.
    public func reportFailed(_ requestId: String, token: String, reason: String, final: Bool, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE external_reports SET state = \(bind: final ? "failed" : "pending"), response = \(bind: reason),
                attempts = attempts + 1 WHERE request_identifier = \(bind: requestId)
                """
            ).run()
            if final {
                try await PurchaseStore.audit(
                    sql, actor: "storekeeper", action: "external_report_refused", subject: token,
                    detail: "External Purchase report \(requestId) refused by Apple: \(reason)", at: now.milliseconds)
            }
        }
    }

    /// The report journal of a token (or all), newest first.
    public func reports(token: String? = nil, limit: Int = 200) async throws -> [(
        requestIdentifier: String, token: String, status: String, state: String, response: String?, createdAt: Date
    )] {
        try await database.read { sql in
            let filter: SQLQueryString = token.map { "WHERE external_purchase_id = \(bind: $0)" } ?? ""
            return try await sql.raw(
                "SELECT * FROM external_reports \(filter) ORDER BY created_at DESC LIMIT \(bind: max(1, min(limit, 1000)))"
            ).all().map { row in
                (
                    try row.decode(column: "request_identifier", as: String.self),
                    try row.decode(column: "external_purchase_id", as: String.self),
                    try row.decode(column: "status", as: String.self), try row.decode(column: "state", as: String.self),
                    try row.decode(column: "response", as: String?.self),
                    Date(milliseconds: try row.decode(column: "created_at", as: Int64.self))
                )
            }
        }
    }
}

extension NotificationStore {
    /// A refund this server decided itself (a web payment the provider refunded), through the
    /// one refund path, in one transaction.
    public func applyRefund(_ event: RefundEvent, settings: Settings, now: Date, actor: String = "backend")
        async throws -> (String, String)
    {
        let kind = database.kind
        return try await database.transaction { sql in
            try await NotificationStore.lock([event.originalTransactionId], sql: sql, kind: kind)
            return try await NotificationApplier.refund(event, settings: settings, sql: sql, now: now, actor: actor)
        }
    }
}
