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

/// StoreKeeperKit's third pass (issue 45): one test per finding, each failing on the code the
/// review read.
final class ThirdPassTests: XCTestCase {
    var queue: FakeQueue!
    var store: MemoryStore!
    var clock: ManualClock!
    var lines: Locked<[String]>!

    override func setUp() {
        queue = FakeQueue()
        store = MemoryStore()
        clock = ManualClock()
        lines = Locked([])
    }

    struct Collecting: StoreKeeperLogger {
        let lines: Locked<[String]>
        func log(_ level: LogLevel, _ message: String) { lines.withValue { $0.append("\(level) \(message)") } }
    }

    func coordinator(_ backend: Backend) -> PurchaseCoordinator {
        PurchaseCoordinator(
            queue: queue, backend: backend, store: store, clock: clock,
            configuration: .init(
                retry: RetryPolicy(base: 10, cap: 100), purchaseTimeout: 30, logger: Collecting(lines: lines),
                random: { 1 }))
    }

    func http(_ server: SigningServer, keys: [ResponseSigningKey]) -> HTTPBackend {
        HTTPBackend(
            baseURL: URL(string: "https://example.invalid")!, appId: "ios", transport: server,
            responseSigningKeys: keys, tokens: { _, _ in "t" })
    }

    // MARK: N5: signed answers survive a key rotation, and failures are seen

    func testAKeyRotationKeepsPurchasesFlowingForABuildThatHoldsBothKeys() async throws {
        let current = Curve25519.Signing.PrivateKey()
        let next = Curve25519.Signing.PrivateKey()
        let server = SigningServer(.v2(current))
        let coordinator = coordinator(
            http(server, keys: [try SignedAnswers.publicKey(current), try SignedAnswers.publicKey(next)]))
        await coordinator.configure()
        await coordinator.login("alice")
        guard case .delivered = try await coordinator.purchase(productId: "coins_60") else {
            return XCTFail("not delivered before the rotation")
        }
        // The operator switches the server to the next key.
        server.signature.withValue { $0 = .v2(next) }
        guard case .delivered = try await coordinator.purchase(productId: "coins_60") else {
            return XCTFail("not delivered after the rotation")
        }
        let diagnostics = await coordinator.diagnostics
        XCTAssertEqual(diagnostics.unverifiedAnswers, 0)
        XCTAssertEqual(diagnostics.heldSubmissions, 0)
        await coordinator.shutdown()
    }

    func testAnAnswerSignedWithAKeyTheBuildLacksIsHeldAndReportedNeverSilent() async throws {
        let old = Curve25519.Signing.PrivateKey()
        let rotated = Curve25519.Signing.PrivateKey()
        let server = SigningServer(.v2(rotated))
        let coordinator = coordinator(http(server, keys: [try SignedAnswers.publicKey(old)]))
        await coordinator.configure()
        await coordinator.login("alice")
        let outcome = try await coordinator.purchase(productId: "coins_60")
        XCTAssertEqual(outcome, .processing)
        await coordinator.idle()
        let diagnostics = await coordinator.diagnostics
        XCTAssertGreaterThanOrEqual(diagnostics.unverifiedAnswers, 1)
        XCTAssertEqual(diagnostics.lastSignatureProblem, .unknownKey(SignedAnswers.keyId(rotated)))
        XCTAssertEqual(diagnostics.heldSubmissions, 1)
        let held = await coordinator.pendingSubmissions
        XCTAssertTrue(held.first?.lastError?.contains("unsigned_answer") == true, "\(held)")
        XCTAssertTrue(held.first?.lastError?.contains(SignedAnswers.keyId(rotated)) == true, "\(held)")
        // Nothing finished: the transaction waits for an answer that verifies.
        XCTAssertTrue(queue.finished.isEmpty)
        // One error line, however many answers are refused.
        clock.advance(200)
        await coordinator.redrive(.foreground)
        await coordinator.idle()
        let errors = lines.withValue { $0 }.filter { $0.hasPrefix("error") && $0.contains("refused") }
        XCTAssertEqual(errors.count, 1, "\(lines.withValue { $0 })")
        // The account read says why too.
        do {
            _ = try await http(server, keys: [try SignedAnswers.publicKey(old)]).customerInfo(accountId: "alice")
            XCTFail("an unverified account view was taken")
        } catch let error as BackendError {
            XCTAssertEqual(error, .unverifiedAnswer(.unknownKey(SignedAnswers.keyId(rotated))))
        }
        // Given the rotated key (an update of the app), the held purchase goes through.
        await coordinator.shutdown()
        let updated = self.coordinator(
            http(server, keys: [try SignedAnswers.publicKey(old), try SignedAnswers.publicKey(rotated)]))
        await updated.configure()
        await updated.login("alice")
        let drained = await eventually { await updated.pendingSubmissions.isEmpty }
        XCTAssertTrue(drained)
        XCTAssertEqual(queue.finished.count, 1)
        await updated.shutdown()
    }

