import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Orders and deliveries on the database: every delivery is planned and committed inside one
/// database transaction, keyed by transactionId, so concurrent and repeated submissions —
/// from one or many server instances — deliver exactly once (docs/architecture.md invariant 1).
public struct PurchaseStore: Sendable {
    public let database: Database
    let batcher: DeliveryBatcher

    /// Retention requests, group committed: concurrent answers share one commit.
    let retentionCommitter: GroupCommit<RetentionRecord>

    public init(
        database: Database, sharedAppleIdLimit: Int = OfferStore.defaultSharedAppleIdLimit,
        apps: AppDirectory = AppDirectory()
    ) {
        self.database = database
        self.batcher = DeliveryBatcher(database: database, sharedAppleIdLimit: sharedAppleIdLimit, apps: apps)
        self.retentionCommitter = GroupCommit(database: database) { items, sql in
            try await Self.insertRetention(items, sql: sql)
        }
    }

    /// More accounts than this on one Apple Account (appTransactionId) raise `shared_apple_id`.
    public var sharedAppleIdLimit: Int { batcher.sharedAppleIdLimit }

    /// The deployment's apps: each delivery and subscription records its app.
    public var apps: AppDirectory { batcher.apps }

    public struct DeliveryResult: Sendable {
        public var plan: DeliveryPlanner.Plan
        /// For `already_delivered`: the delivery recorded the first time.
        public var existing: DeliveryPlanner.Delivery?
        /// The submitting account as committed with this delivery (balances and entitlements),
        /// read in the same database transaction, so the answer needs no second round trip.
        public var account: AccountState?
        /// What SubscriptionMachine decided for an auto-renewable (`stale`, `ignored`…).
        public var subscriptionEffects: [SubscriptionMachine.Effect] = []
        /// A store's purchase recorded but not planned: not paid yet, or a replaced token.
        public var held: Held? = nil

        public enum Held: Sendable, Hashable {
            case unpaid
            case retired
        }
    }

    /// An account's consumable balances and entitlements.
    public struct AccountState: Sendable, Hashable {
        public var balances: [String: Int64] = [:]
        public var entitlements: [EntitlementRow] = []
        public var subscriptions: [SubscriptionRow] = []
    }

    /// An auto-renewable subscription as the account read shows it.
    public struct SubscriptionRow: Sendable, Hashable {
        public var originalTransactionId: String
        public var productId: String
        public var status: String
        public var expiresAt: Date?
        public var autoRenew: Bool
        /// A monthly plan with a 12-month commitment: this period, the commitment's end, and
        /// whether a new commitment follows it (nil: not known).
        public var commitment: Commitment? = nil
        /// The app recorded with it (nil: a row from before several apps, or a web checkout).
        public var appId: String? = nil
        /// The store it was bought in, as recorded.
        public var store: Store? = nil

        public struct Commitment: Sendable, Hashable {
            public var period: Int
            public var periods: Int
            public var expiresAt: Date?
            public var renews: Bool?
        }
    }
}
