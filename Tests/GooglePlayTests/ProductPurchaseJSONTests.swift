import Foundation
import Testing

@testable import GooglePlay

/// The local Google Play writes a one-time purchase's JSON by hand: the same bytes as
/// `JSONEncoder` with sorted keys, for every field present or absent and any text.
@Suite struct ProductPurchaseJSONTests {
    static func encoded(_ value: ProductPurchaseV2) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return [UInt8](try encoder.encode(value))
    }

    @Test func everyFieldIsWrittenAsJSONEncoderWritesIt() throws {
        var full = ProductPurchaseV2()
        full.kind = "androidpublisher#productPurchaseV2"
        full.orderId = "GPA.3302-1234-5678-90123"
        full.obfuscatedExternalAccountId = "u\"42\\ /\n\t\u{1}e\u{301}🇫🇷"
        full.obfuscatedExternalProfileId = ""
        full.regionCode = "US"
        full.purchaseCompletionTime = "2026-11-29T01:02:03.456Z"
        full.acknowledgementState = AcknowledgementState.pending
        full.purchaseStateContext = .init(purchaseState: ProductPurchaseV2.purchased)
        full.testPurchaseContext = .init(fopType: "TEST")
        var details = ProductPurchaseV2.LineItem.OfferDetails(
            purchaseOptionId: "legacy", offerId: "o1", quantity: 5, refundableQuantity: 4,
            consumptionState: "CONSUMPTION_STATE_YET_TO_BE_CONSUMED")
        details.offerTags = ["a", "b\"c"]
        full.productLineItem = [
            .init(productId: "coins_60", productOfferDetails: details),
            .init(productId: nil, productOfferDetails: nil),
        ]
        #expect(full.json == (try Self.encoded(full)))
        let empty = ProductPurchaseV2()
        #expect(empty.json == (try Self.encoded(empty)))
        var sparse = ProductPurchaseV2()
        sparse.productLineItem = []
        sparse.purchaseStateContext = .init(purchaseState: nil)
        #expect(sparse.json == (try Self.encoded(sparse)))
        #expect(try JSONDecoder().decode(ProductPurchaseV2.self, from: Data(full.json)) == full)
    }
}
