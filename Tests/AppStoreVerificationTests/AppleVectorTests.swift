import AppStoreModels
import Foundation
import Testing

@testable import AppStoreVerification

/// Genuine Apple-signed data (Tests/Fixtures, from shared/vectors): accepted against Apple's
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
