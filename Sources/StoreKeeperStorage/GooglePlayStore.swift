import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Google Play's rows: purchase tokens as last read, notifications, voided purchases, and the
/// acknowledgement duty (google-play.md §4.4).
public struct GooglePlayStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    public static let acknowledgeJobKind = "google_acknowledge"
    public static let syncJobKind = "google_sync"
    /// Reads a paid one-time purchase's order for its price (`orders.get`): Google's purchase
    /// resources carry none, so analytics would count the purchase without money.
    public static let orderPriceJobKind = "google_order_price"

    /// A purchase token as the server last read it.
    public struct Purchase: Sendable, Hashable {
        public var purchaseToken: String
        public var appId: String
        /// `one_time` or `subscription`.
        public var kind: String
        public var productId: String
        public var catalogProductId: String
        public var accountId: String?
        public var orderId: String?
        public var quantity: Int
        public var state: String
        public var test: Bool
        public var paidAt: Date?
        public var acknowledgedAt: Date?
        public var linkedPurchaseToken: String?
        public var retired: Bool
        public var originalTransactionId: String?
        public var expiresAt: Date?

        public init(
            purchaseToken: String, appId: String, kind: String, productId: String, catalogProductId: String,
            accountId: String?, orderId: String?, quantity: Int, state: String, test: Bool, paidAt: Date?,
            acknowledgedAt: Date?, linkedPurchaseToken: String?, retired: Bool = false,
            originalTransactionId: String?, expiresAt: Date?
        ) {
            self.purchaseToken = purchaseToken
            self.appId = appId
            self.kind = kind
            self.productId = productId
            self.catalogProductId = catalogProductId
            self.accountId = accountId
            self.orderId = orderId
            self.quantity = quantity
            self.state = state
            self.test = test
            self.paidAt = paidAt
            self.acknowledgedAt = acknowledgedAt
            self.linkedPurchaseToken = linkedPurchaseToken
            self.retired = retired
            self.originalTransactionId = originalTransactionId
            self.expiresAt = expiresAt
        }

        init(row: some SQLRow) throws {
            self.init(
                purchaseToken: try row.decode(column: "purchase_token", as: String.self),
                appId: try row.decode(column: "app_id", as: String.self),
                kind: try row.decode(column: "kind", as: String.self),
                productId: try row.decode(column: "product_id", as: String.self),
                catalogProductId: try row.decode(column: "catalog_product_id", as: String.self),
                accountId: try row.decode(column: "account_id", as: String?.self),
                orderId: try row.decode(column: "order_id", as: String?.self),
                quantity: try row.decode(column: "quantity", as: Int.self),
                state: try row.decode(column: "state", as: String.self),
                test: try row.decode(column: "test", as: Int.self) != 0,
                paidAt: try row.decode(column: "paid_at", as: Int64?.self).map(Date.init(milliseconds:)),
                acknowledgedAt: try row.decode(column: "acknowledged_at", as: Int64?.self).map(
                    Date.init(milliseconds:)),
                linkedPurchaseToken: try row.decode(column: "linked_purchase_token", as: String?.self),
                retired: try row.decode(column: "retired", as: Int.self) != 0,
                originalTransactionId: try row.decode(column: "original_transaction_id", as: String?.self),
                expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)))
        }
    }

    /// The app a Google subscription (`gp:s.…`) or charge (`gp:<orderId>`) was read for.
    /// The token a Google subscription is current under (its latest, not replaced), if any.
    public func currentSubscription(original id: String) async throws -> Purchase? {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM google_purchases
                WHERE original_transaction_id = \(bind: id) AND kind = 'subscription' AND retired = 0
                ORDER BY COALESCE(paid_at, 0) DESC, purchase_token LIMIT 1
                """
            ).first().map { try Purchase(row: $0) }
        }
    }

    public func appId(ofOriginal id: String) async throws -> String? {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT app_id FROM google_purchases WHERE original_transaction_id = \(bind: id)
                   OR order_id = \(bind: String(id.dropFirst(GooglePlayPlanner.prefix.count)))
                LIMIT 1
                """
            ).first()?.decode(column: "app_id", as: String.self)
        }
    }

    /// Several tokens as last read, in one statement: what is recorded of each, by token.
    public func purchases(_ tokens: [String]) async throws -> [String: Purchase] {
        let unique = Array(Set(tokens))
        guard !unique.isEmpty else { return [:] }
        return try await database.read { sql in
            var found: [String: Purchase] = [:]
            for row in try await sql.raw("SELECT * FROM google_purchases WHERE purchase_token IN (\(binds: unique))")
                .all()
            {
                let purchase = try Purchase(row: row)
                found[purchase.purchaseToken] = purchase
            }
            return found
        }
    }

    public func purchase(_ token: String) async throws -> Purchase? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM google_purchases WHERE purchase_token = \(bind: token)").first().map {
                try Purchase(row: $0)
            }
        }
    }

    /// Records what was read (the account and paid time, once known, are kept), and — when
    /// Google still waits for it — queues the acknowledgement in the same transaction.
    /// Returns whether the token is retired (an upgrade or re-signup replaced it).
    @discardableResult
    public func record(_ purchase: Purchase, acknowledge: Bool, now: Date) async throws -> Bool {
        try await database.transaction { sql in
            try await Self.record(purchase, acknowledge: acknowledge, sql: sql, now: now)
        }
    }

    static func record(_ purchase: Purchase, acknowledge: Bool, sql: any SQLDatabase, now: Date) async throws -> Bool {
        let retired = try await upsert([(purchase, now)], sql: sql)
        try await JobStore.insertMany(
            (acknowledge ? [acknowledgeJob(purchase.purchaseToken)] : [])
                + [orderPriceJob(purchase, now: now)].compactMap { $0 },
            sql: sql, now: now)
        return retired.contains(purchase.purchaseToken)
    }

    /// Purchases as read, in one statement (each token at most once: a token twice in one
    /// `ON CONFLICT DO UPDATE` is an error on PostgreSQL); what is already known is kept where the
    /// new reading says nothing. Returns the tokens that are retired (a replacement retired them).
    static func upsert(_ purchases: [(purchase: Purchase, now: Date)], sql: any SQLDatabase) async throws -> Set<String>
    {
        guard !purchases.isEmpty else { return [] }
        var upsert = RowsInsert(
            into: "google_purchases",
            columns: [
                "purchase_token", "app_id", "kind", "product_id", "catalog_product_id", "account_id", "order_id",
                "quantity", "state", "test", "paid_at", "acknowledged_at", "linked_purchase_token",
                "original_transaction_id", "expires_at", "updated_at",
            ],
            suffix: """
                ON CONFLICT (purchase_token) DO UPDATE SET
                    account_id = COALESCE(google_purchases.account_id, excluded.account_id),
                    order_id = COALESCE(excluded.order_id, google_purchases.order_id),
                    quantity = excluded.quantity, state = excluded.state,
                    paid_at = COALESCE(google_purchases.paid_at, excluded.paid_at),
                    acknowledged_at = COALESCE(google_purchases.acknowledged_at, excluded.acknowledged_at),
                    linked_purchase_token = COALESCE(excluded.linked_purchase_token, google_purchases.linked_purchase_token),
                    original_transaction_id = COALESCE(google_purchases.original_transaction_id, excluded.original_transaction_id),
                    expires_at = COALESCE(excluded.expires_at, google_purchases.expires_at),
                    updated_at = excluded.updated_at
                RETURNING purchase_token, retired
                """)
        for (purchase, now) in purchases {
            upsert.append([
                .text(purchase.purchaseToken), .text(purchase.appId), .text(purchase.kind), .text(purchase.productId),
                .text(purchase.catalogProductId), .text(purchase.accountId), .text(purchase.orderId),
                .int(purchase.quantity), .text(purchase.state), .bool(purchase.test),
                .integer(purchase.paidAt?.milliseconds), .integer(purchase.acknowledgedAt?.milliseconds),
                .text(purchase.linkedPurchaseToken), .text(purchase.originalTransactionId),
                .integer(purchase.expiresAt?.milliseconds), .integer(now.milliseconds),
            ])
        }
        var retired = Set<String>()
        for row in try await upsert.fetch(on: sql).all() where try row.decode(column: "retired", as: Int.self) == 1 {
            retired.insert(try row.decode(column: "purchase_token", as: String.self))
        }
        return retired
    }

    /// The acknowledgement Google waits for, as a job (one per token).
    static func acknowledgeJob(_ token: String) -> (kind: String, dedupeKey: String, payload: String, runAt: Date?) {
        (acknowledgeJobKind, "\(acknowledgeJobKind)|\(tokenDigest(token))", token, nil)
    }

    /// Once per paid one-time order (a test purchase earns nothing): its price, read from the
    /// Orders API after it is delivered.
    static func orderPriceJob(_ purchase: Purchase, now: Date)
        -> (kind: String, dedupeKey: String, payload: String, runAt: Date?)?
    {
        guard purchase.kind == "one_time", !purchase.test, purchase.paidAt != nil, let orderId = purchase.orderId
        else { return nil }
        return (orderPriceJobKind, "\(orderPriceJobKind)|\(orderId)", purchase.purchaseToken, now.addingTimeInterval(5))
    }

    /// A purchase token's digest: what the audit log, job keys and stored ids hold in place of
    /// Google's long bearer-like token (kept raw only where Google must be called with it).
    public static func tokenDigest(_ token: String) -> String {
        SHA256.hash(data: Data(token.utf8)).prefix(16).lowercaseHex
    }

    /// An upgrade, downgrade or re-signup named `token` as its `linkedPurchaseToken`: it never
    /// grants again, even on a late notification. A token never seen is recorded retired.
    public func retire(_ token: String, appId: String, replacedBy: String, now: Date) async throws {
        try await database.transaction { sql in
            try await Self.retire(token, appId: appId, sql: sql, now: now)
        }
    }

    static func retire(_ token: String, appId: String, sql: any SQLDatabase, now: Date) async throws {
        try await sql.raw(
            """
            INSERT INTO google_purchases (purchase_token, app_id, kind, product_id, catalog_product_id, quantity,
                state, retired, updated_at)
            VALUES (\(bind: token), \(bind: appId), 'subscription', '', '', 1, 'REPLACED', 1, \(bind: now.milliseconds))
            ON CONFLICT (purchase_token) DO UPDATE SET retired = 1, updated_at = excluded.updated_at
            """
        ).run()
        try await PurchaseStore.audit(
            sql, actor: "google", action: "google_token_retired", subject: Self.tokenDigest(token),
            detail: "purchase token replaced by a newer one (linkedPurchaseToken): it grants nothing from now on",
            at: now.milliseconds)
    }

    /// Which of `transactionIds` were delivered (refunded since or not), in one statement.
    public func delivered(_ transactionIds: [String]) async throws -> Set<String> {
        let unique = Array(Set(transactionIds))
        guard !unique.isEmpty else { return [] }
        return try await database.read { sql in
            Set(
                try await sql.raw(
                    "SELECT transaction_id FROM deliveries WHERE transaction_id IN (\(binds: unique))"
                ).all().map { try $0.decode(column: "transaction_id", as: String.self) })
        }
    }

    /// A Google order's price for its delivery, and the job that read it.
    public struct OrderPrice: Sendable {
        public var transactionId: String
        public var priceMilli: Int64
        public var currency: String
        public var jobId: String

        public init(transactionId: String, priceMilli: Int64, currency: String, jobId: String) {
            self.transactionId = transactionId
            self.priceMilli = priceMilli
            self.currency = currency
            self.jobId = jobId
        }
    }

    /// Several deliveries priced from their Google orders (each unless it has a price) and the
    /// jobs that read them done, in one database transaction.
    public func priceDeliveries(_ prices: [OrderPrice]) async throws {
        guard !prices.isEmpty else { return }
        try await database.transaction { sql in
            for price in prices {
                try await sql.raw(
                    """
                    UPDATE deliveries SET price_milli = \(bind: price.priceMilli), currency = \(bind: price.currency)
                    WHERE transaction_id = \(bind: price.transactionId) AND price_milli IS NULL
                    """
                ).run()
            }
            try await sql.raw("UPDATE jobs SET status = 'done' WHERE id IN (\(binds: prices.map(\.jobId)))").run()
        }
    }

    /// Several purchases acknowledged at Google, each with its audit entry, and their jobs done —
    /// one database transaction for a batch (three writes a purchase were one each).
    public func completeAcknowledgements(
        _ done: [(
            token: String, jobId: String, audit: (actor: String, action: String, subject: String?, detail: String)
        )],
        now: Date
    ) async throws {
        guard !done.isEmpty else { return }
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE google_purchases SET acknowledged_at = \(bind: now.milliseconds)
                WHERE purchase_token IN (\(binds: done.map(\.token))) AND acknowledged_at IS NULL
                """
            ).run()
            // Their audit entries in one statement.
            var audit = RowsInsert(
                into: "audit", columns: ["id", "actor", "action", "subject", "detail", "created_at"])
            for entry in done {
                audit.append([
                    .text(RowIdentifiers.uuidString()), .text(entry.audit.actor), .text(entry.audit.action),
                    .text(entry.audit.subject), .text(entry.audit.detail), .integer(now.milliseconds),
                ])
            }
            try await sql.execute(sql: audit) { _ in }
            try await sql.raw("UPDATE jobs SET status = 'done' WHERE id IN (\(binds: done.map(\.jobId)))").run()
        }
    }

    public func markAcknowledged(_ token: String, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE google_purchases SET acknowledged_at = \(bind: now.milliseconds)
                WHERE purchase_token = \(bind: token) AND acknowledged_at IS NULL
                """
            ).run()
        }
    }

    /// The sweeper: paid purchases still unacknowledged `after` their payment get an
    /// acknowledgement job (again, under a new key per hour); those past `alertAfter` are
    /// returned once each for an alert. Reads by the partial index, never the table.
    public func sweepUnacknowledged(
        after: TimeInterval, alertAfter: TimeInterval, until: TimeInterval = GooglePlayPlanner.acknowledgeUntil,
        now: Date
    ) async throws -> (
        queued: Int, alerts: [Purchase]
    ) {
        try await database.transaction { sql in
            let rows = try await sql.raw(
                """
                SELECT * FROM google_purchases
                WHERE acknowledged_at IS NULL AND paid_at <= \(bind: now.addingTimeInterval(-after).milliseconds)
                AND paid_at >= \(bind: now.addingTimeInterval(-until).milliseconds)
                AND retired = 0
                ORDER BY paid_at LIMIT 500
                """
            ).all().map { try Purchase(row: $0) }
            var alerts: [Purchase] = []
            let hour = now.milliseconds / 3_600_000
            for purchase in rows {
                try await JobStore.insert(
                    kind: Self.acknowledgeJobKind,
                    dedupeKey: "\(Self.acknowledgeJobKind)|\(purchase.purchaseToken)|sweep|\(hour)",
                    payload: purchase.purchaseToken, sql: sql, now: now)
                if let paid = purchase.paidAt, now.timeIntervalSince(paid) >= alertAfter {
                    let marked = try await sql.raw(
                        """
                        UPDATE google_purchases SET ack_alerted = 1
                        WHERE purchase_token = \(bind: purchase.purchaseToken) AND ack_alerted = 0
                        RETURNING purchase_token
                        """
                    ).first()
                    if marked != nil { alerts.append(purchase) }
                }
            }
            return (rows.count, alerts)
        }
    }

    // MARK: Notifications

    public enum Recorded: Sendable, Hashable {
        case new
        case duplicate
    }

    /// A Pub/Sub push, durably, once per messageId; a new one queues its sync job in the same
    /// transaction.
    public func recordNotification(
        messageId: String, appId: String?, type: String, purchaseToken: String?, body: String, sync: String?,
        now: Date
    ) async throws -> Recorded {
        try await database.transaction { sql in
            let inserted = try await sql.raw(
                """
                INSERT INTO google_notifications (message_id, app_id, type, purchase_token, body, status, received_at)
                VALUES (\(bind: messageId), \(bind: appId), \(bind: type), \(bind: purchaseToken), \(bind: body),
                        \(bind: sync == nil ? "recorded" : "pending"), \(bind: now.milliseconds))
                ON CONFLICT (message_id) DO NOTHING RETURNING message_id
                """
            ).first()
            guard inserted != nil else { return .duplicate }
            if let sync {
                try await JobStore.insert(
                    kind: Self.syncJobKind, dedupeKey: "\(Self.syncJobKind)|\(messageId)", payload: sync, sql: sql,
                    now: now)
            }
            return .new
        }
    }

    public func finishNotification(_ messageId: String, status: String, outcome: String, now: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                UPDATE google_notifications SET status = \(bind: status), outcome = \(bind: outcome),
                applied_at = \(bind: now.milliseconds) WHERE message_id = \(bind: messageId)
                """
            ).run()
        }
    }

    public struct Notification: Sendable, Hashable {
        public var messageId: String
        public var type: String
        public var purchaseToken: String?
        public var status: String
        public var outcome: String?
    }

    public func notifications(limit: Int = 100) async throws -> [Notification] {
        try await database.read { sql in
            try await sql.raw(
                "SELECT * FROM google_notifications ORDER BY received_at DESC LIMIT \(bind: max(1, min(limit, 1000)))"
            ).all().map {
                Notification(
                    messageId: try $0.decode(column: "message_id", as: String.self),
                    type: try $0.decode(column: "type", as: String.self),
                    purchaseToken: try $0.decode(column: "purchase_token", as: String?.self),
                    status: try $0.decode(column: "status", as: String.self),
                    outcome: try $0.decode(column: "outcome", as: String?.self))
            }
        }
    }

    // MARK: Voided purchases

    /// A voided record as Google listed it, and whether it was applied before.
    public struct Voided: Sendable {
        /// Unique per record (order, quantity, time).
        public var key: String
        public var seen: Bool
        /// Every voided quantity of that order so far, this record's included.
        public var quantities: [Int?]
    }

    /// What applying a voided record needs, read: it is marked (`markVoided`) only after its
    /// refund committed, so a crash in between applies it again next time — harmless, the
    /// refund path takes nothing it took before.
    public func voided(purchaseToken: String, orderId: String?, voidedQuantity: Int?, voidedAt: Int64?)
        async throws -> Voided
    {
        let key = AnomalyStore.dedupeKey(
            purchaseToken, orderId, voidedQuantity.map(String.init), voidedAt.map(String.init))
        return try await database.read { sql in
            let rows = try await sql.raw(
                """
                SELECT void_key, voided_quantity FROM google_voided WHERE purchase_token = \(bind: purchaseToken)
                AND (order_id = \(bind: orderId) OR (order_id IS NULL AND \(bind: orderId) IS NULL))
                """
            ).all()
            let keys = try rows.map { try $0.decode(column: "void_key", as: String.self) }
            let quantities = try rows.map { try $0.decode(column: "voided_quantity", as: Int?.self) }
            let seen = keys.contains(key)
            return Voided(key: key, seen: seen, quantities: seen ? quantities : quantities + [voidedQuantity])
        }
    }

    public func markVoided(
        _ voided: Voided, appId: String, purchaseToken: String, orderId: String?, voidedQuantity: Int?,
        voidedAt: Int64?, now: Date
    ) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO google_voided (void_key, app_id, purchase_token, order_id, voided_quantity, voided_at, recorded_at)
                VALUES (\(bind: voided.key), \(bind: appId), \(bind: purchaseToken), \(bind: orderId),
                        \(bind: voidedQuantity), \(bind: voidedAt), \(bind: now.milliseconds))
                ON CONFLICT (void_key) DO NOTHING
                """
            ).run()
        }
    }

    public func voidedPolledAt(appId: String) async throws -> Date? {
        try await database.read { sql in
            try await sql.raw("SELECT voided_polled_at FROM google_poll_state WHERE app_id = \(bind: appId)").first()?
                .decode(column: "voided_polled_at", as: Int64.self)
        }.map(Date.init(milliseconds:))
    }

    public func setVoidedPolledAt(appId: String, _ at: Date) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO google_poll_state (app_id, voided_polled_at) VALUES (\(bind: appId), \(bind: at.milliseconds))
                ON CONFLICT (app_id) DO UPDATE SET voided_polled_at = excluded.voided_polled_at
                """
            ).run()
        }
    }

    /// Subscriptions worth a fresh read (reconciliation): open tokens whose period ends before
    /// `before` (notifications about them may have been lost).
    public func subscriptionsToReread(before: Date, limit: Int = 1000) async throws -> [Purchase] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM google_purchases WHERE kind = 'subscription' AND retired = 0
                AND state IN ('SUBSCRIPTION_STATE_ACTIVE', 'SUBSCRIPTION_STATE_CANCELED',
                              'SUBSCRIPTION_STATE_IN_GRACE_PERIOD', 'SUBSCRIPTION_STATE_ON_HOLD', 'SUBSCRIPTION_STATE_PAUSED')
                AND expires_at <= \(bind: before.milliseconds)
                ORDER BY expires_at LIMIT \(bind: max(1, limit))
                """
            ).all().map { try Purchase(row: $0) }
        }
    }
}

