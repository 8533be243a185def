import Foundation
import StoreKeeperSupport

/// `productsv2.getproductpurchasev2`, read on every Google Play delivery, by `FastJSON`:
/// `JSONDecoder` was a tenth of a Google purchase's CPU. Whenever `init(fast:)` succeeds it
/// equals what `JSONDecoder` gives; anything it does not model throws and `JSONDecoder` reads
/// the body instead (and gives the error). Tests hold both to the same answer on mutated bodies.
extension ProductPurchaseV2 {
    public static func decode(json bytes: [UInt8]) throws -> ProductPurchaseV2 {
        if case .object(let fields)? = try? FastJSON.parse(bytes),
            let value = try? ProductPurchaseV2(fast: FastJSON.Fields(fields))
        {
            return value
        }
        return try JSONDecoder().decode(ProductPurchaseV2.self, from: Data(bytes))
    }

    init(fast f: FastJSON.Fields) throws {
        func int(_ fields: FastJSON.Fields, _ key: String) throws -> Int? {
            guard let value = try fields.int64(key) else { return nil }
            guard let narrow = Int(exactly: value) else { throw FastJSON.Fields.Unsupported() }
            return narrow
        }
        self.init()
        kind = try f.string("kind")
        switch f.values["productLineItem"] {
        case nil, .null?: productLineItem = nil
        case .array(let items)?:
            productLineItem = try items.map { item in
                guard case .object(let values) = item else { throw FastJSON.Fields.Unsupported() }
                let line = FastJSON.Fields(values)
                return LineItem(
                    productId: try line.string("productId"),
                    productOfferDetails: try line.object("productOfferDetails").map { offer in
                        var details = LineItem.OfferDetails(
                            purchaseOptionId: try offer.string("purchaseOptionId"),
                            offerId: try offer.string("offerId"),
                            quantity: try int(offer, "quantity"),
                            refundableQuantity: try int(offer, "refundableQuantity"),
                            consumptionState: try offer.string("consumptionState"))
                        details.offerTags = try offer.strings("offerTags")
                        return details
                    })
            }
        default: throw FastJSON.Fields.Unsupported()
        }
        purchaseStateContext = try f.object("purchaseStateContext").map {
            PurchaseStateContext(purchaseState: try $0.string("purchaseState"))
        }
        testPurchaseContext = try f.object("testPurchaseContext").map {
            TestPurchaseContext(fopType: try $0.string("fopType"))
        }
        orderId = try f.string("orderId")
        obfuscatedExternalAccountId = try f.string("obfuscatedExternalAccountId")
        obfuscatedExternalProfileId = try f.string("obfuscatedExternalProfileId")
        regionCode = try f.string("regionCode")
        purchaseCompletionTime = try f.string("purchaseCompletionTime")
        acknowledgementState = try f.string("acknowledgementState")
    }
}