    // MARK: 12: a signed answer binds the request; N10: the shedder's Retry-After holds

    func testASignedAnswerBindsMethodStatusAndTheRequestBody() async throws {
        let key = Curve25519.Signing.PrivateKey()
        let publicKey = try SignedAnswers.publicKey(key)
        let cases: [(SigningServer.Signature, SignatureProblem?)] = [
            (.v2(key), nil),
            (.requestChangedInTransit(key), .invalid(keyId: SignedAnswers.keyId(key))),
            (.statusChanged(key), .invalid(keyId: SignedAnswers.keyId(key))),
            (.v1(key), .unboundSignature),
            (.none, .missing),
        ]
        for (signature, problem) in cases {
            let backend = http(SigningServer(signature), keys: [publicKey])
            let verdict = await backend.submitPurchase(
                accountId: "a", orderId: nil, proof: .signedTransaction("jws-7"), transactionId: nil)
            if let problem {
                XCTAssertEqual(
                    verdict, .retryable(status: nil, code: "unsigned_answer", retryAfter: nil), "\(signature)")
                XCTAssertEqual(backend.signatureDiagnostics?.lastProblem, problem)
                XCTAssertEqual(backend.signatureDiagnostics?.unverifiedAnswers, 1)
            } else {
                XCTAssertTrue(verdict.isFinal, "\(verdict)")
            }
        }
    }

    func testTheLoadSheddersUnsigned503KeepsItsRetryAfter() async throws {
        let key = Curve25519.Signing.PrivateKey()
        let server = SigningServer(.v2(key))
        server.shed.withValue { $0 = 30 }
        let backend = http(server, keys: [try SignedAnswers.publicKey(key)])
        let verdict = await backend.submitPurchase(
            accountId: "a", orderId: nil, proof: .signedTransaction("jws-7"), transactionId: nil)
        XCTAssertEqual(verdict, .retryable(status: 503, code: "unavailable", retryAfter: 30))
        XCTAssertEqual(backend.signatureDiagnostics?.unverifiedAnswers, 0)
    }

    // MARK: N9: a batch answer settles entries by transaction id, never by position