extension PurchaseStore {
    /// A store's snapshot of a subscription (Google Play), applied like Apple's status: the
    /// period's transaction delivered (exactly once) to the account its order or binding names
    /// — or to `submittingAccount`, as a device's submission — and the state moved by
    /// SubscriptionMachine (`.storeState`), under the subject's lock.
    public func applyStoreSnapshot(
        _ transaction: StoreTransaction, event: SubscriptionEvent?, submittingAccount: String?,
        requestedOrderId: String?, catalog: Catalog, policy: OwnershipPolicy, now: Date
    ) async throws -> DeliveryResult {
        let kind = database.kind
        let subject = transaction.originalTransactionId ?? transaction.transactionId ?? ""
        return try await database.transaction { sql in
            try await NotificationStore.lock([subject], sql: sql, kind: kind)
            return try await BatchDelivery.run(
                [
                    BatchDelivery.Item(
                        transaction: transaction, submittingAccount: submittingAccount,
                        requestedOrderId: requestedOrderId, catalog: catalog, policy: policy, evidence: .device,
                        now: now, event: event, sharedAppleIdLimit: sharedAppleIdLimit, apps: apps)
                ], sql: sql, combineWrites: false)[0]
        }
    }
}

extension PurchaseStore {
    /// The account a transaction was delivered to, nil when it was not.
    public func deliveryAccount(_ transactionId: String) async throws -> String? {
        try await database.read { sql in
            try await sql.raw(
                "SELECT account_id FROM deliveries WHERE transaction_id = \(bind: transactionId) AND quantity > 0"
            ).first()?.decode(column: "account_id", as: String.self)
        }
    }
}

