import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Orders: made before payment (the account token the app passes to the store), matched
/// to the store's transaction on delivery, cancelled, expired when unpaid.
public struct OrderStore: Sendable {
    public let database: Database
    /// More accounts than this on one Apple Account (appTransactionId) raise `shared_apple_id`.
    public let sharedAppleIdLimit: Int

    public init(database: Database, sharedAppleIdLimit: Int = OfferStore.defaultSharedAppleIdLimit) {
        self.database = database
        self.sharedAppleIdLimit = sharedAppleIdLimit
    }
}

/// Orders before payment: created with their appAccountToken, read, expired.
extension OrderStore {
    /// The account already has `limit` unpaid, unexpired orders (`too_many_open_orders`).
    public struct TooManyOpenOrders: Error, Sendable {
        public var limit: Int
    }

    /// The account created `limit` orders in the last 24 hours, whatever became of them
    /// (`too_many_orders`): what bounds the rows one client token can write.
    public struct TooManyOrdersToday: Error, Sendable {
        public var limit: Int
    }

    /// Signing one more of the offer would exceed `maxPerAccount` (checked again in the order's
    /// transaction: an order created meanwhile counts).
    public struct OfferLimitReached: Error, Sendable {
        public var outstanding: Int
    }

    /// Creates an order; refused with `TooManyOpenOrders` when the account has `maxOpen`
    /// unpaid orders created within `ttl` (cancelled and expired orders are not open).
    /// `offerLimit`: how many signatures of `offerId` may be outstanding for the account at most
    /// (its `maxPerAccount` less its redemptions); `introAllowed`: the order carries an
    /// introductory-offer eligibility signed `true`.
    public func createOrder(
        accountId: String, productId: String, quantity: Int, maxOpen: Int? = nil, ttl: TimeInterval = 24 * 3600,
        appAccountToken: UUID = UUID(), offerId: String? = nil, offerNonce: UUID? = nil, offerLimit: Int? = nil,
        introAllowed: Bool = false, appTransactionId: String? = nil, appId: String? = nil, maxPerDay: Int? = nil,
        now: Date
    ) async throws -> Order {
        let order = Order(
            orderId: UUID().uuidString.lowercased(), appAccountToken: appAccountToken, accountId: accountId,
            productId: productId,
            quantity: quantity, status: .created, createdAt: Date(milliseconds: now.milliseconds), offerId: offerId,
            appTransactionId: appTransactionId, appId: appId)
        let limit = sharedAppleIdLimit
        let cutoff = now.addingTimeInterval(-ttl).milliseconds
        let postgres = database.kind == .postgres
        try await database.transaction { sql in
            if postgres, maxOpen != nil || offerLimit != nil || maxPerDay != nil {
                // Counted and inserted under the account's lock (PostgreSQL reads committed
                // rows only: two orders created at once would each count the other's absent
                // and both pass the cap). SQLite has one writer.
                try await sql.raw("SELECT pg_advisory_xact_lock(hashtext(\(bind: "orders|" + accountId)))").run()
            }
            if let maxOpen {
                let open =
                    try await sql.raw(
                        """
                        SELECT COUNT(*) AS n FROM (SELECT 1 FROM orders WHERE account_id = \(bind: accountId)
                        AND status IN ('created', 'pending') AND created_at >= \(bind: cutoff) LIMIT \(unsafeRaw: String(maxOpen))) AS o
                        """
                    ).first()?.decode(column: "n", as: Int.self) ?? 0
                if open >= maxOpen { throw TooManyOpenOrders(limit: maxOpen) }
            }
            if let maxPerDay {
                // Every order of the last 24 hours, cancelled and expired ones included, read
                // through `orders_account_created` and stopping at the cap.
                let since = now.addingTimeInterval(-86_400).milliseconds
                let today =
                    try await sql.raw(
                        """
                        SELECT COUNT(*) AS n FROM (SELECT 1 FROM orders WHERE account_id = \(bind: accountId)
                        AND created_at >= \(bind: since) LIMIT \(unsafeRaw: String(maxPerDay))) AS o
                        """
                    ).first()?.decode(column: "n", as: Int.self) ?? 0
                if today >= maxPerDay { throw TooManyOrdersToday(limit: maxPerDay) }
            }
            if let offerId, let offerLimit {
                let since = now.addingTimeInterval(-OfferStore.signedOfferLifetime).milliseconds
                let outstanding =
                    try await sql.raw(
                        """
                        SELECT COUNT(*) AS n FROM orders WHERE account_id = \(bind: accountId) AND offer_id = \(bind: offerId)
                        AND created_at >= \(bind: since) AND offer_redeemed_transaction_id IS NULL
                        """
                    ).first()?.decode(column: "n", as: Int.self) ?? 0
                if outstanding >= offerLimit { throw OfferLimitReached(outstanding: outstanding) }
            }
            try await sql.raw(
                """
                INSERT INTO orders (order_id, app_account_token, account_id, product_id, quantity, status, created_at,
                                    offer_id, offer_nonce, app_transaction_id, intro_allowed, app_id)
                VALUES (\(bind: order.orderId), \(bind: order.appAccountToken.uuidString.lowercased()), \(bind: accountId),
                        \(bind: productId), \(bind: quantity), \(bind: order.status.rawValue), \(bind: now.milliseconds),
                        \(bind: offerId), \(bind: offerNonce?.uuidString.lowercased()), \(bind: appTransactionId),
                        \(bind: introAllowed ? 1 : nil as Int?), \(bind: appId))
                """
            ).run()
            if let appTransactionId {
                try await OfferStore.noteAppleAccount(
                    appTransactionId, account: accountId, limit: limit, sql: sql, at: now.milliseconds)
            }
        }
        return order
    }

