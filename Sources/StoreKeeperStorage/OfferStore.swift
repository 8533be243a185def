import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Offers on the database: what Apple signed about each delivered transaction's offer, the
/// order a signed offer was for, and which Apple Accounts (appTransactionId) each account used.
public struct OfferStore: Sendable {
    public let database: Database
    /// More app accounts than this on one Apple Account raise `shared_apple_id`.
    public let sharedAppleIdLimit: Int

    public init(database: Database, sharedAppleIdLimit: Int = Self.defaultSharedAppleIdLimit) {
        self.database = database
        self.sharedAppleIdLimit = sharedAppleIdLimit
    }

    /// More app accounts than this on one Apple Account raise `shared_apple_id`, unless configured.
    public static let defaultSharedAppleIdLimit = 3

    /// A transaction delivered in this database transaction, for the offer and Apple Account facts.
    struct DeliveredFacts {
        var transaction: StoreTransaction
        var delivery: DeliveryPlanner.Delivery
        var limit: Int
        var at: Int64
        /// The catalog's per-account limit on the offer code or win-back offer it redeemed.
        var redemptionLimit: Int? = nil
    }

    /// The deliveries row's offer columns: Apple's `offerType` and `offerIdentifier`; whose
    /// offer it was is 'apple' for introductory, offer-code and win-back offers, and settled
    /// by `record` for promotional ones (ours for the order, or not).
    static func offerColumns(_ transaction: StoreTransaction) -> (
        type: Int?, identifier: String?, source: String?
    ) {
        guard let type = transaction.offerType else { return (nil, nil, nil) }
        return (Int(type.rawValue), transaction.offerIdentifier, type == .promotional ? nil : "apple")
    }

    /// After a batch's deliveries are inserted: links promotional-offer redemptions to the
    /// order they were signed for, and records the Apple Accounts seen (raising
    /// `shared_apple_id` past the limit). Rare work only: nothing for a plain purchase by a
    /// known Apple Account but one insert.
    static func record(_ facts: [DeliveredFacts], sql: any SQLDatabase) async throws {
        for fact in facts where fact.transaction.offerType == .promotional {
            var source = "not_signed_here"
            if let orderId = fact.delivery.orderId, let offerId = fact.transaction.offerIdentifier {
                let signed = try await sql.raw(
                    "SELECT offer_id FROM orders WHERE order_id = \(bind: orderId)"
                ).first()?.decode(column: "offer_id", as: String?.self)
                if signed == offerId {
                    source = "order"
                    try await sql.raw(
                        """
                        UPDATE orders SET offer_redeemed_transaction_id = \(bind: fact.delivery.transactionId)
                        WHERE order_id = \(bind: orderId)
                        """
                    ).run()
                }
            }
            try await sql.raw(
                "UPDATE deliveries SET offer_source = \(bind: source) WHERE transaction_id = \(bind: fact.delivery.transactionId)"
            ).run()
        }
        // An offer code or win-back offer past the catalog's per-account limit (redeemed under
        // several Apple IDs): delivered — Apple was paid — and shown to the operator.
        for fact in facts where fact.redemptionLimit != nil {
            guard let type = fact.transaction.offerType, let id = fact.transaction.offerIdentifier else { continue }
            let redemptions =
                try await sql.raw(
                    """
                    SELECT COUNT(*) AS n FROM deliveries
                    WHERE account_id = \(bind: fact.delivery.accountId) AND offer_type = \(bind: Int(type.rawValue))
                    AND offer_identifier = \(bind: id)
                    """
                ).first()?.decode(column: "n", as: Int.self) ?? 0
            guard OfferEligibility.overLimit(fact.redemptionLimit, redemptions: redemptions) else { continue }
            try await AnomalyStore.insertAnomaly(
                AnomalyDraft(
                    kind: .offerLimitExceeded, transactionId: fact.delivery.transactionId,
                    orderId: fact.delivery.orderId, accountId: fact.delivery.accountId,
                    detail:
                        "\(type == .winBack ? "win-back offer" : "offer code") \(Identifiers.quoted(id)) redeemed \(redemptions) times by account \(Identifiers.quoted(fact.delivery.accountId)) (catalog maxPerAccount \(fact.redemptionLimit ?? 0)); delivered"
                ), dedupeKey: AnomalyStore.dedupeKey("offer_limit_exceeded", fact.delivery.transactionId),
                payload: nil, sql: sql, at: fact.at)
        }
        // The Apple Accounts seen: one multi-row insert for the batch; only pairs seen for the
        // first time are counted, with one grouped query.
        var pairs: [String: (appTransactionId: String, account: String, at: Int64)] = [:]
        var limit = OfferStore.defaultSharedAppleIdLimit
        for fact in facts {
            guard let appTransactionId = fact.transaction.appTransactionId, !appTransactionId.isEmpty else { continue }
            pairs["\(appTransactionId)\u{0}\(fact.delivery.accountId)"] = (
                appTransactionId, fact.delivery.accountId, fact.at
            )
            limit = fact.limit
        }
        try await noteAppleAccounts(Array(pairs.values), limit: limit, sql: sql)
    }

