import Foundation
import SQLKit
import StoreKeeperCore

/// One transaction by any of its ids, with its account, order, refunds and anomalies; and
/// transfers of a purchase between accounts.
public struct TransactionStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }
}

/// Support's look-up: any id a player or a store quotes — an App Store transaction or original
/// transaction id, a Google order id as Google prints it (`GPA.…`, with or without `gp:`), a
/// Google purchase token, a web payment id — to the transaction this server recorded, with its
/// account, order, refunds and anomalies. Exact matches only, each by an index or a key.
extension TransactionStore {
    public struct TransactionRecord: Sendable, Hashable {
        public var transactionId: String
        public var originalTransactionId: String
        public var store: Store
        public var appId: String?
        public var accountId: String?
        public var orderId: String?
        public var productId: String
        public var quantity: Int
        public var environment: String
        public var storefront: String?
        public var purchasedAt: Date?
        public var deliveredAt: Date?
        public var expiresAt: Date?
        public var priceMilli: Int64?
        public var currency: String?
        /// Whether it was delivered (nil `deliveredAt`: refunded before anyone claimed it).
        public var delivered: Bool
        public var refunds: [Refund]
        public var anomalies: [AnomalyStore.StoredAnomaly]
    }

    public struct Refund: Sendable, Hashable {
        public var refundedAt: Date
        /// The share refunded, in thousandths of a percent (100 000: everything).
        public var share: Int32
        public var type: String?
        /// Refunded before anyone claimed the purchase: never delivered.
        public var beforeDelivery: Bool
    }

    /// The transaction ids `id` names, most specific first: the id itself, the Google order id
    /// with its `gp:` prefix, a purchase token's order, a web payment's transaction, a Stripe
    /// object's id without its `stripe:` (`pi_…`, `in_…`, `sub_…`), our order id or an order's
    /// `appAccountToken` (the order's payment, or a checkout's without an account), an original
    /// transaction's latest.
    static func transactionIds(naming id: String, sql: any SQLDatabase) async throws -> [String] {
        var ids = [id, GooglePlayPlanner.prefix + id]
        if let order = googleOrderId(quoted: id), order != id { ids.append(GooglePlayPlanner.prefix + order) }
        ids.append(StoreTransaction.webTransactionId(paymentId: id))
        ids.append("stripe:" + id)
        // Our order, by its id or its token (what a support ticket, a log line or the app shows).
        for row in try await sql.raw(
            """
            SELECT transaction_id FROM orders WHERE order_id = \(bind: id) AND transaction_id IS NOT NULL
            UNION ALL
            SELECT transaction_id FROM orders WHERE app_account_token = \(bind: id.lowercased()) AND transaction_id IS NOT NULL
            UNION ALL
            SELECT transaction_id FROM stripe_checkouts WHERE order_id = \(bind: id) AND transaction_id IS NOT NULL
            UNION ALL
            SELECT transaction_id FROM stripe_checkouts
            WHERE app_account_token = \(bind: id.lowercased()) AND transaction_id IS NOT NULL
            """
        ).all() {
            if let transaction = try row.decode(column: "transaction_id", as: String?.self) { ids.append(transaction) }
        }
        for row in try await sql.raw(
            """
            SELECT order_id, original_transaction_id FROM google_purchases WHERE purchase_token = \(bind: id)
            """
        ).all() {
            if let order = try row.decode(column: "order_id", as: String?.self) {
                ids.append(GooglePlayPlanner.prefix + order)
            }
            if let original = try row.decode(column: "original_transaction_id", as: String?.self) {
                ids.append(original)
            }
        }
        return ids
    }