    public enum Cancellation: Sendable {
        case cancelled(Order)
        case notCancellable(Order.Status)
        case missing
    }

    /// Cancels an unpaid order (`created`); an order already cancelled stays so.
    public func cancelOrder(_ orderId: String) async throws -> Cancellation {
        try await database.transaction { sql in
            try await sql.raw(
                "UPDATE orders SET status = 'cancelled' WHERE order_id = \(bind: orderId) AND status = 'created'"
            ).run()
            guard let order = try await Self.order(sql, where: "order_id", orderId) else { return .missing }
            return order.status == .cancelled ? .cancelled(order) : .notCancellable(order.status)
        }
    }

    public func order(_ orderId: String) async throws -> Order? {
        try await database.read { sql in try await Self.order(sql, where: "order_id", orderId) }
    }

    /// Deletes unpaid orders (cancelled, or never paid and past `ttl`) created before
    /// `olderThan`, at most `limit` at a time (the retention of `limits.orderRetentionDays`).
    /// A payment that arrives later still delivers through its account's binding or becomes an
    /// anomaly an operator resolves; paid orders are kept for good.
    @discardableResult
    public func deleteUnpaidOrders(createdBefore cutoff: Date, limit: Int = 1_000) async throws -> Int {
        let cutoff = cutoff.milliseconds
        return try await database.transaction { sql in
            let ids = try await sql.raw(
                """
                SELECT order_id FROM orders WHERE status IN ('cancelled', 'created') AND created_at < \(bind: cutoff)
                LIMIT \(bind: limit)
                """
            ).all().map { try $0.decode(column: "order_id", as: String.self) }
            guard !ids.isEmpty else { return 0 }
            try await sql.raw("DELETE FROM orders WHERE order_id IN (\(binds: ids))").run()
            return ids.count
        }
    }

    /// Orders still `created` after `ttl` become `cancelled` (a late payment is still delivered).
    @discardableResult
    public func cancelExpiredOrders(olderThan ttl: TimeInterval, now: Date) async throws -> Int {
        let cutoff = now.addingTimeInterval(-ttl).milliseconds
        return try await database.transaction { sql in
            let expired = try await sql.raw(
                "SELECT order_id FROM orders WHERE status = 'created' AND created_at < \(bind: cutoff)"
            ).all().count
            try await sql.raw(
                "UPDATE orders SET status = 'cancelled' WHERE status = 'created' AND created_at < \(bind: cutoff)"
            )
            .run()
            return expired
        }
    }

    static func order(_ sql: any SQLDatabase, where column: String, _ value: String) async throws -> Order? {
        try await sql.raw("SELECT * FROM orders WHERE \(ident: column) = \(bind: value)").first().map(decodeOrder)
    }

    static func decodeOrder(_ row: any SQLRow) throws -> Order {
        Order(
            orderId: try row.decode(column: "order_id", as: String.self),
            appAccountToken: UUID(uuidString: try row.decode(column: "app_account_token", as: String.self)) ?? UUID(),
            accountId: try row.decode(column: "account_id", as: String.self),
            productId: try row.decode(column: "product_id", as: String.self),
            quantity: try row.decode(column: "quantity", as: Int.self),
            status: Order.Status(rawValue: try row.decode(column: "status", as: String.self)) ?? .failed,
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
            transactionId: try row.decode(column: "transaction_id", as: String?.self),
            deliveredAt: try row.decode(column: "delivered_at", as: Int64?.self).map(Date.init(milliseconds:)),
            offerId: try row.decode(column: "offer_id", as: String?.self),
            offerRedeemed: try row.decode(column: "offer_redeemed_transaction_id", as: String?.self) != nil,
            appTransactionId: try row.decode(column: "app_transaction_id", as: String?.self),
            appId: (try? row.decode(column: "app_id", as: String?.self)) ?? nil)
    }
}
