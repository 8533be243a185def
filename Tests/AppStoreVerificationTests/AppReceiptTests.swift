import AppStoreModels
import AppStoreSigning
import Foundation
import SwiftASN1
import Testing

@testable import AppStoreVerification

@Suite struct AppReceiptTests {
    static let created = Date(timeIntervalSince1970: 1_767_225_600)

    static func receipt(purchases: Int = 2, type: String = "ProductionSandbox", bundleId: String = TestPKI.bundleId)
        -> AppReceipt
    {
        var receipt = AppReceipt(
            inAppPurchases: (0..<purchases).map { index in
                AppReceiptInAppPurchase(
                    quantity: 1, productId: index % 2 == 0 ? "coins_60" : "pro_monthly",
                    transactionId: String(2_000_000_000_000_000 + index),
                    purchaseDate: created.addingTimeInterval(Double(-index)),
                    originalTransactionId: String(2_000_000_000_000_000 + index),
                    originalPurchaseDate: created.addingTimeInterval(Double(-index)),
                    subscriptionExpirationDate: index % 2 == 0 ? nil : created.addingTimeInterval(30 * 86_400),
                    webOrderLineItemId: index % 2 == 0 ? nil : String(9_000_000 + index),
                    isTrialPeriod: false, isInIntroOfferPeriod: false)
            })
        receipt.receiptType = type
        receipt.appItemId = TestPKI.appAppleId
        receipt.bundleId = bundleId
        receipt.applicationVersion = "42"
        receipt.opaqueValue = [1, 2, 3, 4]
        receipt.sha1Hash = Array(repeating: 7, count: 20)
        receipt.creationDate = created
        receipt.requestDate = created
        receipt.originalPurchaseDate = created.addingTimeInterval(-86_400)
        receipt.originalApplicationVersion = "1.0"
        return receipt
    }

    static var verifier: AppReceiptVerifier {
        try! AppReceiptVerifier(
            trustedRoots: [TestPKI.genuine.receiptRoot!.derBytes], bundleId: TestPKI.bundleId,
            environments: [.production, .sandbox])
    }

    @Test(arguments: [true, false])
    func signedReceiptRoundTrips(signedAttributes: Bool) async throws {
        let original = Self.receipt()
        let bytes = try TestPKI.genuine.receiptSigner!.sign(original, signedAttributes: signedAttributes)
        let parsed = try await Self.verifier.verify(bytes)
        #expect(parsed.bundleId == original.bundleId)
        #expect(parsed.receiptType == "ProductionSandbox")
        #expect(parsed.environment == .sandbox)
        #expect(parsed.appItemId == TestPKI.appAppleId)
        #expect(parsed.creationDate == Self.created)
        #expect(parsed.opaqueValue == [1, 2, 3, 4])
        #expect(parsed.inAppPurchases == original.inAppPurchases)
        #expect(parsed.bundleIdValueBytes?.first == 0x0C)  // the UTF8String TLV, as the device hash needs
        // Base64 with line breaks, as apps and support tickets send it.
        let wrapped = Data(bytes).base64EncodedString(options: .lineLength76Characters)
        #expect(try await Self.verifier.verify(base64: wrapped).inAppPurchases.count == 2)
    }

    @Test func tenThousandPurchasesParse() async throws {
        let bytes = try TestPKI.genuine.receiptSigner!.sign(Self.receipt(purchases: 10_000))
        let parsed = try await Self.verifier.verify(bytes)
        #expect(parsed.inAppPurchases.count == 10_000)
        #expect(parsed.inAppPurchases.last?.transactionId == "2000000000009999")
    }

    @Test func receiptJSONUsesApplesKeys() throws {
        let info = Self.receipt().receiptInfo
        let json = String(decoding: try JSONEncoder().encode(info), as: UTF8.self)
        #expect(json.contains("\"bundle_id\":\"com.example.app\""))
        #expect(json.contains("\"in_app\":["))
        #expect(json.contains("\"receipt_creation_date_ms\":\"1767225600000\""))
        #expect(json.contains("\"receipt_creation_date\":\"2026-01-01 00:00:00 Etc\\/GMT\""))
        #expect(json.contains("\"receipt_creation_date_pst\":\"2025-12-31 16:00:00 America\\/Los_Angeles\""))
    }

    @Test func forgedReceiptsAreRejected() async throws {
        let receipt = Self.receipt()
        // Signed by a chain this verifier does not trust.
        let stranger = try ApplePKI.generate(name: "Stranger")
        await expectFailure("invalid_chain") {
            _ = try await Self.verifier.verify(stranger.receiptSigner!.sign(receipt))
        }
        // Genuine signature, then one purchase added to the payload.
        var signed = try TestPKI.genuine.receiptSigner!.sign(receipt, signedAttributes: false)
        let payload = try AppReceiptEncoder.payload(receipt)
        let start = signed.firstRange(of: payload)!.lowerBound
        signed[start + payload.count - 3] ^= 0x01
        await expectFailure("invalid_signature") { _ = try await Self.verifier.verify(signed) }
        await expectFailure("wrong_bundle") {
            _ = try await Self.verifier.verify(TestPKI.genuine.receiptSigner!.sign(Self.receipt(bundleId: "com.evil")))
        }
        let productionOnly = try AppReceiptVerifier(
            trustedRoots: [TestPKI.genuine.receiptRoot!.derBytes], environments: [.production])
        await expectFailure("wrong_environment") {
            _ = try await productionOnly.verify(TestPKI.genuine.receiptSigner!.sign(receipt))
        }
        // Created before the signing certificate was valid.
        var early = receipt
        early.creationDate = Date(timeIntervalSince1970: 1_000_000_000)
        await expectFailure("invalid_chain") {
            _ = try await Self.verifier.verify(TestPKI.genuine.receiptSigner!.sign(early))
        }
    }

