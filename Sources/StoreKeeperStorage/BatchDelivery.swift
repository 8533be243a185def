import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// A whole batch of deliveries with a handful of statements: the context of every item read
/// with one query per table, planned in order against an in-memory overlay (so an item sees
/// what earlier items of the same batch delivered, paid or bound), then written with
/// multi-row inserts. It is the only way to a delivery's context: a single delivery (the
/// retry after a conflict with another instance) is a batch of one.
struct BatchDelivery {
    struct OpenOrderKey: Hashable {
        var account: String
        var product: String
    }

    struct Item {
        var transaction: StoreTransaction
        var submittingAccount: String?
        var requestedOrderId: String?
        var catalog: Catalog
        var policy: OwnershipPolicy
        var evidence: DeliveryPlanner.Evidence = .device
        var now: Date
        /// What moves an auto-renewable subscription: a notification's event (applied even
        /// when the transaction was delivered before); nil for a submitted transaction (applied
        /// with a new delivery).
        var event: SubscriptionEvent? = nil
        /// More accounts than this on one Apple Account (appTransactionId): `shared_apple_id`.
        var sharedAppleIdLimit = OfferStore.defaultSharedAppleIdLimit
        /// The deployment's apps: the transaction's app is recorded with it.
        var apps = AppDirectory()
        /// The store's own writes beside the delivery, in the same database transaction.
        var sideWrites: (any StoreSideWrites)? = nil

        /// The store the transaction comes from (its adapter says so): recorded with each row.
        var store: Store { transaction.store }

        /// The app this transaction is of (its bundle id or package name), if configured.
        var appId: String? { apps.appId(ofStoreIdentity: transaction.storeIdentity) }
    }

    struct EntitlementKey: Hashable {
        var account: String
        var entitlement: String
    }

    /// `combineWrites`: send the inserts as one statement (PostgreSQL, where each statement is a
    /// network round trip; SQLite runs in-process and has no data-modifying WITH).
    static func run(_ items: [Item], sql: any SQLDatabase, combineWrites: Bool) async throws
        -> [PurchaseStore.DeliveryResult]
    {
        guard items.contains(where: { $0.sideWrites != nil }) else {
            return try await runPlanned(items, sql: sql, combineWrites: combineWrites)
        }
        // A store's side writes first (Google: the purchase as read, the token it replaces, a
        // refund Google already made; Stripe: its event and payment); a purchase not paid, or a
        // replaced token, is not planned.
        var held: [Int: PurchaseStore.DeliveryResult.Held] = [:]
        let subjects = items.compactMap { item in
            item.sideWrites.map { _ in item.transaction.originalTransactionId ?? item.transaction.transactionId ?? "" }
        }
        try await NotificationStore.lock(
            subjects, sql: sql, kind: sql.dialect.name == "postgresql" ? .postgres : .sqlite)
        // Each store's side writes as a batch (a few multi-row statements for the whole batch
        // where the store can, one round trip each on PostgreSQL), stores in turn.
        for indices in sideWriteGroups(items.indices) {
            let batch = indices.map {
                (writes: items[$0].sideWrites!, transaction: items[$0].transaction, now: items[$0].now)
            }
            let answers = try await batch[0].writes.beforeDeliveries(batch, sql: sql)
            for (index, answer) in zip(indices, answers) { held[index] = answer }
        }
        let planned = items.indices.filter { held[$0] == nil }
        let results = try await runPlanned(planned.map { items[$0] }, sql: sql, combineWrites: combineWrites)
        var all = items.indices.map { index in
            PurchaseStore.DeliveryResult(
                plan: .notPlanned, held: held[index])
        }
        for (index, result) in zip(planned, results) { all[index] = result }
        for indices in sideWriteGroups(planned) {
            let batch = indices.map { (writes: items[$0].sideWrites!, result: all[$0], now: items[$0].now) }
            try await batch[0].writes.afterDeliveries(batch, sql: sql)
        }
        return all

        /// The indices with side writes, grouped by their type (one store's each), in order.
        func sideWriteGroups(_ indices: some Collection<Int>) -> [[Int]] {
            var groups: [(type: ObjectIdentifier, indices: [Int])] = []
            for index in indices {
                guard let writes = items[index].sideWrites else { continue }
                let type = ObjectIdentifier(Swift.type(of: writes))
                if let at = groups.firstIndex(where: { $0.type == type }) {
                    groups[at].indices.append(index)
                } else {
                    groups.append((type, [index]))
                }
            }
            return groups.map(\.indices)
        }
    }

