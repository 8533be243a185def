import Combine
import Foundation
import Network
import Security
import StoreKeeperKit
import StoreKit
import UIKit
import XCTest

@testable import StoreKeeperKitCore

/// The parts of StoreKeeperKit that need Apple's frameworks, built on Linux against shims that
/// declare those APIs with Apple's signatures: compiling is the first test (a renamed call or a
/// wrong type fails CI here). The Keychain store and the lifecycle triggers also run, against
/// an in-memory Keychain and hand-delivered notifications.
final class StoreKitAdapterTypeCheckTests: XCTestCase {
    func testAdaptersArePaymentQueues() {
        let kinds: [Any.Type] = [StoreKit2PaymentQueue.self, StoreKit1PaymentQueue.self]
        XCTAssertTrue(kinds.allSatisfy { $0 is PaymentQueue.Type })
        XCTAssertTrue((StoreKit1PaymentQueue.self as Any.Type) is SKPaymentTransactionObserver.Type)
        XCTAssertTrue((ReceiptRefresher.self as Any.Type) is SKRequestDelegate.Type)
    }

    /// Finding 9: `import StoreKeeperKit` alone names the coordinator, and building it cannot fail.
    func testImportStoreKeeperKitIsEnoughAndBuildingCannotThrow() {
        let make: (URL) -> PurchaseCoordinator = { server in
            PurchaseCoordinator.storeKit2(server: server, tokens: { _, _ in "token" })
        }
        XCTAssertNotNil(make as Any)
    }

    /// N14: a signing key that does not parse, or a server that is not https, is an error at
    /// configuration — never a build that silently stops checking answers.
    @MainActor
    func testTheOneCallSetupRefusesABadKeyOrAnInsecureServer() throws {
        let tokens: ClientTokenProvider = { _, _ in "token" }
        let https = URL(string: "https://iap.example.com")!
        XCTAssertThrowsError(
            try StoreKeeper.configure(server: https, appId: "ios", responseSigningKeys: ["not a key"], tokens: tokens)
        ) { XCTAssertTrue($0 is ResponseSigningKeyError, "\($0)") }
        XCTAssertThrowsError(
            try StoreKeeper.configure(
                server: URL(string: "http://iap.example.com")!, appId: "ios", tokens: tokens)
        ) { XCTAssertTrue($0 is StoreKeeperConfigurationCheck.Invalid, "\($0)") }
        XCTAssertNoThrow(try StoreKeeperConfigurationCheck.server(URL(string: "http://127.0.0.1:8080")!))
        XCTAssertNil(StoreKeeper.shared, "nothing configured by a refused call")
        // The SwiftUI model's shape: an ObservableObject whose reads are the core's.
        let model: (PurchaseCoordinator) -> StoreKeeperModel = { StoreKeeperModel(coordinator: $0) }
        XCTAssertNotNil(model as Any)
    }

    func testTheKeychainStoreKeepsOneItemPerRecordAfterFirstUnlock() throws {
        KeychainShim.reset()
        defer { KeychainShim.reset() }
        let store = KeychainPendingStore()
        XCTAssertEqual(try store.load(), [:])
        try store.write(["a": Data("1".utf8), "b": Data("2".utf8)], removing: [])
        try store.write(["a": Data("3".utf8)], removing: ["b"])
        XCTAssertEqual(try store.load(), ["a": Data("3".utf8)])
        XCTAssertEqual(KeychainShim.count, 1, "one item per record")
        XCTAssertEqual(KeychainShim.accessibility, [kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly])
        // Before the first unlock: an error, never an empty state.
        KeychainShim.locked = true
        XCTAssertThrowsError(try store.load())
        XCTAssertThrowsError(try store.write(["c": Data()], removing: []))
    }

