import Foundation
import SQLKit

/// The schema, as numbered migrations applied once each, at start and by `storekeeper migrate`.
/// Portable SQL: the same statements run on SQLite and PostgreSQL. Times are epoch ms.
public enum Migrations {
    public static let all: [(version: Int, statements: [String])] = [
        (
            1,
            [
                """
                CREATE TABLE orders (
                    order_id TEXT PRIMARY KEY,
                    app_account_token TEXT NOT NULL UNIQUE,
                    account_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    quantity INTEGER NOT NULL,
                    status TEXT NOT NULL,
                    created_at BIGINT NOT NULL,
                    transaction_id TEXT,
                    delivered_at BIGINT
                )
                """,
                "CREATE INDEX orders_open ON orders (account_id, product_id, status, created_at)",
                """
                CREATE TABLE deliveries (
                    transaction_id TEXT PRIMARY KEY,
                    original_transaction_id TEXT NOT NULL,
                    account_id TEXT NOT NULL,
                    order_id TEXT,
                    product_id TEXT NOT NULL,
                    quantity INTEGER NOT NULL,
                    environment TEXT NOT NULL,
                    delivered_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX deliveries_account ON deliveries (account_id)",
                """
                CREATE TABLE ownership (
                    original_transaction_id TEXT PRIMARY KEY,
                    account_id TEXT NOT NULL,
                    bound_at BIGINT NOT NULL
                )
                """,
                """
                CREATE TABLE ledger (
                    entry_key TEXT PRIMARY KEY,
                    account_id TEXT NOT NULL,
                    currency TEXT NOT NULL,
                    amount BIGINT NOT NULL,
                    created_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX ledger_account ON ledger (account_id, currency)",
                """
                CREATE TABLE entitlements (
                    account_id TEXT NOT NULL,
                    entitlement_id TEXT NOT NULL,
                    original_transaction_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    expires_at BIGINT,
                    PRIMARY KEY (account_id, entitlement_id, original_transaction_id)
                )
                """,
                """
                CREATE TABLE anomalies (
                    id TEXT PRIMARY KEY,
                    dedupe_key TEXT NOT NULL UNIQUE,
                    kind TEXT NOT NULL,
                    status TEXT NOT NULL,
                    transaction_id TEXT,
                    order_id TEXT,
                    account_id TEXT,
                    detail TEXT NOT NULL,
                    created_at BIGINT NOT NULL,
                    resolved_at BIGINT,
                    resolution TEXT
                )
                """,
                "CREATE INDEX anomalies_status ON anomalies (status, created_at)",
                """
                CREATE TABLE audit (
                    id TEXT PRIMARY KEY,
                    actor TEXT NOT NULL,
                    action TEXT NOT NULL,
                    subject TEXT,
                    detail TEXT NOT NULL,
                    created_at BIGINT NOT NULL
                )
                """,
                """
                CREATE TABLE outbox (
                    id TEXT PRIMARY KEY,
                    event TEXT NOT NULL,
                    payload TEXT NOT NULL,
                    created_at BIGINT NOT NULL,
                    sent_at BIGINT
                )
                """,
            ]
        ),
        (
            2,
            [
                // What an operator needs to deliver a held transaction by hand.
                "ALTER TABLE anomalies ADD COLUMN payload TEXT",
                """
                CREATE TABLE debits (
                    idempotency_key TEXT PRIMARY KEY,
                    account_id TEXT NOT NULL,
                    currency TEXT NOT NULL,
                    amount BIGINT NOT NULL,
                    balance_after BIGINT NOT NULL,
                    created_at BIGINT NOT NULL
                )
                """,
            ]
        ),
        (
            3,
            [
                // Durable work that needs Apple: survives restarts, shared by every instance.
                """
                CREATE TABLE jobs (
                    id TEXT PRIMARY KEY,
                    kind TEXT NOT NULL,
                    dedupe_key TEXT NOT NULL UNIQUE,
                    payload TEXT NOT NULL,
                    status TEXT NOT NULL,
                    attempts INTEGER NOT NULL,
                    run_at BIGINT NOT NULL,
                    created_at BIGINT NOT NULL,
                    last_error TEXT,
                    stuck_reported INTEGER NOT NULL
                )
                """,
                "CREATE INDEX jobs_due ON jobs (status, run_at)",
            ]
        ),
        (
            4,
            [
                // Each balance kept beside its ledger, changed in the same transaction as the
                // entries (always equal to their sum): O(1) to read, and a debit is one
                // conditional UPDATE, which PostgreSQL serializes per account (no overdraw).
                """
                CREATE TABLE balances (
                    account_id TEXT NOT NULL,
                    currency TEXT NOT NULL,
                    amount BIGINT NOT NULL,
                    PRIMARY KEY (account_id, currency)
                )
                """,
                """
                INSERT INTO balances (account_id, currency, amount)
                SELECT account_id, currency, CAST(SUM(amount) AS BIGINT) FROM ledger GROUP BY account_id, currency
                """,
            ]
        ),
        (
            5,
            [
                // Webhook delivery state of each outbox event: retried with backoff until sent.
                "ALTER TABLE outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE outbox ADD COLUMN next_attempt_at BIGINT NOT NULL DEFAULT 0",
                "ALTER TABLE outbox ADD COLUMN last_error TEXT",
                "CREATE INDEX outbox_pending ON outbox (sent_at, next_attempt_at)",
            ]
        ),
        (
            6,
            [
                // Proofs that failed verification, kept for re-verification after a configuration
                // fix (deduplicated by SHA-256, capped per account per day, pruned after retention).
                """
                CREATE TABLE rejected_proofs (
                    id TEXT PRIMARY KEY,
                    sha256 TEXT NOT NULL UNIQUE,
                    kind TEXT NOT NULL,
                    proof TEXT NOT NULL,
                    size BIGINT NOT NULL,
                    code TEXT NOT NULL,
                    reason TEXT NOT NULL,
                    account_id TEXT NOT NULL,
                    order_id TEXT,
                    created_at BIGINT NOT NULL,
                    server_version TEXT NOT NULL,
                    status TEXT NOT NULL,
                    checked_at BIGINT,
                    outcome TEXT
                )
                """,
                "CREATE INDEX rejected_proofs_account ON rejected_proofs (account_id, created_at)",
                "CREATE INDEX rejected_proofs_status ON rejected_proofs (status, created_at)",
                "CREATE INDEX rejected_proofs_created ON rejected_proofs (created_at)",
            ]
        ),
        (
            7,
            [
                // Counting an account's open orders (limits.maxOpenOrdersPerAccount) without
                // reading its delivered ones.
                "CREATE INDEX orders_account_status ON orders (account_id, status, created_at)"
            ]
        ),
        (
            8,
            [
                // Debit idempotency keys in their own column, bound to the request they first
                // answered (a hash of account, currency and amount): a reuse with anything
                // different is a conflict, never a silent no-op. (`debits` keeps the rows of
                // the earlier scheme, still honoured for retries across the upgrade.)
                """
                CREATE TABLE debit_requests (
                    idempotency_key TEXT PRIMARY KEY,
                    request_hash TEXT NOT NULL,
                    account_id TEXT NOT NULL,
                    currency TEXT NOT NULL,
                    amount BIGINT NOT NULL,
                    balance_after BIGINT NOT NULL,
                    created_at BIGINT NOT NULL
                )
                """
            ]
        ),
        (
            9,
            [
                // Auto-renewable subscriptions, one row per original transaction, as
                // SubscriptionMachine left them; bound to the account the delivery was.
                """
                CREATE TABLE subscriptions (
                    original_transaction_id TEXT PRIMARY KEY,
                    account_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    status TEXT NOT NULL,
                    expires_at BIGINT,
                    auto_renew INTEGER NOT NULL,
                    next_product_id TEXT,
                    grace_ends_at BIGINT,
                    latest_transaction_id TEXT,
                    revoked_transaction_id TEXT,
                    signed_at BIGINT NOT NULL,
                    updated_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX subscriptions_account ON subscriptions (account_id)",
            ]
        ),
        (
            10,
            [
                // App Store Server Notifications, committed before the 200 (unique by UUID: a
                // retry is a no-op) and applied per subject (the original transaction) in
                // signedDate order: pending → applied | ignored | stale | unattributed.
                """
                CREATE TABLE notifications (
                    notification_uuid TEXT PRIMARY KEY,
                    notification_type TEXT NOT NULL,
                    subtype TEXT,
                    subject TEXT NOT NULL,
                    transaction_id TEXT,
                    signed_date BIGINT NOT NULL,
                    environment TEXT,
                    signed_payload TEXT NOT NULL,
                    status TEXT NOT NULL,
                    outcome TEXT,
                    received_at BIGINT NOT NULL,
                    applied_at BIGINT
                )
                """,
                "CREATE INDEX notifications_subject ON notifications (subject, status, signed_date)",
                "CREATE INDEX notifications_status ON notifications (status, received_at)",
                // A refunded delivery (REFUND until a REFUND_REVERSED): what a repeat changes nothing on.
                "ALTER TABLE deliveries ADD COLUMN refunded_at BIGINT",
                // Webhook events refused for webhooks.maxAttemptHours move to the dead letters
                // (dead_at); a replay starts a new attempt window (window_start, else created_at).
                "ALTER TABLE outbox ADD COLUMN dead_at BIGINT",
                "ALTER TABLE outbox ADD COLUMN window_start BIGINT",
            ]
        ),
        (
            11,
            [
                // Revenue facts per delivered transaction (Apple's price in milliunits of
                // `currency`; the period it paid for, for the one-year rule) and the percent the
                // developer keeps by the core's `Proceeds` rule before the Small Business
                // Program (applied when reading). Sandbox and Xcode: NULL percent, never revenue.
                "ALTER TABLE deliveries ADD COLUMN price_milli BIGINT",
                "ALTER TABLE deliveries ADD COLUMN currency TEXT",
                "ALTER TABLE deliveries ADD COLUMN proceeds_percent INTEGER",
                "ALTER TABLE deliveries ADD COLUMN period_start BIGINT",
                "ALTER TABLE deliveries ADD COLUMN period_end BIGINT",
                "CREATE INDEX deliveries_original ON deliveries (original_transaction_id)",
            ]
        ),
        (
            12,
            [
                // What a refund removed of a one-time product's entitlement (1, and the window's
                // end, or NULL for a lasting unlock), so REFUND_REVERSED reinstates exactly it —
                // a stacked non-renewing pass keeps the window it had, not one recomputed from
                // its purchase date.
                "ALTER TABLE deliveries ADD COLUMN refund_removed_entitlement INTEGER",
                "ALTER TABLE deliveries ADD COLUMN refund_removed_expires_at BIGINT",
            ]
        ),
        (
            13,
            [
                // Offers (issue 14): the promotional offer an order was signed for (its nonce
                // single-use), the transaction that redeemed it, and the app's appTransactionId.
                "ALTER TABLE orders ADD COLUMN offer_id TEXT",
                "ALTER TABLE orders ADD COLUMN offer_nonce TEXT",
                "ALTER TABLE orders ADD COLUMN offer_redeemed_transaction_id TEXT",
                "ALTER TABLE orders ADD COLUMN app_transaction_id TEXT",
                "CREATE UNIQUE INDEX orders_offer_nonce ON orders (offer_nonce)",
                // What Apple signed about the offer of a delivered transaction; offer_source says
                // whose it was: 'order' (signed by us for the order it paid), 'not_signed_here'
                // (a promotional offer we did not sign for that order), 'apple' (introductory,
                // offer code, win-back: Apple's decision).
                "ALTER TABLE deliveries ADD COLUMN offer_type INTEGER",
                "ALTER TABLE deliveries ADD COLUMN offer_identifier TEXT",
                "ALTER TABLE deliveries ADD COLUMN offer_source TEXT",
                "CREATE INDEX deliveries_account_offer ON deliveries (account_id, offer_type)",
                // Which Apple Accounts (appTransactionId) each account used, and the reverse.
                """
                CREATE TABLE apple_accounts (
                    app_transaction_id TEXT NOT NULL,
                    account_id TEXT NOT NULL,
                    first_seen_at BIGINT NOT NULL,
                    PRIMARY KEY (app_transaction_id, account_id)
                )
                """,
                "CREATE INDEX apple_accounts_account ON apple_accounts (account_id)",
                // Operator grants: entitlement until expires_at (ended_at when revoked early).
                """
                CREATE TABLE grants (
                    grant_id TEXT PRIMARY KEY,
                    account_id TEXT NOT NULL,
                    entitlement_id TEXT NOT NULL,
                    expires_at BIGINT NOT NULL,
                    created_at BIGINT NOT NULL,
                    ended_at BIGINT,
                    note TEXT NOT NULL
                )
                """,
                "CREATE INDEX grants_account ON grants (account_id, expires_at)",
                // Renewal-date extensions asked of Apple: one request identifier for every retry.
                """
                CREATE TABLE extensions (
                    request_id TEXT PRIMARY KEY,
                    original_transaction_id TEXT,
                    product_id TEXT,
                    account_id TEXT,
                    days INTEGER NOT NULL,
                    reason TEXT NOT NULL,
                    note TEXT NOT NULL,
                    status TEXT NOT NULL,
                    created_at BIGINT NOT NULL,
                    completed_at BIGINT,
                    effective_date BIGINT,
                    succeeded_count INTEGER,
                    failed_count INTEGER,
                    error TEXT
                )
                """,
                "CREATE INDEX extensions_subscription ON extensions (original_transaction_id, created_at)",
                // Apple's Get Retention Message requests, once each, with the answer given.
                """
                CREATE TABLE retention_requests (
                    request_identifier TEXT PRIMARY KEY,
                    original_transaction_id TEXT NOT NULL,
                    account_id TEXT,
                    product_id TEXT NOT NULL,
                    rule_name TEXT,
                    holdout INTEGER NOT NULL,
                    answer TEXT NOT NULL,
                    environment TEXT,
                    received_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX retention_requests_rule ON retention_requests (rule_name, received_at)",
            ]
        ),
        (
            14,
            [
                // JWS headers (`alg` and the x5c chain, ~4 KB, the same in nearly every
                // notification) stored once, by the SHA-256 of the segment; a notification's
                // signed_payload refers to them (StoredJWS). Rows written before keep the text.
                "CREATE TABLE jws_headers (id TEXT PRIMARY KEY, segment TEXT NOT NULL)"
            ]
        ),
        (
            15,
            [
                // Dashboard sessions ended on the server (DashboardSessionStore): one signed-out
                // session by its nonce, kept until it would have expired anyway; and, per secret
                // key, "sign out everywhere": sessions issued at or before `not_before` are over.
                """
                CREATE TABLE dashboard_sessions_ended (
                    nonce TEXT PRIMARY KEY,
                    expires_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX dashboard_sessions_ended_expiry ON dashboard_sessions_ended (expires_at)",
                "CREATE TABLE dashboard_sign_outs (key_id TEXT PRIMARY KEY, not_before BIGINT NOT NULL)",
                // Whether the order carries an introductory-offer eligibility signed `true`: a
                // once-per-account allowance counts from when it is signed, not only once redeemed.
                "ALTER TABLE orders ADD COLUMN intro_allowed INTEGER",
                // Rejected proofs within a byte budget (RejectedProofStore): what each row costs,
                // whether its text was kept (only proofs whose chain reaches a trusted or Apple
                // root; the others are their hash, code and account), and the bytes per UTC day.
                "ALTER TABLE rejected_proofs ADD COLUMN stored_bytes BIGINT",
                "ALTER TABLE rejected_proofs ADD COLUMN proof_kept INTEGER NOT NULL DEFAULT 1",
                "UPDATE rejected_proofs SET stored_bytes = size + 256",
                "CREATE INDEX rejected_proofs_unkept ON rejected_proofs (proof_kept, created_at)",
                "CREATE TABLE rejected_proofs_budget (day BIGINT PRIMARY KEY, bytes BIGINT NOT NULL)",
                """
                INSERT INTO rejected_proofs_budget (day, bytes)
                SELECT created_at / 86400000, SUM(stored_bytes) FROM rejected_proofs GROUP BY created_at / 86400000
                """,
            ]
        ),
        (
            16,
            [
                // Apple 2025–2026 (issue 33). A refund takes back what it refunded, once: the
                // share refunded so far (milliunits of a percent) and the units taken back, so a
                // repeat takes nothing, a larger share only the difference, a reversal exactly that.
                "ALTER TABLE deliveries ADD COLUMN refund_share INTEGER",
                "ALTER TABLE deliveries ADD COLUMN refund_taken BIGINT",
                "ALTER TABLE deliveries ADD COLUMN refund_type TEXT",
                // The Apple Account behind each transaction (appTransactionId): RESCIND_CONSENT
                // finds its accounts by it; the shared-Apple-ID signal and anyTransactionId use it.
                "ALTER TABLE deliveries ADD COLUMN app_transaction_id TEXT",
                // Finish Transaction on the server (apple.finishTransactions): -1 queued, else when.
                "ALTER TABLE deliveries ADD COLUMN finished_at BIGINT",
                // The finish sweep reads the last week's unfinished deliveries, not the table.
                "CREATE INDEX deliveries_unfinished ON deliveries (delivered_at) WHERE finished_at IS NULL",
                "CREATE INDEX deliveries_app_transaction ON deliveries (app_transaction_id)",
                "CREATE INDEX orders_app_transaction ON orders (app_transaction_id)",
                // The customer's consent to share consumption data with Apple (Send Consumption
                // Information V2), recorded by the app (or its backend), withdrawn by the customer
                // or by a parent (RESCIND_CONSENT).
                """
                CREATE TABLE consents (
                    account_id TEXT PRIMARY KEY,
                    consented INTEGER NOT NULL,
                    source TEXT NOT NULL,
                    changed_at BIGINT NOT NULL
                )
                """,
                """
                CREATE TABLE consent_rescissions (
                    notification_uuid TEXT PRIMARY KEY,
                    app_transaction_id TEXT,
                    bundle_id TEXT,
                    environment TEXT,
                    account_ids TEXT NOT NULL,
                    received_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX consent_rescissions_received ON consent_rescissions (received_at)",
                "CREATE INDEX consent_rescissions_app_transaction ON consent_rescissions (app_transaction_id)",
                // Each account's own appAccountToken, stable, for Set App Account Token: purchases
                // made outside the app carry it once an account claims them.
                """
                CREATE TABLE account_tokens (
                    account_id TEXT PRIMARY KEY,
                    app_account_token TEXT NOT NULL UNIQUE,
                    created_at BIGINT NOT NULL
                )
                """,
                // A monthly plan with a 12-month commitment (billingPlanType MONTHLY).
                "ALTER TABLE subscriptions ADD COLUMN billing_plan TEXT",
                "ALTER TABLE subscriptions ADD COLUMN commitment_period INTEGER",
                "ALTER TABLE subscriptions ADD COLUMN commitment_periods INTEGER",
                "ALTER TABLE subscriptions ADD COLUMN commitment_expires_at BIGINT",
                "ALTER TABLE subscriptions ADD COLUMN commitment_renews INTEGER",
                // External purchases (ExternalPurchaseStore): Apple's tokens, the web checkout's
                // purchases each token covers, and the journal of External Purchase Server API
                // reports (one requestIdentifier per report, reused only to resend a failed one).
                """
                CREATE TABLE external_tokens (
                    external_purchase_id TEXT PRIMARY KEY,
                    account_id TEXT,
                    token_type TEXT,
                    environment TEXT NOT NULL,
                    bundle_id TEXT,
                    created_at BIGINT,
                    expires_at BIGINT,
                    first_seen_at BIGINT NOT NULL,
                    last_notice TEXT,
                    last_notice_at BIGINT,
                    unreported_notices INTEGER NOT NULL DEFAULT 0,
                    reported_at BIGINT
                )
                """,
                """
                CREATE TABLE web_purchases (
                    payment_id TEXT PRIMARY KEY,
                    transaction_id TEXT NOT NULL UNIQUE,
                    account_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    quantity INTEGER NOT NULL,
                    amount_milli BIGINT NOT NULL,
                    tax_milli BIGINT NOT NULL,
                    currency TEXT NOT NULL,
                    tax_country TEXT,
                    external_purchase_id TEXT,
                    line_item_id TEXT NOT NULL,
                    purchased_at BIGINT NOT NULL,
                    refunded_at BIGINT,
                    refund_line_item_id TEXT,
                    reported_buy INTEGER NOT NULL DEFAULT 0,
                    reported_refund INTEGER NOT NULL DEFAULT 0
                )
                """,
                "CREATE INDEX web_purchases_token ON web_purchases (external_purchase_id)",
                """
                CREATE TABLE external_reports (
                    request_identifier TEXT PRIMARY KEY,
                    external_purchase_id TEXT NOT NULL,
                    status TEXT NOT NULL,
                    payload TEXT NOT NULL,
                    state TEXT NOT NULL,
                    response TEXT,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    created_at BIGINT NOT NULL,
                    sent_at BIGINT
                )
                """,
                "CREATE INDEX external_reports_token ON external_reports (external_purchase_id, created_at)",
            ]
        ),
        (
            17,
            [
                // Web subscriptions: each payment is a paid period (until `expires_at`) of the
                // subscription its first payment started (`original_payment_id`).
                "ALTER TABLE web_purchases ADD COLUMN original_payment_id TEXT",
                "ALTER TABLE web_purchases ADD COLUMN expires_at BIGINT",
                // The minute pass looks for open web subscriptions past their period: a partial
                // index of just those, never a scan of every subscription.
                """
                CREATE INDEX subscriptions_web_open ON subscriptions (expires_at)
                WHERE original_transaction_id LIKE 'web:%' AND status IN ('active', 'grace_period')
                """,
            ]
        ),
        (
            18,
            [
                // Google Play: every purchase token read from the Play Developer API, with what
                // the server owes Google for it (acknowledgement within three days).
                """
                CREATE TABLE google_purchases (
                    purchase_token TEXT PRIMARY KEY,
                    app_id TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    catalog_product_id TEXT NOT NULL,
                    account_id TEXT,
                    order_id TEXT,
                    quantity INTEGER NOT NULL,
                    state TEXT NOT NULL,
                    test INTEGER NOT NULL DEFAULT 0,
                    paid_at BIGINT,
                    acknowledged_at BIGINT,
                    ack_alerted INTEGER NOT NULL DEFAULT 0,
                    linked_purchase_token TEXT,
                    retired INTEGER NOT NULL DEFAULT 0,
                    original_transaction_id TEXT,
                    expires_at BIGINT,
                    updated_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX google_purchases_unacknowledged ON google_purchases (paid_at) WHERE acknowledged_at IS NULL",
                "CREATE INDEX google_purchases_order ON google_purchases (order_id)",
                "CREATE INDEX google_purchases_original ON google_purchases (original_transaction_id)",
                "CREATE INDEX google_purchases_open ON google_purchases (kind, expires_at)",
                // Real-time developer notifications, durable before the push is acknowledged,
                // one row per Pub/Sub messageId.
                """
                CREATE TABLE google_notifications (
                    message_id TEXT PRIMARY KEY,
                    app_id TEXT,
                    type TEXT NOT NULL,
                    purchase_token TEXT,
                    body TEXT NOT NULL,
                    status TEXT NOT NULL,
                    outcome TEXT,
                    received_at BIGINT NOT NULL,
                    applied_at BIGINT
                )
                """,
                "CREATE INDEX google_notifications_received ON google_notifications (received_at)",
                // Voided purchases seen (polled or notified), once each.
                """
                CREATE TABLE google_voided (
                    void_key TEXT PRIMARY KEY,
                    app_id TEXT NOT NULL,
                    purchase_token TEXT NOT NULL,
                    order_id TEXT,
                    voided_quantity INTEGER,
                    voided_at BIGINT,
                    recorded_at BIGINT NOT NULL
                )
                """,
                "CREATE INDEX google_voided_token ON google_voided (purchase_token)",
                "CREATE TABLE google_poll_state (app_id TEXT PRIMARY KEY, voided_polled_at BIGINT NOT NULL)",
                // Orders name their app (`apps` id) once a deployment has several.
                "ALTER TABLE orders ADD COLUMN app_id TEXT",
            ]
        ),
        (
            19,
            [
                // Several apps per deployment: the app of each delivery and subscription (the
                // transaction's bundle id or package name, as `apps[].id`). Rows from before
                // have none; reads fall back to the app their store implies.
                "ALTER TABLE deliveries ADD COLUMN app_id TEXT",
                "ALTER TABLE subscriptions ADD COLUMN app_id TEXT",
                "ALTER TABLE anomalies ADD COLUMN app_id TEXT",
            ]
        ),
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
            ] + AnalyticsViews.create
        ),
    ]

    /// Applies every migration not yet applied, each in its own transaction. Safe to run from
    /// several processes at once: a migration that loses the race is skipped.
    public static func run(on database: Database) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"
            ).run()
        }
        for migration in all {
            do {
                // A migration may build an index on a large table: far longer than the 30 s an
                // ordinary PostgreSQL transaction is given.
                try await database.transaction(deadline: .seconds(3600)) { sql in
                    let applied = try await sql.raw(
                        "SELECT version FROM schema_migrations WHERE version = \(bind: migration.version)"
                    ).first()
                    guard applied == nil else { return }
                    // Claim the version first, so a concurrent migrator fails here, not halfway.
                    try await sql.raw(
                        "INSERT INTO schema_migrations (version, applied_at) VALUES (\(bind: migration.version), \(bind: Date().milliseconds))"
                    ).run()
                    for statement in migration.statements { try await sql.raw(SQLQueryString(statement)).run() }
                }
            } catch {
                let applied = try await database.read { sql in
                    try await sql.raw(
                        "SELECT version FROM schema_migrations WHERE version = \(bind: migration.version)"
                    )
                    .first()
                }
                if applied == nil { throw error }
            }
        }
    }

    public static func appliedVersions(on database: Database) async throws -> [Int] {
        try await database.read { sql in
            try await sql.raw("SELECT version FROM schema_migrations ORDER BY version").all().map {
                try $0.decode(column: "version", as: Int.self)
            }
        }
    }
}

extension Date {
    var milliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }
    init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
