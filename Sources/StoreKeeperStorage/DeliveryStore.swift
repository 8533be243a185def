import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Deliveries: the batcher, the planner's context read, and applying a plan with its ledger,
/// grants, outbox event and audit entry in one transaction.
extension PurchaseStore {
    /// Plans and commits the delivery of one verified transaction. Concurrent deliveries are
    /// committed together (group commit); each is answered only once it is durable.
    /// How long the oldest submitted delivery has waited for its batch, if one is waiting.
    public var oldestWaitingDelivery: Duration? { batcher.oldestWaiting }

    public func deliver(
        _ transaction: StoreTransaction, submittingAccount: String?, requestedOrderId: String? = nil,
        catalog: Catalog, policy: OwnershipPolicy = .firstBinder, evidence: DeliveryPlanner.Evidence = .device,
        event: SubscriptionEvent? = nil, sideWrites: (any StoreSideWrites)? = nil, now: Date
    ) async throws -> DeliveryResult {
        try await batcher.deliver(
            transaction, submittingAccount: submittingAccount, requestedOrderId: requestedOrderId, catalog: catalog,
            policy: policy, evidence: evidence, event: event, sideWrites: sideWrites, now: now)
    }

    /// One delivery in its own database transaction — a batch of one, through the same read
    /// and plan as every batch — retried when a concurrent delivery of the same transaction
    /// wins the unique key (the retry then reads it: already_delivered).
    static func deliverAlone(_ database: Database, _ item: BatchDelivery.Item) async throws -> DeliveryResult {
        var lastError: (any Error)?
        let combineWrites = database.kind == .postgres
        for _ in 0..<4 {
            do {
                return try await database.transaction { sql in
                    try await BatchDelivery.run([item], sql: sql, combineWrites: combineWrites)[0]
                }
            } catch {
                // An outage is not a conflict: retrying it here would only wait longer.
                if let unavailable = StorageUnavailable.classify(error) { throw unavailable }
                lastError = error
            }
        }
        throw lastError ?? CancellationError()
    }

    static func apply(
        _ plan: DeliveryPlanner.Plan, transaction: StoreTransaction, context: DeliveryPlanner.Context,
        sql: any SQLDatabase, now: Date
    ) async throws {
        let at = now.milliseconds
        let originalId = transaction.originalTransactionId ?? transaction.transactionId ?? ""
        if let delivery = plan.delivery {
            var periods: [String: [Proceeds.Period]] = [:]
            let money = try await Revenue.of(
                transaction, originalId: originalId,
                isAutoRenewable: context.catalog.product(delivery.productId)?.type == .autoRenewable, periods: &periods,
                sql: sql)
            let offer = OfferStore.offerColumns(transaction)
            // The exactly-once key: a second insert of this transactionId fails and rolls back.
            try await sql.raw(
                """
                INSERT INTO deliveries (transaction_id, original_transaction_id, account_id, order_id, product_id, quantity,
                                        environment, delivered_at, price_milli, currency, proceeds_percent,
                                        period_start, period_end, offer_type, offer_identifier, offer_source,
                                        app_transaction_id, purchased_at, storefront, trial, family_shared)
                VALUES (\(bind: delivery.transactionId), \(bind: originalId), \(bind: delivery.accountId),
                        \(bind: delivery.orderId), \(bind: delivery.productId), \(bind: delivery.quantity),
                        \(bind: transaction.environment?.rawValue ?? "Production"), \(bind: at), \(bind: money.price),
                        \(bind: money.currency), \(bind: money.percent), \(bind: money.periodStart),
                        \(bind: money.periodEnd), \(bind: offer.type), \(bind: offer.identifier), \(bind: offer.source),
                        \(bind: transaction.appTransactionId), \(bind: money.purchasedAt), \(bind: money.storefront),
                        \(bind: money.trial ? 1 : 0), \(bind: money.familyShared ? 1 : 0))
                """
            ).run()
            if money.overlaps, let start = money.periodStart, let end = money.periodEnd {
                try await Revenue.supersede(originalId: originalId, start: start, end: end, sql: sql)
            }
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
                    detail:
                        "moved from account \(Identifiers.quoted(previous)) to \(Identifiers.quoted(binding)) (transfer policy)",
                    at: at)
            } else {
                try await sql.raw(
                    "INSERT INTO ownership (original_transaction_id, account_id, bound_at) VALUES (\(bind: originalId), \(bind: binding), \(bind: at))"
                ).run()
            }
        }
        let held = String(decoding: try JSONEncoder().encode(transaction), as: UTF8.self)
        for anomaly in plan.anomalies {
            let key = AnomalyStore.dedupeKey(
                anomaly.kind.rawValue, anomaly.transactionId, anomaly.orderId, anomaly.accountId)
            try await AnomalyStore.insertAnomaly(anomaly, dedupeKey: key, payload: held, sql: sql, at: at)
        }
        if let delivery = plan.delivery {
            try await sql.raw(
                """
                INSERT INTO outbox (id, event, payload, created_at)
                VALUES (\(bind: OutboxStore.newEventId()), 'delivery', \(bind: Self.outboxPayload(delivery, environment: transaction.environment?.rawValue ?? "Production", store: context.store)), \(bind: at))
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
            VALUES (\(bind: RowIdentifiers.uuidString()), \(bind: actor), \(bind: action), \(bind: subject), \(bind: detail), \(bind: at))
            """
        ).run()
    }

    /// Ledger entries and the balance changes they make: a multi-row insert into `ledger` and one
    /// upsert into `balances` (one row per account and currency, in key order, so concurrent
    /// transactions lock balance rows in the same order). Run in the caller's transaction.
    static func ledgerWrites(_ entries: [(LedgerEntry, Int64)]) -> [any SQLExpression] {
        guard !entries.isEmpty else { return [] }
        var ledger = RowsInsert(
            into: "ledger", columns: ["entry_key", "account_id", "currency", "amount", "created_at"])
        for (entry, at) in entries {
            ledger.append([
                .text(entry.key), .text(entry.accountId), .text(entry.currency), .integer(entry.amount), .integer(at),
            ])
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
        var balances = RowsInsert(
            into: "balances", columns: ["account_id", "currency", "amount"],
            suffix: "ON CONFLICT (account_id, currency) DO UPDATE SET amount = balances.amount + excluded.amount")
        for (key, amount) in changes.sorted(by: { $0.key < $1.key }) {
            balances.append([.text(key.account), .text(key.currency), .integer(amount)])
        }
        return [ledger, balances]
    }

    /// The outbox event of a delivery:
    /// `{"accountId","appId"?,"environment","orderId","productId","quantity","store","transactionId"}`,
    /// keys sorted, written by hand (it is on the hot path; JSONSerialization cost ~7 % of a request).
    static func outboxPayload(
        _ delivery: DeliveryPlanner.Delivery, environment: String, appId: String? = nil, store: Store
    ) -> String {
        var json = #"{"accountId":"#
        appendJSONString(delivery.accountId, to: &json)
        if let appId {
            json += #","appId":"#
            appendJSONString(appId, to: &json)
        }
        json += #","environment":"#
        appendJSONString(environment, to: &json)
        json += #","orderId":"#
        if let orderId = delivery.orderId { appendJSONString(orderId, to: &json) } else { json += "null" }
        json += #","productId":"#
        appendJSONString(delivery.productId, to: &json)
        json += #","quantity":\#(delivery.quantity),"store":""#
        json += store.rawValue
        json += #"","transactionId":"#
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
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