    static func runPlanned(_ items: [Item], sql: any SQLDatabase, combineWrites: Bool) async throws
        -> [PurchaseStore.DeliveryResult]
    {
        guard !items.isEmpty else { return [] }
        // MARK: Read everything the batch needs.
        let transactionIds = Array(Set(items.compactMap(\.transaction.transactionId)))
        var deliveries: [String: DeliveryPlanner.Delivery] = [:]
        // Refunds the store made before anyone claimed these purchases (a voided Google
        // purchase, an App Store refund of a transaction never delivered here), read with the
        // deliveries in one statement (one round trip on PostgreSQL).
        var refundedEarlier: [String: (revocation: RefundPlanner.Revocation, key: String)] = [:]
        if !transactionIds.isEmpty {
            for row in try await sql.raw(
                """
                SELECT 'd' AS source, transaction_id, account_id, order_id, product_id, quantity, refunded_at,
                       NULL AS revocation_type, NULL AS percentage, NULL AS units_refunded, NULL AS units,
                       NULL AS refund_key
                FROM deliveries WHERE transaction_id IN (\(binds: transactionIds))
                UNION ALL
                SELECT 'u', transaction_id, NULL, NULL, product_id, NULL, NULL, revocation_type, percentage,
                       units_refunded, units, refund_key
                FROM undelivered_refunds WHERE transaction_id IN (\(binds: transactionIds))
                """
            ).all() {
                if try row.decode(column: "source", as: String.self) == "u" {
                    refundedEarlier[try row.decode(column: "transaction_id", as: String.self)] =
                        try PurchaseStore.undeliveredRefund(row)
                    continue
                }
                let delivery = DeliveryPlanner.Delivery(
                    transactionId: try row.decode(column: "transaction_id", as: String.self),
                    accountId: try row.decode(column: "account_id", as: String.self),
                    orderId: try row.decode(column: "order_id", as: String?.self),
                    productId: try row.decode(column: "product_id", as: String.self),
                    quantity: try row.decode(column: "quantity", as: Int.self),
                    refunded: try row.decode(column: "refunded_at", as: Int64?.self) != nil)
                deliveries[delivery.transactionId] = delivery
            }
        }
        // A refund recorded before a delivery that exists now (another path delivered it
        // meanwhile) is the refund path's: only undelivered ones count here.
        refundedEarlier = refundedEarlier.filter { deliveries[$0.key] == nil }
        // Every order an item could be attributed to: by token and by the order id in the
        // request, with one query; then — for what names no order, as in one-by-one delivery —
        // the oldest open orders of the submitting account for the product, through the
        // orders_open index and no more of them than the batch could pay (an account's open
        // orders never all enter the write transaction).
        var orders: [String: Order] = [:]
        let tokens = Array(Set(items.compactMap { $0.transaction.appAccountToken?.lowercased() }))
        let requestedIds = Array(Set(items.compactMap(\.requestedOrderId)))
        var selects: [any SQLExpression] = []
        if !tokens.isEmpty {
            selects.append(SQLQueryString("SELECT * FROM orders WHERE app_account_token IN (\(binds: tokens))"))
        }
        if !requestedIds.isEmpty {
            selects.append(SQLQueryString("SELECT * FROM orders WHERE order_id IN (\(binds: requestedIds))"))
        }
        if !selects.isEmpty {
            let union = SQLList(selects, separator: SQLRaw(" UNION ALL "))
            for row in try await sql.raw("\(union)").all() {
                let order = try OrderStore.decodeOrder(row)
                orders[order.orderId] = order
            }
        }
        // The FIFO rule's candidates, only for what names no order: no order id in the request
        // and a token that is no order's (or none). First which of those accounts have open
        // orders of those products at all (one small indexed read; usually none, as for
        // purchases made outside the app), then each such pair's oldest ones.
        let tokensOfOrders = Set(orders.values.map { $0.appAccountToken.uuidString.lowercased() })
        var wanted: [OpenOrderKey: Int] = [:]
        for item in items where item.requestedOrderId == nil {
            guard let account = item.submittingAccount,
                item.transaction.appAccountToken.map({ !tokensOfOrders.contains($0.lowercased()) }) ?? true
            else { continue }
            wanted[OpenOrderKey(account: account, product: item.transaction.productId ?? ""), default: 0] += 1
        }
        if !wanted.isEmpty {
            var open = Set<OpenOrderKey>()
            for row in try await sql.raw(
                """
                SELECT DISTINCT account_id, product_id FROM orders
                WHERE account_id IN (\(binds: Array(Set(wanted.keys.map(\.account))))) AND status IN ('created', 'pending')
                """
            ).all() {
                open.insert(
                    OpenOrderKey(
                        account: try row.decode(column: "account_id", as: String.self),
                        product: try row.decode(column: "product_id", as: String.self)))
            }
            let oldest = wanted.filter { open.contains($0.key) }.sorted {
                ($0.key.account, $0.key.product) < ($1.key.account, $1.key.product)
            }.map { key, count -> any SQLExpression in
                SQLQueryString(
                    """
                    SELECT * FROM (SELECT * FROM orders WHERE account_id = \(bind: key.account) AND product_id = \(bind: key.product)
                    AND status IN ('created', 'pending') ORDER BY created_at, order_id LIMIT \(unsafeRaw: String(count))) AS o
                    """)
            }
            if !oldest.isEmpty {
                for row in try await sql.raw("\(SQLList(oldest, separator: SQLRaw(" UNION ALL ")))").all() {
                    let order = try OrderStore.decodeOrder(row)
                    orders[order.orderId] = order
                }
            }
        }
        // A token that is no order's may be an account's own (Set App Account Token gave it to
        // a purchase made outside the app): that account submits it.
        var accountTokens: [String: String] = [:]
        let unmatched = tokens.filter { token in
            !orders.values.contains { $0.appAccountToken.uuidString.lowercased() == token }
        }
        if !unmatched.isEmpty {
            for row in try await sql.raw(
                "SELECT app_account_token, account_id FROM account_tokens WHERE app_account_token IN (\(binds: unmatched))"
            ).all() {
                accountTokens[try row.decode(column: "app_account_token", as: String.self)] =
                    try row.decode(column: "account_id", as: String.self)
            }
        }
        var claims: [(originalId: String, account: String, environment: String, at: Date)] = []
        let originals = Array(
            Set(
                items.filter { $0.catalog.product($0.transaction.productId ?? "")?.type != .consumable }
                    .map { $0.transaction.originalTransactionId ?? $0.transaction.transactionId ?? "" }))
        var bindings: [String: String] = [:]
        if !originals.isEmpty {
            for row in try await sql.raw(
                "SELECT original_transaction_id, account_id FROM ownership WHERE original_transaction_id IN (\(binds: originals))"
            ).all() {
                bindings[try row.decode(column: "original_transaction_id", as: String.self)] =
                    try row.decode(column: "account_id", as: String.self)
            }
        }

        // Auto-renewable subscriptions the batch touches, as SubscriptionMachine left them, and
        // their paid periods (the one-year rule of `Proceeds`).
        let autoRenewables = Array(
            Set(
                items.filter { $0.catalog.product($0.transaction.productId ?? "")?.type == .autoRenewable }
                    .map { $0.transaction.originalTransactionId ?? $0.transaction.transactionId ?? "" }))
        var subscriptions = try await SubscriptionStore.states(autoRenewables, sql: sql)
        var paidPeriods = try await Revenue.periods(of: autoRenewables, sql: sql)
        var subscriptionWrites: [SubscriptionStore.Write] = []
        var newBindings: [(String, String, Int64)] = []  // original id, account, at
        var newSubscriptions: Set<String> = []

        // MARK: Plan in order, against the overlay.
        var results: [PurchaseStore.DeliveryResult] = []
        // Each with its original id, environment, time and app.
        var newDeliveries: [(DeliveryPlanner.Delivery, String, String, Int64, String?, Store)] = []
        var offerFacts: [OfferStore.DeliveredFacts] = []
        var revenue: [Revenue] = []  // one per new delivery, in the same order
        var ledger: [(LedgerEntry, Int64)] = []
        var outbox: [(String, Int64)] = []
        var applied: [(DeliveryPlanner.Plan, StoreTransaction, DeliveryPlanner.Context, Date)] = []
        // Non-renewing access windows extend the latest expiry of the entitlement: read when
        // an item needs it (rare products), then kept up to date by the batch's own grants.
        var expiries: [EntitlementKey: Date?] = [:]
        if sql.dialect.name == "postgresql" {
            // Two batches (or instances) extending the same account's pass read-modify-write its
            // expiry: each key is locked for the transaction first, in one order, so neither
            // reads the expiry before the other's extension is committed.
            var keys: Set<String> = []
            for item in items {
                guard let product = item.catalog.product(item.transaction.productId ?? ""),
                    product.type == .nonRenewing, let entitlement = product.grants.entitlement
                else { continue }
                for account in [item.submittingAccount].compactMap({ $0 })
                    + orders.values.filter({
                        $0.appAccountToken.uuidString.lowercased() == item.transaction.appAccountToken?.lowercased()
                            || $0.orderId == item.requestedOrderId
                    }).map(\.accountId)
                {
                    keys.insert("entitlement|\(account)|\(entitlement)")
                }
            }
            for key in keys.sorted() {
                try await sql.raw("SELECT pg_advisory_xact_lock(hashtext(\(bind: key)))").run()
            }
        }
        for item in items {
            let transaction = item.transaction
            let transactionId = transaction.transactionId ?? ""
            let originalId = transaction.originalTransactionId ?? transactionId
            let token = transaction.appAccountToken?.lowercased()
            let byToken = token.flatMap { token in
                orders.values.first { $0.appAccountToken.uuidString.lowercased() == token }
            }
            let requested = item.requestedOrderId.flatMap { orders[$0] }
            let submitting = item.submittingAccount ?? (byToken == nil ? token.flatMap { accountTokens[$0] } : nil)
            var oldest: Order?
            if let account = submitting, byToken == nil, requested == nil {
                oldest = DeliveryPlanner.oldestOpenOrder(
                    of: account, product: transaction.productId, among: orders.values)
            }
            let product = item.catalog.product(transaction.productId ?? "")
            let isConsumable = product?.type == .consumable
            let bound = isConsumable ? nil : bindings[originalId]
            var currentExpiry: Date?
            if let product, product.type == .nonRenewing, let entitlement = product.grants.entitlement,
                let account = byToken?.accountId ?? requested?.accountId ?? submitting ?? bound
            {
                let key = EntitlementKey(account: account, entitlement: entitlement)
                if let known = expiries[key] {
                    currentExpiry = known
                } else {
                    currentExpiry = try await sql.raw(
                        """
                        SELECT MAX(expires_at) AS expiry FROM entitlements
                        WHERE account_id = \(bind: account) AND entitlement_id = \(bind: entitlement)
                        """
                    ).first().flatMap { try $0.decode(column: "expiry", as: Int64?.self) }.map(Date.init(milliseconds:))
                    expiries[key] = currentExpiry
                }
            }
            var context = DeliveryPlanner.Context(
                transaction: transaction, submittingAccount: submitting, orderByToken: byToken,
                requestedOrder: requested, oldestOpenOrder: oldest, existingDelivery: deliveries[transactionId],
                boundAccount: bound, currentEntitlementExpiry: currentExpiry, catalog: item.catalog,
                policy: item.policy, evidence: item.evidence)
            context.transactionAppId = item.appId
            context.store = item.store
            context.refundedBeforeDelivery = refundedEarlier[transactionId]?.revocation
            context.configuredAppIds = Set(item.apps.apps.values)
            context.acceptedEnvironments = item.apps.environments
            var plan = DeliveryPlanner.plan(context, now: item.now)
            for index in plan.anomalies.indices {
                plan.anomalies[index].store = item.store
                plan.anomalies[index].appId = item.appId
            }
            // An auto-renewable subscription's state moves through the core's machine
            // (`signedDate` order), bound where the delivery went: with a new period submitted,
            // or with any notification about it. Its entitlement follows that state, never the
            // transaction alone (an older period, or one in billing retry, grants nothing).
            var subscriptionEffects: [SubscriptionMachine.Effect] = []
            if product?.type == .autoRenewable {
                plan.grants.removeAll { if case .entitlement = $0 { true } else { false } }
                if plan.delivery != nil || item.event != nil,
                    let account = plan.accountId ?? context.existingDelivery?.accountId ?? bound
                {
                    let signed = transaction.signedDate.map { Date(milliseconds: $0) } ?? item.now
                    let event =
                        item.event
                        ?? SubscriptionEvent(.submittedTransaction, signedDate: signed, transaction: transaction)
                    let before = subscriptions[originalId]
                    let (state, effects) = SubscriptionMachine.apply(before, event)
                    subscriptionEffects = effects
                    if let state, state != before {
                        if before == nil { newSubscriptions.insert(originalId) }
                        subscriptions[originalId] = state
                        subscriptionWrites.append(
                            SubscriptionStore.Write(
                                state: state, account: account, effects: effects, catalog: item.catalog,
                                at: item.now.milliseconds, appId: item.appId, store: item.store))
                    }
                }
            }
            if product?.type == .nonRenewing, let account = plan.accountId {
                for case .entitlement(let id, let expiresAt?) in plan.grants {
                    let key = EntitlementKey(account: account, entitlement: id)
                    let known = expiries[key] ?? nil
                    expiries[key] = max(known ?? expiresAt, expiresAt)
                }
            }
            results.append(
                .init(plan: plan, existing: context.existingDelivery, subscriptionEffects: subscriptionEffects))

            // A purchase made outside the app (no token, no order: an offer code, a promoted
            // purchase or a win-back redeemed on the App Store) claimed by an account now: Apple is
            // told the account's token, so every later renewal and notification carries it. One that
            // pays an order (a StoreKit 1 receipt, whose entries never show the token) is the app's.
            if let delivery = plan.delivery, transaction.appAccountToken == nil, delivery.quantity > 0,
                plan.order == nil,
                item.store == .appStore,
                transaction.ownership != .familyShared, transaction.environment != .xcode,
                isConsumable || bound == nil
            {
                claims.append(
                    (originalId, delivery.accountId, transaction.environment?.rawValue ?? "Production", item.now))
            }
            // The overlay: what later items of this batch must see.
            if let delivery = plan.delivery {
                deliveries[delivery.transactionId] = delivery
                revenue.append(
                    try await Revenue.of(
                        transaction, originalId: originalId,
                        isAutoRenewable: product?.type == .autoRenewable,
                        periods: &paidPeriods, sql: sql))
                let environment = transaction.environment?.rawValue ?? "Production"
                newDeliveries.append((delivery, originalId, environment, item.now.milliseconds, item.appId, item.store))
                offerFacts.append(
                    OfferStore.DeliveredFacts(
                        transaction: transaction, delivery: delivery, limit: item.sharedAppleIdLimit,
                        at: item.now.milliseconds,
                        redemptionLimit: transaction.offerType.flatMap { type in
                            item.catalog.redemptionLimit(
                                offerType: Int(type.rawValue), offerIdentifier: transaction.offerIdentifier ?? "",
                                productId: delivery.productId)
                        }))
                outbox.append(
                    (
                        PurchaseStore.outboxPayload(
                            delivery, environment: environment, appId: item.appId, store: item.store),
                        item.now.milliseconds
                    ))
            }
            if let order = plan.order { orders[order.orderId] = order }
            if let binding = plan.binding { bindings[originalId] = binding }
            ledger += plan.ledger.map { ($0, item.now.milliseconds) }
            // A first binding (every new subscription or non-consumable) goes into one insert;
            // everything else (orders, entitlements, transfers, anomalies) is rare: written per
            // item below, through the same code as one-by-one delivery.
            var rest = plan
            rest.delivery = nil
            rest.ledger = []
            if let binding = plan.binding, context.boundAccount == nil {
                newBindings.append((originalId, binding, item.now.milliseconds))
                rest.binding = nil
            }
            applied.append((rest, transaction, context, item.now))
        }

        // MARK: Write.
        var inserts: [any SQLExpression] = []
        if !newDeliveries.isEmpty {
            var insert = RowsInsert(
                into: "deliveries",
                columns: [
                    "transaction_id", "original_transaction_id", "account_id", "order_id", "product_id", "quantity",
                    "environment", "delivered_at", "price_milli", "currency", "proceeds_percent", "period_start",
                    "period_end", "offer_type", "offer_identifier", "offer_source", "app_transaction_id", "app_id",
                    "purchased_at", "storefront", "trial", "family_shared", "store", "stated_proceeds_milli",
                ])
            for (((delivery, originalId, environment, at, appId, store), money), facts) in zip(
                zip(newDeliveries, revenue), offerFacts)
            {
                let offer = OfferStore.offerColumns(facts.transaction)
                insert.append([
                    .text(delivery.transactionId), .text(originalId), .text(delivery.accountId),
                    .text(delivery.orderId),
                    .text(delivery.productId), .int(delivery.quantity), .text(environment), .integer(at),
                    .integer(money.price), .text(money.currency), .int(money.percent), .integer(money.periodStart),
                    .integer(money.periodEnd), .int(offer.type), .text(offer.identifier), .text(offer.source),
                    .text(facts.transaction.appTransactionId), .text(appId), .integer(money.purchasedAt),
                    .text(money.storefront), .bool(money.trial), .bool(money.familyShared), .text(store.rawValue),
                    .integer(money.stated),
                ])
            }
            inserts.append(insert)
        }
        inserts += PurchaseStore.ledgerWrites(ledger)
        if !newBindings.isEmpty {
            var insert = RowsInsert(into: "ownership", columns: ["original_transaction_id", "account_id", "bound_at"])
            for (originalId, account, at) in newBindings {
                insert.append([.text(originalId), .text(account), .integer(at)])
            }
            inserts.append(insert)
        }
        if !outbox.isEmpty {
            var insert = RowsInsert(into: "outbox", columns: ["id", "event", "payload", "created_at"])
            for (payload, at) in outbox {
                insert.append([.text(OutboxStore.newEventId()), .text("delivery"), .text(payload), .integer(at)])
            }
            inserts.append(insert)
        }
        if let jobs = AppleAccountStore.claimJobs(claims) { inserts.append(jobs) }
        if let tokens = AppleAccountStore.claimTokens(claims) { inserts.append(tokens) }
        if combineWrites && inserts.count > 1 {
            // PostgreSQL: one statement (data-modifying WITH), one round trip for all of them.
            try await sql.execute(sql: CombinedWrites(writes: inserts)) { _ in }
        } else {
            for insert in inserts { try await sql.execute(sql: insert) { _ in } }
        }
        for ((_, originalId, _, _, _, _), money) in zip(newDeliveries, revenue) where money.overlaps {
            try await Revenue.supersede(
                originalId: originalId, start: money.periodStart ?? 0, end: money.periodEnd ?? 0, sql: sql)
        }
        for (plan, transaction, context, now) in applied
        where plan.order != nil || plan.binding != nil || !plan.anomalies.isEmpty
            || plan.grants.contains(where: { if case .entitlement = $0 { true } else { false } })
        {
            try await PurchaseStore.apply(plan, transaction: transaction, context: context, sql: sql, now: now)
        }
        // Open anomalies about what was just delivered close themselves (`delivered_later`).
        try await AnomalyStore.resolveDeliveredLater(
            newDeliveries.map { ($0.0.transactionId, $0.0.accountId) }, sql: sql, now: items[0].now)
        try await SubscriptionStore.apply(subscriptionWrites, sql: sql)
        try await OfferStore.record(offerFacts, sql: sql)
        if !newSubscriptions.isEmpty {
            // Notifications held for want of an account (a subscription bought while the
            // server was down, an offer code redeemed outside the app) apply now that one
            // owns it.
            try await NotificationStore.release(Array(newSubscriptions), sql: sql, now: items[0].now)
        }
        // A partial refund made before the purchase was claimed is taken back from what was just
        // delivered, in this transaction, through the one refund path.
        if !refundedEarlier.isEmpty {
            for (item, result) in zip(items, results) where result.plan.delivery != nil {
                guard let id = item.transaction.transactionId, let refund = refundedEarlier[id] else { continue }
                try await PurchaseStore.applyUndeliveredRefund(
                    refund, transaction: item.transaction, store: item.store, catalog: item.catalog,
                    policy: item.policy,
                    apps: item.apps,
                    sql: sql, now: item.now)
            }
        }
        // The submitting accounts as committed, for the answers.
        let states = try await AccountStore.accountStates(
            Array(Set(items.compactMap(\.submittingAccount))), sql: sql)
        for (index, item) in items.enumerated() {
            results[index].account = item.submittingAccount.map { states[$0] ?? PurchaseStore.AccountState() }
        }
        return results
    }
}

