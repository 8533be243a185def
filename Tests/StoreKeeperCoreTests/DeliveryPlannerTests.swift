import AppStoreAdapter
import AppStoreModels
import Foundation
import StoreKeeperCatalog
import Testing

@testable import StoreKeeperCore

@Suite struct DeliveryPlannerTests {
    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
              - { id: coins_300, type: consumable, grants: { currency: coins, amount: 300 } }
              - { id: remove_ads, type: non_consumable, grants: { entitlement: no_ads } }
              - { id: pro_monthly, type: auto_renewable, group: pro, grants: { entitlement: pro } }
              - { id: season_pass, type: non_renewing, duration: P30D, grants: { entitlement: season } }
            """)
    static let now = Date(timeIntervalSince1970: 1_767_225_600)

    static func transaction(
        _ productId: String = "coins_60", id: String = "2000000000000001", original: String? = nil, quantity: Int32 = 1,
        token: UUID? = nil, revoked: Bool = false, expires: Int64? = nil
    ) -> StoreTransaction {
        StoreTransaction.appStore(
            transactionId: id, originalTransactionId: original ?? id, bundleId: "com.example.app", productId: productId,
            purchaseDate: 1_767_225_000_000, expiresDate: expires, quantity: quantity,
            appAccountToken: token?.uuidString.lowercased(), revocationDate: revoked ? 1_767_225_500_000 : nil,
            environment: .production)
    }

    static func order(_ productId: String = "coins_60", account: String = "u42", status: Order.Status = .created)
        -> Order
    {
        Order(
            orderId: UUID().uuidString, appAccountToken: UUID(), accountId: account, productId: productId, quantity: 1,
            status: status, createdAt: now.addingTimeInterval(-60))
    }

    func plan(_ context: DeliveryPlanner.Context) -> DeliveryPlanner.Plan {
        DeliveryPlanner.plan(context, now: Self.now)
    }

    @Test func happyPathDeliversTheTokensOrderOnce() {
        let order = Self.order()
        let result = plan(
            .init(
                transaction: Self.transaction(quantity: 3, token: order.appAccountToken), submittingAccount: "u42",
                orderByToken: order, catalog: Self.catalog))
        #expect(result.outcome == .delivered)
        #expect(result.accountId == "u42")
        #expect(result.order?.status == .delivered)
        #expect(result.order?.transactionId == "2000000000000001")
        #expect(result.order?.deliveredAt == Self.now)
        #expect(result.grants == [.currency(code: "coins", amount: 180)])
        #expect(
            result.ledger == [
                .init(key: "purchase:2000000000000001:coins", accountId: "u42", currency: "coins", amount: 180)
            ])
        #expect(result.delivery?.orderId == order.orderId)
        #expect(result.anomalies.isEmpty)
        #expect(result.binding == nil)  // consumables bind nobody
    }

    @Test func repeatedSubmissionIsAlreadyDeliveredWithNoEffects() {
        let existing = DeliveryPlanner.Delivery(
            transactionId: "2000000000000001", accountId: "u42", orderId: "o1", productId: "coins_60", quantity: 1)
        let result = plan(
            .init(
                transaction: Self.transaction(), submittingAccount: "u42", existingDelivery: existing,
                catalog: Self.catalog))
        #expect(result.outcome == .alreadyDelivered)
        #expect(result.grants.isEmpty && result.ledger.isEmpty && result.order == nil && result.delivery == nil)
    }

    @Test func revokedTransactionsGrantNothing() {
        let result = plan(
            .init(transaction: Self.transaction(revoked: true), submittingAccount: "u42", catalog: Self.catalog))
        #expect(result.outcome == .refunded)
        #expect(result.refusal == .revoked)
        #expect(result.grants.isEmpty)
    }

    /// FIFO among the candidates storage read: the account's oldest created or pending order
    /// for the product (ties by order id); other accounts, products, paid and cancelled
    /// orders never.
    @Test func theOldestOpenOrderIsChosenHere() {
        func order(_ id: String, _ account: String, _ product: String, _ status: Order.Status, _ age: TimeInterval)
            -> Order
        {
            Order(
                orderId: id, appAccountToken: UUID(), accountId: account, productId: product, quantity: 1,
                status: status, createdAt: Self.now.addingTimeInterval(-age))
        }
        let orders = [
            order("a-other-account", "u1", "coins_60", .created, 900),
            order("b-other-product", "u42", "gems", .created, 800),
            order("c-delivered", "u42", "coins_60", .delivered, 700),
            order("d-cancelled", "u42", "coins_60", .cancelled, 600),
            order("f-pending", "u42", "coins_60", .pending, 500),
            order("e-created", "u42", "coins_60", .created, 500),
            order("g-newer", "u42", "coins_60", .created, 100),
        ]
        #expect(DeliveryPlanner.oldestOpenOrder(of: "u42", product: "coins_60", among: orders)?.orderId == "e-created")
        #expect(
            DeliveryPlanner.oldestOpenOrder(of: "u42", product: "gems", among: orders)?.orderId == "b-other-product")
        #expect(DeliveryPlanner.oldestOpenOrder(of: "u9", product: "coins_60", among: orders) == nil)
    }

    @Test func attributionFallsBackToRequestedThenOldestOpenOrder() {
        let requested = Self.order()
        let byRequest = plan(
            .init(
                transaction: Self.transaction(), submittingAccount: "u42", requestedOrder: requested,
                catalog: Self.catalog))
        #expect(byRequest.order?.orderId == requested.orderId)
        let oldest = Self.order(status: .cancelled)  // a TTL-cancelled order still takes a late payment
        let byOldest = plan(
            .init(
                transaction: Self.transaction(), submittingAccount: "u42", oldestOpenOrder: oldest,
                catalog: Self.catalog))
        #expect(byOldest.order?.orderId == oldest.orderId)
        #expect(byOldest.order?.status == .delivered)
        let none = plan(.init(transaction: Self.transaction(), submittingAccount: "u42", catalog: Self.catalog))
        // No order: a device's proof is delivered to its submitter (holding it is the proof).
        #expect(none.outcome == .delivered)
        #expect(none.accountId == "u42")
        #expect(none.grants == [.currency(code: "coins", amount: 60)])
        #expect(none.order == nil)
    }

    @Test func anotherAccountsOrderIsRefused() {
        let result = plan(
            .init(
                transaction: Self.transaction(), submittingAccount: "u42", requestedOrder: Self.order(account: "u7"),
                catalog: Self.catalog))
        #expect(result.refusal == .orderOfAnotherAccount)
        #expect(result.grants.isEmpty)
    }

    @Test func theSignedTokenOutranksTheSubmitter() {
        // Account B submits A's payment: it was paid for A's order, so A gets it.
        let order = Self.order(account: "alice")
        let result = plan(
            .init(
                transaction: Self.transaction(token: order.appAccountToken), submittingAccount: "bob",
                orderByToken: order,
                catalog: Self.catalog))
        #expect(result.accountId == "alice")
        #expect(result.order?.orderId == order.orderId)
    }

    @Test func productMismatchDeliversWhatWasPaidAndKeepsTheOrderOpen() {
        let order = Self.order("coins_300")
        let result = plan(
            .init(
                transaction: Self.transaction("coins_60", token: order.appAccountToken), submittingAccount: "u42",
                orderByToken: order, catalog: Self.catalog))
        #expect(result.outcome == .delivered)
        #expect(result.grants == [.currency(code: "coins", amount: 60)])
        #expect(result.order == nil)  // the 300-coin order stays unpaid
        #expect(result.delivery?.orderId == nil)
        #expect(result.anomalies.map(\.kind) == [.productMismatch])
        #expect(result.anomalies.first?.orderId == order.orderId)
    }

    /// An upgrade carries its subscription's original token; a merged payment's other half
    /// rides on the first one's: the token names an order paid long ago. Delivered to that
    /// order's account, with no product_mismatch (nothing claims that order now).
    @Test func aTokenOfAnOrderAlreadyPaidIsNoMismatch() {
        var order = Self.order("coins_60")
        order.status = .delivered
        let result = plan(
            .init(
                transaction: Self.transaction("coins_300", token: order.appAccountToken), submittingAccount: "u42",
                orderByToken: order, catalog: Self.catalog))
        #expect(result.outcome == .delivered)
        #expect(result.accountId == order.accountId)
        #expect(result.grants == [.currency(code: "coins", amount: 300)])
        #expect(result.anomalies.isEmpty)
        #expect(result.order == nil)
    }

    @Test func unknownProductsAndOrphansBecomeAnomalies() {
        let unknown = plan(
            .init(transaction: Self.transaction("mystery"), submittingAccount: "u42", catalog: Self.catalog))
        #expect(unknown.outcome == .notDelivered)
        #expect(unknown.anomalies.map(\.kind) == [.unknownProduct])
        let orphan = plan(.init(transaction: Self.transaction(), submittingAccount: nil, catalog: Self.catalog))
        #expect(orphan.outcome == .unattributed)
        #expect(orphan.anomalies.map(\.kind) == [.unattributedTransaction])
        #expect(orphan.grants.isEmpty)
    }

    @Test func ownershipBindsToTheFirstAccount() {
        let first = plan(
            .init(transaction: Self.transaction("remove_ads"), submittingAccount: "alice", catalog: Self.catalog))
        #expect(first.binding == "alice")
        #expect(first.grants == [.entitlement(id: "no_ads", expiresAt: nil)])
        let conflict = plan(
            .init(
                transaction: Self.transaction("remove_ads", id: "2000000000000002", original: "2000000000000001"),
                submittingAccount: "bob", boundAccount: "alice", catalog: Self.catalog))
        #expect(conflict.refusal == .ownedByOtherAccount(owner: "alice"))
        #expect(conflict.anomalies.map(\.kind) == [.ownershipConflict])
        #expect(conflict.grants.isEmpty)
        let transfer = plan(
            .init(
                transaction: Self.transaction("remove_ads", id: "2000000000000002", original: "2000000000000001"),
                submittingAccount: "bob", boundAccount: "alice", catalog: Self.catalog, policy: .transfer))
        #expect(transfer.accountId == "bob")
        #expect(transfer.binding == "bob")
        // A renewal from Apple (no submitter) goes to the bound account.
        let renewal = plan(
            .init(
                transaction: Self.transaction(
                    "pro_monthly", id: "2000000000000009", original: "2000000000000001", expires: 1_769_904_000_000),
                submittingAccount: nil, boundAccount: "alice", catalog: Self.catalog))
        #expect(renewal.accountId == "alice")
        #expect(renewal.grants == [.entitlement(id: "pro", expiresAt: Date(timeIntervalSince1970: 1_769_904_000))])
        #expect(renewal.binding == nil)
    }

    @Test func nonRenewingAccessIsComputedAndExtended() {
        let fresh = plan(
            .init(transaction: Self.transaction("season_pass"), submittingAccount: "u42", catalog: Self.catalog))
        let purchased = Date(timeIntervalSince1970: 1_767_225_000)
        #expect(fresh.grants == [.entitlement(id: "season", expiresAt: purchased.addingTimeInterval(30 * 86_400))])
        let held = purchased.addingTimeInterval(10 * 86_400)
        let extended = plan(
            .init(
                transaction: Self.transaction("season_pass", id: "2000000000000003"), submittingAccount: "u42",
                boundAccount: "u42", currentEntitlementExpiry: held, catalog: Self.catalog))
        #expect(extended.grants == [.entitlement(id: "season", expiresAt: held.addingTimeInterval(30 * 86_400))])
    }
}

extension DeliveryPlannerTests {
    /// One environment policy for every store: a payment of an environment the deployment does
    /// not accept is refused (`wrong_environment`), whichever store it comes from.
    @Test(
        arguments: [
            (Store.appStore, "Sandbox", ["Production"], false), (Store.googlePlay, "Sandbox", ["Production"], false),
            (Store.stripe, "Sandbox", ["Production"], false), (Store.stripe, "Production", ["Production"], true),
            (Store.stripe, "Sandbox", ["Production", "Sandbox"], true), (Store.web, "Sandbox", nil, true),
        ] as [(Store, String, [String]?, Bool)])
    func paymentsOutsideTheAcceptedEnvironmentsAreRefused(
        store: Store, environment: String, accepted: [String]?, delivers: Bool
    ) {
        var transaction = Self.transaction()
        transaction.store = store
        transaction.environment = StoreEnvironment(rawValue: environment)
        var context = DeliveryPlanner.Context(transaction: transaction, submittingAccount: "u42", catalog: Self.catalog)
        context.store = store
        context.acceptedEnvironments = accepted.map(Set.init)
        let result = plan(context)
        if delivers {
            #expect(result.outcome == .delivered)
        } else {
            #expect(result.refusal == .wrongEnvironment(environment))
            #expect(result.grants.isEmpty && result.ledger.isEmpty && result.delivery == nil)
        }
    }
}
