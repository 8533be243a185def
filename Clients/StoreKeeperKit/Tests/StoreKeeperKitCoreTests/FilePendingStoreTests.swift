import Foundation
import XCTest

@testable import StoreKeeperKitCore

final class FilePendingStoreTests: XCTestCase {
    var directory: URL!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("skk-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(at: directory)
    }

    func sampleState() -> PendingState {
        var state = PendingState()
        state.intents = [
            PurchaseIntent(
                orderId: "o1", appAccountToken: UUID(uuidString: "5742E386-757E-4762-9349-D6ADAA160407")!,
                productId: "coins_60", quantity: 2, accountId: "u1",
                createdAt: Date(timeIntervalSince1970: 1_800_000_000.123), state: .paying, transactionId: nil)
        ]
        state.pending = [
            PendingSubmission(
                transaction: StoreTransaction(
                    id: "1", productId: "coins_60", purchaseDate: Date(timeIntervalSince1970: 1_800_000_001),
                    signedTransaction: "a.b.c"), reason: .purchase, accountId: "u1", orderId: "o1", attempts: 3,
                nextAttemptAt: Date(timeIntervalSince1970: 1_800_000_100), notBefore: nil, lastError: "network")
        ]
        state.customerInfo = ["u1": CustomerInfo(accountId: "u1", balances: ["coins": 120])]
        return state
    }

    func testRoundTripAndNothingLeftBehind() throws {
        let url = directory.appendingPathComponent("pending.json")
        let store = FilePendingStore(url: url)
        XCTAssertEqual(try store.load(), PendingState(), "no file: empty")
        let state = sampleState()
        try store.save(state)
        XCTAssertEqual(try FilePendingStore(url: url).load(), state)
        try store.save(PendingState())
        XCTAssertEqual(try store.load(), PendingState())
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: directory.path), ["pending.json"])
    }

    // A crash mid-write leaves a stray temporary file, never a torn state file.
    func testAStrayTemporaryFileDoesNotMatter() throws {
        let url = directory.appendingPathComponent("pending.json")
        let store = FilePendingStore(url: url)
        try store.save(sampleState())
        try Data("{\"version\":1,\"inte".utf8).write(to: directory.appendingPathComponent(".pending.json.x.tmp"))
        XCTAssertEqual(try store.load(), sampleState())
    }

    // An unreadable file is kept aside; the coordinator starts from StoreKit's own queue.
    func testUnreadableFileIsMovedAsideNotLost() throws {
        let url = directory.appendingPathComponent("pending.json")
        try Data("{not json".utf8).write(to: url)
        let store = FilePendingStore(url: url)
        XCTAssertEqual(try store.load(), PendingState())
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        XCTAssertTrue(names.contains { $0.hasPrefix("pending.json.unreadable-") }, "\(names)")
        try store.save(sampleState())
        XCTAssertEqual(try store.load(), sampleState())
    }

    func testUnwritableDirectoryIsAnError() throws {
        let blocker = directory.appendingPathComponent("file")
        try Data().write(to: blocker)
        let store = FilePendingStore(url: blocker.appendingPathComponent("pending.json"))
        XCTAssertThrowsError(try store.save(sampleState()))
    }

    // The coordinator on a file store: a purchase whose upload failed survives a rebuild.
    func testCoordinatorStateSurvivesARebuildFromTheFile() async throws {
        let url = directory.appendingPathComponent("pending.json")
        let queue = FakeQueue()
        let backend = FakeBackend()
        backend.script(.retryable(status: nil, code: "network", retryAfter: nil))
        let first = try PurchaseCoordinator(queue: queue, backend: backend, store: FilePendingStore(url: url))
        await first.configure()
        await first.login("u1")
        _ = try await first.purchase(productId: "coins_60")
        await first.shutdown()
        let onDisk = try FilePendingStore(url: url).load()
        XCTAssertEqual(onDisk.pending.count, 1)
        XCTAssertEqual(onDisk.intents.first?.orderId, backend.orders.first?.orderId)

        let second = try PurchaseCoordinator(queue: queue, backend: backend, store: FilePendingStore(url: url))
        await second.configure()
        XCTAssertEqual(backend.submissions.count, 2)
        XCTAssertEqual(backend.submissions.last?.orderId, backend.orders.first?.orderId)
        XCTAssertEqual(queue.finished.count, 1)
        XCTAssertEqual(try FilePendingStore(url: url).load().pending, [])
        await second.shutdown()
    }
}
