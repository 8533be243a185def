import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Applies one verified notification inside the applier's transaction, as
/// NotificationPlanner routes it: deliveries and subscription events through the one
/// delivery path (BatchDelivery), refunds and their reversals through RefundPlanner.
/// Returns the notification's new status and what happened.
enum NotificationApplier {
    static func apply(
        _ record: NotificationRecord, settings: NotificationStore.Settings, sql: any SQLDatabase, now: Date
    ) async throws -> (String, String) {
        switch NotificationPlanner.action(for: record) {
        case .ignored(let reason):
            return ("ignored", reason)
        case .deliver:
            return try await deliver([record], settings: settings, sql: sql, combineWrites: false, now: now)[0]
        case .refund, .refundReversed:
            guard
                let event = RefundEvent(notification: record)
            else { return ("ignored", "no transaction") }
            return try await refund(event, settings: settings, sql: sql, now: now)
        case .rescindConsent:
            return try await rescindConsent(record, sql: sql, now: now)
        case .externalPurchaseToken:
            return try await ExternalPurchaseStore.record(record, sql: sql, now: now)
        case .consumptionRequest:
            guard settings.consumptionEnabled, let transactionId = record.transaction?.transactionId else {
                return ("ignored", "CONSUMPTION_REQUEST: apple.consumption.enabled is off, so Apple gets no answer")
            }
            // Apple: answer only with the customer's valid consent; without it, no call at all.
            let owner = try await sql.raw(
                "SELECT account_id FROM deliveries WHERE transaction_id = \(bind: transactionId)"
            ).first()?.decode(column: "account_id", as: String.self)
            let consent: Consent? = if let owner { try await AccountStore.consent(of: owner, sql: sql) } else { nil }
            guard owner != nil, consent?.consumptionData == true else {
                let reason =
                    owner == nil
                    ? "transaction \(transactionId) was never delivered here, so no customer's consent is known"
                    : consent?.consumptionData == false
                        ? "account \(Identifiers.quoted(owner!)) withdrew consent to share consumption data"
                        : "account \(Identifiers.quoted(owner!)) never consented to share consumption data"
                try await PurchaseStore.audit(
                    sql, actor: "storekeeper", action: "consumption_withheld", subject: transactionId,
                    detail: "CONSUMPTION_REQUEST not answered: \(reason)", at: now.milliseconds)
                return ("ignored", "CONSUMPTION_REQUEST: \(reason); Apple gets no answer")
            }
            // Answered from the job queue (Apple allows 12 hours), once per request.
            try await JobStore.insert(
                kind: NotificationStore.consumptionJobKind,
                dedupeKey: "\(NotificationStore.consumptionJobKind)|\(record.notificationUUID)",
                payload: transactionId, sql: sql, now: now)
            return ("applied", "CONSUMPTION_REQUEST for \(transactionId): Send Consumption Information queued")
        }
    }

    /// Purchases, renewals and subscription events (NotificationPlanner's `.deliver`, each
    /// with a transaction): delivered to whoever owns them (exactly once; again, they are
    /// already_delivered) and the subscriptions moved — as one batch through the delivery
    /// path, which plans them in order (a later one sees what an earlier one did).
    static func deliver(
        _ records: [NotificationRecord], settings: NotificationStore.Settings, sql: any SQLDatabase,
        combineWrites: Bool, now: Date
    ) async throws -> [(String, String)] {
        let items = records.compactMap { record -> BatchDelivery.Item? in
            guard let transaction = record.transaction else { return nil }
            let product = settings.catalog.product(transaction.productId ?? "")
            return BatchDelivery.Item(
                transaction: transaction, submittingAccount: nil, requestedOrderId: nil, catalog: settings.catalog,
                policy: settings.policy, evidence: .device, now: now,
                event: product?.type == .autoRenewable ? record.subscriptionEvent : nil,
                sharedAppleIdLimit: settings.sharedAppleIdLimit, apps: settings.apps)
        }
        precondition(items.count == records.count, "NotificationPlanner delivers only what has a transaction")
        let results = try await BatchDelivery.run(items, sql: sql, combineWrites: combineWrites)
        return zip(items, results).map { outcome(of: $1, transactionId: $0.transaction.transactionId ?? "") }
    }

