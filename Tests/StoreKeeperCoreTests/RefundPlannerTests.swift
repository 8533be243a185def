import AppStoreModels
import Foundation
import StoreKeeperCatalog
import Testing

@testable import StoreKeeperCore

/// docs/architecture.md invariant 7: a refund takes back what it refunded, once — a table over
/// (product kind × full / prorated / family revoke × arrival order), applied to a simulated
/// store so each row checks the state after every event, not one plan alone.
@Suite struct RefundPlannerTests {
    /// What storage keeps of one delivery, evolved by the plans as NotificationApplier commits them.
    struct Stored {
        var kind: Product.Kind
        var credited: Int64?
        var balance: Int64
        var refunded = false
        var share: Int32 = 0
        var taken: Int64 = 0
        var hasEntitlement: Bool
        var orderStatus: Order.Status = .delivered
        var shortenedBy: Int32 = 0

        init(kind: Product.Kind, credited: Int64? = nil, balance: Int64? = nil) {
            self.kind = kind
            self.credited = credited
            self.balance = balance ?? credited ?? 0
            self.hasEntitlement = credited == nil
        }

        var context: RefundPlanner.Context {
            RefundPlanner.Context(
                delivery: .init(
                    transactionId: "t1", accountId: "a", orderId: "o", productId: "p", quantity: 1, refunded: refunded),
                refunded: refunded, credited: credited.map { .init(currency: "coins", amount: $0) }, balance: balance,
                entitlement: credited == nil ? "e" : nil, productType: kind, refundedShare: refunded ? share : 0,
                takenBack: taken)
        }

        mutating func apply(_ plan: RefundPlanner.Plan) {
            guard plan.skipped == nil else { return }
            for entry in plan.ledger { balance += entry.amount }
            if plan.removeEntitlement != nil { hasEntitlement = false }
            if let shortening = plan.shortenEntitlement { shortenedBy = shortening.share }
            if plan.reinstateEntitlement != nil {
                hasEntitlement = true
                shortenedBy = 0
            }
            if let refunded = plan.refunded { self.refunded = refunded }
            if let share = plan.refundedShare { self.share = share }
            if let taken = plan.takenBack { self.taken = taken }
            if let status = plan.orderStatus { orderStatus = status }
        }
    }

    enum Event: CustomStringConvertible {
        case full
        case prorated(Int32)
        case family, reversed

        var description: String {
            switch self {
            case .full: "full"
            case .prorated(let share): "prorated(\(share))"
            case .family: "family"
            case .reversed: "reversed"
            }
        }

        var revocation: RefundPlanner.Revocation {
            switch self {
            case .full: .init(type: .refundFull, percentage: nil)
            case .prorated(let share): .init(type: .refundProrated, percentage: share)
            case .family: .init(type: .familyRevoke, percentage: nil)
            case .reversed: .init(type: nil, percentage: nil)
            }
        }
    }

    struct Row: CustomStringConvertible, Sendable {
        var kind: Product.Kind
        var credited: Int64?
        var events: [Event]
        /// After the last event: the balance, the entitlement, the order's status.
        var balance: Int64
        var entitled: Bool
        var status: Order.Status
        var shortenedBy: Int32 = 0

        var description: String { "\(kind.rawValue) \(credited.map(String.init) ?? "-") \(events)" }
    }

