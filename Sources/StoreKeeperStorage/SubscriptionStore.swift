import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Auto-renewable subscriptions on the database: one row per original transaction, as
/// SubscriptionMachine left it, and the writes its effects make — the entitlement of the
/// subscription's current product (granted, moved or removed) and a
/// `subscription_status_changed` outbox event — in the caller's transaction.
public enum SubscriptionStore {
    /// A state to save with the effects that produced it, for `account`.
    struct Write {
        var state: SubscriptionState
        var account: String
        var effects: [SubscriptionMachine.Effect]
        var catalog: Catalog
        var at: Int64
        /// The app of the transaction that moved it (nil: the one recorded stays).
        var appId: String? = nil
        /// The store it was bought in: recorded when the subscription is first written.
        var store: Store = .appStore
    }

    /// The stored states of `originals`, one query.
    /// A subscription's state as the machine left it (nil: unknown).
    public static func state(_ originalTransactionId: String, database: Database) async throws -> SubscriptionState? {
        try await database.read { sql in try await states([originalTransactionId], sql: sql)[originalTransactionId] }
    }

    static func states(_ originals: [String], sql: any SQLDatabase) async throws -> [String: SubscriptionState] {
        guard !originals.isEmpty else { return [:] }
        var states: [String: SubscriptionState] = [:]
        for row in try await sql.raw(
            "SELECT * FROM subscriptions WHERE original_transaction_id IN (\(binds: originals))"
        ).all() {
            let state = try decodeState(row)
            states[state.originalTransactionId] = state
        }
        return states
    }

    static func decodeState(_ row: any SQLRow) throws -> SubscriptionState {
        var state = SubscriptionState(
            originalTransactionId: try row.decode(column: "original_transaction_id", as: String.self),
            productId: try row.decode(column: "product_id", as: String.self),
            status: SubscriptionStatus(rawValue: try row.decode(column: "status", as: String.self)) ?? .expired,
            expiresAt: try row.decode(column: "expires_at", as: Int64?.self).map(Date.init(milliseconds:)),
            autoRenew: try row.decode(column: "auto_renew", as: Int64.self) != 0,
            signedDate: Date(milliseconds: try row.decode(column: "signed_at", as: Int64.self)))
        state.nextProductId = try row.decode(column: "next_product_id", as: String?.self)
        state.gracePeriodEndsAt = try row.decode(column: "grace_ends_at", as: Int64?.self).map(
            Date.init(milliseconds:))
        state.latestTransactionId = try row.decode(column: "latest_transaction_id", as: String?.self)
        state.revokedTransactionId = try row.decode(column: "revoked_transaction_id", as: String?.self)
        if try row.decode(column: "billing_plan", as: String?.self) == "MONTHLY",
            let period = try row.decode(column: "commitment_period", as: Int?.self)
        {
            let renews = try row.decode(column: "commitment_renews", as: Int?.self)
            state.commitment = SubscriptionState.Commitment(
                period: period, periods: try row.decode(column: "commitment_periods", as: Int?.self) ?? 12,
                expiresAt: try row.decode(column: "commitment_expires_at", as: Int64?.self).map(
                    Date.init(milliseconds:)),
                renews: renews.map { $0 != 0 })
        }
        return state
    }

