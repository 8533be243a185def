import Foundation
import Observation
import XCTest

@testable import StoreKeeperKitCore

/// The SwiftUI-facing models: synchronous reads on the main actor, one stream, never another
/// account's view.
@MainActor
final class AccountViewModelTests: XCTestCase {
    func testTheObservableModelFollowsTheLoggedInAccountAndNothingElse() async throws {
        let queue = FakeQueue()
        let backend = FakeBackend()
        backend.state.withValue {
            $0.accounts["alice"] = CustomerInfo(
                accountId: "alice",
                entitlements: [.init(id: "pro", active: true, productId: "pro_monthly", expiresAt: nil)],
                balances: ["coins": 60])
        }
        let coordinator = PurchaseCoordinator(
            queue: queue, backend: backend, store: MemoryStore(), clock: ManualClock(),
            configuration: .init(logger: PrintLogger(minimum: .error)))
        await coordinator.configure()
        let store = StoreKeeperObservable(coordinator: coordinator)
        XCTAssertNil(store.accountId)
        XCTAssertFalse(store.isEntitled("pro"))

        let changed = Locked(0)
        func track() {
            withObservationTracking {
                _ = store.view
            } onChange: {
                changed.withValue { $0 += 1 }
            }
        }
        track()
        await store.login("alice")
        await eventuallyOnMain { store.accountId == "alice" }
        XCTAssertGreaterThanOrEqual(changed.withValue { $0 }, 1, "a body reading it re-renders")
        await store.refresh()
        await eventuallyOnMain { store.isEntitled("pro") }
        XCTAssertEqual(store.balance("coins"), 60)
        XCTAssertEqual(store.activeEntitlements.map(\.id), ["pro"])

        // A purchase: the held count, then the delivered view.
        let outcome = try await store.purchase("coins_60")
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
        await eventuallyOnMain { store.balance("coins") == 1 && store.pendingPurchases == 0 }

        // Another account: nothing of alice's shows, at once.
        await store.login("bob")
        await eventuallyOnMain { store.accountId == "bob" }
        // Bob's own view only (login fetches it), never alice's.
        XCTAssertTrue(store.customerInfo == nil || store.customerInfo?.accountId == "bob")
        XCTAssertFalse(store.isEntitled("pro"))
        XCTAssertEqual(store.balance("coins"), 0)
        await store.logout()
        await eventuallyOnMain { store.accountId == nil }
        await coordinator.shutdown()
    }

    func eventuallyOnMain(
        _ condition: @MainActor () -> Bool, file: StaticString = #filePath, line: UInt = #line
    ) async {
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if condition() { return }
            try? await Task.sleep(nanoseconds: 2_000_000)
        }
        XCTAssertTrue(condition(), "condition not met", file: file, line: line)
    }
}