    static let rows: [Row] = [
        // Consumables: 60 coins.
        Row(kind: .consumable, credited: 60, events: [.full], balance: 0, entitled: false, status: .refunded),
        Row(
            kind: .consumable, credited: 60, events: [.prorated(50_000)], balance: 30, entitled: false,
            status: .partiallyRefunded),
        // Retried (new UUIDs): once.
        Row(
            kind: .consumable, credited: 60, events: [.prorated(50_000), .prorated(50_000), .prorated(50_000)],
            balance: 30, entitled: false, status: .partiallyRefunded),
        // Rounded down: 33.333 % of 100 is 33, never 34.
        Row(
            kind: .consumable, credited: 100, events: [.prorated(33_333)], balance: 67, entitled: false,
            status: .partiallyRefunded),
        Row(
            kind: .consumable, credited: 1, events: [.prorated(99_999)], balance: 1, entitled: false,
            status: .partiallyRefunded),
        // A larger share later takes only the difference; a smaller one nothing.
        Row(
            kind: .consumable, credited: 60, events: [.prorated(25_000), .prorated(50_000)], balance: 30,
            entitled: false, status: .partiallyRefunded),
        Row(
            kind: .consumable, credited: 60, events: [.prorated(50_000), .prorated(25_000)], balance: 30,
            entitled: false, status: .partiallyRefunded),
        Row(
            kind: .consumable, credited: 60, events: [.prorated(50_000), .full], balance: 0, entitled: false,
            status: .refunded),
        Row(
            kind: .consumable, credited: 60, events: [.full, .prorated(50_000)], balance: 0, entitled: false,
            status: .refunded),
        // Reversal gives back exactly what was taken.
        Row(
            kind: .consumable, credited: 60, events: [.prorated(50_000), .reversed], balance: 60, entitled: false,
            status: .delivered),
        Row(
            kind: .consumable, credited: 60, events: [.prorated(25_000), .prorated(50_000), .reversed], balance: 60,
            entitled: false, status: .delivered),
        Row(
            kind: .consumable, credited: 60, events: [.full, .reversed, .reversed], balance: 60, entitled: false,
            status: .delivered),
        Row(kind: .consumable, credited: 60, events: [.reversed], balance: 60, entitled: false, status: .delivered),
        Row(
            kind: .consumable, credited: 60, events: [.full, .reversed, .prorated(50_000)], balance: 30,
            entitled: false, status: .partiallyRefunded),
        // An out-of-range percentage is clamped; prorated without a percentage is a full refund.
        Row(
            kind: .consumable, credited: 60, events: [.prorated(250_000)], balance: 0, entitled: false,
            status: .refunded),
        Row(
            kind: .consumable, credited: 60, events: [.prorated(-5)], balance: 60, entitled: false,
            status: .partiallyRefunded),
        // Non-consumables: indivisible, removed at ≥ 50 % (the default policy) or on a full refund / family revoke.
        Row(kind: .nonConsumable, events: [.prorated(30_000)], balance: 0, entitled: true, status: .partiallyRefunded),
        Row(kind: .nonConsumable, events: [.prorated(50_000)], balance: 0, entitled: false, status: .partiallyRefunded),
        Row(kind: .nonConsumable, events: [.prorated(30_000), .full], balance: 0, entitled: false, status: .refunded),
        Row(kind: .nonConsumable, events: [.family], balance: 0, entitled: false, status: .refunded),
        Row(kind: .nonConsumable, events: [.family, .reversed], balance: 0, entitled: true, status: .delivered),
        // Non-renewing: the window shortened by the share.
        Row(
            kind: .nonRenewing, events: [.prorated(40_000)], balance: 0, entitled: true, status: .partiallyRefunded,
            shortenedBy: 40_000),
        Row(
            kind: .nonRenewing, events: [.prorated(40_000), .reversed], balance: 0, entitled: true, status: .delivered),
        Row(kind: .nonRenewing, events: [.full], balance: 0, entitled: false, status: .refunded),
        // Auto-renewables: access follows the subscription's state (SubscriptionMachine), never the plan.
        Row(kind: .autoRenewable, events: [.prorated(40_000)], balance: 0, entitled: true, status: .partiallyRefunded),
        Row(kind: .autoRenewable, events: [.full], balance: 0, entitled: true, status: .refunded),
    ]