    func testABatchAnswerIsMatchedByTransactionIdNotPosition() async throws {
        /// Answers a batch with entries for other transactions, in the batch's length.
        final class Shuffling: Backend, @unchecked Sendable {
            let inner = FakeBackend()
            func createOrder(accountId: String, productId: String, quantity: Int) async throws -> ServerOrder {
                try await inner.createOrder(accountId: accountId, productId: productId, quantity: quantity)
            }
            func submitPurchase(accountId: String, orderId: String?, proof: Proof, transactionId: String?) async
                -> SubmissionVerdict
            {
                guard case .signedTransactions(let list) = proof else {
                    return .retryable(status: 503, code: nil, retryAfter: nil)
                }
                // The second entry is about someone else's transaction: it must settle nothing.
                var entries = [PurchaseResponse.Transaction(transactionId: "901", outcome: "delivered")]
                entries += list.dropFirst().map { _ in
                    PurchaseResponse.Transaction(transactionId: "555", outcome: "delivered")
                }
                return .accepted(PurchaseResponse(status: "delivered", transactions: entries, account: nil))
            }
            func cancelOrder(accountId: String, orderId: String) async throws {}
            func customerInfo(accountId: String) async throws -> CustomerInfo {
                try await inner.customerInfo(accountId: accountId)
            }
            func setConsumptionDataConsent(accountId: String, granted: Bool) async throws {}
        }
        let old = clock.now().addingTimeInterval(-86_400)
        let coordinator = coordinator(Shuffling())
        await coordinator.configure()
        await coordinator.login("alice")
        await coordinator.idle()
        // A restore sends both in one batch.
        queue.state.withValue { state in
            state.restorable = ["901", "902"].map {
                StoreTransaction(id: $0, productId: "pro", purchaseDate: old, signedTransaction: "jws-\($0)")
            }
        }
        let result = try await coordinator.restore()
        XCTAssertEqual(result.transactions.map(\.outcome), ["delivered", "held"])
        await coordinator.idle()
        XCTAssertEqual(queue.finished, ["901"])
        let held = await coordinator.pendingSubmissions.map(\.transaction.id)
        XCTAssertEqual(held, ["902"])
        await coordinator.shutdown()
    }

    // MARK: N1: a purchase's own transaction reaching `Transaction.updates` first

