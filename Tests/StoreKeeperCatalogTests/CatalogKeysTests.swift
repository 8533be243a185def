import Foundation
import Testing

@testable import StoreKeeperCatalog

/// A catalog typo is refused with "did you mean", like the configuration's (a mis-keyed
/// `storeProducts` turned every real purchase into an `unknown_product` anomaly), and the
/// example catalog shipped beside the example configuration loads.
@Suite struct CatalogKeysTests {
    static let base = "products:\n  - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 }KEY }\n"

    @Test(arguments: [
        (", storeProduct: { app_store: a }", "unknown key 'storeProduct'", "did you mean 'storeProducts'"),
        (", introductoryOfer: { discountType: free_trial, period: P1W }", "'introductoryOfer'", "'introductoryOffer'"),
        (", perid: P1M", "unknown key 'perid'", "did you mean 'period'"),
        (", storeProducts: { app_stor: a }", "unknown store 'app_stor'", "did you mean 'app_store'"),
        (", grants: { currency: coins, amout: 5 }", "grants", "did you mean 'amount'"),
        (", prices: { USA: { currency: USD, prise: 0.99 } }", "prices.USA", "did you mean 'price'"),
    ])
    func aTypoIsRefusedWithWhatItMeant(key: String, first: String, second: String) {
        let yaml = Self.base.replacingOccurrences(of: "KEY", with: key)
            .replacingOccurrences(of: "amount: 60 }, grants: { currency: coins, amout: 5 }", with: "amout: 5 }")
        #expect {
            _ = try Catalog.parse(yaml: yaml)
        } throws: { error in
            let text = "\(error)"
            return text.contains(first) && text.contains(second)
        }
    }

    @Test func aTypoAtTheTopAndInJSONIsRefusedToo() {
        #expect(throws: CatalogError.self) { _ = try Catalog.parse(yaml: "product:\n  - { id: a }\n") }
        #expect {
            _ = try Catalog.parse(
                json:
                    #"{"products":[{"id":"a","type":"consumable","grants":{"currency":"c","amount":1},"stroeProducts":{}}]}"#
            )
        } throws: { "\($0)".contains("did you mean 'storeProducts'") }
    }

    @Test func theExampleCatalogLoads() throws {
        let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("deploy/catalog.example.yaml")
        let catalog = try Catalog.load(path: file.path)
        #expect(catalog.products.map(\.id) == ["coins_100", "remove_ads", "vip_monthly", "season_pass"])
        #expect(
            catalog.product(store: "app_store", storeProductId: "com.example.game.vip_monthly")?.id == "vip_monthly")
    }
}

extension CatalogKeysTests {
    /// The key check never traps where Yams' own `load` would (a key that is not text), nor
    /// recurses without bound: hostile catalogs are errors.
    @Test func hostileCatalogsAreErrorsNotCrashes() {
        for yaml in [
            "{ {a: 1}: 2 }", "products:\n  - { [a]: 1 }", "? [a, b]\n: 1", "base: &b { id: 1 }\nproducts: [*b]",
            String(repeating: "[", count: 300) + String(repeating: "]", count: 300),
            "products:\n  - " + String(repeating: "{a: ", count: 100) + "1" + String(repeating: "}", count: 100),
        ] {
            #expect(throws: CatalogError.self, "\(yaml.prefix(40))") { _ = try Catalog.parse(yaml: yaml) }
        }
    }
}
