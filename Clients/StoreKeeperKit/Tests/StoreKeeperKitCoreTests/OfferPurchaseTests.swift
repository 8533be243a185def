import Foundation
import XCTest

@testable import StoreKeeperKitCore

/// Offers through the coordinator: the order asks the server (with the device's Apple Account),
/// the server's signature and intro decision reach StoreKit, and a refusal pays nothing.
final class OfferPurchaseTests: XCTestCase {
    struct FixedAppTransaction: AppTransactionSource {
        func appTransactionId() async -> String? { "705000000000000123" }
    }

    func started(
        _ queue: FakeQueue, _ backend: FakeBackend, appTransactions: AppTransactionSource? = FixedAppTransaction()
    ) async throws -> PurchaseCoordinator {
        let coordinator = try PurchaseCoordinator(
            queue: queue, backend: backend, store: MemoryStore(), clock: ManualClock(),
            configuration: .init(retry: RetryPolicy(base: 10, cap: 100), random: { 1 }),
            appTransactions: appTransactions)
        await coordinator.configure()
        await coordinator.login("u1")
        return coordinator
    }

    func testAPromotionalOfferIsSignedForTheOrderAndPassedToStoreKit() async throws {
        let queue = FakeQueue()
        let backend = FakeBackend()
        let coordinator = try await started(queue, backend)
        let outcome = try await coordinator.purchase(productId: "pro_monthly", offer: "comeback")
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
        let request = try XCTUnwrap(backend.state.withValue { $0.orderRequests.first })
        XCTAssertEqual(request.offerId, "comeback")
        XCTAssertEqual(request.appTransactionId, "705000000000000123")
        let options = try XCTUnwrap(queue.state.withValue { $0.options.first })
        XCTAssertEqual(options.promotionalOffer?.id, "comeback")
        XCTAssertEqual(queue.payments.map(\.token), backend.orders.map(\.appAccountToken))
        XCTAssertNotNil(options.promotionalOffer?.signatureBytes, "V1's signature decodes to bytes")
    }

    /// The Apple Account id read at launch reaches every order once read: the 2 s bound's timer,
    /// cancelled when the id arrives, never answers for it (a cancelled sleep used to fall through
    /// and race the answer with nil — CI saw an order go without the id).
    func testTheAppTransactionIdIsNeverLostToItsCancelledTimer() async throws {
        let coordinator = try await started(FakeQueue(), FakeBackend())
        // Many at once, so the two tasks of each call run on different threads in either order.
        let lost = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var lost = 0
                    for _ in 0..<250 where await coordinator.knownAppTransactionId() != "705000000000000123" {
                        lost += 1
                    }
                    return lost
                }
            }
            return await group.reduce(0, +)
        }
        XCTAssertEqual(lost, 0)
    }

    func testTheServersIntroDecisionRidesOnEverySubscriptionOrder() async throws {
        let queue = FakeQueue()
        let backend = FakeBackend()
        backend.state.withValue { $0.introductory = IntroductoryOfferEligibility(allowed: false, jws: "intro.jws.sig") }
        let coordinator = try await started(queue, backend)
        _ = try await coordinator.purchase(productId: "pro_monthly")
        XCTAssertEqual(queue.state.withValue { $0.options.first?.introductoryOfferEligibilityJWS }, "intro.jws.sig")
        XCTAssertNil(queue.state.withValue { $0.options.first?.promotionalOffer })
    }

    func testWinBackOffersNeedNoSignature() async throws {
        let queue = FakeQueue()
        let backend = FakeBackend()
        let coordinator = try await started(queue, backend, appTransactions: nil)
        _ = try await coordinator.purchase(productId: "pro_monthly", winBackOffer: "winback_1")
        XCTAssertEqual(queue.state.withValue { $0.options.first?.winBackOfferId }, "winback_1")
        let request = try XCTUnwrap(backend.state.withValue { $0.orderRequests.first })
        XCTAssertNil(request.offerId)
        XCTAssertNil(request.appTransactionId)
        // The order names the win-back offer, for the server's per-account policy.
        XCTAssertEqual(backend.state.withValue { $0.winBackRequests }, ["winback_1"])
        _ = try await coordinator.purchase(productId: "pro_monthly")
        XCTAssertEqual(backend.state.withValue { $0.winBackRequests }, ["winback_1", nil])
    }

    func testARefusedOfferPaysNothing() async throws {
        let queue = FakeQueue()
        let backend = FakeBackend()
        backend.state.withValue {
            $0.orderFailure = .server(
                status: 403, code: "offer_not_eligible", message: "refused by rule eligible: lapsed", retryable: false)
        }
        let coordinator = try await started(queue, backend)
        do {
            _ = try await coordinator.purchase(productId: "pro_monthly", offer: "comeback")
            XCTFail("expected the server's refusal")
        } catch PurchaseError.order(.server(let status, let code, _, _)) {
            XCTAssertEqual(status, 403)
            XCTAssertEqual(code, "offer_not_eligible")
        }
        XCTAssertTrue(queue.payments.isEmpty)
    }

    func testAQueueWithoutOfferSupportRefusesBeforePaying() async throws {
        let queue = FakeQueue()
        queue.state.withValue { $0.offersUnsupported = true }
        let backend = FakeBackend()
        let coordinator = try await started(queue, backend)
        do {
            _ = try await coordinator.purchase(productId: "pro_monthly", offer: "comeback")
            XCTFail("expected a refusal")
        } catch PurchaseError.storeKit {
        }
        XCTAssertTrue(queue.payments.isEmpty)
        // A plain purchase still goes through such a queue.
        let outcome = try await coordinator.purchase(productId: "coins_60")
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
    }
}
