import Foundation

/// Migrations of offers, refunds, consent, external purchases, Google Play, several apps (11–19).
extension Migrations {
    static let era2: [(version: Int, statements: [String])] = [
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
    ]
}