    /// Records (appTransactionId, account) pairs; for every Apple Account that gained an
    /// account and is now on more than `limit`, raises `shared_apple_id` (once per Apple Account).
    static func noteAppleAccounts(
        _ pairs: [(appTransactionId: String, account: String, at: Int64)], limit: Int, sql: any SQLDatabase
    ) async throws {
        guard !pairs.isEmpty else { return }
        var insert = sql.insert(into: "apple_accounts").columns("app_transaction_id", "account_id", "first_seen_at")
        for pair in pairs { insert = insert.values([pair.appTransactionId, pair.account, pair.at]) }
        let added = try await insert.ignoringConflicts(with: ["app_transaction_id", "account_id"])
            .returning("app_transaction_id").all()
            .map { try $0.decode(column: "app_transaction_id", as: String.self) }
        guard !added.isEmpty else { return }
        let crowded = try await sql.raw(
            """
            SELECT app_transaction_id FROM apple_accounts WHERE app_transaction_id IN (\(binds: Array(Set(added))))
            GROUP BY app_transaction_id HAVING COUNT(*) > \(bind: limit)
            """
        ).all().map { try $0.decode(column: "app_transaction_id", as: String.self) }
        let at = pairs.map(\.at).max() ?? 0
        for appTransactionId in crowded {
            let accounts = try await sql.raw(
                """
                SELECT account_id FROM apple_accounts WHERE app_transaction_id = \(bind: appTransactionId)
                ORDER BY first_seen_at, account_id LIMIT 50
                """
            ).all().map { try $0.decode(column: "account_id", as: String.self) }
            try await AnomalyStore.insertAnomaly(
                AnomalyDraft(
                    kind: .sharedAppleId, transactionId: nil, orderId: nil, accountId: accounts.last,
                    detail:
                        "Apple Account (appTransactionId \(Identifiers.quoted(appTransactionId))) used by \(accounts.count)\(accounts.count == 50 ? "+" : "") accounts, more than \(limit): \(accounts.prefix(10).map(Identifiers.quoted).joined(separator: ", "))"
                ), dedupeKey: AnomalyStore.dedupeKey("shared_apple_id", appTransactionId), payload: nil, sql: sql,
                at: at)
        }
    }

    /// Records that `account` used the Apple Account `appTransactionId` (an order told us).
    static func noteAppleAccount(
        _ appTransactionId: String, account: String, limit: Int, sql: any SQLDatabase, at: Int64
    ) async throws {
        try await noteAppleAccounts(
            [(appTransactionId: appTransactionId, account: account, at: at)], limit: limit, sql: sql)
    }
}

extension OfferStore {
    /// What offer eligibility reads about an account in a subscription group.
    public struct OfferHistory: Sendable {
        public var subscriptions: [SubscriptionState]
        /// Apple-signed transactions of the account per promotional offer id (retention offers,
        /// `offerType` 5, count as promotional).
        public var redemptions: [String: Int]
        /// Apple-signed transactions of the account per win-back offer id (`offerType` 4).
        public var winBackRedemptions: [String: Int] = [:]
        /// Whether any Apple-signed transaction of the account in the group had an introductory offer.
        public var hadIntroductoryOffer: Bool
        /// The account's latest transaction in the group (for the V2 JWS `transactionId`).
        public var latestTransactionId: String?
        /// Promotional offers signed for the account's orders (per offer id) that are still
        /// redeemable at Apple: signed within `signedOfferLifetime` and not redeemed yet.
        public var outstandingOffers: [String: Int] = [:]
        /// Whether an order of the account in the group carries an introductory-offer eligibility
        /// signed `allowIntroductoryOffer: true` within `signedOfferLifetime`.
        public var introductoryOutstanding = false
    }