    @Test(arguments: rows)
    func aRefundTakesBackItsShareOnce(row: Row) {
        var stored = Stored(kind: row.kind, credited: row.credited)
        for (index, event) in row.events.enumerated() {
            let plan: RefundPlanner.Plan
            if case .reversed = event {
                plan = RefundPlanner.reversal(stored.context, transactionId: "t1", key: "n\(index)")
            } else {
                plan = RefundPlanner.refund(
                    stored.context, transactionId: "t1", key: "n\(index)", reason: "REFUND",
                    revocation: event.revocation)
            }
            // Never more than the refunded share: the balance never falls below what was credited less it.
            for entry in plan.ledger { #expect(entry.key.hasSuffix(":n\(index)")) }
            stored.apply(plan)
        }
        if row.credited != nil { #expect(stored.balance == row.balance, "\(row)") }
        if row.credited == nil { #expect(stored.hasEntitlement == row.entitled, "\(row)") }
        #expect(stored.orderStatus == row.status, "\(row)")
        #expect(stored.shortenedBy == row.shortenedBy, "\(row)")
    }

    @Test func aSpentCreditGoesNegativeByTheShareOnlyAndOpensAnAnomaly() {
        var stored = Stored(kind: .consumable, credited: 60, balance: 10)
        let plan = RefundPlanner.refund(
            stored.context, transactionId: "t1", key: "n", reason: "REFUND",
            revocation: .init(type: .refundProrated, percentage: 50_000))
        stored.apply(plan)
        #expect(stored.balance == -20)
        #expect(plan.anomalies.map(\.kind) == [.refundedAfterDelivery])
    }

    @Test func portionsRoundDownAndNeverOverflow() {
        #expect(RefundPlanner.portion(of: 60, share: 50_000) == 30)
        #expect(RefundPlanner.portion(of: 3, share: 33_333) == 0)
        #expect(RefundPlanner.portion(of: 3, share: 66_667) == 2)
        #expect(
            RefundPlanner.portion(of: .max, share: 99_999) == Int64.max / 100_000 * 99_999 + (Int64.max % 100_000)
                * 99_999 / 100_000)
        #expect(RefundPlanner.portion(of: .max, share: 100_000) == .max)
        #expect(RefundPlanner.portion(of: 0, share: 50_000) == 0)
        #expect(RefundPlanner.percent(33_333) == "33.333 %")
        #expect(RefundPlanner.percent(50_000) == "50 %")
    }

    @Test func aRefundOfATransactionNeverDeliveredIsRecordedWithItsShare() {
        let plan = RefundPlanner.refund(
            RefundPlanner.Context(
                delivery: nil, refunded: false, credited: nil, balance: 0, entitlement: nil, productType: .consumable),
            transactionId: "t", key: "n", reason: "REFUND", revocation: .init(type: .refundProrated, percentage: 10_000)
        )
        // A partial refund of what nobody holds yet: kept for the delivery path, which delivers
        // and takes back the share (never a marker that would deliver nothing at all).
        #expect(!plan.recordUndelivered)
        #expect(plan.refundedBeforeDelivery?.share == 10_000)
        #expect(plan.refundedShare == 10_000)
        let whole = RefundPlanner.refund(
            RefundPlanner.Context(
                delivery: nil, refunded: false, credited: nil, balance: 0, entitlement: nil, productType: .consumable),
            transactionId: "t", key: "n", reason: "REFUND", revocation: .init(type: .refundFull, percentage: nil))
        #expect(whole.recordUndelivered && whole.refundedBeforeDelivery?.isPartial == false)
        #expect(whole.orderStatus == .refunded)
    }

    @Test func theNonConsumablePolicyComesFromTheCatalog() throws {
        let catalog = try Catalog.parse(
            yaml: """
                products:
                  - { id: ads, type: non_consumable, grants: { entitlement: no_ads } }
                refunds:
                  revokeNonConsumableAt: 25
                """)
        #expect(catalog.refunds.revokeNonConsumableAtShare == 25_000)
        let context = RefundPlanner.Context(
            delivery: .init(transactionId: "t", accountId: "a", orderId: nil, productId: "ads", quantity: 1),
            refunded: false, credited: nil, balance: 0, entitlement: "no_ads", productType: .nonConsumable,
            revokeNonConsumableAt: catalog.refunds.revokeNonConsumableAtShare)
        let plan = RefundPlanner.refund(
            context, transactionId: "t", key: "n", reason: "REFUND",
            revocation: .init(type: .refundProrated, percentage: 30_000))
        #expect(plan.removeEntitlement == "no_ads")
        #expect(throws: CatalogError.self) {
            try Catalog.parse(
                yaml:
                    "products:\n  - { id: ads, type: non_consumable, grants: { entitlement: x } }\nrefunds: { revokeNonConsumableAt: 150 }"
            )
        }
    }
}