    /// A delivery's result as the notification's status and outcome.
    static func outcome(of result: PurchaseStore.DeliveryResult, transactionId id: String) -> (String, String) {
        if result.subscriptionEffects.contains(.stale) {
            return ("stale", "signed before the subscription's newest applied event: recorded, not applied")
        }
        for case .ignored(let reason) in result.subscriptionEffects { return ("ignored", reason) }
        let plan = result.plan
        switch plan.outcome {
        case .delivered:
            return ("applied", "transaction \(id) delivered to account \(plan.accountId ?? "-")")
        case .alreadyDelivered:
            let status = result.subscriptionEffects.compactMap { effect -> String? in
                if case .statusChanged(let from, let to) = effect {
                    return "\(from?.rawValue ?? "none") → \(to.rawValue)"
                }
                return nil
            }
            return ("applied", "account \(plan.accountId ?? "-"): " + (status.first ?? "subscription updated"))
        case .unattributed:
            return ("unattributed", "no account owns transaction \(id) yet: held until one submits it")
        case .refunded:
            return ("applied", "transaction \(id) is revoked: nothing delivered")
        case .notDelivered:
            return ("applied", "transaction \(id) not delivered: \(plan.anomalies.first?.detail ?? "refused")")
        }
    }

    /// REFUND or REVOKE (`reversed` false), REFUND_REVERSED (true): the ledger, the
    /// entitlement, the order, the subscription — each exactly once, audited, with a webhook event.
    /// `actor`: who decided it, for the audit (`apple`, or `backend` for a web payment's refund).
    static func refund(
        _ event: RefundEvent, settings: NotificationStore.Settings, sql: any SQLDatabase, now: Date,
        actor: String = "apple"
    ) async throws -> (String, String) {
        let transactionId = event.transactionId
        let reversed = event.kind == .reversal
        let at = now.milliseconds
        let originalId = event.originalTransactionId
        let row = try await sql.raw("SELECT * FROM deliveries WHERE transaction_id = \(bind: transactionId)").first()
        let delivery = try row.map {
            DeliveryPlanner.Delivery(
                transactionId: transactionId, accountId: try $0.decode(column: "account_id", as: String.self),
                orderId: try $0.decode(column: "order_id", as: String?.self),
                productId: try $0.decode(column: "product_id", as: String.self),
                quantity: try $0.decode(column: "quantity", as: Int.self),
                refunded: try $0.decode(column: "refunded_at", as: Int64?.self) != nil)
        }
        // The app: recorded with the delivery, else the one the refund's own data names.
        let appId =
            (try? row?.decode(column: "app_id", as: String?.self)) ?? nil
            ?? settings.apps.appId(ofStoreIdentity: event.storeIdentity)
        let product = settings.catalog.product(delivery?.productId ?? event.productId ?? "")
        var credit: RefundPlanner.Credit?
        var balance: Int64 = 0
        if let delivery, let credited = try await AccountStore.credit(of: transactionId, sql: sql) {
            credit = credited
            balance = try await AccountStore.balance(delivery.accountId, credited.currency, sql: sql)
        }
        let context = RefundPlanner.Context(
            delivery: delivery, refunded: delivery?.refunded == true, credited: credit, balance: balance,
            entitlement: product?.grants.entitlement, productType: product?.type,
            refundedShare: try row?.decode(column: "refund_share", as: Int32?.self),
            takenBack: try row?.decode(column: "refund_taken", as: Int64?.self),
            revokeNonConsumableAt: settings.catalog.refunds.revokeNonConsumableAtShare)
        let kind = event.kind.rawValue
        let revocation = event.revocation
        let plan =
            reversed
            ? RefundPlanner.reversal(context, transactionId: transactionId, key: event.key)
            : RefundPlanner.refund(
                context, transactionId: transactionId, key: event.key,
                reason: event.kind == .revoke ? "REVOKE" : "REFUND",
                revocation: revocation)

        // An auto-renewable's access follows its state: revoked, or reinstated.
        var subscriptionNote = ""
        if product?.type == .autoRenewable,
            let account = try await sql.raw(
                "SELECT account_id FROM ownership WHERE original_transaction_id = \(bind: originalId)"
            ).first()?.decode(column: "account_id", as: String.self) ?? delivery?.accountId
        {
            let before = try await SubscriptionStore.states([originalId], sql: sql)[originalId]
            let (state, effects) = SubscriptionMachine.apply(
                before,
                event.subscriptionEvent
                    ?? RefundEvent.subscriptionEvent(
                        event.kind, transactionId: transactionId,
                        periodEnd: event.periodEnd.map(Date.init(milliseconds:)),
                        at: now))
            if effects.contains(.stale) {
                subscriptionNote = "; the subscription has newer events"
            } else if let state, state != before {
                try await SubscriptionStore.apply(
                    [.init(state: state, account: account, effects: effects, catalog: settings.catalog, at: at)],
                    sql: sql)
                subscriptionNote = "; subscription \(originalId) is \(state.status.rawValue)"
            }
        }
        var heldForDelivery = false
        if reversed, delivery == nil {
            // The store took its refund back before anyone claimed the purchase: deliverable again.
            try await sql.raw("DELETE FROM undelivered_refunds WHERE transaction_id = \(bind: transactionId)").run()
        }
        if let refunded = plan.refundedBeforeDelivery {
            // Kept by transaction id whoever holds it (nobody, often): the delivery path reads it.
            try await PurchaseStore.recordUndeliveredRefund(
                transactionId, originalId: originalId, productId: event.productId ?? "", revocation: refunded,
                reason: kind, key: event.key, store: event.store, sql: sql, at: at)
            heldForDelivery = true
            try await PurchaseStore.audit(
                sql, actor: actor, action: kind, subject: transactionId,
                detail:
                    "\(kind) of transaction \(transactionId) before anyone claimed it (\(RefundPlanner.percent(refunded.share))): recorded; \(refunded.isPartial ? "a delivery gives only what was not refunded" : "it is never delivered")",
                at: at)
        }
        if plan.recordUndelivered,
            let (account, orderId) = try await owner(token: event.appAccountToken, originalId: originalId, sql: sql)
        {
            // The marker: delivered with nothing, refunded — the exactly-once key now says so.
            try await sql.raw(
                """
                INSERT INTO deliveries (transaction_id, original_transaction_id, account_id, order_id, product_id, quantity,
                                        environment, delivered_at, refunded_at, refund_share, refund_taken, refund_type,
                                        app_transaction_id, store)
                VALUES (\(bind: transactionId), \(bind: originalId), \(bind: account), \(bind: orderId),
                        \(bind: event.productId ?? ""), 0, \(bind: event.environment ?? "Production"),
                        \(bind: at), \(bind: at), \(bind: revocation.share), 0,
                        \(bind: event.revocationType), \(bind: event.appTransactionId),
                        \(bind: event.store.rawValue))
                ON CONFLICT (transaction_id) DO NOTHING
                """
            ).run()
            if let orderId, let status = plan.orderStatus {
                try await sql.raw(
                    "UPDATE orders SET status = \(bind: status.rawValue) WHERE order_id = \(bind: orderId) AND status IN ('created', 'pending', 'cancelled')"
                ).run()
            }
            try await PurchaseStore.audit(
                sql, actor: actor, action: kind, subject: transactionId,
                detail:
                    "\(kind) of transaction \(transactionId), never delivered: recorded for account \(Identifiers.quoted(account))",
                at: at)
        }
        if let skipped = plan.skipped {
            return (
                subscriptionNote.isEmpty && !plan.recordUndelivered && !heldForDelivery ? "ignored" : "applied",
                skipped + subscriptionNote
            )
        }
        guard let delivery, let account = plan.accountId else { return ("ignored", "nothing delivered") }

        for write in PurchaseStore.ledgerWrites(plan.ledger.map { ($0, at) }) {
            try await sql.execute(sql: write) { _ in }
        }
        if let entitlement = plan.removeEntitlement {
            // Keep what is removed (the window's end included) for an exact reversal.
            let removed = try await sql.raw(
                """
                SELECT expires_at FROM entitlements WHERE account_id = \(bind: account)
                AND entitlement_id = \(bind: entitlement) AND original_transaction_id = \(bind: originalId)
                """
            ).first()
            if let removed {
                // A window shortened by an earlier prorated refund keeps its original end.
                try await sql.raw(
                    """
                    UPDATE deliveries SET refund_removed_entitlement = 1,
                    refund_removed_expires_at = CASE WHEN refund_removed_entitlement = 2 THEN refund_removed_expires_at
                        ELSE \(bind: try removed.decode(column: "expires_at", as: Int64?.self)) END
                    WHERE transaction_id = \(bind: transactionId)
                    """
                ).run()
            }
            try await sql.raw(
                """
                DELETE FROM entitlements WHERE account_id = \(bind: account) AND entitlement_id = \(bind: entitlement)
                AND original_transaction_id = \(bind: originalId)
                """
            ).run()
        }
        if let shortening = plan.shortenEntitlement, let purchased = event.purchasedAt {
            let (entitlement, share) = (shortening.id, shortening.share)
            // A non-renewing window shortened by the refunded share of its length; what it was is
            // kept for an exact reversal.
            if let current = try await sql.raw(
                """
                SELECT expires_at FROM entitlements WHERE account_id = \(bind: account)
                AND entitlement_id = \(bind: entitlement) AND original_transaction_id = \(bind: originalId)
                """
            ).first()?.decode(column: "expires_at", as: Int64?.self) {
                let length = max(0, current - purchased)
                let shortened = current - RefundPlanner.portion(of: length, share: share)
                if try row?.decode(column: "refund_removed_entitlement", as: Int?.self) == nil {
                    try await sql.raw(
                        """
                        UPDATE deliveries SET refund_removed_entitlement = 2, refund_removed_expires_at = \(bind: current)
                        WHERE transaction_id = \(bind: transactionId)
                        """
                    ).run()
                }
                try await sql.raw(
                    """
                    UPDATE entitlements SET expires_at = \(bind: shortened) WHERE account_id = \(bind: account)
                    AND entitlement_id = \(bind: entitlement) AND original_transaction_id = \(bind: originalId)
                    """
                ).run()
            }
        }
        if let entitlement = plan.reinstateEntitlement, let product {
            // Exactly what the refund removed (or shortened); a refund recorded before that was
            // kept (or that found no entitlement to remove) falls back to the product's own window.
            let removed = try row?.decode(column: "refund_removed_entitlement", as: Int?.self)
            let refundedBefore = try row?.decode(column: "refund_share", as: Int32?.self) != nil
            if removed == 2, let row {
                try await sql.raw(
                    """
                    UPDATE entitlements SET expires_at = \(bind: try row.decode(column: "refund_removed_expires_at", as: Int64?.self))
                    WHERE account_id = \(bind: account) AND entitlement_id = \(bind: entitlement)
                    AND original_transaction_id = \(bind: originalId)
                    """
                ).run()
            } else if removed == 1 || !refundedBefore {
                // A refund from before migration 16 (no share recorded) that found nothing to
                // remove falls back to the product's own window; a newer one that removed
                // nothing (a prorated refund below the policy's share) reinstates nothing.
                let expiresAt: Int64?
                if let row, removed == 1 {
                    expiresAt = try row.decode(column: "refund_removed_expires_at", as: Int64?.self)
                } else {
                    expiresAt =
                        DeliveryPlanner.expiry(
                            of: product, purchasedAt: event.purchasedAt, periodEnd: event.periodEnd, currentExpiry: nil
                        )?.milliseconds
                }
                try await sql.raw(
                    """
                    INSERT INTO entitlements (account_id, entitlement_id, original_transaction_id, product_id, expires_at)
                    VALUES (\(bind: account), \(bind: entitlement), \(bind: originalId), \(bind: product.id),
                            \(bind: expiresAt))
                    ON CONFLICT (account_id, entitlement_id, original_transaction_id) DO NOTHING
                    """
                ).run()
            }
        }
        if let refunded = plan.refunded {
            try await sql.raw(
                """
                UPDATE deliveries SET refunded_at = \(bind: refunded ? at : nil), refund_share = \(bind: plan.refundedShare),
                refund_taken = \(bind: plan.takenBack), refund_type = \(bind: refunded ? event.revocationType : nil)
                WHERE transaction_id = \(bind: transactionId)
                """
            ).run()
            if !refunded {
                try await sql.raw(
                    """
                    UPDATE deliveries SET refund_removed_entitlement = NULL, refund_removed_expires_at = NULL
                    WHERE transaction_id = \(bind: transactionId)
                    """
                ).run()
            }
        }
        if let status = plan.orderStatus, let orderId = delivery.orderId {
            try await sql.raw("UPDATE orders SET status = \(bind: status.rawValue) WHERE order_id = \(bind: orderId)")
                .run()
        }
        for anomaly in plan.anomalies {
            try await AnomalyStore.insertAnomaly(
                anomaly,
                dedupeKey: AnomalyStore.dedupeKey(anomaly.kind.rawValue, transactionId, event.key),
                payload: nil, sql: sql, at: at)
        }
        let amount = plan.ledger.first
        var detail = "\(kind) of transaction \(transactionId) ('\(delivery.productId)') for account \(account)"
        if let amount { detail += ": \(amount.amount) \(amount.currency)" }
        if !reversed, revocation.isPartial { detail += " (prorated, \(RefundPlanner.percent(revocation.share)))" }
        try await PurchaseStore.audit(sql, actor: actor, action: kind, subject: transactionId, detail: detail, at: at)
        try await OutboxStore.append(
            reversed ? "refund_reversed" : "refund",
            [
                "transactionId": .string(transactionId), "accountId": .string(account),
                "orderId": .string(delivery.orderId), "productId": .string(delivery.productId), "kind": .string(kind),
                "currency": .string(amount?.currency), "amount": .number(amount?.amount),
                "revocationReason": .number(event.reasonCode),
                "revocationType": .string(reversed ? nil : event.revocationType),
                "refundedShare": .number(plan.refundedShare.map(Int64.init)),
                "orderStatus": .string(plan.orderStatus?.rawValue),
                "store": .string(
                    ((try? row?.decode(column: "store", as: String?.self)) ?? nil) ?? event.store.rawValue),
                "appId": .string(appId),
            ], sql: sql, at: at)
        return ("applied", detail + subscriptionNote)
    }

    /// Who a transaction that was never delivered belongs to: the account its original
    /// transaction is bound to, else the order its token names (and that order).
    static func owner(token: String?, originalId: String, sql: any SQLDatabase) async throws -> (String, String?)? {
        var order: (String, String)?
        if let token = token?.lowercased(),
            let row = try await sql.raw(
                "SELECT order_id, account_id FROM orders WHERE app_account_token = \(bind: token)"
            )
            .first()
        {
            order = (
                try row.decode(column: "account_id", as: String.self),
                try row.decode(column: "order_id", as: String.self)
            )
        }
        if let bound = try await sql.raw(
            "SELECT account_id FROM ownership WHERE original_transaction_id = \(bind: originalId)"
        ).first()?.decode(column: "account_id", as: String.self) {
            return (bound, order?.0 == bound ? order?.1 : nil)
        }
        return order.map { ($0.0, $0.1) }
    }
}
