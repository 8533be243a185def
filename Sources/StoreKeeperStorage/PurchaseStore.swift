import AppStoreModels
import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore

/// Orders and deliveries on the database: every delivery is planned and committed inside one
/// database transaction, keyed by transactionId, so concurrent and repeated submissions —
/// from one or many server instances — deliver exactly once (ARCHITECTURE.md invariant 1).
public struct PurchaseStore: Sendable {
    public let database: Database
    let batcher: DeliveryBatcher

    public init(database: Database) {
        self.database = database
        self.batcher = DeliveryBatcher(database: database)
    }

    public struct DeliveryResult: Sendable {
        public var plan: DeliveryPlanner.Plan
        /// For `already_delivered`: the delivery recorded the first time.
        public var existing: DeliveryPlanner.Delivery?
        /// The submitting account as committed with this delivery (balances and entitlements),
        /// read in the same database transaction, so the answer needs no second round trip.
        public var account: AccountState?
    }

    /// An account's consumable balances and entitlements.
    public struct AccountState: Sendable, Hashable {
        public var balances: [String: Int64] = [:]
        public var entitlements: [EntitlementRow] = []
    }

    // MARK: Orders

    /// The account already has `limit` unpaid, unexpired orders (`too_many_open_orders`).
    public struct TooManyOpenOrders: Error, Sendable {
        public var limit: Int
    }

    /// Creates an order; refused with `TooManyOpenOrders` when the account has `maxOpen`
    /// unpaid orders created within `ttl` (cancelled and expired orders are not open).
    public func createOrder(
        accountId: String, productId: String, quantity: Int, maxOpen: Int? = nil, ttl: TimeInterval = 24 * 3600,
        now: Date
    ) async throws -> Order {
        let order = Order(
            orderId: UUID().uuidString.lowercased(), appAccountToken: UUID(), accountId: accountId,
            productId: productId,
            quantity: quantity, status: .created, createdAt: now)
        let cutoff = now.addingTimeInterval(-ttl).milliseconds
        try await database.transaction { sql in
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
            try await sql.raw(
                """
                INSERT INTO orders (order_id, app_account_token, account_id, product_id, quantity, status, created_at)
                VALUES (\(bind: order.orderId), \(bind: order.appAccountToken.uuidString.lowercased()), \(bind: accountId),
                        \(bind: productId), \(bind: quantity), \(bind: order.status.rawValue), \(bind: now.milliseconds))
                """
            ).run()
        }
        return order
    }