    @Test func hostileAndTruncatedDERIsAClearError() async throws {
        let good = try TestPKI.genuine.receiptSigner!.sign(Self.receipt())
        var inputs: [[UInt8]] = [
            [], [0x30], [0x30, 0x80], [0x30, 0x84, 0xFF, 0xFF, 0xFF, 0xFF],  // lying length
            [0x30, 0x89, 1, 2, 3, 4, 5, 6, 7, 8, 9],  // length of length too long
            [0x04, 0x00], [0x1F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x00],
            Array(repeating: 0x30, count: 4000),  // deep nesting, no lengths
            Array(good.prefix(good.count / 2)), good + [0x00], Array(good.dropLast()),
        ]
        // Deep but well-formed nesting.
        var nested: [UInt8] = [0x05, 0x00]
        for _ in 0..<200 { nested = [0x30, 0x80] + nested + [0x00, 0x00] }
        inputs.append(nested)
        // A huge count of empty elements inside a plausible container.
        let many: [UInt8] = (0..<2_000_000).map { $0 % 2 == 0 ? 0x30 : 0x00 }
        inputs.append([0x30, 0x83, 0x1E, 0x84, 0x80] + many)
        for input in inputs {
            await expectFailure("invalid_signature") { _ = try await Self.verifier.verify(input) }
        }
        for text in ["", "!!!!", "AAAA=AAA", String(repeating: "A", count: 50_000_000)] {
            await expectFailure("invalid_signature") { _ = try await Self.verifier.verify(base64: text) }
        }
    }

    @Test func hostilePayloadsAreClearErrors() throws {
        let payloads: [[UInt8]] = [
            [0x31, 0x00],  // empty receipt: fine, no purchases
            [0x31, 0x03, 0x30, 0x01, 0x02],  // attribute missing fields
            [0x31, 0x08, 0x30, 0x06, 0x02, 0x01, 0x11, 0x02, 0x01, 0x01],  // no value
            [0x31, 0x0A, 0x30, 0x08, 0x02, 0x01, 0x11, 0x02, 0x01, 0x01, 0x04, 0x00],  // in-app: empty value
            // bundle id as INTEGER
            [0x31, 0x0C, 0x30, 0x0A, 0x02, 0x01, 0x02, 0x02, 0x01, 0x01, 0x04, 0x02, 0x02, 0x01],
            [0x31, 0x0D, 0x30, 0x0B, 0x02, 0x01, 0x0C, 0x02, 0x01, 0x01, 0x04, 0x03, 0x16, 0x01, 0x78],  // date "x"
            [0x31, 0x0A, 0x30, 0x08, 0x02, 0x01, 0x11, 0x02, 0x01, 0x01, 0x04, 0x7F],  // lying inner length
            [0x30, 0x00],  // SEQUENCE, not SET
        ]
        #expect(try AppReceiptParser.parsePayload([0x31, 0x00][...]).inAppPurchases.isEmpty)
        for payload in payloads.dropFirst() {
            #expect(throws: AppReceiptParser.MalformedReceipt.self) { try AppReceiptParser.parsePayload(payload[...]) }
        }
        // Hundreds of thousands of purchases beyond the limit are refused before parsing.
        var many: [UInt8] = []
        for _ in 0..<2000 { many += [0x30, 0x08, 0x02, 0x01, 0x11, 0x02, 0x01, 0x01, 0x04, 0x00] }
        let set = [0x31, 0x82, UInt8(many.count >> 8), UInt8(many.count & 0xFF)] + many
        #expect(throws: AppReceiptParser.MalformedReceipt.self) {
            try AppReceiptParser.parsePayload(set[...], maxInAppPurchases: 100)
        }
    }

    @Test(arguments: [
        ("2018-11-13T16:46:31Z", 1_542_127_591.0), ("2021-04-16T10:59:33+0800", 1_618_541_973.0),
        ("2021-04-16T10:59:33-07:00", 1_618_595_973.0), ("2000-02-29T00:00:00.250Z", 951_782_400.25),
        ("1969-12-31T23:59:59Z", -1.0),
    ])
    func receiptDatesParse(text: String, epoch: Double) {
        #expect(RFC3339.parse(text)?.timeIntervalSince1970 == epoch)
    }

    @Test(arguments: [
        "", "2018-11-13", "2018-13-13T16:46:31Z", "2018-11-13T16:46:31", "2018-11-13T16:46:31Zjunk",
        "2018-11-13T25:46:31Z", "2018-11-13T16:46:31+9",
    ])
    func badReceiptDatesAreRejected(text: String) {
        #expect(RFC3339.parse(text) == nil)
    }
}

extension Array where Element == UInt8 {
    func firstRange(of other: [UInt8]) -> Range<Int>? {
        guard other.count <= count else { return nil }
        for start in 0...(count - other.count) where self[start..<(start + other.count)].elementsEqual(other) {
            return start..<(start + other.count)
        }
        return nil
    }
}