/// `WITH w0 AS (INSERT …), w1 AS (INSERT …) INSERT …`: PostgreSQL runs every write of the
/// statement, atomically, in one round trip.
struct CombinedWrites: SQLExpression {
    var writes: [any SQLExpression]

    func serialize(to serializer: inout SQLSerializer) {
        for (index, write) in writes.dropLast().enumerated() {
            serializer.write(index == 0 ? "WITH " : ", ")
            serializer.write("w\(index) AS (")
            write.serialize(to: &serializer)
            serializer.write(")")
        }
        serializer.write(" ")
        writes.last?.serialize(to: &serializer)
    }
}

/// A store's own writes beside a delivery, in the delivery's database transaction (so a
/// store's records and the delivery commit together or not at all). Each store's record type
/// conforms; the delivery path names none of them.
public protocol StoreSideWrites: Sendable {
    /// Before planning: nil to plan the delivery, else why it is held (not paid, replaced).
    func beforeDelivery(transaction: StoreTransaction, sql: any SQLDatabase, now: Date) async throws
        -> PurchaseStore.DeliveryResult.Held?
    /// After planning, with what the delivery did.
    func afterDelivery(result: PurchaseStore.DeliveryResult, sql: any SQLDatabase, now: Date) async throws
    /// `beforeDelivery` for a batch's writes of this type (`self` is the first of them), in
    /// order; a store may write them as a few multi-row statements.
    func beforeDeliveries(
        _ batch: [(writes: any StoreSideWrites, transaction: StoreTransaction, now: Date)], sql: any SQLDatabase
    ) async throws -> [PurchaseStore.DeliveryResult.Held?]
    /// `afterDelivery` for a batch's planned writes of this type (`self` is the first of them).
    func afterDeliveries(
        _ batch: [(writes: any StoreSideWrites, result: PurchaseStore.DeliveryResult, now: Date)], sql: any SQLDatabase
    ) async throws
}

extension StoreSideWrites {
    /// One after the other.
    public func beforeDeliveries(
        _ batch: [(writes: any StoreSideWrites, transaction: StoreTransaction, now: Date)], sql: any SQLDatabase
    ) async throws -> [PurchaseStore.DeliveryResult.Held?] {
        var held: [PurchaseStore.DeliveryResult.Held?] = []
        for item in batch {
            held.append(try await item.writes.beforeDelivery(transaction: item.transaction, sql: sql, now: item.now))
        }
        return held
    }

    /// One after the other.
    public func afterDeliveries(
        _ batch: [(writes: any StoreSideWrites, result: PurchaseStore.DeliveryResult, now: Date)], sql: any SQLDatabase
    ) async throws {
        for item in batch { try await item.writes.afterDelivery(result: item.result, sql: sql, now: item.now) }
    }
}
