import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Purchases on the database: deliveries — every one planned and committed inside one database
/// transaction, keyed by transactionId, so concurrent and repeated submissions, from one or many
/// server instances, deliver exactly once (docs/architecture.md invariant 1) — and the
/// aggregates around them, each its own store over the same database: orders, accounts,
/// anomalies and the audit log, Apple Accounts, offers, support, reports, transactions and
/// reconciliation.
public struct PurchaseStore: Sendable {
    public let database: Database
    let batcher: DeliveryBatcher

    public let orders: OrderStore
    public let accounts: AccountStore
    public let anomalies: AnomalyStore
    public let appleAccounts: AppleAccountStore
    public let offers: OfferStore
    public let support: SupportStore
    public let reports: ReportStore
    public let transactions: TransactionStore
    public let reconciliation: ReconcileStore

    public init(
        database: Database, sharedAppleIdLimit: Int = OfferStore.defaultSharedAppleIdLimit,
        apps: AppDirectory = AppDirectory()
    ) {
        self.database = database
        self.batcher = DeliveryBatcher(database: database, sharedAppleIdLimit: sharedAppleIdLimit, apps: apps)
        orders = OrderStore(database: database, sharedAppleIdLimit: sharedAppleIdLimit)
        accounts = AccountStore(database: database)
        anomalies = AnomalyStore(database: database)
        appleAccounts = AppleAccountStore(database: database)
        offers = OfferStore(database: database, sharedAppleIdLimit: sharedAppleIdLimit)
        support = SupportStore(database: database)
        reports = ReportStore(database: database)
        transactions = TransactionStore(database: database)
        reconciliation = ReconcileStore(database: database, sharedAppleIdLimit: sharedAppleIdLimit, apps: apps)
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
        public var entitlements: [AccountStore.EntitlementRow] = []
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
