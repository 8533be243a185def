import Foundation
import StoreKeeperCatalog
import Testing

@Suite struct CatalogTests {
    static let apiSample = """
        products:
          - id: coins_60
            type: consumable            # consumable | non_consumable | auto_renewable | non_renewing
            grants: { currency: coins, amount: 60 }     # credited × quantity
          - id: remove_ads
            type: non_consumable
            grants: { entitlement: no_ads }
          - id: pro_monthly
            type: auto_renewable
            group: pro
            grants: { entitlement: pro }
          - id: season_pass
            type: non_renewing
            duration: P30D
            grants: { entitlement: season }
        """

    @Test func apiMdSampleParses() throws {
        let catalog = try Catalog.parse(yaml: Self.apiSample)
        #expect(catalog.products.map(\.id) == ["coins_60", "remove_ads", "pro_monthly", "season_pass"])
        #expect(catalog.product("coins_60")?.grants == .init(currency: "coins", amount: 60))
        #expect(catalog.product("pro_monthly")?.type == .autoRenewable)
        #expect(catalog.product("season_pass")?.duration == ISODuration(days: 30))
        #expect(catalog.group("pro").map(\.id) == ["pro_monthly"])
        #expect(catalog.product("nope") == nil)
    }

    @Test func jsonAndFilesByExtension() throws {
        let json =
            #"{"products":[{"id":"gems","type":"consumable","grants":{"currency":"gems","amount":5},"prices":{"JPN":{"currency":"JPY","price":300}}}]}"#
        let catalog = try Catalog.parse(json: json)
        #expect(catalog.product("gems")?.price(in: "JPN").milliunits == 300_000)
        #expect(catalog.product("gems")?.price(in: "DEU") == .init(currency: "USD", price: Decimal(string: "0.99")!))
        let directory = FileManager.default.temporaryDirectory
        let jsonFile = directory.appendingPathComponent("catalog-\(UUID()).json")
        let yamlFile = directory.appendingPathComponent("catalog-\(UUID()).yml")
        try Data(json.utf8).write(to: jsonFile)
        try Data(Self.apiSample.utf8).write(to: yamlFile)
        #expect(try Catalog.load(path: jsonFile.path).products.count == 1)
        #expect(try Catalog.load(path: yamlFile.path).products.count == 4)
        #expect(throws: CatalogError.self) { try Catalog.load(path: "/nonexistent.yaml") }
        #expect(throws: CatalogError.self) { try Catalog.load(path: jsonFile.path + ".txt") }
    }

    @Test(arguments: [
        (
            "products: [{id: a, type: gift, grants: {entitlement: x}}]",
            "'gift' is not one of consumable, non_consumable"
        ),
        (
            "products: [{id: a, type: auto_renewable, group: g, grants: {entitlement: x}, offers: [{id: o, eligible: lapsd}]}]",
            "'lapsd' is not one of lapsed, active, any_subscriber"
        ),
        (
            "products: [{id: a, type: consumable, grants: {currency: c, amount: 1}}]\nrefunds: {preference: [{name: r, preference: refuse}]}",
            "'refuse' is not one of decline, grant_full, grant_prorated"
        ),
        ("products: [{id: a, type: auto_renewable, grants: {entitlement: x}}]", "group"),
        ("products: [{id: a, type: non_renewing, grants: {entitlement: x}}]", "duration"),
        ("products: [{id: a, type: consumable, grants: {}}]", "grants"),
        ("products: [{id: a, type: consumable, grants: {currency: coins}}]", "amount"),
        ("products: [{id: a, type: consumable, grants: {currency: coins, amount: 0}}]", "amount"),
        (
            "products: [{id: a, type: consumable, grants: {entitlement: x}}, {id: a, type: consumable, grants: {entitlement: y}}]",
            "duplicate"
        ),
        ("products: [{id: a, type: non_renewing, duration: P1X, grants: {entitlement: x}}]", "P1X"),
        ("products: [{type: consumable, grants: {entitlement: x}}]", "id"),
        ("products: 5", "products"),
        ("{", "not valid"),
        ("products: [{id: '', type: consumable, grants: {entitlement: x}}]", "id"),
    ])
    func invalidCatalogsSayWhatIsWrong(yaml: String, mention: String) {
        do {
            _ = try Catalog.parse(yaml: yaml)
            Issue.record("accepted: \(yaml)")
        } catch {
            #expect("\(error)".contains(mention), "\(error)")
        }
    }

    @Test func isoDurations() {
        #expect(ISODuration("P1M") == ISODuration(months: 1))
        #expect(
            ISODuration("P1Y2M3DT4H5M6S") == ISODuration(years: 1, months: 2, days: 3, hours: 4, minutes: 5, seconds: 6)
        )
        #expect(ISODuration("P2W") == ISODuration(days: 14))
        #expect(ISODuration("PT5M")?.description == "PT5M")
        for bad in ["", "P", "PT", "1M", "P1", "PM", "P0D", "P1H", "PT1D", "P1MT", "P-1D", "P9999999D"] {
            #expect(ISODuration(bad) == nil, "\(bad)")
        }
        let jan31 = Date(timeIntervalSince1970: 1_769_817_600)  // 2026-01-31
        #expect(ISODuration(months: 1).added(to: jan31) == Date(timeIntervalSince1970: 1_772_236_800))  // 2026-02-28
    }
}