    /// Saves the states and applies their effects, in order: entitlements follow each
    /// subscription (one per subscription, for its current product), status changes become
    /// webhook events. A batch's writes become a handful of multi-row statements: each
    /// subscription's last state, each entitlement's last grant (or its removal), every event.
    static func apply(_ writes: [Write], sql: any SQLDatabase) async throws {
        guard !writes.isEmpty else { return }
        struct EntitlementKey: Hashable {
            var account: String
            var entitlement: String
            var original: String
        }
        var states: [String: Write] = [:]
        var order: [String] = []
        var entitlements: [EntitlementKey: (productId: String, expiresAt: Date?)?] = [:]  // nil: removed
        var entitlementOrder: [EntitlementKey] = []
        var events: [(String, Int64)] = []
        // The app recorded with each subscription, for events whose write does not name it.
        var recordedApps: [String: String] = [:]
        let unnamed = Set(writes.filter { $0.appId == nil }.map(\.state.originalTransactionId))
        if !unnamed.isEmpty {
            for row in try await sql.raw(
                """
                SELECT original_transaction_id, app_id FROM subscriptions
                WHERE original_transaction_id IN (\(binds: Array(unnamed))) AND app_id IS NOT NULL
                """
            ).all() {
                recordedApps[try row.decode(column: "original_transaction_id", as: String.self)] = try row.decode(
                    column: "app_id", as: String.self)
            }
        }
        for write in writes {
            let state = write.state
            if states.updateValue(write, forKey: state.originalTransactionId) == nil {
                order.append(state.originalTransactionId)
            }
            for effect in write.effects {
                switch effect {
                case .entitlementRemoved(let productId), .entitlementGranted(let productId, _):
                    guard let entitlement = write.catalog.product(productId)?.grants.entitlement else { continue }
                    let key = EntitlementKey(
                        account: write.account, entitlement: entitlement, original: state.originalTransactionId)
                    if entitlements.index(forKey: key) == nil { entitlementOrder.append(key) }
                    if case .entitlementGranted(_, let expiresAt) = effect {
                        entitlements[key] = (productId, expiresAt)
                    } else {
                        entitlements[key] = .some(nil)
                    }
                case .statusChanged(let from, let to):
                    events.append(
                        (
                            OutboxStore.json([
                                "originalTransactionId": .string(state.originalTransactionId),
                                "accountId": .string(write.account), "productId": .string(state.productId),
                                "oldStatus": .string(from?.rawValue), "newStatus": .string(to.rawValue),
                                "expiresAt": .string(state.expiresAt.map(Self.iso8601)),
                                "store": .string(write.store.rawValue),
                                "appId": .string(write.appId ?? recordedApps[state.originalTransactionId]),
                            ]), write.at
                        ))
                case .stale, .ignored:
                    break
                }
            }
        }
        var upsert = sql.insert(into: "subscriptions").columns(
            "original_transaction_id", "account_id", "product_id", "status", "expires_at", "auto_renew",
            "next_product_id", "grace_ends_at", "latest_transaction_id", "revoked_transaction_id", "signed_at",
            "updated_at", "billing_plan", "commitment_period", "commitment_periods", "commitment_expires_at",
            "commitment_renews", "app_id", "store")
        for original in order {
            let write = states[original]!
            let state = write.state
            upsert = upsert.values([
                state.originalTransactionId, write.account, state.productId, state.status.rawValue,
                state.expiresAt?.milliseconds, state.autoRenew ? 1 : 0, state.nextProductId,
                state.gracePeriodEndsAt?.milliseconds, state.latestTransactionId, state.revokedTransactionId,
                state.signedDate.milliseconds, write.at, state.commitment == nil ? nil : "MONTHLY",
                state.commitment?.period, state.commitment?.periods, state.commitment?.expiresAt?.milliseconds,
                state.commitment?.renews.map { $0 ? 1 : 0 }, write.appId, write.store.rawValue,
            ])
        }
        try await sql.raw(
            """
            \(upsert.insert) ON CONFLICT (original_transaction_id) DO UPDATE SET
                account_id = excluded.account_id, product_id = excluded.product_id, status = excluded.status,
                expires_at = excluded.expires_at, auto_renew = excluded.auto_renew,
                next_product_id = excluded.next_product_id, grace_ends_at = excluded.grace_ends_at,
                latest_transaction_id = excluded.latest_transaction_id,
                revoked_transaction_id = excluded.revoked_transaction_id, signed_at = excluded.signed_at,
                updated_at = excluded.updated_at, billing_plan = excluded.billing_plan,
                commitment_period = excluded.commitment_period, commitment_periods = excluded.commitment_periods,
                commitment_expires_at = excluded.commitment_expires_at, commitment_renews = excluded.commitment_renews,
                app_id = COALESCE(excluded.app_id, subscriptions.app_id)
            """
        ).run()
        var grants = sql.insert(into: "entitlements").columns(
            "account_id", "entitlement_id", "original_transaction_id", "product_id", "expires_at")
        var granted = false
        for key in entitlementOrder {
            guard let grant = entitlements[key]! else {
                try await sql.raw(
                    """
                    DELETE FROM entitlements WHERE account_id = \(bind: key.account)
                    AND entitlement_id = \(bind: key.entitlement) AND original_transaction_id = \(bind: key.original)
                    """
                ).run()
                continue
            }
            grants = grants.values([
                key.account, key.entitlement, key.original, grant.productId, grant.expiresAt?.milliseconds,
            ])
            granted = true
        }
        if granted {
            try await sql.raw(
                """
                \(grants.insert) ON CONFLICT (account_id, entitlement_id, original_transaction_id)
                DO UPDATE SET expires_at = excluded.expires_at, product_id = excluded.product_id
                """
            ).run()
        }
        try await OutboxStore.insert("subscription_status_changed", events, sql: sql)
    }

    static func iso8601(_ date: Date) -> String {
        date.formatted(
            .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
    }
}
