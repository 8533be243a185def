import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// An account's balances, entitlements, deliveries, debits and credits, notes and consent.
public struct AccountStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }
}

/// What an account holds: balances, entitlements, deliveries.
extension AccountStore {
    public func balances(of accountId: String) async throws -> [String: Int64] {
        try await account(accountId).balances
    }

    /// Balances and entitlements of an account, read together.
    public func account(_ accountId: String) async throws -> PurchaseStore.AccountState {
        try await database.read { sql in
            try await Self.accountStates([accountId], sql: sql)[accountId] ?? PurchaseStore.AccountState()
        }
    }

    /// Balances and entitlements of several accounts in one statement (one round trip on
    /// PostgreSQL); accounts with neither are absent.
    static func accountStates(_ accounts: [String], sql: any SQLDatabase) async throws -> [String: PurchaseStore
        .AccountState]
    {
        guard !accounts.isEmpty else { return [:] }
        var states: [String: PurchaseStore.AccountState] = [:]
        var commitments: [String: [String: PurchaseStore.SubscriptionRow.Commitment]] = [:]
        for row in try await sql.raw(
            """
            SELECT account_id, 'b' AS kind, currency AS name, amount, NULL AS product_id,
                   NULL AS original_transaction_id, NULL AS expires_at, NULL AS app_id, NULL AS store
            FROM balances WHERE account_id IN (\(binds: accounts))
            UNION ALL
            SELECT account_id, 'e' AS kind, entitlement_id AS name, NULL AS amount, product_id,
                   original_transaction_id, expires_at, NULL AS app_id, NULL AS store
            FROM entitlements WHERE account_id IN (\(binds: accounts))
            UNION ALL
            SELECT account_id, 's' AS kind, status AS name, auto_renew AS amount, product_id,
                   original_transaction_id, expires_at, app_id, store
            FROM subscriptions WHERE account_id IN (\(binds: accounts))
            UNION ALL
            SELECT account_id, 'c' AS kind, CAST(COALESCE(commitment_renews, -1) AS TEXT) AS name,
                   commitment_period * 100 + COALESCE(commitment_periods, 12) AS amount, NULL AS product_id,
                   original_transaction_id, commitment_expires_at AS expires_at, NULL AS app_id, NULL AS store
            FROM subscriptions WHERE account_id IN (\(binds: accounts)) AND billing_plan = 'MONTHLY'
            UNION ALL
            SELECT account_id, 'g' AS kind, entitlement_id AS name, NULL AS amount, NULL AS product_id,
                   grant_id AS original_transaction_id, expires_at, NULL AS app_id, NULL AS store
            FROM grants WHERE account_id IN (\(binds: accounts)) AND ended_at IS NULL
            ORDER BY account_id, kind, name, original_transaction_id
            """
        ).all() {
            let account = try row.decode(column: "account_id", as: String.self)
            let name = try row.decode(column: "name", as: String.self)
            let kind = try row.decode(column: "kind", as: String.self)
            if kind == "s" {
                states[account, default: PurchaseStore.AccountState()].subscriptions.append(
                    PurchaseStore.SubscriptionRow(
                        originalTransactionId: try row.decode(column: "original_transaction_id", as: String.self),
                        productId: try row.decode(column: "product_id", as: String.self), status: name,
                        expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)),
                        autoRenew: try row.decode(column: "amount", as: Int64.self) != 0,
                        appId: try row.decode(column: "app_id", as: String?.self),
                        store: try row.decode(column: "store", as: String?.self).flatMap(Store.init(rawValue:))))
            } else if kind == "c" {
                // Attached to its subscription once every row is read.
                commitments[account, default: [:]][try row.decode(column: "original_transaction_id", as: String.self)] =
                    PurchaseStore.SubscriptionRow.Commitment(
                        period: try row.decode(column: "amount", as: Int.self) / 100,
                        periods: try row.decode(column: "amount", as: Int.self) % 100,
                        expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)),
                        renews: name == "-1" ? nil : name == "1")
            } else if kind == "b" {
                states[account, default: PurchaseStore.AccountState()].balances[name] = try row.decode(
                    column: "amount", as: Int64.self)
            } else if kind == "g" {
                states[account, default: PurchaseStore.AccountState()].entitlements.append(
                    EntitlementRow(
                        entitlementId: name, productId: nil,
                        originalTransactionId: nil,
                        // A grant for good never ends.
                        expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:))
                            .flatMap { $0 >= SupportStore.grantForGood ? nil : $0 },
                        grantId: try row.decode(column: "original_transaction_id", as: String.self)))
            } else {
                states[account, default: PurchaseStore.AccountState()].entitlements.append(
                    EntitlementRow(
                        entitlementId: name, productId: try row.decode(column: "product_id", as: String.self),
                        originalTransactionId: try row.decode(column: "original_transaction_id", as: String.self),
                        expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:))))
            }
        }
        for (account, byOriginal) in commitments {
            guard var state = states[account] else { continue }
            for index in state.subscriptions.indices {
                state.subscriptions[index].commitment = byOriginal[state.subscriptions[index].originalTransactionId]
            }
            states[account] = state
        }
        return states
    }

    public func deliveries(of accountId: String) async throws -> [DeliveryPlanner.Delivery] {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM deliveries WHERE account_id = \(bind: accountId) ORDER BY delivered_at")
                .all().map {
                    DeliveryPlanner.Delivery(
                        transactionId: try $0.decode(column: "transaction_id", as: String.self),
                        accountId: try $0.decode(column: "account_id", as: String.self),
                        orderId: try $0.decode(column: "order_id", as: String?.self),
                        productId: try $0.decode(column: "product_id", as: String.self),
                        quantity: try $0.decode(column: "quantity", as: Int.self),
                        refunded: try $0.decode(column: "refunded_at", as: Int64?.self) != nil)
                }
        }
    }

    public struct EntitlementRow: Sendable, Hashable {
        public var entitlementId: String
        /// The product and subscription (or purchase) it comes from; nil for an operator grant.
        public var productId: String?
        public var originalTransactionId: String?
        public var expiresAt: Date?
        /// Set for an operator grant (`source: grant`).
        public var grantId: String? = nil
    }

    public func entitlements(of accountId: String) async throws -> [EntitlementRow] {
        try await account(accountId).entitlements
    }
}