    /// A Google order id as a player may quote it: `gpa.3302-…` typed in lower case, or the
    /// digits alone (`3302-0002-1234-00002`, a renewal's `..0` suffix kept) — Google's own
    /// spelling, `GPA.` and the digits; nil when `id` is not of that shape.
    static func googleOrderId(quoted id: String) -> String? {
        var digits = Substring(id)
        if digits.count > 4, digits.prefix(4).lowercased() == "gpa." { digits = digits.dropFirst(4) }
        let groups = digits.split(separator: "..", maxSplits: 1, omittingEmptySubsequences: false)
        let parts = groups[0].split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count >= 2, parts.allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isASCIIDigitCharacter) }),
            groups.count == 1 || (!groups[1].isEmpty && groups[1].allSatisfy(\.isASCIIDigitCharacter))
        else { return nil }
        return "GPA." + digits
    }

    public func transaction(named id: String) async throws -> TransactionRecord? {
        let term = id.trimmingCharacters(in: .whitespaces)
        guard !term.isEmpty, term.unicodeScalars.count <= 4096 else { return nil }
        return try await database.read { sql in
            let ids = try await Self.transactionIds(naming: term, sql: sql)
            var row = try await sql.raw(
                "SELECT * FROM deliveries WHERE transaction_id IN (\(binds: ids)) ORDER BY delivered_at DESC LIMIT 1"
            ).first()
            if row == nil {
                // An original transaction (or a Google chain's identity): its latest period.
                row = try await sql.raw(
                    """
                    SELECT * FROM deliveries WHERE original_transaction_id IN (\(binds: ids))
                    ORDER BY delivered_at DESC, transaction_id DESC LIMIT 1
                    """
                ).first()
            }
            if let row { return try await Self.record(delivery: row, sql: sql) }
            // Refunded before anyone claimed it: recorded by transaction id, never delivered.
            guard
                let refund = try await sql.raw(
                    "SELECT * FROM undelivered_refunds WHERE transaction_id IN (\(binds: ids)) LIMIT 1"
                ).first()
            else { return nil }
            let transactionId = try refund.decode(column: "transaction_id", as: String.self)
            var store = try refund.decode(column: "store", as: String?.self).flatMap(Store.init(rawValue:))
            if store == nil { store = try await Self.storeOfUndelivered(transactionId, sql: sql) }
            return TransactionRecord(
                transactionId: transactionId,
                originalTransactionId: try refund.decode(column: "original_transaction_id", as: String.self),
                store: store ?? .appStore, appId: nil, accountId: nil,
                orderId: nil, productId: try refund.decode(column: "product_id", as: String.self), quantity: 1,
                environment: "Production", storefront: nil, purchasedAt: nil, deliveredAt: nil, expiresAt: nil,
                priceMilli: nil, currency: nil, delivered: false,
                refunds: [
                    Refund(
                        refundedAt: Date(milliseconds: try refund.decode(column: "refunded_at", as: Int64.self)),
                        share: try refund.decode(column: "share", as: Int32.self),
                        type: try refund.decode(column: "revocation_type", as: String?.self), beforeDelivery: true)
                ],
                anomalies: try await Self.anomalies(of: transactionId, sql: sql))
        }
    }

    /// A refund recorded before migration 35 has no store of its own: Google's record of the
    /// token says it, else a web payment's, else (ids of digits) the App Store's.
    static func storeOfUndelivered(_ transactionId: String, sql: any SQLDatabase) async throws -> Store {
        if try await sql.raw(
            """
            SELECT 1 AS found FROM google_purchases
            WHERE original_transaction_id = \(bind: transactionId)
               OR order_id = \(bind: String(transactionId.dropFirst(GooglePlayPlanner.prefix.count)))
            LIMIT 1
            """
        ).first() != nil {
            return .googlePlay
        }
        if try await sql.raw("SELECT 1 AS found FROM web_purchases WHERE transaction_id = \(bind: transactionId)")
            .first() != nil
        {
            return .web
        }
        return .appStore
    }

    static func record(delivery row: any SQLRow, sql: any SQLDatabase) async throws -> TransactionRecord {
        let transactionId = try row.decode(column: "transaction_id", as: String.self)
        var refunds: [Refund] = []
        if let refundedAt = try row.decode(column: "refunded_at", as: Int64?.self) {
            refunds.append(
                Refund(
                    refundedAt: Date(milliseconds: refundedAt),
                    share: try row.decode(column: "refund_share", as: Int32?.self) ?? RefundPlanner.wholeShare,
                    type: try row.decode(column: "refund_type", as: String?.self), beforeDelivery: false))
        }
        if let early = try await sql.raw(
            "SELECT * FROM undelivered_refunds WHERE transaction_id = \(bind: transactionId)"
        ).first() {
            refunds.insert(
                Refund(
                    refundedAt: Date(milliseconds: try early.decode(column: "refunded_at", as: Int64.self)),
                    share: try early.decode(column: "share", as: Int32.self),
                    type: try early.decode(column: "revocation_type", as: String?.self), beforeDelivery: true),
                at: 0)
        }
        return TransactionRecord(
            transactionId: transactionId,
            originalTransactionId: try row.decode(column: "original_transaction_id", as: String.self),
            store: Store(rawValue: try row.decode(column: "store", as: String.self)) ?? .appStore,
            appId: try row.decode(column: "app_id", as: String?.self),
            accountId: try row.decode(column: "account_id", as: String.self),
            orderId: try row.decode(column: "order_id", as: String?.self),
            productId: try row.decode(column: "product_id", as: String.self),
            quantity: try row.decode(column: "quantity", as: Int.self),
            environment: try row.decode(column: "environment", as: String.self),
            storefront: try row.decode(column: "storefront", as: String?.self),
            purchasedAt: try row.decode(column: "purchased_at", as: Int64?.self).map(Date.init(milliseconds:)),
            deliveredAt: Date(milliseconds: try row.decode(column: "delivered_at", as: Int64.self)),
            expiresAt: try row.decode(column: "period_end", as: Int64?.self).map(Date.init(milliseconds:)),
            priceMilli: try row.decode(column: "price_milli", as: Int64?.self),
            currency: try row.decode(column: "currency", as: String?.self), delivered: true, refunds: refunds,
            anomalies: try await anomalies(of: transactionId, sql: sql))
    }

    static func anomalies(of transactionId: String, sql: any SQLDatabase) async throws -> [AnomalyStore.StoredAnomaly] {
        try await sql.raw(
            "SELECT * FROM anomalies WHERE transaction_id = \(bind: transactionId) ORDER BY created_at DESC LIMIT 50"
        ).all().map(AnomalyStore.decodeAnomaly)
    }
}