extension GooglePlayStore {
    /// What one reading of a Google purchase writes beside its delivery, in the delivery's own
    /// database transaction (through the group-commit batcher like every store's purchase): the
    /// purchase as read, the token a paid replacement retires, the units Google refunded before
    /// anyone claimed them, and — once an account has it — its account and acknowledgement duty.
    public struct Writes: StoreSideWrites {
        public var purchase: Purchase
        public var paid: Bool
        public var needsAcknowledgement: Bool
        /// The token this paid replacement (or resubscription) retires.
        public var retires: String?
        /// Units Google refunded before anyone claimed them (its `refundableQuantity`).
        public var refundedBeforeDelivery: RefundPlanner.Revocation?
        public var refundKey: String

        public init(
            purchase: Purchase, paid: Bool, needsAcknowledgement: Bool, retires: String?,
            refundedBeforeDelivery: RefundPlanner.Revocation?, refundKey: String
        ) {
            self.purchase = purchase
            self.paid = paid
            self.needsAcknowledgement = needsAcknowledgement
            self.retires = retires
            self.refundedBeforeDelivery = refundedBeforeDelivery
            self.refundKey = refundKey
        }
    }

}

extension GooglePlayStore.Writes {
    /// Before planning: the purchase recorded; nil when it is to be planned, else why not.
    public func beforeDelivery(transaction: StoreTransaction, sql: any SQLDatabase, now: Date) async throws
        -> PurchaseStore.DeliveryResult.Held?
    {
        let writes = self
        let retired = try await GooglePlayStore.record(writes.purchase, acknowledge: false, sql: sql, now: now)
        guard writes.paid else { return .unpaid }
        if retired { return .retired }
        if let linked = writes.retires {
            try await GooglePlayStore.retire(linked, appId: writes.purchase.appId, sql: sql, now: now)
        }
        if let refunded = writes.refundedBeforeDelivery, let id = transaction.transactionId,
            try await sql.raw("SELECT 1 AS d FROM deliveries WHERE transaction_id = \(bind: id)").first() == nil
        {
            try await PurchaseStore.recordUndeliveredRefund(
                id, originalId: transaction.originalTransactionId ?? id, productId: writes.purchase.catalogProductId,
                revocation: refunded, reason: "refund", key: writes.refundKey, store: .googlePlay, sql: sql,
                at: now.milliseconds)
        }
        return nil
    }

