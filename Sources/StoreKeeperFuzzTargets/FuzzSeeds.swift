import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import LocalAppStore
import StoreKeeperCatalog
import StoreKeeperServer

/// The seed corpus: valid inputs of every target, signed by a fresh local App Store (whose
/// roots go to `trust/`) plus Apple's genuine vectors, so mutation starts from inputs that pass
/// every check. Written once by `storekeeper-fuzz seeds DIR` and committed under `Fuzz/`.
public enum FuzzSeeds {
    public static func write(to directory: URL, genuineVectors: URL?) async throws {
        let pki = try ApplePKI.generate(name: "StoreKeeper Fuzz Seeds")
        let store = LocalAppStore(configuration: .init(catalog: .demo), pki: pki)
        var jws: [String: String] = [:]
        var receipts: [String: [UInt8]] = [:]

        let coins = try await store.buy("fuzz@example.com", items: [.init(productId: "coins_60", quantity: 2)])
        jws["transaction-consumable"] = coins.signedTransactions[0]
        receipts["receipt-one"] = coins.receipt
        let merged = try await store.buy(
            "fuzz@example.com", items: [.init(productId: "coins_300"), .init(productId: "remove_ads")],
            appAccountToken: UUID())
        jws["transaction-merged"] = merged.signedTransactions[1]
        receipts["receipt-merged"] = merged.receipt
        let pro = try await store.buy("fuzz-sub@example.com", items: [.init(productId: "pro_monthly")])
        jws["transaction-subscription"] = pro.signedTransactions[0]
        receipts["receipt-subscription"] = pro.receipt
        await store.advance(by: 40 * 86_400)
        await store.processDueEvents()
        try await store.refund(merged.transactions[0].transactionId ?? "")
        _ = try await store.sendTestNotification()
        for (index, sent) in await store.notifications.enumerated() {
            let kind = sent.payload.notificationType?.rawValue.lowercased() ?? "unknown"
            jws["notification-\(index)-\(kind)"] = sent.signedPayload
            for (name, nested) in Self.nested(in: sent.payload) { jws["notification-\(index)-\(name)"] = nested }
        }

        if let genuineVectors {
            if let text = try? String(
                contentsOf: genuineVectors.appendingPathComponent(
                    "apple-transaction-sandbox-consumable.jws"), encoding: .utf8)
            {
                jws["apple-transaction-sandbox-consumable"] = text.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            if let text = try? String(
                contentsOf: genuineVectors.appendingPathComponent(
                    "apple-receipt-production.b64"), encoding: .utf8),
                let bytes = Data(base64Encoded: text.trimmingCharacters(in: .whitespacesAndNewlines))
            {
                receipts["apple-receipt-production"] = [UInt8](bytes)
            }
        }

        let corpus = directory.appendingPathComponent("corpus")
        var roots = ["jws-root.der": pki.root.derBytes]
        roots["receipt-root.der"] = pki.receiptRoot?.derBytes
        try write(directory.appendingPathComponent("trust"), roots)
        try write(corpus.appendingPathComponent("jws"), jws.mapValues { Array($0.utf8) })
        try write(
            corpus.appendingPathComponent("payload"),
            jws.compactMapValues { text in
                let parts = text.split(separator: ".", omittingEmptySubsequences: false)
                return parts.count == 3 ? Self.base64URL(parts[1]) : nil
            })
        var receiptSeeds = receipts
        for (name, bytes) in receipts { receiptSeeds["\(name)-base64"] = Array(Data(bytes).base64EncodedString().utf8) }
        // The inner ASN.1 set, as the parser sees it after a good signature.
        let receiptVerifier = try AppReceiptVerifier(
            trustedRoots: [AppleRootCertificates.appleIncRootDER] + (pki.receiptRoot.map { [$0.derBytes] } ?? []),
            environments: nil)
        for (name, bytes) in receipts {
            if let receipt = try? await receiptVerifier.verify(bytes) {
                receiptSeeds["\(name)-payload"] = try AppReceiptEncoder.payload(receipt)
            }
        }
        try write(corpus.appendingPathComponent("receipt"), receiptSeeds)
        try write(corpus.appendingPathComponent("requests"), requestSeeds(jws: jws, receipt: receipts["receipt-one"]))
        let catalogYAML = try Self.demoCatalogYAML()
        try write(
            corpus.appendingPathComponent("catalog"),
            ["demo.yaml": Array(catalogYAML.utf8), "demo.json": Array(Self.demoCatalogJSON.utf8)])
        try write(
            corpus.appendingPathComponent("config"),
            [
                "production.yaml": Array(Self.productionConfig.utf8),
                "inline-catalog.yaml": Array((Self.productionConfig + Self.inlineCatalog).utf8),
                "json.json": Array(
                    #"{"http":{"port":8080},"database":{"url":"sqlite:/tmp/fuzz.sqlite"},"apple":{"bundleId":"com.example.app","appAppleId":1234567890}}"#
                        .utf8),
            ])
    }

    static func base64URL(_ text: Substring) -> [UInt8]? {
        Base64.decodeURL(text)
    }

    static func nested(in payload: ResponseBodyV2DecodedPayload) -> [String: String] {
        var found: [String: String] = [:]
        if let data = payload.data {
            if let transaction = data.signedTransactionInfo { found["transaction"] = transaction }
            if let renewal = data.signedRenewalInfo { found["renewal"] = renewal }
        }
        return found
    }

    static func requestSeeds(jws: [String: String], receipt: [UInt8]?) -> [String: [UInt8]] {
        func body(_ name: String, _ json: String) -> [UInt8] {
            [UInt8(RequestBodies.names.firstIndex(of: name)!)] + Array(json.utf8)
        }
        let transaction = jws["transaction-consumable"] ?? "a.b.c"
        let notification = jws.first { $0.key.hasPrefix("notification-") && !$0.key.hasSuffix("transaction") }?.value
        return [
            "order": body("order", #"{"accountId":"player-1","productId":"coins_60","quantity":2}"#),
            "order-offer": body(
                "order",
                #"{"accountId":"player-1","productId":"pro_monthly","offerId":"winback","appTransactionId":"7042"}"#),
            "purchase-jws": body(
                "purchase", #"{"accountId":"player-1","orderId":"o-1","signedTransaction":"\#(transaction)"}"#),
            "purchase-receipt": body(
                "purchase",
                #"{"accountId":"player-1","receipt":"\#(Data(receipt ?? []).base64EncodedString())"}"#),
            "purchase-id": body("purchase", #"{"accountId":"player-1","transactionId":"2000000000000001"}"#),
            "debit": body("debit", #"{"amount":60,"idempotencyKey":"spend-1"}"#),
            "notification": body("notification", #"{"signedPayload":"\#(notification ?? "a.b.c")"}"#),
            "resolve": body("resolve", #"{"action":"deliver","accountId":"player-2","note":"checked the receipt"}"#),
            "retention": body("retention", #"{"signedPayload":"a.b.c"}"#),
            "extend": body("extend", #"{"days":7,"reason":"service_issue","note":"outage"}"#),
            "mass-extend": body("massExtend", #"{"productId":"pro_monthly","days":3,"reason":"other"}"#),
            "grant": body("grant", #"{"entitlement":"pro","expiresAt":"2030-01-01T00:00:00Z","note":"goodwill"}"#),
        ]
    }

    static func demoCatalogYAML() throws -> String {
        """
        products:
          - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 }, prices: { USA: { currency: USD, price: 0.99 } } }
          - { id: remove_ads, type: non_consumable, grants: { entitlement: no_ads } }
          - id: pro_monthly
            type: auto_renewable
            group: pro
            period: P1M
            grants: { entitlement: pro }
            offers:
              - { id: comeback_50, eligible: lapsed, lapsedAtLeast: P30D, maxPerAccount: 1 }
              - { id: stay_20, eligible: active }
          - { id: pro_yearly, type: auto_renewable, group: pro, period: P1Y, grants: { entitlement: pro } }
          - { id: season_pass, type: non_renewing, duration: P30D, grants: { entitlement: season } }
        retention:
          - id: yearly-switch
            when: { productId: pro_yearly }
            alternateProduct: { messageId: 5a0b5e46-0d5c-4a4f-9d8e-0c7f3a4e2b11, productId: pro_monthly }
          - id: monthly-offer
            when: { productId: pro_monthly, tenureAtLeast: P6M, sample: 0.8 }
            promotionalOffer: { messageId: 0f6a3c2e-51b4-4a8e-b0a2-7c9d7c1e9f20, offerId: stay_20 }
          - message: { messageId: 9b1f2d3c-4e5a-4b6c-8d7e-1f2a3b4c5d6e }

        """
    }

    static let demoCatalogJSON = #"""
        {"products":[{"id":"coins_60","type":"consumable","grants":{"currency":"coins","amount":60}},
        {"id":"pro_monthly","type":"auto_renewable","group":"pro","period":"P1M","grants":{"entitlement":"pro"}}]}
        """#

    static let productionConfig = """
        http: { host: 127.0.0.1, port: 8080 }
        database: { url: "sqlite:/tmp/storekeeper-fuzz.sqlite" }
        apple:
          bundleId: com.example.app
          appAppleId: 1234567890
          environments: [Production, Sandbox]
        auth:
          secretKeys: [sk_fuzz_0123456789abcdef0123456789abcdef]

        """

    static let inlineCatalog = """
        catalog:
          products:
            - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 } }
            - { id: pro_monthly, type: auto_renewable, group: pro, grants: { entitlement: pro } }

        """

    static func write(_ directory: URL, _ files: [String: [UInt8]]) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        for (name, bytes) in files {
            try Data(bytes).write(to: directory.appendingPathComponent(name))
        }
    }
}