extension TransactionStore {
    public enum TransferOutcome: Sendable, Hashable {
        /// Moved: `from` held it, `to` does now.
        case transferred(from: String)
        /// `to` holds it already: nothing changed.
        case alreadyHeld
        /// Nobody owns it (a consumable, spent as it was delivered; or nothing delivered).
        case notOwned
    }

    /// Support moves a purchase to another account ("I bought it on my old account"): its
    /// ownership, entitlements and subscription, with an audit entry — one database transaction
    /// under the purchase's lock.
    public func transfer(
        originalTransactionId original: String, to account: String, actor: String, note: String, now: Date
    ) async throws -> TransferOutcome {
        let kind = database.kind
        return try await database.transaction { sql in
            try await NotificationStore.lock([original], sql: sql, kind: kind)
            guard
                let owner = try await sql.raw(
                    "SELECT account_id FROM ownership WHERE original_transaction_id = \(bind: original)"
                ).first()?.decode(column: "account_id", as: String.self)
            else { return .notOwned }
            if Identifiers.same(owner, account) { return .alreadyHeld }
            let at = now.milliseconds
            try await sql.raw(
                """
                UPDATE ownership SET account_id = \(bind: account), bound_at = \(bind: at)
                WHERE original_transaction_id = \(bind: original)
                """
            ).run()
            try await sql.raw(
                """
                INSERT INTO entitlements (account_id, entitlement_id, original_transaction_id, product_id, expires_at)
                SELECT \(bind: account), entitlement_id, original_transaction_id, product_id, expires_at FROM entitlements
                WHERE account_id = \(bind: owner) AND original_transaction_id = \(bind: original)
                ON CONFLICT (account_id, entitlement_id, original_transaction_id)
                DO UPDATE SET expires_at = excluded.expires_at, product_id = excluded.product_id
                """
            ).run()
            try await sql.raw(
                "DELETE FROM entitlements WHERE account_id = \(bind: owner) AND original_transaction_id = \(bind: original)"
            ).run()
            try await sql.raw(
                "UPDATE subscriptions SET account_id = \(bind: account) WHERE original_transaction_id = \(bind: original)"
            ).run()
            // Its deliveries are the new holder's too: a replay from the old account is then
            // another account's purchase, not its own delivery.
            try await sql.raw(
                """
                UPDATE deliveries SET account_id = \(bind: account)
                WHERE original_transaction_id = \(bind: original) AND account_id = \(bind: owner)
                """
            ).run()
            try await PurchaseStore.audit(
                sql, actor: actor, action: "ownership_transfer", subject: original,
                detail:
                    "moved from account \(Identifiers.quoted(owner)) to \(Identifiers.quoted(account)) by support\(note.isEmpty ? "" : ": \(note)")",
                at: at)
            return .transferred(from: owner)
        }
    }
}

extension Character {
    fileprivate var isASCIIDigitCharacter: Bool { isASCII && isNumber }
}