    /// A batch's readings at once: the common purchase (a token once in the batch, replacing
    /// none, no refund Google made before anyone claimed it) recorded by one multi-row upsert
    /// that answers whether each token was retired, and their order-price jobs by one insert;
    /// the others one by one first, as `beforeDelivery`.
    public func beforeDeliveries(
        _ batch: [(writes: any StoreSideWrites, transaction: StoreTransaction, now: Date)], sql: any SQLDatabase
    ) async throws -> [PurchaseStore.DeliveryResult.Held?] {
        var held = [PurchaseStore.DeliveryResult.Held?](repeating: nil, count: batch.count)
        var tokens: [String: Int] = [:]
        for item in batch {
            if let writes = item.writes as? Self { tokens[writes.purchase.purchaseToken, default: 0] += 1 }
        }
        var common: [(index: Int, writes: Self, now: Date)] = []
        for (index, item) in batch.enumerated() {
            if let writes = item.writes as? Self, writes.retires == nil, writes.refundedBeforeDelivery == nil,
                tokens[writes.purchase.purchaseToken] == 1
            {
                common.append((index, writes, item.now))
            } else {
                held[index] = try await item.writes.beforeDelivery(
                    transaction: item.transaction, sql: sql, now: item.now)
            }
        }
        guard !common.isEmpty else { return held }
        let retired = try await GooglePlayStore.upsert(common.map { ($0.writes.purchase, $0.now) }, sql: sql)
        try await JobStore.insertMany(
            common.compactMap { item in
                GooglePlayStore.orderPriceJob(item.writes.purchase, now: item.now)
            }, sql: sql, now: common[0].now)
        for item in common {
            if !item.writes.paid {
                held[item.index] = .unpaid
            } else if retired.contains(item.writes.purchase.purchaseToken) {
                held[item.index] = .retired
            }
        }
        return held
    }

