import Foundation

/// Migrations of the first schema: orders, deliveries, ledger, ownership, jobs, notifications, subscriptions (1–10).
extension Migrations {
    static let era1: [(version: Int, statements: [String])] = [
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
    ]
}
