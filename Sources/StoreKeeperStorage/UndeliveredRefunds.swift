import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Refunds of purchases nobody held yet (a Google purchase voided or auto-refunded before its
/// token was submitted, an App Store refund of a transaction never delivered here): kept by
/// transaction id so the delivery path honours them — a whole refund is never delivered, a
/// partial one delivers and is taken back at once, through the one refund path.
extension PurchaseStore {
    static func recordUndeliveredRefund(
        _ transactionId: String, originalId: String, productId: String, revocation: RefundPlanner.Revocation,
        reason: String, key: String, store: Store, sql: any SQLDatabase, at: Int64
    ) async throws {
        // A later refund of the same purchase says more (Google's voided quantities add up):
        // the larger share stands.
        try await sql.raw(
            """
            INSERT INTO undelivered_refunds (transaction_id, original_transaction_id, product_id, revocation_type,
                                             percentage, units_refunded, units, share, reason, refund_key, refunded_at,
                                             store)
            VALUES (\(bind: transactionId), \(bind: originalId), \(bind: productId), \(bind: revocation.type?.rawValue),
                    \(bind: revocation.percentage), \(bind: revocation.unitsRefunded), \(bind: revocation.units),
                    \(bind: revocation.share), \(bind: reason), \(bind: key), \(bind: at), \(bind: store.rawValue))
            ON CONFLICT (transaction_id) DO UPDATE SET
                revocation_type = excluded.revocation_type, percentage = excluded.percentage,
                units_refunded = excluded.units_refunded, units = excluded.units, share = excluded.share,
                reason = excluded.reason, refund_key = excluded.refund_key, refunded_at = excluded.refunded_at
            WHERE excluded.share >= undelivered_refunds.share
            """
        ).run()
    }

    /// One `undelivered_refunds` row: the revocation and the key its take-back is applied under.
    static func undeliveredRefund(_ row: any SQLRow) throws -> (revocation: RefundPlanner.Revocation, key: String) {
        (
            RefundPlanner.Revocation(
                type: try row.decode(column: "revocation_type", as: String?.self).map(
                    StoreTransaction.RevocationKind.init(rawValue:)),
                percentage: try row.decode(column: "percentage", as: Int32?.self),
                unitsRefunded: try row.decode(column: "units_refunded", as: Int64?.self),
                units: try row.decode(column: "units", as: Int64?.self)),
            try row.decode(column: "refund_key", as: String.self)
        )
    }

    /// A partial refund recorded before delivery, applied to the delivery just written (same
    /// database transaction) through the one refund path.
    static func applyUndeliveredRefund(
        _ refund: (revocation: RefundPlanner.Revocation, key: String), transaction: StoreTransaction,
        store: Store, catalog: Catalog, policy: OwnershipPolicy, apps: AppDirectory, sql: any SQLDatabase,
        now: Date
    ) async throws {
        var settings = NotificationStore.Settings(
            catalog: catalog, policy: policy, consumptionEnabled: false,
            read: { _ in throw CancellationError() })
        settings.apps = apps
        let id = transaction.transactionId ?? ""
        var event = RefundEvent(
            kind: .refund, store: store, key: refund.key, transactionId: id,
            originalTransactionId: transaction.originalTransactionId, productId: transaction.productId,
            revocation: refund.revocation)
        event.storeIdentity = transaction.storeIdentity
        event.environment = transaction.environment?.rawValue
        event.purchasedAt = transaction.purchaseDate
        event.periodEnd = transaction.expiresDate
        event.subscriptionEvent = RefundEvent.subscriptionEvent(
            .refund, transactionId: id, periodEnd: transaction.expiresDate.map { Date(milliseconds: $0) }, at: now)
        _ = try await NotificationApplier.refund(event, settings: settings, sql: sql, now: now, actor: "storekeeper")
    }
}
