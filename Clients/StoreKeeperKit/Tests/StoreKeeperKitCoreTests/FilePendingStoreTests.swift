import Foundation
import XCTest

@testable import StoreKeeperKitCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

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

    func records(_ state: PendingState) throws -> [String: Data] {
        try PendingRecords.changes(from: [:], to: PendingRecords.records(state)).write
    }

    func testRoundTripAndNothingLeftBehind() throws {
        let url = directory.appendingPathComponent("pending.journal")
        let store = FilePendingStore(url: url)
        XCTAssertEqual(try store.load(), [:], "no file: empty")
        let state = sampleState()
        try store.write(try records(state), removing: [])
        XCTAssertEqual(PendingRecords.decode(try FilePendingStore(url: url).load()).state, state)
        try store.write([:], removing: Array(try records(state).keys))
        XCTAssertEqual(try FilePendingStore(url: url).load(), [:])
        // No temporary file left behind; the lock file stays (it is how writers share the journal).
        XCTAssertEqual(
            try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted(),
            ["pending.journal", "pending.journal.lock"])
    }

    // Finding 8: one update appends one short line, whatever the history holds; the journal is
    // compacted once it is four times what it holds.
    func testOneUpdateWritesOneRecordNotTheHistory() throws {
        let url = directory.appendingPathComponent("pending.journal")
        let store = FilePendingStore(url: url, synchronous: false)
        var history: [String: Data] = [:]
        for index in 0..<2_000 {
            history["settled:\(index)"] = Data(
                #"{"v":2,"value":{"key":"\#(index)","verdict":"delivered","at":1}}"#.utf8)
        }
        try store.write(history, removing: [])
        let before = try Data(contentsOf: url).count
        XCTAssertGreaterThan(before, 100_000)
        try store.write(["pending:9": Data(#"{"v":2}"#.utf8)], removing: [])
        let after = try Data(contentsOf: url).count
        XCTAssertLessThan(after - before, 200, "one record appended, not the document rewritten")
        for round in 0..<400 { try store.write(["pending:9": Data("{\"v\":2,\"n\":\(round)}".utf8)], removing: []) }
        XCTAssertLessThan(try Data(contentsOf: url).count, 5 * before, "compacted")
        XCTAssertEqual(try FilePendingStore(url: url).load().count, 2_001)
    }

    // A crash mid-append leaves a torn last line: ignored (that write never returned); the
    // next write rewrites the journal whole.
    func testATornLastLineIsIgnored() throws {
        let url = directory.appendingPathComponent("pending.journal")
        try FilePendingStore(url: url).write(try records(sampleState()), removing: [])
        let handle = try FileHandle(forWritingTo: url)
        handle.seekToEndOfFile()
        handle.write(Data(#"{"w":{"pending:2":"eyJ2Ij"#.utf8))
        handle.closeFile()
        let store = FilePendingStore(url: url)
        XCTAssertEqual(PendingRecords.decode(try store.load()).state, sampleState())
        try store.write(["x": Data("{}".utf8)], removing: [])
        XCTAssertEqual(try FilePendingStore(url: url).load().count, try records(sampleState()).count + 1)
    }

    // Finding 10: a damaged line in the middle is copied aside, never lost; the rest loads.
    func testADamagedLineIsKeptAside() throws {
        let url = directory.appendingPathComponent("pending.journal")
        let store = FilePendingStore(url: url)
        try store.write(["a": Data("1".utf8)], removing: [])
        try store.write(["b": Data("2".utf8)], removing: [])
        var text = try String(contentsOf: url, encoding: .utf8)
        text = text.replacingOccurrences(of: #"{"w":{"a""#, with: #"{"w":{"a"#)
        try Data(text.utf8).write(to: url)
        XCTAssertEqual(try FilePendingStore(url: url).load(), ["b": Data("2".utf8)])
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        XCTAssertTrue(names.contains { $0.hasPrefix("pending.journal.damaged-") }, "\(names)")
    }

    // Version 1's single document is handed over as `legacy` and migrated by the coordinator.
    func testVersionOneDocumentIsMigrated() async throws {
        let url = directory.appendingPathComponent("pending.json")
        let legacy = """
            {"version":1,"intents":[],"pending":[{"transaction":{"id":"77","productId":"coins_60","quantity":1,\
            "purchaseDate":1800000000000,"signedTransaction":"jws-77"},"reason":"purchase","accountId":"u1",\
            "attempts":2,"nextAttemptAt":1800000000000}],"settled":[{"key":"5","accountId":"u1","verdict":"delivered",\
            "at":1800000000000}],"customerInfo":{}}
            """
        try Data(legacy.utf8).write(to: url)
        let queue = FakeQueue()
        let backend = FakeBackend()
        let coordinator = PurchaseCoordinator(queue: queue, backend: backend, store: FilePendingStore(url: url))
        await coordinator.configure()
        await coordinator.login("u1")
        await assertEventually { queue.finished == ["77"] }
        let records = try FilePendingStore(url: url).load()
        XCTAssertNil(records[PendingRecords.legacyKey])
        XCTAssertNotNil(records["settled:5"])
        XCTAssertTrue(try String(contentsOf: url, encoding: .utf8).hasPrefix("storekeeper-journal 2"))
        await coordinator.shutdown()
    }

    func testUnwritableDirectoryIsAnError() throws {
        let blocker = directory.appendingPathComponent("file")
        try Data().write(to: blocker)
        let store = FilePendingStore(url: blocker.appendingPathComponent("pending.journal"))
        XCTAssertThrowsError(try store.write(try records(sampleState()), removing: []))
    }

    // The coordinator on a file store: a purchase whose upload failed survives a rebuild.
    func testCoordinatorStateSurvivesARebuildFromTheFile() async throws {
        let url = directory.appendingPathComponent("pending.journal")
        let queue = FakeQueue()
        let backend = FakeBackend()
        backend.script(.retryable(status: nil, code: "network", retryAfter: nil))
        let first = PurchaseCoordinator(queue: queue, backend: backend, store: FilePendingStore(url: url))
        await first.configure()
        await first.login("u1")
        _ = try await first.purchase(productId: "coins_60")
        await first.shutdown()
        let onDisk = PendingRecords.decode(try FilePendingStore(url: url).load()).state
        XCTAssertEqual(onDisk.pending.count, 1)
        XCTAssertEqual(onDisk.intents.first?.orderId, backend.orders.first?.orderId)

        let second = PurchaseCoordinator(queue: queue, backend: backend, store: FilePendingStore(url: url))
        await second.configure()
        await assertEventually { backend.submissions.count == 2 && queue.finished.count == 1 }
        XCTAssertEqual(backend.submissions.last?.orderId, backend.orders.first?.orderId)
        await assertEventually {
            PendingRecords.decode((try? FilePendingStore(url: url).load()) ?? [:]).state.pending.isEmpty
        }
        await second.shutdown()
    }

    // MARK: N6: a write that failed part way never swallows the next one

    func testAWriteAfterAPartlyFailedAppendSurvivesAReload() throws {
        let url = directory.appendingPathComponent("journal")
        let store = FilePendingStore(url: url)
        try store.write(["a": Data("1".utf8)], removing: [])
        store.failNextAppendAfter = 5
        XCTAssertThrowsError(try store.write(["b": Data("2".utf8)], removing: []))
        try store.write(["c": Data("3".utf8)], removing: [])
        let reloaded = try FilePendingStore(url: url).load()
        XCTAssertEqual(reloaded, ["a": Data("1".utf8), "c": Data("3".utf8)])
    }

    // MARK: N7: two stores (an app and its extension) on one journal keep each other's records

    func testTwoStoresOnOneJournalNeverDropEachOthersRecords() throws {
        let url = directory.appendingPathComponent("journal")
        let app = FilePendingStore(url: url)
        let ext = FilePendingStore(url: url)
        try app.write(["app": Data("1".utf8)], removing: [])
        XCTAssertEqual(try ext.load(), ["app": Data("1".utf8)])
        try ext.write(["extension": Data("2".utf8)], removing: [])
        // The app's journal grows until it compacts: what the extension wrote stays.
        let big = Data(repeating: 0x41, count: 40_000)
        for _ in 0..<4 {
            try app.write(["scratch": big], removing: [])
            try app.write([:], removing: ["scratch"])
        }
        let reloaded = try FilePendingStore(url: url).load()
        XCTAssertEqual(reloaded, ["app": Data("1".utf8), "extension": Data("2".utf8)])
        XCTAssertEqual(try app.load(), reloaded)
        XCTAssertEqual(try ext.load(), reloaded)
        // Concurrent writers in one process: every record lands.
        DispatchQueue.concurrentPerform(iterations: 40) { index in
            let store = index.isMultiple(of: 2) ? app : ext
            try? store.write(["k\(index)": Data("\(index)".utf8)], removing: [])
        }
        XCTAssertEqual(try FilePendingStore(url: url).load().count, 42)
    }

    /// A writer that never lets go of the lock makes a write fail within its deadline, never hang.
    func testALockHeldForGoodFailsTheWriteInsteadOfHanging() throws {
        let url = directory.appendingPathComponent("journal")
        let store = FilePendingStore(url: url)
        try store.write(["a": Data("1".utf8)], removing: [])
        let fd = open(url.path + ".lock", O_RDWR)
        XCTAssertGreaterThanOrEqual(fd, 0)
        XCTAssertEqual(flock(fd, LOCK_EX), 0)
        defer {
            flock(fd, LOCK_UN)
            close(fd)
        }
        let other = FilePendingStore(url: url)
        XCTAssertThrowsError(try other.write(["b": Data("2".utf8)], removing: []))
    }
}
