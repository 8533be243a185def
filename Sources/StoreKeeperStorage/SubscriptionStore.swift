import AppStoreModels
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore

/// Auto-renewable subscriptions on the database: one row per original transaction, as
/// SubscriptionMachine left it, and the writes its effects make — the entitlement of the
/// subscription's current product (granted, moved or removed) and a
/// `subscription_status_changed` outbox event — in the caller's transaction.
enum SubscriptionStore {
    /// A state to save with the effects that produced it, for `account`.
    struct Write {
        var state: SubscriptionState
        var account: String
        var effects: [SubscriptionMachine.Effect]
        var catalog: Catalog
        var at: Int64
    }

    /// The stored states of `originals`, one query.
    static func states(_ originals: [String], sql: any SQLDatabase) async throws -> [String: SubscriptionState] {
        guard !originals.isEmpty else { return [:] }
        var states: [String: SubscriptionState] = [:]
        for row in try await sql.raw(
            "SELECT * FROM subscriptions WHERE original_transaction_id IN (\(binds: originals))"
        ).all() {
            let original = try row.decode(column: "original_transaction_id", as: String.self)
            var state = SubscriptionState(
                originalTransactionId: original, productId: try row.decode(column: "product_id", as: String.self),
                status: SubscriptionStatus(rawValue: try row.decode(column: "status", as: String.self)) ?? .expired,
                expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)),
                autoRenew: try row.decode(column: "auto_renew", as: Int64.self) != 0,
                signedDate: Date(milliseconds: try row.decode(column: "signed_at", as: Int64.self)))
            state.nextProductId = try row.decode(column: "next_product_id", as: String?.self)
            state.gracePeriodEndsAt = try row.decode(column: "grace_ends_at", as: Int64?.self).map(
                Date.init(milliseconds:))
            state.latestTransactionId = try row.decode(column: "latest_transaction_id", as: String?.self)
            state.revokedTransactionId = try row.decode(column: "revoked_transaction_id", as: String?.self)
            states[original] = state
        }
        return states
    }

    /// Saves the state and applies its effects: entitlements follow the subscription (one per
    /// subscription, for its current product), status changes become webhook events.
    static func apply(_ write: Write, sql: any SQLDatabase) async throws {
        let state = write.state
        try await sql.raw(
            """
            INSERT INTO subscriptions (original_transaction_id, account_id, product_id, status, expires_at, auto_renew,
                                       next_product_id, grace_ends_at, latest_transaction_id, revoked_transaction_id,
                                       signed_at, updated_at)
            VALUES (\(bind: state.originalTransactionId), \(bind: write.account), \(bind: state.productId),
                    \(bind: state.status.rawValue), \(bind: state.expiresAt?.milliseconds), \(bind: state.autoRenew ? 1 : 0),
                    \(bind: state.nextProductId), \(bind: state.gracePeriodEndsAt?.milliseconds),
                    \(bind: state.latestTransactionId), \(bind: state.revokedTransactionId),
                    \(bind: state.signedDate.milliseconds), \(bind: write.at))
            ON CONFLICT (original_transaction_id) DO UPDATE SET
                account_id = excluded.account_id, product_id = excluded.product_id, status = excluded.status,
                expires_at = excluded.expires_at, auto_renew = excluded.auto_renew,
                next_product_id = excluded.next_product_id, grace_ends_at = excluded.grace_ends_at,
                latest_transaction_id = excluded.latest_transaction_id,
                revoked_transaction_id = excluded.revoked_transaction_id, signed_at = excluded.signed_at,
                updated_at = excluded.updated_at
            """
        ).run()
        for effect in write.effects {
            switch effect {
            case .entitlementRemoved(let productId):
                guard let entitlement = write.catalog.product(productId)?.grants.entitlement else { continue }
                try await sql.raw(
                    """
                    DELETE FROM entitlements WHERE account_id = \(bind: write.account)
                    AND entitlement_id = \(bind: entitlement) AND original_transaction_id = \(bind: state.originalTransactionId)
                    """
                ).run()
            case .entitlementGranted(let productId, let expiresAt):
                guard let entitlement = write.catalog.product(productId)?.grants.entitlement else { continue }
                try await sql.raw(
                    """
                    INSERT INTO entitlements (account_id, entitlement_id, original_transaction_id, product_id, expires_at)
                    VALUES (\(bind: write.account), \(bind: entitlement), \(bind: state.originalTransactionId),
                            \(bind: productId), \(bind: expiresAt?.milliseconds))
                    ON CONFLICT (account_id, entitlement_id, original_transaction_id)
                    DO UPDATE SET expires_at = excluded.expires_at, product_id = excluded.product_id
                    """
                ).run()
            case .statusChanged(let from, let to):
                try await OutboxStore.append(
                    "subscription_status_changed",
                    [
                        "originalTransactionId": .string(state.originalTransactionId),
                        "accountId": .string(write.account), "productId": .string(state.productId),
                        "oldStatus": .string(from?.rawValue), "newStatus": .string(to.rawValue),
                        "expiresAt": .string(state.expiresAt.map(Self.iso8601)),
                    ], sql: sql, at: write.at)
            case .stale, .ignored:
                break
            }
        }
    }

    static func iso8601(_ date: Date) -> String {
        date.formatted(
            .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
    }
}
