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
        XCTAssertEqual(outcome, .pending)
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
}