    func testVersionOnesSingleItemIsHandedOverAndRemovedAfterMigration() throws {
        KeychainShim.reset()
        defer { KeychainShim.reset() }
        let legacy: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "StoreKeeperKit",
            kSecAttrAccount as String: "pending-state", kSecValueData as String: Data("{}".utf8),
        ]
        XCTAssertEqual(SecItemAdd(legacy as CFDictionary, nil), errSecSuccess)
        let store = KeychainPendingStore()
        XCTAssertEqual(try store.load(), [PendingRecords.legacyKey: Data("{}".utf8)])
        try store.write([:], removing: [PendingRecords.legacyKey])
        XCTAssertEqual(try store.load(), [:])
    }

    func testTheCoordinatorRunsOnTheKeychainStore() async throws {
        KeychainShim.reset()
        defer { KeychainShim.reset() }
        KeychainShim.locked = true
        let coordinator = PurchaseCoordinator(
            queue: NoQueue(), backend: NoBackend(), store: KeychainPendingStore(),
            configuration: .init(logger: SilentLogger()))
        await coordinator.configure()
        let lockedAtLaunch = await coordinator.isLoaded
        XCTAssertFalse(lockedAtLaunch)
        KeychainShim.locked = false
        await coordinator.redrive(.foreground)
        let loaded = await coordinator.isLoaded
        XCTAssertTrue(loaded)
        await coordinator.shutdown()
    }

    func testLifecycleTriggersReDriveOnForegroundAndNetwork() async throws {
        let backend = NoBackend()
        let store = MemoryRecords()
        var held = PendingState()
        held.pending = [
            PendingSubmission(
                transaction: StoreTransaction(
                    id: "1", productId: "p", purchaseDate: Date(), signedTransaction: "a.b.c"),
                reason: .purchase, accountId: "u1", orderId: nil, attempts: 3,
                nextAttemptAt: Date().addingTimeInterval(900), backoff: 900)
        ]
        try store.write(PendingRecords.changes(from: [:], to: PendingRecords.records(held)).write, removing: [])
        let coordinator = PurchaseCoordinator(
            queue: NoQueue(), backend: backend, store: store,
            configuration: .init(triggerDebounce: 0, logger: SilentLogger()))
        await coordinator.configure()
        try await Task.sleep(nanoseconds: 100_000_000)
        let atLaunch = backend.submissions.withValue { $0 }
        XCTAssertEqual(atLaunch, 1, "the launch re-drives it; it fails again (offline) and backs off")
        let triggers = LifecycleTriggers(coordinator: coordinator)
        NotificationCenter.default.post(name: UIApplication.willEnterForegroundNotification, object: nil)
        try await Task.sleep(nanoseconds: 100_000_000)
        XCTAssertEqual(backend.submissions.withValue { $0 }, 2, "foreground re-drives it")
        NWPathMonitor.simulate(NWPath(status: .unsatisfied))
        try await Task.sleep(nanoseconds: 100_000_000)
        XCTAssertEqual(backend.submissions.withValue { $0 }, 2, "no network: nothing")
        NWPathMonitor.simulate(NWPath(status: .satisfied))
        try await Task.sleep(nanoseconds: 100_000_000)
        XCTAssertEqual(backend.submissions.withValue { $0 }, 3, "the network is back: re-driven")
        withExtendedLifetime(triggers) {}
        await coordinator.shutdown()
    }
}

struct NoQueue: PaymentQueue {
    func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult { .cancelled }
    func finish(transactionId: String) async {}
    func unfinished() async -> [StoreTransaction] { [] }
    func restore() async throws -> [StoreTransaction] { [] }
    func updates() -> AsyncStream<PaymentUpdate> { AsyncStream { _ in } }
}

final class NoBackend: Backend, @unchecked Sendable {
    let submissions = Locked(0)
    func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder {
        throw BackendError.network("offline")
    }
    func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
        -> SubmissionVerdict
    {
        submissions.withValue { $0 += 1 }
        return .retryable(status: nil, code: "network", retryAfter: nil)
    }
    func setConsumptionDataConsent(accountId: String, granted: Bool) async throws {}
    func cancelOrder(accountId: String, orderId: String) async throws {}
    func customerInfo(accountId: String) async throws -> CustomerInfo { throw BackendError.network("offline") }
}

final class MemoryRecords: PendingStore, @unchecked Sendable {
    let records = Locked<[String: Data]>([:])
    func load() throws -> [String: Data] { records.withValue { $0 } }
    func write(_ changes: [String: Data], removing: [String]) throws {
        records.withValue { records in
            for (key, value) in changes { records[key] = value }
            for key in removing { records[key] = nil }
        }
    }
}