    /// StoreKit 2 with SCA or 3-D Secure: the transaction arrives through `updates` (and is
    /// delivered) before `purchase()` returns it.
    final class UpdatesFirstQueue: PaymentQueue, @unchecked Sendable {
        let inner: FakeQueue
        let delivered: @Sendable (String) async -> Bool
        init(_ inner: FakeQueue, delivered: @escaping @Sendable (String) async -> Bool) {
            self.inner = inner
            self.delivered = delivered
        }
        func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
            let transaction = inner.transaction(productId: productId, token: appAccountToken, quantity: quantity)
            inner.send(.transaction(transaction))
            _ = await eventually { await self.delivered(transaction.id) }
            return .purchased(transaction)
        }
        func purchase(productId: String, quantity: Int, appAccountToken: UUID, options: PurchaseOptions) async throws
            -> PaymentResult
        { try await purchase(productId: productId, quantity: quantity, appAccountToken: appAccountToken) }
        func finish(transactionId: String) async { await inner.finish(transactionId: transactionId) }
        func unfinished() async -> [StoreTransaction] { await inner.unfinished() }
        func restore() async throws -> [StoreTransaction] { try await inner.restore() }
        func updates() -> AsyncStream<PaymentUpdate> { inner.updates() }
    }

    func testAPurchasesOwnTransactionSeenFirstThroughUpdatesIsDeliveredNotNotCharged() async throws {
        let backend = FakeBackend()
        let fake = queue!
        let updatesFirst = UpdatesFirstQueue(fake) { id in fake.finished.contains(id) }
        let coordinator = PurchaseCoordinator(
            queue: updatesFirst, backend: backend, store: store, clock: clock,
            configuration: .init(logger: Collecting(lines: lines)))
        await coordinator.configure()
        await coordinator.login("alice")
        let outcome = try await coordinator.purchase(productId: "coins_60")
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
        XCTAssertEqual(backend.state.withValue { $0.cancelled }, [], "its order is never cancelled")
        XCTAssertEqual(backend.submissions.count, 1)
        await coordinator.shutdown()
    }

    // MARK: N2: a timed-out StoreKit 1 sheet's late cancel never resolves the next purchase

    func testALateCancelOfATimedOutSheetNeverEndsTheNextPurchase() async throws {
        let backend = FakeBackend()
        let coordinator = coordinator(backend)
        await coordinator.configure()
        await coordinator.login("alice")
        let queue = self.queue!
        queue.answer(.enqueued)
        let first = Task { try await coordinator.purchase(productId: "coins_60") }
        await assertEventually { queue.payments.count == 1 }
        clock.advance(31)
        let firstOutcome = try await first.value
        XCTAssertEqual(firstOutcome, .waitingForStore)
        queue.answer(.enqueued)
        let second = Task { try await coordinator.purchase(productId: "coins_60") }
        await assertEventually { queue.payments.count == 2 }
        let firstToken = queue.payments[0].token
        let secondToken = queue.payments[1].token
        // The first sheet's late cancel, without its token, then with it: neither is the second's.
        queue.send(.failed(productId: "coins_60", transactionId: "f1", cancelled: true))
        queue.send(.failed(productId: "coins_60", transactionId: "f2", cancelled: true, appAccountToken: firstToken))
        await assertEventually { queue.finished.contains("f2") }
        // The second payment succeeds: delivered to its own order.
        queue.send(.transaction(queue.storeKit1(productId: "coins_60", token: secondToken, id: "7002")))
        let outcome = try await second.value
        guard case .delivered = outcome else { return XCTFail("\(outcome)") }
        XCTAssertEqual(backend.submissions.first?.orderId, backend.orders[1].orderId)
        await assertEventually { backend.state.withValue { $0.cancelled } == [backend.orders[0].orderId] }
        await coordinator.shutdown()
    }

    // MARK: N3: an account switch never shows the previous account's view

    func testCustomerInfoUpdatesNeverYieldAnotherAccountsViewAfterASwitch() async throws {
        let backend = FakeBackend()
        backend.script(.retryable(status: 503, code: nil, retryAfter: nil))
        let coordinator = coordinator(backend)
        await coordinator.configure()
        await coordinator.login("alice")
        let held = try await coordinator.purchase(productId: "coins_60")
        XCTAssertEqual(held, .processing)
        await coordinator.login("bob")
        let seen = Locked<[String]>([])
        let stream = await coordinator.customerInfoUpdates()
        let watcher = Task { for await info in stream { seen.withValue { $0.append(info.accountId) } } }
        // Alice's held purchase goes through now, answered with alice's view.
        clock.advance(200)
        await coordinator.redrive(.foreground)
        await assertEventually { backend.submissions.count == 2 }
        await coordinator.idle()
        let cached = await coordinator.cachedCustomerInfo()
        // Bob's own view (fetched at login), never alice's.
        XCTAssertTrue(cached == nil || cached?.accountId == "bob", "\(String(describing: cached))")
        _ = try await coordinator.customerInfo()
        await assertEventually { seen.withValue { $0 }.contains("bob") }
        XCTAssertEqual(seen.withValue { $0 }, ["bob"])
        watcher.cancel()
        await coordinator.shutdown()
    }

    // MARK: N4: a restore never joins another account's

    final class SlowRestoreQueue: PaymentQueue, @unchecked Sendable {
        let inner: FakeQueue
        let gate = Gate()
        init(_ inner: FakeQueue) { self.inner = inner }
        func purchase(productId: String, quantity: Int, appAccountToken: UUID) async throws -> PaymentResult {
            try await inner.purchase(productId: productId, quantity: quantity, appAccountToken: appAccountToken)
        }
        func purchase(productId: String, quantity: Int, appAccountToken: UUID, options: PurchaseOptions) async throws
            -> PaymentResult
        { try await purchase(productId: productId, quantity: quantity, appAccountToken: appAccountToken) }
        func finish(transactionId: String) async { await inner.finish(transactionId: transactionId) }
        func unfinished() async -> [StoreTransaction] { await inner.unfinished() }
        func restore() async throws -> [StoreTransaction] {
            await gate.wait()
            return try await inner.restore()
        }
        func updates() -> AsyncStream<PaymentUpdate> { inner.updates() }
    }

    func testARestoreOfAnotherAccountIsNeverJoined() async throws {
        let backend = FakeBackend()
        let slow = SlowRestoreQueue(queue)
        queue.state.withValue {
            $0.restorable = [
                StoreTransaction(id: "500", productId: "pro", purchaseDate: Date(), signedTransaction: "jws-500")
            ]
        }
        let coordinator = PurchaseCoordinator(
            queue: slow, backend: backend, store: store, clock: clock,
            configuration: .init(logger: Collecting(lines: lines)))
        await coordinator.configure()
        await coordinator.login("alice")
        let alices = Task { try await coordinator.restore() }
        try await Task.sleep(nanoseconds: 20_000_000)
        await coordinator.login("bob")
        let bobs = Task { try await coordinator.restore() }
        await slow.gate.open()
        let alice = try await alices.value
        let bob = try await bobs.value
        XCTAssertEqual(alice.customerInfo?.accountId, "alice")
        XCTAssertEqual(bob.customerInfo?.accountId, "bob", "bob gets his own restore")
        XCTAssertTrue(backend.submissions.contains { $0.accountId == "bob" }, "something restored for bob")
        await coordinator.shutdown()
    }

    // MARK: N13: a login while the Keychain is locked still attributes what waits for nobody

    func testALoginWhileTheStoreIsLockedAttributesHeldTransactionsOnceReadable() async throws {
        let backend = FakeBackend()
        backend.state.withValue { $0.offline = true }
        // A transaction arrived while nobody was logged in: held for nobody.
        let first = coordinator(backend)
        await first.configure()
        await first.idle()
        queue.send(.transaction(queue.transaction(productId: "coins_60", token: nil, id: "800")))
        await assertEventually { await first.pendingSubmissions.count == 1 }
        await first.shutdown()
        // Next launch after a reboot: the Keychain is locked, the user logs in anyway.
        store.unreadable.withValue { $0 = true }
        let second = coordinator(backend)
        await second.configure()
        await second.login("alice")
        store.unreadable.withValue { $0 = false }
        // The state is read again on the retry's schedule (a manual clock, moved on until it is).
        let clock = self.clock!
        await assertEventually {
            clock.advance(1)
            return backend.submissions.contains { $0.accountId == "alice" }
        }
        await second.idle()
        XCTAssertEqual(queue.finished, ["800"])
        await second.shutdown()
    }

    // MARK: N12: an offer the App Store attached is told to the server

    func testAPromotedPurchasesOfferIsToldToTheServer() async throws {
        let backend = FakeBackend()
        let coordinator = coordinator(backend)
        await coordinator.configure()
        await coordinator.login("alice")
        queue.send(.promoted(PromotedPurchase(id: "h1", productId: "pro", offerId: "comeback", offerKind: .winBack)))
        queue.send(.promoted(PromotedPurchase(id: "h2", productId: "pro", offerId: "spring", offerKind: .promotional)))
        await assertEventually { await coordinator.waitingPromotedPurchases.count == 2 }
        for purchase in await coordinator.waitingPromotedPurchases { _ = try await coordinator.purchase(purchase) }
        XCTAssertEqual(backend.state.withValue { $0.winBackRequests }, ["comeback", nil])
        XCTAssertEqual(backend.state.withValue { $0.orderRequests.map(\.offerId) }, [nil, "spring"])
        // The server's signature is what the payment carries for the promotional offer.
        XCTAssertEqual(queue.state.withValue { $0.options.last?.promotionalOffer?.id }, "spring")
        await coordinator.shutdown()
    }

    // MARK: F17: a restore's unfinished copy is a restore, never an open order's payment

    func testARestoredCopyLeftUnfinishedIsNeverAnOpenOrdersPayment() async throws {
        let backend = FakeBackend()
        let first = coordinator(backend)
        await first.configure()
        await first.login("alice")
        queue.answer(.enqueued)
        let abandoned = Task { try await first.purchase(productId: "pro") }
        let queue = self.queue!
        await assertEventually { queue.payments.count == 1 }
        await first.shutdown()
        _ = try await abandoned.value
        // Next launch: StoreKit 1 still holds a restored copy of an older purchase of "pro".
        queue.state.withValue {
            $0.unfinished = [
                StoreTransaction(
                    id: "300", originalId: "100", productId: "pro", purchaseDate: clock.now(), isRestored: true)
            ]
        }
        let second = coordinator(backend)
        await second.configure()
        await second.login("alice")
        let manual = self.clock!
        await assertEventually {
            manual.advance(1)
            return backend.submissions.count == 1
        }
        XCTAssertNil(backend.submissions.first?.orderId, "not the open order's payment")
        await second.shutdown()
    }

    // MARK: N11: the background loop never keeps refreshing the receipt

    func testReceiptRefreshesAreBoundedToOncePerLaunchAndNeverInTheBackground() async throws {
        let receipt = FileManager.default.temporaryDirectory.appendingPathComponent("receipt-\(UUID())")
        try Data("receipt".utf8).write(to: receipt)
        defer { try? FileManager.default.removeItem(at: receipt) }
        let refreshes = Locked(0)
        let proofs = AppReceiptProofSource(receiptURL: { receipt }, refreshReceipt: { refreshes.withValue { $0 += 1 } })
        let backend = FakeBackend()
        for _ in 0..<40 {
            backend.script(.retryable(status: 422, code: "transaction_not_in_proof", retryAfter: nil))
        }
        func launch() -> PurchaseCoordinator {
            PurchaseCoordinator(
                queue: self.queue, backend: backend, store: store, proofs: proofs, clock: self.clock,
                configuration: .init(
                    retry: RetryPolicy(base: 10, cap: 100), purchaseTimeout: 30, logger: Collecting(lines: lines),
                    random: { 1 }))
        }
        let clock = self.clock!
        func cycles(_ coordinator: PurchaseCoordinator, _ count: Int) async {
            for _ in 0..<count {
                let before = backend.submissions.count
                await assertEventually {
                    clock.advance(20)
                    return backend.submissions.count > before
                }
            }
            await coordinator.idle()
        }
        let coordinator = launch()
        await coordinator.configure()
        await coordinator.login("alice")
        let fake = self.queue!
        fake.answer(.enqueued)
        let call = Task { try await coordinator.purchase(productId: "coins_60") }
        await assertEventually { fake.payments.count == 1 }
        fake.send(.transaction(fake.storeKit1(productId: "coins_60", token: fake.payments[0].token, id: "9")))
        let outcome = try await call.value
        XCTAssertEqual(outcome, .processing, "paid, the server's verdict to come")
        await cycles(coordinator, 10)
        XCTAssertEqual(refreshes.withValue { $0 }, 1, "once per launch and transaction")
        await coordinator.shutdown()
        // The next launch is in the background (a silent push, a background task): none at all.
        let background = launch()
        await background.configure()
        await background.setForeground(false)
        await background.login("alice")
        await cycles(background, 5)
        XCTAssertEqual(refreshes.withValue { $0 }, 1, "no sign-in sheet from the background")
        // In the foreground again: the one refresh this launch allows.
        await background.setForeground(true)
        await cycles(background, 5)
        XCTAssertEqual(refreshes.withValue { $0 }, 2)
        await background.shutdown()
    }
}