    public func order(_ orderId: String) async throws -> Order? {
        try await database.read { sql in try await Self.order(sql, where: "order_id", orderId) }
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

    // MARK: Deliveries

    /// Plans and commits the delivery of one verified transaction. Concurrent deliveries are
    /// committed together (group commit); each is answered only once it is durable.
    /// How long the oldest submitted delivery has waited for its batch, if one is waiting.
    public var oldestWaitingDelivery: Duration? { batcher.oldestWaiting }

    public func deliver(
        _ transaction: JWSTransactionDecodedPayload, submittingAccount: String?, requestedOrderId: String? = nil,
        catalog: Catalog, policy: OwnershipPolicy = .firstBinder, evidence: DeliveryPlanner.Evidence = .device,
        now: Date
    ) async throws -> DeliveryResult {
        try await batcher.deliver(
            transaction, submittingAccount: submittingAccount, requestedOrderId: requestedOrderId, catalog: catalog,
            policy: policy, evidence: evidence, now: now)
    }

    /// One delivery in its own database transaction, retried when a concurrent delivery of
    /// the same transaction wins the unique key (the retry then reads it: already_delivered).
    static func deliverAlone(
        _ database: Database, _ transaction: JWSTransactionDecodedPayload, submittingAccount: String?,
        requestedOrderId: String?, catalog: Catalog, policy: OwnershipPolicy,
        evidence: DeliveryPlanner.Evidence = .device, now: Date
    ) async throws -> DeliveryResult {
        var lastError: (any Error)?
        for _ in 0..<4 {
            do {
                return try await database.transaction { sql in
                    let context = try await Self.context(
                        sql, transaction: transaction, submittingAccount: submittingAccount,
                        requestedOrderId: requestedOrderId, catalog: catalog, policy: policy, evidence: evidence)
                    let plan = DeliveryPlanner.plan(context, now: now)
                    try await Self.apply(plan, transaction: transaction, context: context, sql: sql, now: now)
                    var account: AccountState?
                    if let submittingAccount {
                        account =
                            try await Self.accountStates([submittingAccount], sql: sql)[submittingAccount]
                            ?? AccountState()
                    }
                    return DeliveryResult(plan: plan, existing: context.existingDelivery, account: account)
                }
            } catch {
                lastError = error
            }
        }
        throw lastError ?? CancellationError()
    }

    static func context(
        _ sql: any SQLDatabase, transaction: JWSTransactionDecodedPayload, submittingAccount: String?,
        requestedOrderId: String?, catalog: Catalog, policy: OwnershipPolicy,
        evidence: DeliveryPlanner.Evidence = .device
    ) async throws -> DeliveryPlanner.Context {
        let transactionId = transaction.transactionId ?? ""
        let existing = try await sql.raw("SELECT * FROM deliveries WHERE transaction_id = \(bind: transactionId)")
            .first()
            .map { row in
                DeliveryPlanner.Delivery(
                    transactionId: try row.decode(column: "transaction_id", as: String.self),
                    accountId: try row.decode(column: "account_id", as: String.self),
                    orderId: try row.decode(column: "order_id", as: String?.self),
                    productId: try row.decode(column: "product_id", as: String.self),
                    quantity: try row.decode(column: "quantity", as: Int.self))
            }
        var byToken: Order?
        if let token = transaction.appAccountToken?.lowercased() {
            byToken = try await order(sql, where: "app_account_token", token)
        }
        var requested: Order?
        if let requestedOrderId { requested = try await order(sql, where: "order_id", requestedOrderId) }
        var oldest: Order?
        if let account = submittingAccount, byToken == nil, requested == nil {
            oldest = try await sql.raw(
                """
                SELECT * FROM orders WHERE account_id = \(bind: account) AND product_id = \(bind: transaction.productId ?? "")
                AND status IN ('created', 'pending') ORDER BY created_at, order_id LIMIT 1
                """
            ).first().map(decodeOrder)
        }
        // Consumables bind nobody: no ownership to read.
        let product = catalog.product(transaction.productId ?? "")
        var bound: String?
        if product?.type != .consumable {
            bound = try await sql.raw(
                "SELECT account_id FROM ownership WHERE original_transaction_id = \(bind: transaction.originalTransactionId ?? transactionId)"
            ).first().map { try $0.decode(column: "account_id", as: String.self) }
        }
        var currentExpiry: Date?
        if let product = catalog.product(transaction.productId ?? ""), product.type == .nonRenewing,
            let entitlement = product.grants.entitlement,
            let account = byToken?.accountId ?? requested?.accountId ?? submittingAccount ?? bound
        {
            currentExpiry = try await sql.raw(
                """
                SELECT MAX(expires_at) AS expiry FROM entitlements
                WHERE account_id = \(bind: account) AND entitlement_id = \(bind: entitlement)
                """
            ).first().flatMap { try $0.decode(column: "expiry", as: Int64?.self) }.map(Date.init(milliseconds:))
        }
        return DeliveryPlanner.Context(
            transaction: transaction, submittingAccount: submittingAccount, orderByToken: byToken,
            requestedOrder: requested,
            oldestOpenOrder: oldest, existingDelivery: existing, boundAccount: bound,
            currentEntitlementExpiry: currentExpiry, catalog: catalog, policy: policy, evidence: evidence)
    }

    static func apply(
        _ plan: DeliveryPlanner.Plan, transaction: JWSTransactionDecodedPayload, context: DeliveryPlanner.Context,
        sql: any SQLDatabase, now: Date
    ) async throws {
        let at = now.milliseconds
        let originalId = transaction.originalTransactionId ?? transaction.transactionId ?? ""
        if let delivery = plan.delivery {
            // The exactly-once key: a second insert of this transactionId fails and rolls back.
            try await sql.raw(
                """
                INSERT INTO deliveries (transaction_id, original_transaction_id, account_id, order_id, product_id, quantity,
                                        environment, delivered_at)
                VALUES (\(bind: delivery.transactionId), \(bind: originalId), \(bind: delivery.accountId),
                        \(bind: delivery.orderId), \(bind: delivery.productId), \(bind: delivery.quantity),
                        \(bind: transaction.environment?.rawValue ?? "Production"), \(bind: at))
                """
            ).run()
        }
        if let order = plan.order {
            try await sql.raw(
                """
                UPDATE orders SET status = 'delivered', transaction_id = \(bind: order.transactionId), delivered_at = \(bind: at)
                WHERE order_id = \(bind: order.orderId) AND status IN ('created', 'pending', 'cancelled')
                """
            ).run()
        }
        for write in ledgerWrites(plan.ledger.map { ($0, at) }) { try await sql.execute(sql: write) { _ in } }
        if let account = plan.accountId {
            for case .entitlement(let id, let expiresAt) in plan.grants {
                try await sql.raw(
                    """
                    INSERT INTO entitlements (account_id, entitlement_id, original_transaction_id, product_id, expires_at)
                    VALUES (\(bind: account), \(bind: id), \(bind: originalId), \(bind: transaction.productId ?? ""),
                            \(bind: expiresAt?.milliseconds))
                    ON CONFLICT (account_id, entitlement_id, original_transaction_id)
                    DO UPDATE SET expires_at = excluded.expires_at, product_id = excluded.product_id
                    """
                ).run()
            }
        }
        if let binding = plan.binding {
            if let previous = context.boundAccount {
                try await sql.raw(
                    "UPDATE ownership SET account_id = \(bind: binding), bound_at = \(bind: at) WHERE original_transaction_id = \(bind: originalId)"
                ).run()
                try await sql.raw(
                    "DELETE FROM entitlements WHERE account_id = \(bind: previous) AND original_transaction_id = \(bind: originalId)"
                )
                .run()
                try await audit(
                    sql, actor: "policy", action: "ownership_transfer", subject: originalId,
                    detail: "moved from account \(previous) to \(binding) (transfer policy)", at: at)
            } else {
                try await sql.raw(
                    "INSERT INTO ownership (original_transaction_id, account_id, bound_at) VALUES (\(bind: originalId), \(bind: binding), \(bind: at))"
                ).run()
            }
        }
        let held = String(decoding: try JSONEncoder().encode(transaction), as: UTF8.self)
        for anomaly in plan.anomalies {
            let key = [
                anomaly.kind.rawValue, anomaly.transactionId ?? "", anomaly.orderId ?? "", anomaly.accountId ?? "",
            ]
            .joined(separator: "|")
            try await sql.raw(
                """
                INSERT INTO anomalies (id, dedupe_key, kind, status, transaction_id, order_id, account_id, detail, created_at,
                                       payload)
                VALUES (\(bind: UUID().uuidString.lowercased()), \(bind: key), \(bind: anomaly.kind.rawValue), 'open',
                        \(bind: anomaly.transactionId), \(bind: anomaly.orderId), \(bind: anomaly.accountId),
                        \(bind: anomaly.detail), \(bind: at), \(bind: held))
                ON CONFLICT (dedupe_key) DO NOTHING
                """
            ).run()
        }
        if let delivery = plan.delivery {
            try await sql.raw(
                """
                INSERT INTO outbox (id, event, payload, created_at)
                VALUES (\(bind: OutboxStore.newEventId()), 'delivery', \(bind: Self.outboxPayload(delivery, environment: transaction.environment?.rawValue ?? "Production")), \(bind: at))
                """
            ).run()
        }
    }

    static func audit(
        _ sql: any SQLDatabase, actor: String, action: String, subject: String?, detail: String, at: Int64
    )
        async throws
    {
        try await sql.raw(
            """
            INSERT INTO audit (id, actor, action, subject, detail, created_at)
            VALUES (\(bind: UUID().uuidString.lowercased()), \(bind: actor), \(bind: action), \(bind: subject), \(bind: detail), \(bind: at))
            """
        ).run()
    }

    /// Ledger entries and the balance changes they make: a multi-row insert into `ledger` and one
    /// upsert into `balances` (one row per account and currency, in key order, so concurrent
    /// transactions lock balance rows in the same order). Run in the caller's transaction.
    static func ledgerWrites(_ entries: [(LedgerEntry, Int64)]) -> [any SQLExpression] {
        guard !entries.isEmpty else { return [] }
        var ledger = SQLInsert(table: SQLIdentifier("ledger"))
        ledger.columns = ["entry_key", "account_id", "currency", "amount", "created_at"].map { SQLIdentifier($0) }
        ledger.values = entries.map { entry, at in
            [SQLBind(entry.key), SQLBind(entry.accountId), SQLBind(entry.currency), SQLBind(entry.amount), SQLBind(at)]
        }
        struct Key: Hashable, Comparable {
            var account: String
            var currency: String
            static func < (a: Key, b: Key) -> Bool { (a.account, a.currency) < (b.account, b.currency) }
        }
        var changes: [Key: Int64] = [:]
        for (entry, _) in entries {
            changes[Key(account: entry.accountId, currency: entry.currency), default: 0] += entry.amount
        }
        let rows = changes.sorted { $0.key < $1.key }.map { key, amount in
            SQLGroupExpression([SQLBind(key.account), SQLBind(key.currency), SQLBind(amount)] as [any SQLExpression])
        }
        let balances = SQLQueryString(
            """
            INSERT INTO balances (account_id, currency, amount) VALUES \(SQLList(rows))
            ON CONFLICT (account_id, currency) DO UPDATE SET amount = balances.amount + excluded.amount
            """)
        return [ledger, balances]
    }

    /// The outbox event of a delivery:
    /// `{"accountId","environment","orderId","productId","quantity","transactionId"}`, keys sorted,
    /// written by hand (it is on the hot path; JSONSerialization cost ~7 % of a request).
    static func outboxPayload(_ delivery: DeliveryPlanner.Delivery, environment: String) -> String {
        var json = #"{"accountId":"#
        appendJSONString(delivery.accountId, to: &json)
        json += #","environment":"#
        appendJSONString(environment, to: &json)
        json += #","orderId":"#
        if let orderId = delivery.orderId { appendJSONString(orderId, to: &json) } else { json += "null" }
        json += #","productId":"#
        appendJSONString(delivery.productId, to: &json)
        json += #","quantity":\#(delivery.quantity),"transactionId":"#
        appendJSONString(delivery.transactionId, to: &json)
        json += "}"
        return json
    }

    /// A JSON string literal (RFC 8259 escaping).
    public static func appendJSONString(_ string: String, to json: inout String) {
        json += "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": json += "\\\""
            case "\\": json += "\\\\"
            case "\n": json += "\\n"
            case "\r": json += "\\r"
            case "\t": json += "\\t"
            case _ where scalar.value < 0x20:
                json += "\\u00" + String(scalar.value, radix: 16).leftPadded(to: 2)
            default: json.unicodeScalars.append(scalar)
            }
        }
        json += "\""
    }

    // MARK: Reads

    public func balances(of accountId: String) async throws -> [String: Int64] {
        try await account(accountId).balances
    }

    /// Balances and entitlements of an account, read together.
    public func account(_ accountId: String) async throws -> AccountState {
        try await database.read { sql in
            try await Self.accountStates([accountId], sql: sql)[accountId] ?? AccountState()
        }
    }

    /// Balances and entitlements of several accounts in one statement (one round trip on
    /// PostgreSQL); accounts with neither are absent.
    static func accountStates(_ accounts: [String], sql: any SQLDatabase) async throws -> [String: AccountState] {
        guard !accounts.isEmpty else { return [:] }
        var states: [String: AccountState] = [:]
        for row in try await sql.raw(
            """
            SELECT account_id, 'b' AS kind, currency AS name, amount, NULL AS product_id,
                   NULL AS original_transaction_id, NULL AS expires_at
            FROM balances WHERE account_id IN (\(binds: accounts))
            UNION ALL
            SELECT account_id, 'e' AS kind, entitlement_id AS name, NULL AS amount, product_id,
                   original_transaction_id, expires_at
            FROM entitlements WHERE account_id IN (\(binds: accounts))
            ORDER BY account_id, kind, name, original_transaction_id
            """
        ).all() {
            let account = try row.decode(column: "account_id", as: String.self)
            let name = try row.decode(column: "name", as: String.self)
            if try row.decode(column: "kind", as: String.self) == "b" {
                states[account, default: AccountState()].balances[name] = try row.decode(
                    column: "amount", as: Int64.self)
            } else {
                states[account, default: AccountState()].entitlements.append(
                    EntitlementRow(
                        entitlementId: name, productId: try row.decode(column: "product_id", as: String.self),
                        originalTransactionId: try row.decode(column: "original_transaction_id", as: String.self),
                        expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:))))
            }
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
                        quantity: try $0.decode(column: "quantity", as: Int.self))
                }
        }
    }

    public struct StoredAnomaly: Sendable, Hashable {
        public var id: String
        public var kind: String
        public var status: String
        public var transactionId: String?
        public var orderId: String?
        public var accountId: String?
        public var detail: String
        public var createdAt: Date
        public var resolvedAt: Date?
        public var resolution: String?
        /// The verified transaction the anomaly holds, for manual delivery.
        public var transaction: JWSTransactionDecodedPayload?
    }

    public func anomalies(status: String? = nil) async throws -> [StoredAnomaly] {
        try await database.read { sql in
            let rows =
                if let status {
                    try await sql.raw("SELECT * FROM anomalies WHERE status = \(bind: status) ORDER BY created_at, id")
                        .all()
                } else {
                    try await sql.raw("SELECT * FROM anomalies ORDER BY created_at, id").all()
                }
            return try rows.map(Self.decodeAnomaly)
        }
    }

    /// How many anomalies are open, counted by the database (for `/metrics`).
    public func openAnomalyCount() async throws -> Int {
        try await database.read { sql in
            try await sql.raw("SELECT COUNT(*) AS n FROM anomalies WHERE status = 'open'").first()?
                .decode(column: "n", as: Int.self) ?? 0
        }
    }

    public func anomaly(_ id: String) async throws -> StoredAnomaly? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM anomalies WHERE id = \(bind: id)").first().map(Self.decodeAnomaly)
        }
    }

    static func decodeAnomaly(_ row: any SQLRow) throws -> StoredAnomaly {
        StoredAnomaly(
            id: try row.decode(column: "id", as: String.self), kind: try row.decode(column: "kind", as: String.self),
            status: try row.decode(column: "status", as: String.self),
            transactionId: try row.decode(column: "transaction_id", as: String?.self),
            orderId: try row.decode(column: "order_id", as: String?.self),
            accountId: try row.decode(column: "account_id", as: String?.self),
            detail: try row.decode(column: "detail", as: String.self),
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
            resolvedAt: try row.decode(column: "resolved_at", as: Int64?.self).map(Date.init(milliseconds:)),
            resolution: try row.decode(column: "resolution", as: String?.self),
            transaction: try row.decode(column: "payload", as: String?.self).flatMap {
                try? JSONDecoder().decode(JWSTransactionDecodedPayload.self, from: Data($0.utf8))
            })
    }

    /// Marks an anomaly resolved with an audit entry; idempotent (resolving twice changes nothing).
    public func resolveAnomaly(_ id: String, resolution: String, actor: String, note: String, now: Date) async throws
        -> StoredAnomaly?
    {
        try await database.transaction { sql in
            guard
                let current = try await sql.raw("SELECT * FROM anomalies WHERE id = \(bind: id)").first().map(
                    Self.decodeAnomaly)
            else { return nil }
            guard current.status == "open" else { return current }
            try await sql.raw(
                """
                UPDATE anomalies SET status = 'resolved', resolved_at = \(bind: now.milliseconds), resolution = \(bind: resolution)
                WHERE id = \(bind: id) AND status = 'open'
                """
            ).run()
            try await Self.audit(
                sql, actor: actor, action: "anomaly_\(resolution)", subject: id, detail: note, at: now.milliseconds)
            return try await sql.raw("SELECT * FROM anomalies WHERE id = \(bind: id)").first().map(Self.decodeAnomaly)
        }
    }

    public struct AuditEntry: Sendable, Hashable {
        public var id: String
        public var actor: String
        public var action: String
        public var subject: String?
        public var detail: String
        public var createdAt: Date
    }

    public func audit(limit: Int = 500) async throws -> [AuditEntry] {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM audit ORDER BY created_at DESC, id LIMIT \(bind: limit)").all().map {
                AuditEntry(
                    id: try $0.decode(column: "id", as: String.self),
                    actor: try $0.decode(column: "actor", as: String.self),
                    action: try $0.decode(column: "action", as: String.self),
                    subject: try $0.decode(column: "subject", as: String?.self),
                    detail: try $0.decode(column: "detail", as: String.self),
                    createdAt: Date(milliseconds: try $0.decode(column: "created_at", as: Int64.self)))
            }
        }
    }

    /// Records an anomaly outside a delivery (e.g. `verification_stuck` from the job runner);
    /// the same dedupe key is recorded once.
    public func raiseAnomaly(_ anomaly: AnomalyDraft, dedupeKey: String, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO anomalies (id, dedupe_key, kind, status, transaction_id, order_id, account_id, detail, created_at)
                VALUES (\(bind: UUID().uuidString.lowercased()), \(bind: dedupeKey), \(bind: anomaly.kind.rawValue), 'open',
                        \(bind: anomaly.transactionId), \(bind: anomaly.orderId), \(bind: anomaly.accountId),
                        \(bind: anomaly.detail), \(bind: now.milliseconds))
                ON CONFLICT (dedupe_key) DO NOTHING
                """
            ).run()
        }
    }

    public func recordAudit(actor: String, action: String, subject: String?, detail: String, now: Date) async throws {
        try await database.transaction { sql in
            try await Self.audit(
                sql, actor: actor, action: action, subject: subject, detail: detail, at: now.milliseconds)
        }
    }

    public struct EntitlementRow: Sendable, Hashable {
        public var entitlementId: String
        public var productId: String
        public var originalTransactionId: String
        public var expiresAt: Date?
    }

    public func entitlements(of accountId: String) async throws -> [EntitlementRow] {
        try await account(accountId).entitlements
    }

    public enum DebitResult: Sendable, Hashable {
        case debited(balance: Int64)
        case insufficient(balance: Int64)
        /// The key already answered a debit of another account, currency or amount.
        case idempotencyConflict
    }

    /// What a debit idempotency key is bound to: length-prefixed, so no two requests share it.
    static func debitRequestHash(accountId: String, currency: String, amount: Int64) -> String {
        let canonical = "\(accountId.utf8.count):\(accountId)|\(currency.utf8.count):\(currency)|\(amount)"
        return SHA256.hash(data: Data(canonical.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    /// Debits a consumable balance once per idempotency key: a repeated key with the same
    /// account, currency and amount answers the same balance without debiting again; with
    /// any of them different it is a conflict.
    public func debit(
        accountId: String, currency: String, amount: Int64, idempotencyKey: String, now: Date
    ) async throws -> DebitResult {
        let requestHash = Self.debitRequestHash(accountId: accountId, currency: currency, amount: amount)
        var lastError: (any Error)?
        for _ in 0..<4 {
            do {
                return try await database.transaction { sql in
                    if let previous = try await sql.raw(
                        "SELECT request_hash, balance_after FROM debit_requests WHERE idempotency_key = \(bind: idempotencyKey)"
                    ).first() {
                        guard try previous.decode(column: "request_hash", as: String.self) == requestHash else {
                            return .idempotencyConflict
                        }
                        return .debited(balance: try previous.decode(column: "balance_after", as: Int64.self))
                    }
                    // A retry of a debit made before keys had their own column.
                    if let legacy = try await sql.raw(
                        """
                        SELECT amount, balance_after FROM debits WHERE idempotency_key = \(bind: "\(accountId)|\(currency)|\(idempotencyKey)")
                        AND account_id = \(bind: accountId) AND currency = \(bind: currency)
                        """
                    ).first() {
                        guard try legacy.decode(column: "amount", as: Int64.self) == amount else {
                            return .idempotencyConflict
                        }
                        return .debited(balance: try legacy.decode(column: "balance_after", as: Int64.self))
                    }
                    // One conditional UPDATE: on PostgreSQL concurrent debits of one account
                    // queue on its balance row and each sees the balance the previous one left.
                    let debited = try await sql.raw(
                        """
                        UPDATE balances SET amount = amount - \(bind: amount)
                        WHERE account_id = \(bind: accountId) AND currency = \(bind: currency) AND amount >= \(bind: amount)
                        RETURNING amount
                        """
                    ).first()
                    guard let after = try debited?.decode(column: "amount", as: Int64.self) else {
                        let balance =
                            try await sql.raw(
                                "SELECT amount FROM balances WHERE account_id = \(bind: accountId) AND currency = \(bind: currency)"
                            ).first()?.decode(column: "amount", as: Int64.self) ?? 0
                        return .insufficient(balance: balance)
                    }
                    // The request row claims the key; a concurrent twin fails here, rolls back
                    // its UPDATE and retries (then answers with the first one's result).
                    try await sql.raw(
                        """
                        INSERT INTO debit_requests (idempotency_key, request_hash, account_id, currency, amount, balance_after, created_at)
                        VALUES (\(bind: idempotencyKey), \(bind: requestHash), \(bind: accountId), \(bind: currency),
                                \(bind: amount), \(bind: after), \(bind: now.milliseconds))
                        """
                    ).run()
                    try await sql.raw(
                        """
                        INSERT INTO ledger (entry_key, account_id, currency, amount, created_at)
                        VALUES (\(bind: "debit:v2:" + idempotencyKey), \(bind: accountId), \(bind: currency),
                                \(bind: -amount), \(bind: now.milliseconds))
                        """
                    ).run()
                    return .debited(balance: after)
                }
            } catch {
                lastError = error
            }
        }
        throw lastError ?? CancellationError()
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
            deliveredAt: try row.decode(column: "delivered_at", as: Int64?.self).map(Date.init(milliseconds:)))
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
