import Foundation
import XCTest

@testable import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(CryptoKit)
    import CryptoKit
#else
    import Crypto
#endif

/// The review of StoreKeeperKit (issue 32): one test per finding, each failing on the code the
/// review read, in the seeds' own scenarios.
final class DeviceReviewTests: XCTestCase {
    var queue: FakeQueue!
    var backend: FakeBackend!
    var store: MemoryStore!
    var clock: ManualClock!
    var lines: Locked<[String]>!

    override func setUp() {
        queue = FakeQueue()
        backend = FakeBackend()
        store = MemoryStore()
        clock = ManualClock()
        lines = Locked([])
    }

    struct Collecting: StoreKeeperLogger {
        let lines: Locked<[String]>
        func log(_ level: LogLevel, _ message: String) { lines.withValue { $0.append("\(level) \(message)") } }
    }

    func make(
        purchaseTimeout: TimeInterval = 30, proofs: ProofSource = TransactionProofSource(),
        appTransactions: AppTransactionSource? = nil, installation: InstallationMarker? = nil,
        backend customBackend: Backend? = nil
    ) -> PurchaseCoordinator {
        PurchaseCoordinator(
            queue: queue, backend: customBackend ?? backend, store: store, proofs: proofs, clock: clock,
            configuration: .init(
                retry: RetryPolicy(base: 10, cap: 100), purchaseTimeout: purchaseTimeout, installation: installation,
                logger: Collecting(lines: lines), random: { 1 }),
            appTransactions: appTransactions)
    }

    func started(_ account: String? = "u1", _ coordinator: PurchaseCoordinator? = nil) async -> PurchaseCoordinator {
        let coordinator = coordinator ?? make()
        await coordinator.configure()
        if let account { await coordinator.login(account) }
        await coordinator.idle()
        return coordinator
    }

    // MARK: Finding 2: StoreKit 1 purchases always return; callbacks resolve the right intent.

    func testAStoreKit1PurchaseWithNoCallbackReturnsPendingAndReleasesTheAccount() async throws {
        let coordinator = await started("u1", make(purchaseTimeout: 60))
        queue.answer(.enqueued)
        let call = Task { try await coordinator.purchase(productId: "coins_60") }
        let queue = self.queue!
        await assertEventually { queue.payments.count == 1 }
        clock.advance(61)
        let outcome = try await call.value
        XCTAssertEqual(outcome, .waitingForStore, "bounded: the call returns")
        // The account is not locked: the next purchase goes through.
        let next = try await coordinator.purchase(productId: "coins_60")
        guard case .delivered = next else { return XCTFail("\(next)") }
        await coordinator.shutdown()
    }

    func testATokenlessCallbackResolvesTheNewestPaymentNotAnOlderAskToBuy() async throws {
        let coordinator = await started()
        queue.answer(.deferred)
        let asked = try await coordinator.purchase(productId: "pro")
        XCTAssertEqual(asked, .deferred)
        queue.answer(.enqueued)
        let call = Task { try await coordinator.purchase(productId: "pro") }
        let queue = self.queue!
        await assertEventually { queue.payments.count == 2 }
        queue.send(.failed(productId: "pro", transactionId: "f1", cancelled: true))
        let outcome = try await call.value
        XCTAssertEqual(outcome, .cancelled)
        let intents = await coordinator.intents
        XCTAssertEqual(intents.map(\.state), [.deferred], "the Ask to Buy stays open; the cancelled one closed")
        XCTAssertEqual(intents.first?.orderId, backend.orders.first?.orderId)
        await assertEventually { self.backend.state.withValue { $0.cancelled } == [self.backend.orders[1].orderId] }
        await coordinator.shutdown()
    }

    func testACancelNeverClosesAnIntentAKilledProcessLeft() async throws {
        let first = await started()
        queue.answer(.enqueued)
        let abandoned = Task { try await first.purchase(productId: "coins_60") }
        let queue = self.queue!
        await assertEventually { queue.payments.count == 1 }
        await first.shutdown()
        _ = try await abandoned.value

        let second = await started()
        queue.answer(.enqueued)
        let call = Task { try await second.purchase(productId: "coins_60") }
        await assertEventually { queue.payments.count == 2 }
        queue.send(.failed(productId: "coins_60", transactionId: nil, cancelled: true))
        let outcome = try await call.value
        XCTAssertEqual(outcome, .cancelled, "this run's payment is the one cancelled")
        let intents = await second.intents
        XCTAssertEqual(intents.map(\.orderId), [backend.orders[0].orderId], "the killed run's intent is untouched")
        XCTAssertEqual(intents.first?.state, .created, "re-checked at launch: no longer `paying`")
        await second.shutdown()
    }

    func testAnOldTransactionHandedBackIsNotChargedAndClosesItsIntent() async throws {
        let coordinator = await started()
        _ = try await coordinator.purchase(productId: "coins_60")
        let old = try XCTUnwrap(queue.finished.first)
        queue.answer(.enqueued)
        let call = Task { try await coordinator.purchase(productId: "coins_60") }
        let queue = self.queue!
        await assertEventually { queue.payments.count == 2 }
        queue.send(.transaction(queue.storeKit1(productId: "coins_60", token: nil, id: old)))
        let outcome = try await call.value
        XCTAssertEqual(outcome, .notCharged(transactionId: old))
        let intents = await coordinator.intents
        XCTAssertEqual(intents, [], "its intent is closed")
        await assertEventually { self.backend.state.withValue { $0.cancelled } == [self.backend.orders[1].orderId] }
        XCTAssertEqual(backend.submissions.count, 1, "the old one is not submitted again")
        // And the account is free.
        _ = try await coordinator.purchase(productId: "coins_60")
        await coordinator.shutdown()
    }

