import Foundation

/// Migrations of analytics, Google's order prices, the third audit's bounds, refunds before a claim, the store column, anomalies closing themselves (20–26).
extension Migrations {
    static let era3: [(version: Int, statements: [String])] = [
        (
            20,
            [
                // Analytics (docs/analytics.md): the store's purchase date (buckets follow the
                // store's clock, not the server's), the storefront, free trials, Family Sharing,
                // and where a later period of the same subscription cut this one short (an
                // upgrade): `superseded_at`.
                "ALTER TABLE deliveries ADD COLUMN purchased_at BIGINT",
                "ALTER TABLE deliveries ADD COLUMN storefront TEXT",
                "ALTER TABLE deliveries ADD COLUMN trial INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE deliveries ADD COLUMN family_shared INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE deliveries ADD COLUMN superseded_at BIGINT",
                "UPDATE deliveries SET purchased_at = COALESCE(period_start, delivered_at)",
                "UPDATE deliveries SET trial = 1 WHERE offer_type IS NOT NULL AND price_milli = 0",
                """
                UPDATE deliveries SET superseded_at = (
                    SELECT MIN(n.period_start) FROM deliveries n
                    WHERE n.original_transaction_id = deliveries.original_transaction_id
                    AND n.period_start > deliveries.period_start AND n.period_start < deliveries.period_end)
                WHERE period_start IS NOT NULL
                """,
                "CREATE INDEX deliveries_purchased ON deliveries (purchased_at)",
                "CREATE INDEX deliveries_period_end ON deliveries (period_end) WHERE period_end IS NOT NULL",
                "CREATE INDEX deliveries_delivered ON deliveries (delivered_at, transaction_id)",
                "CREATE INDEX deliveries_refunded ON deliveries (refunded_at, transaction_id) WHERE refunded_at IS NOT NULL",
                "CREATE INDEX subscriptions_updated ON subscriptions (updated_at, original_transaction_id)",
                "CREATE INDEX notifications_received ON notifications (received_at, notification_uuid)",
                "CREATE INDEX anomalies_created ON anomalies (created_at, id)",
            ] + AnalyticsViews.createBeforeStoreColumn
        ),
        (
            21,
            [
                // A subscription's periods in order: whether a period has a later one (churn,
                // new subscriptions, trial conversion) is a range read of this index, stopping
                // at the first later period, instead of reading every period of the
                // subscription. It serves every look-up by original transaction id as the
                // one-column index did.
                "CREATE INDEX deliveries_original_period ON deliveries (original_transaction_id, period_start)",
                "DROP INDEX deliveries_original",
            ]
        ),
        (
            22,
            [
                // Google one-time purchases delivered before their orders were read have no
                // price: each gets the order-price job new purchases get (GooglePlayStore.record),
                // due at once, under the same key — so never twice.
                """
                INSERT INTO jobs (id, kind, dedupe_key, payload, status, attempts, run_at, created_at, stuck_reported)
                SELECT 'google_order_price|' || g.order_id, 'google_order_price', 'google_order_price|' || g.order_id,
                       g.purchase_token, 'pending', 0, g.updated_at, g.updated_at, 0
                FROM google_purchases g JOIN deliveries d ON d.transaction_id = 'gp:' || g.order_id
                WHERE g.kind = 'one_time' AND g.test = 0 AND g.paid_at IS NOT NULL AND g.order_id IS NOT NULL
                AND g.order_id <> '' AND d.price_milli IS NULL
                ON CONFLICT (dedupe_key) DO NOTHING
                """
            ]
        ),
        (
            23,
            [
                // `/healthz` reads the oldest pending job's age: answered by the first entry of
                // this index, whatever the backlog (the due index is ordered by run_at).
                "CREATE INDEX jobs_pending_age ON jobs (status, created_at)",
                // An account's orders of the last 24 hours (limits.maxOrdersPerAccountPerDay) and
                // the unpaid orders past their retention (limits.orderRetentionDays), by index.
                "CREATE INDEX orders_account_created ON orders (account_id, created_at)",
                "CREATE INDEX orders_status_created ON orders (status, created_at)",
                // External purchase tokens registered by an account, and those Apple never reported.
                "CREATE INDEX external_tokens_account ON external_tokens (account_id, first_seen_at)",
                "CREATE INDEX external_tokens_unconfirmed ON external_tokens (first_seen_at) WHERE last_notice IS NULL",
                // A parent's RESCIND_CONSENT, kept apart from the flag the app may set.
                "ALTER TABLE consents ADD COLUMN rescinded_at BIGINT",
                "UPDATE consents SET rescinded_at = changed_at WHERE source = 'rescind_consent'",
            ]
        ),
        (
            24,
            [
                // Refunds of purchases nobody held yet, by the store's transaction id: the
                // delivery path never delivers a whole one and takes a partial one back at once.
                """
                CREATE TABLE undelivered_refunds (
                    transaction_id TEXT PRIMARY KEY,
                    original_transaction_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    revocation_type TEXT,
                    percentage INTEGER,
                    units_refunded BIGINT,
                    units BIGINT,
                    share INTEGER NOT NULL,
                    reason TEXT NOT NULL,
                    refund_key TEXT NOT NULL,
                    refunded_at BIGINT NOT NULL
                )
                """
            ]
        ),
        (
            25,
            [
                // The store each purchase, subscription and anomaly came from, stored as its
                // adapter said — views, exports, analytics and jobs read it; nothing parses it
                // back out of an id. Backfilled once from the ids' prefixes.
                "ALTER TABLE deliveries ADD COLUMN store TEXT NOT NULL DEFAULT 'app_store'",
                "ALTER TABLE subscriptions ADD COLUMN store TEXT NOT NULL DEFAULT 'app_store'",
                "ALTER TABLE anomalies ADD COLUMN store TEXT",
                """
                UPDATE deliveries SET store = CASE WHEN transaction_id LIKE 'gp:%' THEN 'google_play'
                    WHEN transaction_id LIKE 'web:%' THEN 'web' ELSE 'app_store' END
                """,
                """
                UPDATE subscriptions SET store = CASE WHEN original_transaction_id LIKE 'gp:%' THEN 'google_play'
                    WHEN original_transaction_id LIKE 'web:%' THEN 'web' ELSE 'app_store' END
                """,
                """
                UPDATE anomalies SET store = CASE WHEN transaction_id LIKE 'gp:%' THEN 'google_play'
                    WHEN transaction_id LIKE 'web:%' THEN 'web' WHEN transaction_id IS NULL THEN NULL
                    ELSE 'app_store' END
                """,
            ] + AnalyticsViews.createBeforeStatedProceeds
        ),
        (
            26,
            [
                // An open anomaly closes itself when its purchase is delivered later, by any path:
                // each delivery batch looks its transactions up among the open ones.
                "CREATE INDEX anomalies_open_transaction ON anomalies (transaction_id) WHERE status = 'open'"
            ]
        ),
        (
            27,
            [
                // Stripe (the third store): its webhook events, once each by event id; the
                // Checkout Sessions orders opened (a buyer without an account yet gets a
                // redemption code); the Stripe customer of each account (the billing portal).
                """
                CREATE TABLE stripe_events (
                    event_id TEXT PRIMARY KEY,
                    app_id TEXT NOT NULL,
                    type TEXT NOT NULL,
                    object_id TEXT,
                    created BIGINT,
                    status TEXT NOT NULL,
                    outcome TEXT,
                    received_at BIGINT NOT NULL,
                    applied_at BIGINT
                )
                """,
                """
                CREATE TABLE stripe_checkouts (
                    session_id TEXT PRIMARY KEY,
                    app_id TEXT NOT NULL,
                    order_id TEXT NOT NULL UNIQUE,
                    account_id TEXT,
                    product_id TEXT NOT NULL,
                    app_account_token TEXT NOT NULL,
                    url TEXT,
                    expires_at BIGINT NOT NULL,
                    created_at BIGINT NOT NULL,
                    transaction_id TEXT,
                    redemption_code TEXT UNIQUE,
                    redemption_expires_at BIGINT,
                    redeemed_by TEXT,
                    redeemed_at BIGINT
                )
                """,
                """
                CREATE TABLE stripe_customers (
                    app_id TEXT NOT NULL,
                    account_id TEXT NOT NULL,
                    customer_id TEXT NOT NULL,
                    PRIMARY KEY (app_id, account_id)
                )
                """,
                """
                CREATE TABLE stripe_payments (
                    payment_intent_id TEXT PRIMARY KEY,
                    transaction_id TEXT NOT NULL,
                    original_transaction_id TEXT NOT NULL,
                    product_id TEXT NOT NULL
                )
                """,
                "CREATE INDEX stripe_checkouts_transaction ON stripe_checkouts (transaction_id)",
            ]
        ),
        (
            28,
            [
                // What a store states the developer received (Stripe's balance transaction net,
                // milliunits of the delivery's currency): analytics and revenue take it over the
                // percent.
                "ALTER TABLE deliveries ADD COLUMN stated_proceeds_milli BIGINT"
            ] + AnalyticsViews.create
        ),
        (
            29,
            [
                // Partial refunds of payments reported under Apple's external purchase tokens:
                // each its own REFUND line item.
                """
                CREATE TABLE external_refunds (
                    refund_key TEXT PRIMARY KEY,
                    payment_id TEXT NOT NULL,
                    line_item_id TEXT NOT NULL UNIQUE,
                    amount_milli BIGINT NOT NULL,
                    tax_milli BIGINT NOT NULL,
                    refunded_at BIGINT NOT NULL,
                    reported INTEGER NOT NULL DEFAULT 0
                )
                """,
                "CREATE INDEX external_refunds_payment ON external_refunds (payment_id)",
                // Google Play's external transactions (its US programs): the report journal.
                """
                CREATE TABLE google_external_transactions (
                    external_transaction_id TEXT PRIMARY KEY,
                    google_app_id TEXT NOT NULL,
                    source_id TEXT NOT NULL UNIQUE,
                    account_id TEXT,
                    initial_id TEXT,
                    token TEXT,
                    recurring INTEGER NOT NULL,
                    pre_tax_micros BIGINT NOT NULL,
                    tax_micros BIGINT NOT NULL,
                    currency TEXT NOT NULL,
                    transaction_time BIGINT NOT NULL,
                    region_code TEXT NOT NULL,
                    administrative_area TEXT,
                    state TEXT NOT NULL,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    last_error TEXT,
                    reported_at BIGINT,
                    created_at BIGINT NOT NULL
                )
                """,
                """
                CREATE TABLE google_external_refunds (
                    refund_id TEXT PRIMARY KEY,
                    external_transaction_id TEXT NOT NULL,
                    pre_tax_micros BIGINT NOT NULL,
                    full_refund INTEGER NOT NULL,
                    refund_time BIGINT NOT NULL,
                    state TEXT NOT NULL,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    last_error TEXT,
                    reported_at BIGINT,
                    created_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX google_external_refunds_transaction ON google_external_refunds (external_transaction_id)",
            ]
        ),
        (
            30,
            [
                // Support's notes on an account (who wrote what, for which ticket); never shown
                // to the player's app.
                """
                CREATE TABLE account_notes (
                    id TEXT PRIMARY KEY,
                    account_id TEXT NOT NULL,
                    text TEXT NOT NULL,
                    ticket TEXT,
                    author TEXT NOT NULL,
                    created_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX account_notes_account ON account_notes (account_id, created_at)",
            ]
        ),
        (
            31,
            [
                // The orders export and the dashboard's orders list read them in creation order.
                "CREATE INDEX orders_created ON orders (created_at, order_id)"
            ]
        ),
        (
            32,
            [
                // Support's reason on a credit or debit, shown with the ledger entry.
                "ALTER TABLE ledger ADD COLUMN reason TEXT"
            ]
        ),
        (
            33,
            [
                // deliveries_account_offer (account_id, offer_type) serves every read by account:
                // the plain account index was one more B-tree written on every delivery.
                "DROP INDEX IF EXISTS deliveries_account"
            ]
        ),
        (
            34,
            [
                // Stripe's reconciliation resumes where its last complete run ended (Unix
                // seconds): an outage longer than any fixed window loses nothing Stripe keeps.
                "CREATE TABLE stripe_reconcile_state (app_id TEXT PRIMARY KEY, complete_through BIGINT NOT NULL)"
            ]
        ),
        (
            35,
            [
                // A refund recorded before the claim says its store (it was guessed from the
                // other tables, the App Store when none knew it).
                "ALTER TABLE undelivered_refunds ADD COLUMN store TEXT"
            ]
        ),
        (
            36,
            [
                // A support look-up by an order's token reads a checkout by it (one index read,
                // never a scan of every checkout).
                "CREATE INDEX stripe_checkouts_token ON stripe_checkouts (app_account_token)"
            ]
        ),
    ]
}
