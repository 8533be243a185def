import StoreKeeperCore

/// The SQL views for BI tools and for analytics' own reads (one definition of each fact):
/// `storekeeper_transactions`, `storekeeper_subscription_periods`, `storekeeper_subscriptions`
/// and `storekeeper_events`, the same on PostgreSQL and SQLite. docs/analytics.md documents every
/// column.
public enum AnalyticsViews {
    /// A delivery's price less what refunds gave back (its share, rounded down), milliunits.
    static let netPrice =
        "(d.price_milli - CASE WHEN d.refunded_at IS NULL THEN 0 ELSE d.price_milli * COALESCE(d.refund_share, 100000) / 100000 END)"

    /// The store a delivery was made in: its stored column (migration 25).
    static let store = "d.store"
    /// Before migration 25 the views derived it from the id (kept for that migration's history).
    static let storeFromId = "CASE WHEN d.transaction_id LIKE 'gp:%' THEN 'google_play' ELSE 'app_store' END"

    /// 1 for what earns money: a price, a real environment (not Sandbox or Xcode), not shared
    /// by Family Sharing (the organizer's own transaction is the one that paid).
    static let counts = "CASE WHEN \(earns) THEN 1 ELSE 0 END"
    /// The same test as plain conditions (what the analytics queries filter by).
    static let earns = """
        d.price_milli IS NOT NULL AND d.proceeds_percent IS NOT NULL \
        AND d.environment NOT IN ('Sandbox', 'Xcode') AND d.family_shared = 0
        """

    /// Weeks and months of a period, rounded to the nearest (Analytics.monthlyMilli).
    static let length = "(d.period_end - d.period_start)"
    static let monthly = """
        CASE WHEN d.trial = 1 OR d.price_milli IS NULL THEN 0
             WHEN \(length) < 2160000000 THEN d.price_milli * 52 /
                  (12 * CASE WHEN (\(length) + 302400000) / 604800000 < 1 THEN 1 ELSE (\(length) + 302400000) / 604800000 END)
             ELSE d.price_milli /
                  CASE WHEN (\(length) + 1314900000) / 2629800000 < 1 THEN 1 ELSE (\(length) + 1314900000) / 2629800000 END
        END
        """

    static let endsAt =
        "CASE WHEN d.superseded_at IS NOT NULL AND d.superseded_at < d.period_end THEN d.superseded_at ELSE d.period_end END"

    /// The views as migration 20 created them (the store derived from ids).
    public static let createBeforeStoreColumn = views(
        store: storeFromId,
        subscriptionStore: "CASE WHEN s.original_transaction_id LIKE 'gp:%' THEN 'google_play' ELSE 'app_store' END",
        anomalyStore: "CAST(NULL AS TEXT)")
    /// The views as migration 25 created them (every store read from its stored column).
    public static let createBeforeStatedProceeds = views(
        store: store, subscriptionStore: "s.store", anomalyStore: "a.store", statedProceeds: false)
    /// The views now: a store that states its proceeds (Stripe's net) counts them.
    public static let create = views(
        store: store, subscriptionStore: "s.store", anomalyStore: "a.store", statedProceeds: true)

    /// What a delivery kept of `net` (its price less refunds), rounded down: the proceeds its
    /// store stated (Stripe's balance transaction net), in proportion; else its percent — or
    /// the Small Business Program's reduced commission, for the stores that charge one.
    static func kept(net: String, row p: String = "d.", smallBusinessProgram: Bool, statedProceeds: Bool = true)
        -> String
    {
        let percent =
            smallBusinessProgram
            ? "CASE WHEN \(p)store IN ('web', 'stripe') THEN 100 ELSE \(Proceeds.reducedCommissionPercent) END"
            : "\(p)proceeds_percent"
        guard statedProceeds else { return "\(net) * \(percent) / 100" }
        return """
            CASE WHEN \(p)stated_proceeds_milli IS NOT NULL AND \(p)price_milli > 0 \
            THEN \(net) * \(p)stated_proceeds_milli / \(p)price_milli ELSE \(net) * \(percent) / 100 END
            """
    }