extension AccountStore {
    /// What a delivery credited: its ledger entry `purchase:<transactionId>:<currency>`.
    static func credit(of transactionId: String, sql: any SQLDatabase) async throws -> RefundPlanner.Credit? {
        try await sql.raw(
            """
            SELECT currency, amount FROM ledger
            WHERE entry_key >= \(bind: "purchase:\(transactionId):") AND entry_key < \(bind: "purchase:\(transactionId);")
            """
        ).first().map {
            RefundPlanner.Credit(
                currency: try $0.decode(column: "currency", as: String.self),
                amount: try $0.decode(column: "amount", as: Int64.self))
        }
    }

    static func balance(_ account: String, _ currency: String, sql: any SQLDatabase) async throws -> Int64 {
        try await sql.raw(
            "SELECT amount FROM balances WHERE account_id = \(bind: account) AND currency = \(bind: currency)"
        ).first()?.decode(column: "amount", as: Int64.self) ?? 0
    }

    /// What the records say about a transaction, for Send Consumption Information, the
    /// environment it was bought in, and its owner's consent to share it.
    public func consumptionFacts(_ transactionId: String, catalog: Catalog) async throws -> (
        ConsumptionPlanner.Facts, environment: String?, consent: Consent?
    ) {
        try await database.read { sql in
            guard
                let row = try await sql.raw("SELECT * FROM deliveries WHERE transaction_id = \(bind: transactionId)")
                    .first()
            else {
                return (
                    ConsumptionPlanner.Facts(delivered: false, productType: nil, credited: nil, balance: nil), nil, nil
                )
            }
            let account = try row.decode(column: "account_id", as: String.self)
            let productId = try row.decode(column: "product_id", as: String.self)
            let product = catalog.product(productId)
            let credit = try await Self.credit(of: transactionId, sql: sql)
            var balance: Int64?
            if let credit { balance = try await Self.balance(account, credit.currency, sql: sql) }
            let refunded = try row.decode(column: "refunded_at", as: Int64?.self) != nil
            let deliveredAt = try row.decode(column: "delivered_at", as: Int64.self)
            let history = try await sql.raw(
                """
                SELECT (SELECT COUNT(*) FROM deliveries WHERE account_id = \(bind: account)
                        AND delivered_at < \(bind: deliveredAt) AND quantity > 0) AS earlier,
                       (SELECT MIN(delivered_at) FROM deliveries WHERE account_id = \(bind: account)) AS first_delivery,
                       (SELECT MIN(created_at) FROM orders WHERE account_id = \(bind: account)) AS first_order
                """
            ).first()
            let firstDelivery = try history?.decode(column: "first_delivery", as: Int64?.self)
            let firstOrder = try history?.decode(column: "first_order", as: Int64?.self)
            let since = [firstDelivery, firstOrder].compactMap { $0 }.min()
            return (
                ConsumptionPlanner.Facts(
                    delivered: !refunded, productType: product?.type, credited: credit?.amount, balance: balance,
                    productId: productId, firstPurchase: (try history?.decode(column: "earlier", as: Int.self)) == 0,
                    accountSince: since.map(Date.init(milliseconds:)),
                    periodStart: try row.decode(column: "period_start", as: Int64?.self).map(Date.init(milliseconds:)),
                    periodEnd: try row.decode(column: "period_end", as: Int64?.self).map(Date.init(milliseconds:))),
                try row.decode(column: "environment", as: String.self),
                try await Self.consent(of: account, sql: sql)
            )
        }
    }
}