/// The catalog's offers and retention rules (docs/api.md "Product catalog").
@Suite struct CatalogOfferTests {
    static let valid = """
        products:
          - id: pro_monthly
            type: auto_renewable
            group: pro
            grants: { entitlement: pro }
            offers:
              - { id: comeback_50, eligible: lapsed, lapsedAtLeast: P30D, maxPerAccount: 1 }
        retention:
          - when: { productId: pro_monthly, sample: 0.5 }
            promotionalOffer: { messageId: "22222222-2222-2222-2222-222222222222", offerId: comeback_50 }
          - message: { messageId: "33333333-3333-3333-3333-333333333333" }
          - id: season_pass
            type: non_renewing
            duration: P30D
            grants: { entitlement: season }
        """

    @Test func apiMdsExampleParsesWithTheProductListedAfterTheRules() throws {
        let catalog = try Catalog.parse(yaml: Self.valid)
        #expect(catalog.products.map(\.id) == ["pro_monthly", "season_pass"])
        #expect(catalog.retention.count == 2)
        #expect(catalog.offer("comeback_50", of: "pro_monthly")?.maxPerAccount == 1)
        #expect(catalog.retentionRuleName(1) == "rule-2")
    }

    @Test(arguments: [
        ("offers:\n      - { id: a, eligible: sometimes }", "eligible"),
        ("offers:\n      - { id: a, eligible: active, lapsedAtLeast: P1D }", "lapsedAtLeast needs"),
        ("offers:\n      - { id: a, eligible: lapsed, maxPerAccount: 0 }", "maxPerAccount"),
        ("offers:\n      - { id: a, eligible: lapsed }\n      - { id: a, eligible: active }", "used twice"),
        (
            "winBackOffers:\n      - { id: w, discountType: pay_up_front, period: P1M, maxPerAccount: 0 }",
            "win-back offer 'w': maxPerAccount"
        ),
        ("offerCodes:\n      - { id: C, maxPerAccount: 0 }", "offer code 'C': maxPerAccount"),
        ("offerCodes:\n      - { id: C }\n      - { id: C }", "used twice"),
        ("offerCodes:\n      - { id: \"\" }", "is empty"),
    ])
    func badOffersAreRefusedNamingTheProblem(offers: String, expected: String) {
        let yaml = """
            products:
              - id: pro
                type: auto_renewable
                group: g
                grants: { entitlement: pro }
                \(offers)
            """
        #expect {
            _ = try Catalog.parse(yaml: yaml)
        } throws: { error in
            "\(error)".contains(expected)
        }
    }

    @Test(arguments: [
        ("- { message: { messageId: not-a-uuid } }", "UUID"),
        ("- { when: { sample: 2 }, message: { messageId: \"33333333-3333-3333-3333-333333333333\" } }", "sample"),
        (
            "- { promotionalOffer: { messageId: \"33333333-3333-3333-3333-333333333333\", offerId: none } }",
            "no product has"
        ),
        (
            "- { when: { productId: coins }, message: { messageId: \"33333333-3333-3333-3333-333333333333\" } }",
            "not an auto_renewable"
        ),
        (
            "- { alternateProduct: { messageId: \"33333333-3333-3333-3333-333333333333\", productId: coins } }",
            "not an auto_renewable"
        ),
        ("- { }", "exactly one"),
    ])
    func badRetentionRulesAreRefused(rule: String, expected: String) {
        let yaml = """
            products:
              - { id: pro, type: auto_renewable, group: g, grants: { entitlement: pro } }
              - { id: coins, type: consumable, grants: { currency: c, amount: 1 } }
            retention:
              \(rule)
            """
        #expect {
            _ = try Catalog.parse(yaml: yaml)
        } throws: { error in
            "\(error)".contains(expected)
        }
    }

    @Test func offersOnAOneTimeProductAreRefused() {
        #expect(throws: CatalogError.self) {
            _ = try Catalog.parse(
                yaml: """
                    products:
                      - { id: c, type: consumable, grants: { currency: c, amount: 1 }, offers: [{ id: a, eligible: lapsed }] }
                    """)
        }
    }

    @Test func eachStoresProductIdMapsToOneProduct() throws {
        let catalog = try Catalog.parse(
            yaml: """
                products:
                  - id: pro_monthly
                    type: auto_renewable
                    group: pro
                    grants: { entitlement: pro }
                    storeProducts: { app_store: com.x.pro_monthly, google_play: pro.monthly }
                  - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
                """)
        #expect(catalog.product("com.x.pro_monthly")?.id == "pro_monthly")
        #expect(catalog.product(store: "google_play", storeProductId: "pro.monthly")?.id == "pro_monthly")
        #expect(catalog.product(store: "google_play", storeProductId: "coins_60")?.id == "coins_60")
        #expect(catalog.product(store: "google_play", storeProductId: "pro_monthly") == nil)
        for bad in [
            "storeProducts: { amazon: x }", "storeProducts: { google_play: \"\" }",
        ] {
            #expect(throws: CatalogError.self) {
                _ = try Catalog.parse(
                    yaml: "products:\n  - { id: a, type: consumable, grants: { currency: c, amount: 1 }, \(bad) }")
            }
        }
        #expect(throws: CatalogError.self) {
            _ = try Catalog.parse(
                yaml: """
                    products:
                      - { id: a, type: consumable, grants: { currency: c, amount: 1 }, storeProducts: { google_play: x } }
                      - { id: b, type: consumable, grants: { currency: c, amount: 1 }, storeProducts: { google_play: x } }
                    """)
        }
    }
}