/// The fourth pass's HIGH: the SDK never fetched the account view — a subscriber on a new device,
/// after a reinstall or a logout and login, saw the paywall until they tapped Restore.
extension PurchaseCoordinatorTests {
    func testLoginLaunchAndAStaleForegroundFetchTheAccountView() async throws {
        // Bought on another device (or on the web, or granted by support): only the server knows.
        backend.state.withValue {
            $0.accounts["carol"] = CustomerInfo(accountId: "carol", balances: ["coins": 500])
        }
        let coordinator = try await started(login: "carol")
        let backend = self.backend!
        await assertEventually { await coordinator.cachedCustomerInfo()?.balances["coins"] == 500 }
        let fetched = backend.state.withValue { $0.customerInfoCalls }
        XCTAssertGreaterThanOrEqual(fetched, 1, "login asks the server, without Restore")
        // A foreground within the max age asks nothing more; past it, the view is fetched again.
        clock.advance(60)
        await coordinator.redrive(.foreground)
        await coordinator.idle()
        XCTAssertEqual(backend.state.withValue { $0.customerInfoCalls }, fetched)
        clock.advance(PurchaseCoordinator.accountViewMaxAge + 1)
        await coordinator.redrive(.foreground)
        await assertEventually { backend.state.withValue { $0.customerInfoCalls } == fetched + 1 }
        await coordinator.shutdown()
    }
}