    /// A batch's deliveries at once: each purchase's account in one UPDATE, the acknowledgements
    /// Google waits for in one insert.
    public func afterDeliveries(
        _ batch: [(writes: any StoreSideWrites, result: PurchaseStore.DeliveryResult, now: Date)], sql: any SQLDatabase
    ) async throws {
        var accounts: [(token: String, account: String)] = []
        var acknowledgements: [(kind: String, dedupeKey: String, payload: String, runAt: Date?)] = []
        for item in batch {
            guard let writes = item.writes as? Self else {
                try await item.writes.afterDelivery(result: item.result, sql: sql, now: item.now)
                continue
            }
            guard let account = item.result.plan.accountId ?? item.result.plan.delivery?.accountId else { continue }
            accounts.append((writes.purchase.purchaseToken, account))
            if writes.needsAcknowledgement {
                acknowledgements.append(GooglePlayStore.acknowledgeJob(writes.purchase.purchaseToken))
            }
        }
        if !accounts.isEmpty {
            // The rows were written before planning: only their accounts are new (a token
            // twice in the batch: the first account, as one after the other would keep).
            var seen = Set<String>()
            let unique = accounts.filter { seen.insert($0.token).inserted }
            let cases = unique.map { "WHEN \(bind: $0.token) THEN \(bind: $0.account)" as SQLQueryString }
            try await sql.raw(
                """
                UPDATE google_purchases
                SET account_id = COALESCE(account_id, CASE purchase_token \(cases.joined(separator: " ")) END)
                WHERE purchase_token IN (\(binds: unique.map(\.token)))
                """
            ).run()
        }
        try await JobStore.insertMany(acknowledgements, sql: sql, now: batch[0].now)
    }

    /// After planning: the account it went to, and the acknowledgement Google waits for.
    public func afterDelivery(result: PurchaseStore.DeliveryResult, sql: any SQLDatabase, now: Date) async throws {
        let writes = self
        guard let account = result.plan.accountId ?? result.plan.delivery?.accountId else { return }
        // The row was written before planning: only its account, and the duty, are new.
        try await sql.raw(
            """
            UPDATE google_purchases SET account_id = COALESCE(account_id, \(bind: account))
            WHERE purchase_token = \(bind: writes.purchase.purchaseToken)
            """
        ).run()
        if writes.needsAcknowledgement {
            try await JobStore.insertMany(
                [GooglePlayStore.acknowledgeJob(writes.purchase.purchaseToken)], sql: sql, now: now)
        }
    }
}