    // MARK: Finding 4: finish only on an answer naming the transaction; receipts refreshed.

    func testAReceiptThatDoesNotHoldThePurchaseIsRefreshedNeverFinishedUnseen() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skk-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let receipt = directory.appendingPathComponent("receipt")
        try Data("old receipt".utf8).write(to: receipt)
        let refreshes = Locked(0)
        let proofs = AppReceiptProofSource(
            receiptURL: { receipt },
            refreshReceipt: {
                refreshes.withValue { $0 += 1 }
                try Data("new receipt".utf8).write(to: receipt)
            })
        let coordinator = await started("u1", make(proofs: proofs))
        // The server answers the stale receipt with what it holds: nothing about this purchase.
        backend.script(
            .accepted(PurchaseResponse(status: "already_delivered", transactions: [], account: nil)))
        queue.answer(.purchased(StoreTransaction(id: "7001", productId: "coins_60", purchaseDate: clock.now())))
        let outcome = try await coordinator.purchase(productId: "coins_60")
        XCTAssertEqual(outcome, .processing)
        XCTAssertEqual(queue.finished, [], "not finished on an answer that does not name it")
        XCTAssertEqual(backend.submissions.first?.transactionId, "7001", "the request names the transaction")
        XCTAssertEqual(backend.submissions.first?.proof, .receipt(Data("old receipt".utf8).base64EncodedString()))
        backend.script(FakeBackend.delivered("7001"))
        clock.advance(11)
        let queue = self.queue!
        await assertEventually { queue.finished == ["7001"] }
        XCTAssertEqual(refreshes.withValue { $0 }, 1)
        XCTAssertEqual(backend.submissions.last?.proof, .receipt(Data("new receipt".utf8).base64EncodedString()))
        await coordinator.shutdown()
    }

    func testNoReceiptIsRefreshedBeforeFallingBackToTheId() async throws {
        let refreshed = Locked(false)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skk-\(UUID().uuidString)")
        let receipt = directory.appendingPathComponent("receipt")
        let proofs = AppReceiptProofSource(
            receiptURL: { receipt },
            refreshReceipt: {
                refreshed.withValue { $0 = true }
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                try Data("fetched".utf8).write(to: receipt)
            })
        defer { try? FileManager.default.removeItem(at: directory) }
        let proof = try await proofs.proof(
            for: StoreTransaction(id: "1", productId: "p", purchaseDate: Date()), refresh: false)
        XCTAssertTrue(refreshed.withValue { $0 })
        XCTAssertEqual(proof, .receipt(Data("fetched".utf8).base64EncodedString()))
    }

    func testTheServersTransactionNotInProofHoldsAndRefreshes() async {
        struct Canned: HTTPTransport {
            func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
                let body = #"{"error":{"code":"transaction_not_in_proof","message":"refresh","retryable":true}}"#
                return (
                    Data(body.utf8),
                    HTTPURLResponse(url: request.url!, statusCode: 422, httpVersion: nil, headerFields: nil)!
                )
            }
        }
        let http = HTTPBackend(
            baseURL: URL(string: "https://example.invalid")!, transport: Canned(), tokens: { _, _ in "t" })
        let verdict = await http.submitPurchase(accountId: "a", orderId: nil, proof: .receipt("r"), transactionId: "5")
        XCTAssertEqual(verdict, .retryable(status: 422, code: "transaction_not_in_proof", retryAfter: nil))
    }

    // MARK: N8: orders and purchases carry the app's id

    func testOrdersAndPurchasesCarryTheConfiguredAppId() async throws {
        final class Recorder: HTTPTransport, @unchecked Sendable {
            let bodies = Locked<[String: String]>([:])
            func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
                let path = request.url!.path
                let body = (try? JSONSerialization.jsonObject(with: request.httpBody ?? Data())) as? [String: Any]
                bodies.withValue { $0[path] = (body?["appId"] as? String) ?? "-" }
                let answer =
                    path.hasSuffix("/orders")
                    ? #"{"orderId":"o1","appAccountToken":"6a9c5b1e-0f1d-4c7e-9f57-1b2c3d4e5f60","status":"created","productId":"coins_60","quantity":1,"accountId":"a"}"#
                    : #"{"status":"delivered","transactions":[],"account":{"accountId":"a","balances":{},"entitlements":[],"subscriptions":[]}}"#
                return (
                    Data(answer.utf8),
                    HTTPURLResponse(
                        url: request.url!, statusCode: path.hasSuffix("/orders") ? 201 : 200, httpVersion: nil,
                        headerFields: ["Content-Type": "application/json"])!
                )
            }
        }
        let recorder = Recorder()
        let http = HTTPBackend(
            baseURL: URL(string: "https://example.invalid")!, appId: "ios", transport: recorder,
            tokens: { _, _ in "t" })
        _ = try? await http.createOrder(accountId: "a", productId: "coins_60", quantity: 1)
        _ = await http.submitPurchase(
            accountId: "a", orderId: nil, proof: .signedTransaction("x.y.z"), transactionId: nil)
        let appIds = recorder.bodies.withValue { $0 }
        XCTAssertEqual(appIds["/v1/orders"], "ios")
        XCTAssertEqual(appIds["/v1/purchases"], "ios")
    }

    // MARK: Finding 5: a clock set back never holds a paid order past its delay.

    func testAClockSetBackADayStillSendsTheProofWithinItsDelay() async throws {
        backend.script(.retryable(status: 503, code: "storage_unavailable", retryAfter: 60))
        let coordinator = await started()
        _ = try await coordinator.purchase(productId: "coins_60")
        XCTAssertEqual(backend.submissions.count, 1)
        // The user sets the date back a day; a minute of real time passes.
        clock.jump(-86_400)
        clock.advance(61)
        let backend = self.backend!
        await assertEventually { backend.submissions.count == 2 }
        let queue = self.queue!
        await assertEventually { queue.finished.count == 1 }
        await coordinator.shutdown()
    }

    func testStoredAbsoluteTimesAreClampedAtLaunch() async throws {
        backend.script(.retryable(status: 503, code: "busy", retryAfter: 600))
        let first = await started()
        _ = try await first.purchase(productId: "coins_60")
        await first.shutdown()
        clock.jump(-86_400)
        let second = await started()
        let held = await second.pendingSubmissions
        let notBefore = try XCTUnwrap(held.first?.notBefore)
        XCTAssertLessThanOrEqual(notBefore.timeIntervalSince(clock.now()), 600, "never a day past its Retry-After")
        await second.shutdown()
    }

    // MARK: Finding 6: heuristics never cross accounts; intents expire with their order.

    func testATokenlessPurchaseIsNeverCreditedToAnotherAccountsOpenIntent() async throws {
        let coordinator = await started("alice")
        queue.answer(.deferred)
        _ = try await coordinator.purchase(productId: "pro")
        await coordinator.logout()
        await coordinator.login("bob")
        // An offer code redeemed on the App Store while Alice's Ask to Buy is open.
        queue.send(
            .transaction(
                queue.storeKit1(productId: "pro", token: nil, id: "8001", date: clock.now().addingTimeInterval(5))))
        let backend = self.backend!
        await assertEventually { backend.submissions.count == 1 }
        XCTAssertEqual(backend.submissions.first?.accountId, "bob")
        XCTAssertNil(backend.submissions.first?.orderId, "never Alice's order: no product_mismatch, no crossing")
        await coordinator.shutdown()
    }

    /// Seed 10009701283273454782 of the two-app simulation: an offer code (no token) redeemed
    /// while Alice's Ask to Buy waited was taken as that Ask to Buy's payment (same account,
    /// product and quantity); once it settled the intent was pruned, and when the parent
    /// approved — Bob logged in by then — the approval's token named no intent and went to Bob.
    func testAnAskToBuyApprovedAfterAnOfferCodeWasTakenForItStillFindsItsAccount() async throws {
        let coordinator = await started("alice")
        queue.answer(.deferred)
        _ = try await coordinator.purchase(productId: "coins_60")
        let deferred = await coordinator.intents
        let token = try XCTUnwrap(deferred.first?.appAccountToken)
        queue.send(.transaction(queue.storeKit1(productId: "coins_60", token: nil, id: "8301", date: clock.now())))
        let backend = self.backend!
        await assertEventually { backend.submissions.count == 1 }
        await assertEventually { await coordinator.pendingSubmissions.isEmpty }
        XCTAssertEqual(backend.submissions.first?.accountId, "alice")
        XCTAssertEqual(backend.submissions.first?.orderId, backend.orders.first?.orderId, "the guess: her open order")
        let kept = await coordinator.intents
        XCTAssertEqual(kept.map(\.boundByGuess), [true], "kept after its guessed payment settled")
        await coordinator.logout()
        await coordinator.login("bob")
        queue.send(
            .transaction(
                queue.storeKit1(
                    productId: "coins_60", token: token, id: "8302", date: clock.now().addingTimeInterval(60))))
        await assertEventually { backend.submissions.count == 2 }
        let approval = backend.submissions.first { $0.proof == .transactionId("8302") }
        XCTAssertEqual(approval?.accountId, "alice", "the approval's token names Alice's intent")
        XCTAssertNil(approval?.orderId, "her order was already named by the offer code's submission")
        await coordinator.shutdown()
    }

    /// A StoreKit 2 transaction of the app's own payment always carries its token (signed into
    /// it): one without is an offer code or old history, never bound to an intent.
    func testAStoreKit2TransactionWithoutTokenIsNeverAnIntentsPayment() async throws {
        let coordinator = await started()
        queue.answer(.enqueued)
        let call = Task { try await coordinator.purchase(productId: "coins_60") }
        let queue = self.queue!
        await assertEventually { queue.payments.count == 1 }
        queue.send(.transaction(queue.transaction(productId: "coins_60", token: nil, id: "8201", date: clock.now())))
        let backend = self.backend!
        await assertEventually { backend.submissions.count == 1 }
        XCTAssertNil(backend.submissions.first?.orderId)
        let intents = await coordinator.intents
        XCTAssertEqual(intents.first?.state, .paying, "the payment in flight is still waiting for its own")
        call.cancel()
        await coordinator.shutdown()
    }

    func testQuantityAndTheOrdersEndMustMatch() async throws {
        backend.state.withValue { $0.expiresIn = 3_600 }
        let coordinator = await started()
        queue.answer(.deferred)
        _ = try await coordinator.purchase(productId: "coins_60", quantity: 2)
        let intents = await coordinator.intents
        XCTAssertEqual(intents.first?.expiresAt, Date(timeIntervalSince1970: 1_800_003_600), "from the order")
        queue.send(.transaction(queue.storeKit1(productId: "coins_60", token: nil, id: "8101", date: clock.now())))
        let backend = self.backend!
        await assertEventually { backend.submissions.count == 1 }
        XCTAssertNil(backend.submissions.last?.orderId, "quantity 1 does not pay an order of 2")
        queue.send(
            .transaction(
                queue.storeKit1(
                    productId: "coins_60", token: nil, id: "8102", date: clock.now().addingTimeInterval(7_200),
                    quantity: 2)))
        await assertEventually { backend.submissions.count == 2 }
        XCTAssertNil(
            backend.submissions.first { $0.proof == .transactionId("8102") }?.orderId, "paid after its order ended")
        queue.send(
            .transaction(
                queue.storeKit1(
                    productId: "coins_60", token: nil, id: "8103", date: clock.now().addingTimeInterval(60), quantity: 2
                )))
        await assertEventually { backend.submissions.count == 3 }
        let paying = backend.submissions.first { $0.proof == .transactionId("8103") }
        XCTAssertEqual(paying?.orderId, backend.orders.first?.orderId)
        await coordinator.shutdown()
    }

    // MARK: Finding 7: restore is one submission and says what it found.

    func testRestoreIsOneBatchReturnsOutcomesAndIsSerialized() async throws {
        let coordinator = await started()
        let restorable = (1...3).map { queue.transaction(productId: "pro", token: nil, id: "90\($0)") }
        queue.state.withValue { $0.restorable = restorable }
        backend.script(
            .accepted(
                PurchaseResponse(
                    status: "delivered",
                    transactions: [
                        .init(transactionId: "901", outcome: "delivered"),
                        .init(transactionId: "902", outcome: "already_delivered"),
                        .init(transactionId: "903", outcome: "not_delivered", code: "owned_by_other_account"),
                    ], account: CustomerInfo(accountId: "u1", balances: ["coins": 5]))))
        backend.latencyNanoseconds.withValue { $0 = 50_000_000 }
        async let first = coordinator.restore()
        async let second = coordinator.restore()
        let (a, b) = try await (first, second)
        XCTAssertEqual(a, b, "a second restore joins the first")
        XCTAssertEqual(backend.submissions.count, 1, "one submission for the whole restore")
        XCTAssertEqual(backend.submissions.first?.proof, .signedTransactions(["jws-901", "jws-902", "jws-903"]))
        XCTAssertEqual(a.transactions.map(\.outcome), ["delivered", "already_delivered", "not_delivered"])
        XCTAssertEqual(a.ownedByOtherAccount.map(\.transactionId), ["903"])
        XCTAssertEqual(a.customerInfo?.balances["coins"], 5)
        XCTAssertFalse(a.nothingToRestore)
        XCTAssertEqual(Set(queue.finished), ["901", "902", "903"])
        queue.state.withValue { $0.restorable = [] }
        let empty = try await coordinator.restore()
        XCTAssertTrue(empty.nothingToRestore)
        await coordinator.shutdown()
    }

    func testAStoreKit1RestoreSendsTheReceiptOnce() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skk-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let receipt = directory.appendingPathComponent("receipt")
        try Data("receipt".utf8).write(to: receipt)
        let coordinator = await started("u1", make(proofs: AppReceiptProofSource(receiptURL: { receipt })))
        let restorable = (1...4).map {
            StoreTransaction(id: "95\($0)", productId: "pro", purchaseDate: clock.now())
        }
        queue.state.withValue { $0.restorable = restorable }
        backend.script(FakeBackend.delivered("951", "952", "953", "954", outcome: "already_delivered"))
        let result = try await coordinator.restore()
        XCTAssertEqual(backend.submissions.count, 1)
        XCTAssertEqual(backend.submissions.first?.proof, .receipt(Data("receipt".utf8).base64EncodedString()))
        XCTAssertNil(backend.submissions.first?.transactionId, "a restore names no single transaction")
        XCTAssertEqual(result.transactions.map(\.outcome), Array(repeating: "already_delivered", count: 4))
        await coordinator.shutdown()
    }

    // MARK: Finding 8: a replay flood is bounded work, and never ahead of a new purchase.

    func testAReplayFloodIsBatchedStoredPerRecordAndNeverAheadOfANewPurchase() async throws {
        let coordinator = await started()
        let writesBefore = store.writes.withValue { $0 }
        let bytesBefore = store.bytesWritten.withValue { $0 }
        let old = clock.now().addingTimeInterval(-200 * 86_400)
        for index in 0..<300 {
            queue.send(.transaction(queue.transaction(productId: "coins_60", token: nil, id: "r\(index)", date: old)))
        }
        // However fast the server answers (no latency here), the flood is gathered on the
        // coordinator's clock: nothing of it is sent while the clock stands still.
        await assertEventually { await coordinator.pendingSubmissions.count == 300 }
        // A purchase in the middle of the flood: submitted on its own, at once.
        let outcome = try await coordinator.purchase(productId: "coins_60")
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
        let backend = self.backend!
        XCTAssertEqual(backend.submissions.count, 1, "the purchase first, alone")
        clock.advance(3)
        await assertEventually {
            let held = await coordinator.pendingSubmissions
            return backend.submissions.count >= 4 && held.isEmpty
        }
        await coordinator.idle()
        let batches = backend.submissions.filter {
            if case .signedTransactions = $0.proof { return true }
            return false
        }
        XCTAssertEqual(backend.submissions.count, 4, "300 replays in three full batches, and the purchase")
        XCTAssertEqual(batches.count, 3)
        for batch in batches {
            if case .signedTransactions(let list) = batch.proof { XCTAssertLessThanOrEqual(list.count, 100) }
        }
        let bytes = store.bytesWritten.withValue { $0 } - bytesBefore
        let writes = store.writes.withValue { $0 } - writesBefore
        XCTAssertLessThan(bytes / max(writes, 1), 4_096, "each write is a few records, not the whole history")
        // Replayed again at the next launch: settled ids are finished without asking anyone.
        await coordinator.shutdown()
        let submitted = backend.submissions.count
        let again = await started()
        for index in 0..<300 {
            queue.send(.transaction(queue.transaction(productId: "coins_60", token: nil, id: "r\(index)", date: old)))
        }
        await again.idle()
        try await Task.sleep(nanoseconds: 100_000_000)
        XCTAssertEqual(backend.submissions.count, submitted)
        await again.shutdown()
    }

    // MARK: Finding 10: durable state survives what it does not understand.

    func testUnreadableAndNewerRecordsAreKeptAsideNeverOverwritten() async throws {
        let garbage = Data("{not json".utf8)
        let newer = Data(#"{"v":9,"value":{"anything":true}}"#.utf8)
        store.records.withValue {
            $0["pending:garbage"] = garbage
            $0["intent:from-the-future"] = newer
        }
        let coordinator = await started()
        _ = try await coordinator.purchase(productId: "coins_60")
        XCTAssertEqual(store.records.withValue { $0["pending:garbage"] }, garbage)
        XCTAssertEqual(store.records.withValue { $0["intent:from-the-future"] }, newer)
        XCTAssertTrue(lines.withValue { $0 }.contains { $0.contains("unreadable") })
        await coordinator.shutdown()
    }

    func testAnOlderRecordWithUnknownStatesAndMissingFieldsStillLoads() throws {
        let intent =
            #"{"v":2,"value":{"orderId":"o","appAccountToken":"5742E386-757E-4762-9349-D6ADAA160407","productId":"p","accountId":"a","createdAt":1,"state":"refunding"}}"#
        let (state, _) = PendingRecords.decode(["intent:x": Data(intent.utf8)])
        XCTAssertEqual(state.intents.first?.state, .created, "a state from a newer SDK reads as open")
        XCTAssertEqual(state.intents.first?.quantity, 1)
    }

    func testALockedKeychainIsReadLaterAndNothingIsWrittenMeanwhile() async throws {
        store.unreadable.withValue { $0 = true }
        let coordinator = make()
        await coordinator.configure()
        await coordinator.login("u1")
        do {
            _ = try await coordinator.purchase(productId: "coins_60")
            XCTFail("paid with no durable state")
        } catch PurchaseError.storage {}
        queue.send(.transaction(queue.transaction(productId: "coins_60", token: nil, id: "6001")))
        try await Task.sleep(nanoseconds: 30_000_000)
        XCTAssertEqual(store.writes.withValue { $0 }, 0)
        XCTAssertEqual(queue.finished, [])
        store.unreadable.withValue { $0 = false }
        await coordinator.redrive(.foreground)
        let queue = self.queue!
        await assertEventually { queue.finished.contains("6001") }
        XCTAssertEqual(backend.submissions.count, 1)
        await coordinator.shutdown()
    }

    func testAccountCachesAreClearedOnLogoutAndReinstall() async throws {
        let coordinator = await started("alice")
        backend.state.withValue { $0.accounts["alice"] = CustomerInfo(accountId: "alice", balances: ["coins": 9]) }
        _ = try await coordinator.customerInfo()
        XCTAssertFalse(store.state.customerInfo.isEmpty)
        await coordinator.logout()
        XCTAssertTrue(store.state.customerInfo.isEmpty, "logged out: nothing of theirs cached")
        await coordinator.login("alice")
        _ = try await coordinator.customerInfo()
        await coordinator.shutdown()

        // Uninstalled and installed again: the Keychain survived, the app's marker did not. (Offline:
        // the view login fetches would be the server's fresh one, not the old cache.)
        backend.state.withValue { $0.offline = true }
        let marker = FileInstallationMarker(
            url: FileManager.default.temporaryDirectory.appendingPathComponent("skk-\(UUID().uuidString)/installed"))
        defer { try? FileManager.default.removeItem(at: marker.url.deletingLastPathComponent()) }
        let reinstalled = await started("alice", make(installation: marker))
        XCTAssertTrue(store.state.customerInfo.isEmpty)
        XCTAssertTrue(marker.isMarked())
        await reinstalled.shutdown()
    }

    // MARK: Finding 12: lifecycle calls return promptly; streams start with the current value.

    func testLoginAndConfigureReturnWhileUploadsHang() async throws {
        let first = await started()
        backend.script(.retryable(status: nil, code: "network", retryAfter: nil))
        _ = try await first.purchase(productId: "coins_60")
        await first.shutdown()
        let gate = Gate()
        let coordinator = make(backend: GatedFake(inner: backend, gate: gate))
        await coordinator.configure()
        await coordinator.login("u1")
        await coordinator.redrive(.foreground)
        XCTAssertEqual(backend.submissions.count, 1, "returned while the upload still waits")
        await gate.open()
        let queue = self.queue!
        await assertEventually { queue.finished.count == 1 }
        await coordinator.shutdown()
    }

    func testTheAccountStreamStartsWithTheCurrentView() async throws {
        let coordinator = await started()
        _ = try await coordinator.purchase(productId: "coins_60")
        var updates = await coordinator.customerInfoUpdates().makeAsyncIterator()
        let current = await updates.next()
        XCTAssertEqual(current?.accountId, "u1")
        await coordinator.shutdown()
    }

    // MARK: Finding 13: offline, an expired entitlement is not active.

    func testAnExpiredEntitlementStopsBeingActiveOffline() async throws {
        let coordinator = await started()
        backend.state.withValue {
            $0.accounts["u1"] = CustomerInfo(
                accountId: "u1",
                entitlements: [.init(id: "pro", active: true, expiresAt: self.clock.now().addingTimeInterval(60))])
        }
        _ = try await coordinator.customerInfo()
        let before = await coordinator.isEntitled("pro")
        XCTAssertTrue(before)
        backend.state.withValue { $0.offline = true }
        clock.advance(120)
        let info = try await coordinator.customerInfo()
        XCTAssertFalse(info.isActive("pro", at: clock.now()))
        let after = await coordinator.isEntitled("pro")
        XCTAssertFalse(after)
        let json =
            #"{"accountId":"u","entitlements":[{"id":"pro","active":true,"expiresAt":"2026-01-01T00:00:00.000Z"}]}"#
        let decoded = try JSONDecoder().decode(CustomerInfo.self, from: Data(json.utf8))
        XCTAssertEqual(decoded.entitlements.first?.expiresAt, Date(timeIntervalSince1970: 1_767_225_600))
        await coordinator.shutdown()
    }

    /// A commitment plan as the server shows it; one this version cannot read is left out.
    func testACommitmentIsReadAndAMalformedOneIsIgnored() throws {
        let json = #"""
            {"accountId":"u","subscriptions":[
              {"originalTransactionId":"1","productId":"pro_yearly","status":"active","autoRenew":true,
               "commitment":{"billingPeriod":4,"totalBillingPeriods":12,"expiresAt":"2026-01-01T00:00:00.000Z","renews":false}},
              {"originalTransactionId":"2","productId":"pro_yearly","status":"active","commitment":{"billingPeriod":"four"}}]}
            """#
        let decoded = try JSONDecoder().decode(CustomerInfo.self, from: Data(json.utf8))
        XCTAssertEqual(
            decoded.subscriptions.first?.commitment,
            .init(
                billingPeriod: 4, totalBillingPeriods: 12, expiresAt: Date(timeIntervalSince1970: 1_767_225_600),
                renews: false))
        XCTAssertNil(decoded.subscriptions.last?.commitment)
        let again = try JSONDecoder().decode(CustomerInfo.self, from: try JSONEncoder().encode(decoded))
        XCTAssertEqual(again, decoded)
    }

    // MARK: Finding 14: one drive loop; a trigger storm resets backoff once.

    func testOneDriveLoopAndDebouncedTriggers() async throws {
        backend.script(.retryable(status: nil, code: "network", retryAfter: nil))
        let coordinator = await started()
        _ = try await coordinator.purchase(productId: "coins_60")
        backend.script(
            .retryable(status: nil, code: "network", retryAfter: nil),
            .retryable(status: nil, code: "network", retryAfter: nil),
            .retryable(status: nil, code: "network", retryAfter: nil))
        backend.latencyNanoseconds.withValue { $0 = 20_000_000 }
        clock.advance(6)
        for _ in 0..<50 {
            await coordinator.redrive(.networkChange)
            await coordinator.redrive(.foreground)
        }
        await coordinator.idle()
        try await Task.sleep(nanoseconds: 100_000_000)
        XCTAssertEqual(backend.submissions.count, 2, "a storm of triggers: one more attempt, not a hundred")
        await coordinator.shutdown()
    }

    // MARK: Finding 15: the tap path waits on nothing it can know earlier; cancelled orders end.

    func testTheAppTransactionIsAskedOnceAndCancelledOrdersAreCancelled() async throws {
        final class Counting: AppTransactionSource, @unchecked Sendable {
            let calls = Locked(0)
            func appTransactionId() async -> String? {
                calls.withValue { $0 += 1 }
                return "123"
            }
        }
        let source = Counting()
        let coordinator = await started("u1", make(appTransactions: source))
        for _ in 0..<3 { _ = try await coordinator.purchase(productId: "coins_60") }
        XCTAssertEqual(source.calls.withValue { $0 }, 1)
        XCTAssertEqual(backend.state.withValue { $0.orderRequests.map(\.appTransactionId) }, ["123", "123", "123"])
        queue.answer(.cancelled)
        let outcome = try await coordinator.purchase(productId: "coins_60")
        XCTAssertEqual(outcome, .cancelled)
        await assertEventually { self.backend.state.withValue { $0.cancelled } == [self.backend.orders[3].orderId] }
        await coordinator.shutdown()
    }

    /// Every wait has a deadline: StoreKit's AppTransaction never answering holds a tap two
    /// seconds at most (the order goes without it); `ready()` returns while the Keychain is locked.
    func testNothingBeforeThePaymentWaitsWithoutADeadline() async throws {
        struct Hanging: AppTransactionSource {
            func appTransactionId() async -> String? {
                try? await Task.sleep(nanoseconds: 3_600_000_000_000)
                return "never"
            }
        }
        let coordinator = await started("u1", make(appTransactions: Hanging()))
        let call = Task { try await coordinator.purchase(productId: "coins_60") }
        try await Task.sleep(nanoseconds: 50_000_000)
        XCTAssertEqual(backend.orders.count, 0)
        clock.advance(3)
        let outcome = try await call.value
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
        XCTAssertEqual(backend.state.withValue { $0.orderRequests.map(\.appTransactionId) }, [nil])
        await coordinator.shutdown()

        store.unreadable.withValue { $0 = true }
        let locked = make()
        await locked.configure()
        let waiting = Task { await locked.ready(timeout: 5) }
        try await Task.sleep(nanoseconds: 50_000_000)
        clock.advance(6)
        await waiting.value
        let loaded = await locked.isLoaded
        XCTAssertFalse(loaded)
        await locked.shutdown()
    }

    // MARK: Finding 16: typed errors and an injectable logger.

    func testStoreKitErrorsStayTypedAndTheLoggerHearsOfThem() async throws {
        /// As the adapters map StoreKit's own errors: case by case, never parsed.
        enum Refused: Error, Equatable, StoreKitFailureConvertible {
            case invalidOfferSignature
            var storeKitFailure: StoreKitFailure {
                StoreKitFailure(
                    kind: .invalidOffer, code: "Product.PurchaseError.invalidOfferSignature", message: "bad signature",
                    underlying: self)
            }
        }
        final class Throwing: PaymentQueue, @unchecked Sendable {
            func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
                throw Refused.invalidOfferSignature
            }
            func finish(transactionId: String) async {}
            func unfinished() async -> [StoreTransaction] { [] }
            func restore() async throws -> [StoreTransaction] { [] }
            func updates() -> AsyncStream<PaymentUpdate> { AsyncStream { _ in } }
        }
        let coordinator = PurchaseCoordinator(
            queue: Throwing(), backend: backend, store: store, clock: clock,
            configuration: .init(logger: Collecting(lines: lines)))
        await coordinator.configure()
        await coordinator.login("u1")
        do {
            _ = try await coordinator.purchase(productId: "coins_60")
            XCTFail()
        } catch PurchaseError.storeKit(let failure) {
            XCTAssertEqual(failure.underlying as? Refused, .invalidOfferSignature)
            XCTAssertEqual(failure.code, "Product.PurchaseError.invalidOfferSignature")
            XCTAssertEqual(failure.kind, .invalidOffer)
        }
        XCTAssertTrue(lines.withValue { $0 }.contains { $0.contains("refused the payment") })
        await coordinator.shutdown()
    }

    // MARK: Signed answers (seed 004's IAPFree is a man in the middle).

    func testForgedOrUnsignedAnswersAreNetworkFailuresNeverVerdicts() async throws {
        let key = Curve25519.Signing.PrivateKey()
        let publicKey = try ResponseSigningKey(key.publicKey.rawRepresentation.base64EncodedString())
        struct Signing: HTTPTransport {
            let key: Curve25519.Signing.PrivateKey
            let mode: String
            func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
                let body = Data(
                    #"{"status":"delivered","transactions":[{"transactionId":"1","outcome":"delivered"}],"account":{"accountId":"a"}}"#
                        .utf8)
                var nonce = request.value(forHTTPHeaderField: "StoreKeeper-Nonce") ?? ""
                if mode == "replayed" { nonce = "another-request" }
                let signed = mode == "tampered" ? Data(body.dropLast(2)) + Data("}}".utf8) : body
                var headers = ["Content-Type": "application/json"]
                if mode != "unsigned" {
                    headers["StoreKeeper-Signature"] = try SignedAnswers.header(
                        key: key, nonce: nonce, method: "POST", path: request.url!.path, status: 200,
                        requestBody: request.httpBody ?? Data(), body: mode == "tampered" ? Data("x".utf8) : signed)
                }
                return (
                    body, HTTPURLResponse(url: request.url!, statusCode: 200, httpVersion: nil, headerFields: headers)!
                )
            }
        }
        for mode in ["signed", "unsigned", "tampered", "replayed"] {
            let http = HTTPBackend(
                baseURL: URL(string: "https://example.invalid")!, transport: Signing(key: key, mode: mode),
                responseSigningKey: publicKey, tokens: { _, _ in "t" })
            let verdict = await http.submitPurchase(accountId: "a", orderId: nil, proof: .signedTransaction("x.y.z"))
            if mode == "signed" {
                XCTAssertTrue(verdict.isFinal, mode)
            } else {
                XCTAssertEqual(verdict, .retryable(status: nil, code: "unsigned_answer", retryAfter: nil), mode)
            }
        }
        // The key as /v1/status gives it, or as PEM.
        let spki =
            Data([0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00])
            + key.publicKey.rawRepresentation
        let pem = "-----BEGIN PUBLIC KEY-----\n\(spki.base64EncodedString())\n-----END PUBLIC KEY-----\n"
        XCTAssertEqual(try ResponseSigningKey(pem), publicKey)
        XCTAssertThrowsError(try ResponseSigningKey("not a key"))
    }
}

/// A gate a test opens.
actor Gate {
    var isOpen = false
    func open() { isOpen = true }
    func wait() async {
        while !isOpen { try? await Task.sleep(nanoseconds: 2_000_000) }
    }
}

/// The fake server behind a gate: every submission waits until the test opens it.
struct GatedFake: Backend {
    let inner: FakeBackend
    let gate: Gate
    func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder {
        try await inner.createOrder(accountId: accountId, productId: productId, quantity: quantity)
    }
    func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
        -> SubmissionVerdict
    {
        await gate.wait()
        return await inner.submitPurchase(
            accountId: accountId, orderId: orderId, proof: proof, transactionId: transactionId)
    }
    func setConsumptionDataConsent(accountId: String, granted: Bool) async throws {}

    func cancelOrder(accountId: String, orderId: String) async throws {
        try await inner.cancelOrder(accountId: accountId, orderId: orderId)
    }
    func customerInfo(accountId: String) async throws -> CustomerInfo {
        try await inner.customerInfo(accountId: accountId)
    }
}

extension DeviceReviewTests {
    /// `pendingPurchases` counts payments waiting for the server, not a restore's copies (nor a
    /// refund's revocation): a restore held offline shows no "purchase pending".
    func testARestoreHeldOfflineIsNoPendingPurchase() async throws {
        let coordinator = await started("u1")
        backend.state.withValue { $0.offline = true }
        // StoreKit 1 hands a restored transaction (and, separately, a refunded one) to the queue.
        var restored = StoreTransaction(id: "971", productId: "pro", purchaseDate: clock.now())
        restored.isRestored = true
        queue.send(.restored(restored))
        let queue = self.queue!
        await assertEventually { await coordinator.state.pending.contains { $0.transaction.id == "971" } }
        let view = await coordinator.currentAccountView
        XCTAssertEqual(view.pendingPurchases, 0, "a restore's copy is no payment waiting")
        // A real payment held offline counts.
        queue.send(.transaction(queue.transaction(productId: "coins_60", token: nil, id: "972")))
        await assertEventually { await coordinator.state.pending.contains { $0.transaction.id == "972" } }
        let after = await coordinator.currentAccountView
        XCTAssertEqual(after.pendingPurchases, 1)
        await coordinator.shutdown()
    }
}

extension DeviceReviewTests {
    /// The observable model republishes when an entitlement expires (scheduled at the earliest
    /// `expiresAt`), not at the next unrelated change.
    func testTheAccountViewIsRepublishedWhenAnEntitlementExpires() async throws {
        let ends = clock.now().addingTimeInterval(3600)
        backend.state.withValue {
            $0.accounts["u1"] = CustomerInfo(
                accountId: "u1",
                entitlements: [.init(id: "pro", active: true, productId: "pro_monthly", expiresAt: ends)])
        }
        let coordinator = await started("u1")
        let seen = Locked<[[String]]>([])
        let stream = await coordinator.accountViews()
        let watcher = Task { for await view in stream { seen.withValue { $0.append(view.activeEntitlementIds) } } }
        await assertEventually { seen.withValue { $0.last } == ["pro"] }
        clock.advance(3601)
        await assertEventually { seen.withValue { $0.last } == [] }
        watcher.cancel()
        await coordinator.shutdown()
    }
}

extension DeviceReviewTests {
    /// A device set two days ahead (players move the date to skip game timers) shows a
    /// subscription the server just confirmed as active: the server's time decides, and offline
    /// the server's time plus the elapsed time since; the expiry still comes on time.
    func testADeviceClockDaysAheadDoesNotExpireAJustConfirmedSubscription() async throws {
        let serverNow = clock.now()
        let ends = serverNow.addingTimeInterval(3600)
        backend.state.withValue {
            $0.accounts["u1"] = CustomerInfo(
                accountId: "u1",
                entitlements: [.init(id: "pro", active: true, productId: "pro_monthly", expiresAt: ends)],
                serverTime: serverNow)
        }
        clock.jump(2 * 86_400)  // the player's clock, not time passing
        let coordinator = await started("u1")
        await assertEventually { await coordinator.cachedCustomerInfo() != nil }
        let entitled = await coordinator.isEntitled("pro")
        XCTAssertTrue(entitled, "the server's time decides, not the device's")
        let view = await coordinator.currentAccountView
        XCTAssertEqual(view.activeEntitlementIds, ["pro"])
        // Offline, an hour of real (elapsed) time later: expired, whatever the wall clock says.
        backend.state.withValue { $0.offline = true }
        clock.advance(3601)
        let later = await coordinator.isEntitled("pro")
        XCTAssertFalse(later)
        await coordinator.shutdown()
    }

    func testTheHTTPDateHeaderIsRead() {
        let date = HTTPBackend.httpDate("Sun, 06 Nov 1994 08:49:37 GMT")
        XCTAssertEqual(date?.timeIntervalSince1970, 784_111_777)
        XCTAssertEqual(HTTPBackend.httpDate("Thu, 29 Feb 2024 12:00:00 GMT")?.timeIntervalSince1970, 1_709_208_000)
        XCTAssertEqual(HTTPBackend.httpDate("Thu, 01 Jan 1970 00:00:00 GMT")?.timeIntervalSince1970, 0)
        for bad in [
            "yesterday", "Sun, 06 Nov 1994 08:49:37 PST", "Sun, 32 Nov 1994 08:49:37 GMT", "",
            "Sun, 06 Foo 1994 08:49:37 GMT",
        ] {
            XCTAssertNil(HTTPBackend.httpDate(bad), bad)
        }
    }
}