    static func views(store: String, subscriptionStore: String, anomalyStore: String, statedProceeds: Bool = false)
        -> [String]
    {
        [
            "DROP VIEW IF EXISTS storekeeper_events",
            "DROP VIEW IF EXISTS storekeeper_subscription_periods",
            "DROP VIEW IF EXISTS storekeeper_transactions",
            "DROP VIEW IF EXISTS storekeeper_subscriptions",
            """
            CREATE VIEW storekeeper_transactions AS
            SELECT d.transaction_id, d.original_transaction_id, d.account_id, d.order_id, d.app_id,
                   \(store) AS store, d.product_id, d.quantity, d.environment, d.storefront,
                   d.purchased_at, d.delivered_at, d.period_start, d.period_end,
                   \(endsAt) AS ends_at,
                   d.trial, d.family_shared, d.offer_type, d.offer_identifier, d.price_milli, d.currency,
                   d.proceeds_percent, d.refunded_at, d.refund_share,
                   \(netPrice) AS net_price_milli,
                   \(kept(net: netPrice, smallBusinessProgram: false, statedProceeds: statedProceeds)) AS proceeds_milli,
                   \(counts) AS counts
            FROM deliveries d WHERE d.quantity > 0
            """,
            """
            CREATE VIEW storekeeper_subscription_periods AS
            SELECT d.transaction_id, d.original_transaction_id, d.account_id, d.app_id, \(store) AS store,
                   d.product_id, d.environment, d.storefront, d.period_start, d.period_end,
                   \(endsAt) AS ends_at, d.trial, d.offer_type, d.offer_identifier, d.price_milli, d.currency,
                   \(monthly) AS monthly_milli, d.refunded_at,
                   \(counts) AS counts
            FROM deliveries d WHERE d.quantity > 0 AND d.period_start IS NOT NULL AND d.period_end IS NOT NULL
            """,
            """
            CREATE VIEW storekeeper_subscriptions AS
            SELECT s.original_transaction_id, s.account_id, s.app_id,
                   \(subscriptionStore) AS store,
                   s.product_id, s.status, s.expires_at, s.auto_renew, s.next_product_id, s.grace_ends_at,
                   s.latest_transaction_id, s.billing_plan, s.signed_at, s.updated_at
            FROM subscriptions s
            """,
            """
            CREATE VIEW storekeeper_events AS
            SELECT 'delivery' AS type, d.transaction_id AS id, d.delivered_at AS at, d.account_id, d.app_id,
                   \(store) AS store, d.transaction_id, d.original_transaction_id, d.product_id, d.environment,
                   CAST(NULL AS TEXT) AS detail
            FROM deliveries d WHERE d.quantity > 0
            UNION ALL
            SELECT 'refund', d.transaction_id, d.refunded_at, d.account_id, d.app_id, \(store), d.transaction_id,
                   d.original_transaction_id, d.product_id, d.environment, d.refund_type
            FROM deliveries d WHERE d.refunded_at IS NOT NULL
            UNION ALL
            SELECT 'notification', n.notification_uuid, n.received_at, CAST(NULL AS TEXT), CAST(NULL AS TEXT),
                   'app_store', n.transaction_id, n.subject, CAST(NULL AS TEXT), n.environment,
                   n.notification_type || COALESCE('/' || n.subtype, '') || ' ' || n.status
            FROM notifications n
            UNION ALL
            SELECT 'google_notification', g.message_id, g.received_at, CAST(NULL AS TEXT), g.app_id, 'google_play',
                   CAST(NULL AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS TEXT), g.type || ' ' || g.status
            FROM google_notifications g
            UNION ALL
            SELECT 'anomaly', a.id, a.created_at, a.account_id, a.app_id,
                   \(anomalyStore), a.transaction_id, CAST(NULL AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS TEXT),
                   a.kind || ': ' || a.detail
            FROM anomalies a
            """,
        ]
    }
}
