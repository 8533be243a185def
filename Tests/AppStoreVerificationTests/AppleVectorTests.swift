import AppStoreModels
import Foundation
import Testing

@testable import AppStoreVerification

/// Genuine Apple-signed data (Tests/Fixtures): accepted against Apple's
/// real roots at the signing date, rejected after any one-byte edit.
@Suite struct AppleVectorTests {
    static let transactionJWS = Fixtures.text("apple-transaction-sandbox-consumable.jws")
    static let receiptBase64 = Fixtures.text("apple-receipt-production.b64")

    func transactionVerifier(cache: Int = 64) throws -> SignedDataVerifier {
        try SignedDataVerifier(
            .init(bundleId: "com.goodheartapp", environments: [.sandbox], chainCacheCapacity: cache))
    }

    @Test func genuineTransactionVerifiesAtItsSigningDate() async throws {
        let payload = try await transactionVerifier().verifyTransaction(Self.transactionJWS)
        #expect(payload.bundleId == "com.goodheartapp")
        #expect(payload.productId == "gh_super_good_ticket_1")
        #expect(payload.transactionId == "2000000847061981")
        #expect(payload.type == .consumable)
        #expect(payload.price == 230000)
        #expect(payload.currency == "JPY")
        #expect(payload.signedDate == 1_739_161_772_561)
        #expect(payload.environment == .sandbox)
    }

    @Test func genuineReceiptVerifiesAtItsCreationDate() async throws {
        let verifier = try AppReceiptVerifier(bundleId: "org.getpure.pure-iphone", environments: [.production])
        let receipt = try await verifier.verify(base64: Self.receiptBase64)
        #expect(receipt.bundleId == "org.getpure.pure-iphone")
        #expect(receipt.applicationVersion == "15741")
        #expect(receipt.creationDate == Date(timeIntervalSince1970: 1_708_709_236))
        #expect(receipt.inAppPurchases.count == 4)
        #expect(receipt.inAppPurchases.first?.productId == "org.getpure.pure.Week")
        #expect(receipt.inAppPurchases.first?.transactionId == "340001196262039")
    }
}

enum Fixtures {
    static let directory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Fixtures")

    static func text(_ name: String) -> String {
        (try? String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
    }
}

/// One-byte edits of the genuine vectors.
@Suite struct AppleVectorEditTests {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Every character of the JWS replaced by another (a different byte where it matters):
    /// payload and signature exhaustively, header at a stride (each header edit costs a
    /// full chain verification).
    @Test func everyEditOfTheGenuineTransactionIsRejected() async throws {
        let verifier = try SignedDataVerifier(
            .init(bundleId: "com.goodheartapp", environments: [.sandbox]))
        let original = Array(AppleVectorTests.transactionJWS.utf8)
        _ = try await verifier.verifyTransaction(AppleVectorTests.transactionJWS)
        let firstDot = original.firstIndex(of: UInt8(ascii: "."))!
        var positions = Array(stride(from: 0, to: firstDot, by: 7)) + Array(firstDot..<original.count)
        positions.append(firstDot - 1)
        var accepted: [Int] = []
        for position in positions {
            var edited = original
            let current = edited[position]
            edited[position] = current == UInt8(ascii: ".") ? UInt8(ascii: "A") : Self.alphabet.first { $0 != current }!
            if (try? await verifier.verifyTransaction(String(decoding: edited, as: UTF8.self))) != nil {
                accepted.append(position)
            }
        }
        #expect(accepted.isEmpty, "edits accepted at \(accepted)")
    }

    /// Every byte of the genuine receipt changed (xor 0x01, then xor 0x80 for a second kind
    /// of edit); inside the embedded certificates every third byte, since each such edit costs
    /// a full chain verification.
    @Test func everyEditOfTheGenuineReceiptIsRejected() async throws {
        let verifier = try AppReceiptVerifier(bundleId: "org.getpure.pure-iphone", environments: [.production])
        let original = [UInt8](Data(base64Encoded: AppleVectorTests.receiptBase64)!)
        _ = try await verifier.verify(original)
        // Offsets 2372..<6186 hold the three certificates (openssl asn1parse of the vector).
        let certificates = 2372..<6186
        var accepted: [Int] = []
        for position in original.indices where !certificates.contains(position) || position % 3 == 0 {
            for mask: UInt8 in [0x01, 0x80] {
                var edited = original
                edited[position] ^= mask
                if (try? await verifier.verify(edited)) != nil { accepted.append(position) }
            }
        }
        #expect(accepted.isEmpty, "edits accepted at byte offsets \(accepted.prefix(20)) (\(accepted.count) total)")
    }

    @Test func genuineDataFailsWithWrongExpectations() async throws {
        await expectFailure("wrong_bundle") {
            _ = try await SignedDataVerifier(.init(bundleId: "com.other", environments: [.sandbox]))
                .verifyTransaction(AppleVectorTests.transactionJWS)
        }
        await expectFailure("wrong_environment") {
            _ = try await SignedDataVerifier(.init(bundleId: "com.goodheartapp", environments: [.production]))
                .verifyTransaction(AppleVectorTests.transactionJWS)
        }
        // Apple Inc. Root does not anchor JWS; G3 does not anchor receipts.
        await expectFailure("invalid_chain") {
            _ = try await SignedDataVerifier(
                .init(trustedRoots: [AppleRootCertificates.appleIncRootDER], environments: nil)
            ).verifyTransaction(AppleVectorTests.transactionJWS)
        }
        await expectFailure("invalid_chain") {
            _ = try await AppReceiptVerifier(trustedRoots: [AppleRootCertificates.appleRootCAG3DER])
                .verify(base64: AppleVectorTests.receiptBase64)
        }
        // Today the genuine leaves have expired: validating "now" rejects them.
        await expectFailure("invalid_chain") {
            _ = try await SignedDataVerifier(.init(environments: nil, validationTime: .now))
                .verifyTransaction(AppleVectorTests.transactionJWS)
        }
        await expectFailure("wrong_bundle") {
            _ = try await AppReceiptVerifier(bundleId: "com.other").verify(base64: AppleVectorTests.receiptBase64)
        }
        await expectFailure("wrong_environment") {
            _ = try await AppReceiptVerifier(environments: [.sandbox]).verify(base64: AppleVectorTests.receiptBase64)
        }
    }
}
