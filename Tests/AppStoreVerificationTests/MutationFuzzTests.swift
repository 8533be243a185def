import AppStoreModels
import AppStoreSigning
import Foundation
import Testing

@testable import AppStoreVerification

/// Seeded random mutations of valid inputs: every outcome is a typed failure or the original
/// payload, never a crash, a hang or another payload.
@Suite struct MutationFuzzTests {
    struct SplitMix64: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    static func mutate(_ input: [UInt8], using rng: inout SplitMix64, alphabet: [UInt8]? = nil) -> [UInt8] {
        var bytes = input
        func randomByte() -> UInt8 { alphabet?.randomElement(using: &rng) ?? UInt8.random(in: 0...255, using: &rng) }
        let rounds = Int.random(in: 1...3, using: &rng)
        for _ in 0..<rounds where !bytes.isEmpty {
            let position = Int.random(in: 0..<bytes.count, using: &rng)
            switch Int.random(in: 0..<7, using: &rng) {
            case 0: bytes[position] ^= UInt8(1 << Int.random(in: 0..<8, using: &rng))
            case 1: bytes[position] = randomByte()
            case 2:
                bytes.insert(
                    contentsOf: (0..<Int.random(in: 1...8, using: &rng)).map { _ in randomByte() }, at: position)
            case 3: bytes.removeSubrange(position..<min(bytes.count, position + Int.random(in: 1...64, using: &rng)))
            case 4: bytes = Array(bytes.prefix(position))
            case 5:
                let end = min(bytes.count, position + Int.random(in: 1...128, using: &rng))
                bytes.insert(contentsOf: bytes[position..<end], at: position)
            default:
                let other = Int.random(in: 0..<bytes.count, using: &rng)
                bytes.swapAt(position, other)
            }
        }
        return bytes
    }

    @Test func mutatedJWSNeverCrashesOrChangesThePayload() async throws {
        let verifier = try TestPKI.verifier()
        let original = TestPKI.transaction()
        let jws = Array(try TestPKI.genuine.jwsSigner.sign(original).utf8)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ {}\"".utf8)
        var rng = SplitMix64(state: 0x5EED_0001)
        var rejected = 0
        for iteration in 0..<3000 {
            let mutated = Self.mutate(jws, using: &rng, alphabet: iteration % 3 == 0 ? nil : alphabet)
            do {
                let payload = try await verifier.verifyTransaction(String(decoding: mutated, as: UTF8.self))
                #expect(payload == original, "a mutation produced a different accepted payload")
            } catch is VerificationFailure {
                rejected += 1
            } catch {
                Issue.record("untyped error \(error)")
            }
        }
        #expect(rejected > 2900)
    }

    @Test func mutatedNotificationsNeverCrash() async throws {
        let verifier = try TestPKI.verifier()
        let signer = TestPKI.genuine.jwsSigner
        let notification = ResponseBodyV2DecodedPayload(
            notificationType: .oneTimeCharge, notificationUUID: "n-1", version: "2.0", signedDate: TestPKI.signedDate,
            data: NotificationData(
                appAppleId: TestPKI.appAppleId, bundleId: TestPKI.bundleId, environment: .sandbox,
                signedTransactionInfo: try signer.sign(TestPKI.transaction())))
        let bytes = Array(try signer.sign(notification).utf8)
        var rng = SplitMix64(state: 0x5EED_0002)
        for _ in 0..<1000 {
            let mutated = Self.mutate(bytes, using: &rng)
            do {
                let verified = try await verifier.verifyNotification(String(decoding: mutated, as: UTF8.self))
                #expect(verified.payload == notification)
            } catch is VerificationFailure {
            } catch {
                Issue.record("untyped error \(error)")
            }
        }
    }

    @Test func mutatedReceiptsNeverCrashOrChangeThePurchases() async throws {
        let receipt = AppReceiptTests.receipt(purchases: 3)
        let signedWith = try TestPKI.genuine.receiptSigner!.sign(receipt)
        let signedWithout = try TestPKI.genuine.receiptSigner!.sign(receipt, signedAttributes: false)
        let verifier = AppReceiptTests.verifier
        var rng = SplitMix64(state: 0x5EED_0003)
        for iteration in 0..<1500 {
            let mutated = Self.mutate(iteration % 2 == 0 ? signedWith : signedWithout, using: &rng)
            do {
                let parsed = try await verifier.verify(mutated)
                #expect(parsed.inAppPurchases == receipt.inAppPurchases)
                #expect(parsed.bundleId == receipt.bundleId)
            } catch is VerificationFailure {
            } catch {
                Issue.record("untyped error \(error)")
            }
        }
    }

    @Test func mutatedPayloadDERNeverCrashesTheParser() throws {
        let payload = try AppReceiptEncoder.payload(AppReceiptTests.receipt(purchases: 5))
        var rng = SplitMix64(state: 0x5EED_0004)
        for _ in 0..<5000 {
            let mutated = Self.mutate(payload, using: &rng)
            do {
                _ = try AppReceiptParser.parsePayload(mutated[...])
            } catch is AppReceiptParser.MalformedReceipt {
            } catch {
                Issue.record("untyped error \(error)")
            }
        }
    }

    @Test func randomBytesNeverCrashTheBudgetScan() {
        var rng = SplitMix64(state: 0x5EED_0005)
        for _ in 0..<20_000 {
            let bytes = (0..<Int.random(in: 0...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            _ = try? ASN1Budget.check(bytes[...], maxNodes: 100)
        }
    }
}