    /// How long Apple accepts what we sign for an offer: a V1 signature's timestamp gives 24 h
    /// (docs/offers-and-retention.md §1); the V2 JWS are counted for as long.
    public static let signedOfferLifetime: TimeInterval = 24 * 3600

    /// The account's subscriptions, redemptions and latest transaction in the group of
    /// `productIds` (the group's products), in one read transaction.
    /// With `now`, also what is signed and still redeemable (`outstandingOffers`,
    /// `introductoryOutstanding`).
    public func offerHistory(
        account: String, groupProducts productIds: [String], latestTransaction: Bool = true, now: Date? = nil
    ) async throws -> OfferHistory {
        try await database.read { sql in
            try await Self.offerHistory(
                account: account, groupProducts: productIds, latestTransaction: latestTransaction, now: now, sql: sql)
        }
    }

    static func offerHistory(
        account: String, groupProducts productIds: [String], latestTransaction: Bool, now: Date? = nil,
        sql: any SQLDatabase
    ) async throws -> OfferHistory {
        guard !productIds.isEmpty else {
            return OfferHistory(subscriptions: [], redemptions: [:], hadIntroductoryOffer: false)
        }
        let subscriptions = try await sql.raw(
            "SELECT * FROM subscriptions WHERE account_id = \(bind: account) AND product_id IN (\(binds: productIds))"
        ).all().map(SubscriptionStore.decodeState)
        var redemptions: [String: Int] = [:]
        var winBack: [String: Int] = [:]
        var hadIntro = false
        for row in try await sql.raw(
            """
            SELECT offer_type, offer_identifier, COUNT(*) AS n FROM deliveries
            WHERE account_id = \(bind: account) AND offer_type IS NOT NULL AND product_id IN (\(binds: productIds))
            GROUP BY offer_type, offer_identifier
            """
        ).all() {
            let type = try row.decode(column: "offer_type", as: Int.self)
            let count = try row.decode(column: "n", as: Int.self)
            if type == 1 { hadIntro = true }
            guard let id = try row.decode(column: "offer_identifier", as: String?.self) else { continue }
            if type == 2 || type == 5 { redemptions[id, default: 0] += count }
            if type == 4 { winBack[id, default: 0] += count }
        }
        let latest: String? =
            latestTransaction
            ? try await sql.raw(
                """
                SELECT transaction_id FROM deliveries
                WHERE account_id = \(bind: account) AND product_id IN (\(binds: productIds))
                ORDER BY delivered_at DESC, transaction_id DESC LIMIT 1
                """
            ).first()?.decode(column: "transaction_id", as: String.self) : nil
        var history = OfferHistory(
            subscriptions: subscriptions, redemptions: redemptions, hadIntroductoryOffer: hadIntro,
            latestTransactionId: latest)
        history.winBackRedemptions = winBack
        if let now {
            let since = now.addingTimeInterval(-signedOfferLifetime).milliseconds
            for row in try await sql.raw(
                """
                SELECT offer_id, COUNT(*) AS n FROM orders
                WHERE account_id = \(bind: account) AND offer_id IS NOT NULL AND created_at >= \(bind: since)
                AND offer_redeemed_transaction_id IS NULL AND product_id IN (\(binds: productIds))
                GROUP BY offer_id
                """
            ).all() {
                history.outstandingOffers[try row.decode(column: "offer_id", as: String.self)] = try row.decode(
                    column: "n", as: Int.self)
            }
            history.introductoryOutstanding =
                try await sql.raw(
                    """
                    SELECT 1 AS n FROM orders
                    WHERE account_id = \(bind: account) AND intro_allowed = 1 AND created_at >= \(bind: since)
                    AND product_id IN (\(binds: productIds)) LIMIT 1
                    """
                ).first() != nil
        }
        return history
    }

    /// Records that `account` used the Apple Account `appTransactionId` (an order told us).
    public func noteAppleAccount(_ appTransactionId: String, account: String, now: Date) async throws {
        try await database.transaction { sql in
            try await OfferStore.noteAppleAccount(
                appTransactionId, account: account, limit: sharedAppleIdLimit, sql: sql, at: now.milliseconds)
        }
    }
}
