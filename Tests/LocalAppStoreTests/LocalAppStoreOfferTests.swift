import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Crypto
import Foundation
import StoreKeeperCatalog
import Testing

@testable import LocalAppStore

/// Offers, extensions and retention messages at the local App Store, on a frozen clock.
@Suite struct LocalAppStoreOfferTests {
    static let pki = LocalAppStoreEngineTests.pki
    static let key = P256.Signing.PrivateKey()
    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - id: pro_monthly
                type: auto_renewable
                group: pro
                period: P1M
                grants: { entitlement: pro }
                prices: { USA: { currency: USD, price: 4.99 } }
                offers:
                  - { id: promo, eligible: any_subscriber, discountType: pay_as_you_go, price: 1.99 }
                winBackOffers:
                  - { id: winback, discountType: pay_up_front, price: 0.99, period: P1M, paidAtLeast: P1M, churnedAtLeast: P1M }
            """)

    static func store() -> LocalAppStore {
        LocalAppStore(
            configuration: .init(
                catalog: catalog,
                offerKeys: [.init(issuerId: "issuer", keyId: "KEY1", publicKeyPEM: key.publicKey.pemRepresentation)]),
            pki: pki, clock: StoreClock(start: LocalAppStoreEngineTests.start, scale: 0))
    }

    @Test func winBackOffersAreListedForChurnedSubscribersAndRedeemedAsType4() async throws {
        let store = Self.store()
        let first = try await store.buy("wendy", items: [.init(productId: "pro_monthly")]).transactions[0]
        let original = try #require(first.originalTransactionId)
        func eligible() async throws -> [String] {
            let info = try await store.signRenewalInfo(original)
            let payload = try await LocalAppStoreEngineTests.verifier.verifyRenewalInfo(info)
            return payload.eligibleWinBackOfferIds ?? []
        }
        #expect(try await eligible().isEmpty, "subscribed")
        await store.advance(by: 32 * 86_400)  // one renewal: paid a month
        try await store.setAutoRenew(original, false)
        await store.advance(by: 31 * 86_400)  // expired
        #expect(await store.subscriptions[original]?.status == .expired)
        #expect(try await eligible().isEmpty, "churned less than a month ago")
        await #expect(throws: LocalAppStore.OfferRefusal.self) {
            _ = try await store.buy(
                "wendy", items: [.init(productId: "pro_monthly")], offers: .init(winBackOfferId: "winback"))
        }
        await store.advance(by: 32 * 86_400)
        #expect(try await eligible() == ["winback"])
        let back = try await store.buy(
            "wendy", items: [.init(productId: "pro_monthly")], offers: .init(winBackOfferId: "winback")
        ).transactions[0]
        #expect(back.offerType == .winBackOffer)
        #expect(back.offerIdentifier == "winback")
        #expect(back.price == 990)
        #expect(back.originalTransactionId == original)
    }

    @Test func aMassExtensionReportsFailuresAndASummary() async throws {
        let store = Self.store()
        var originals: [String] = []
        for customer in ["a", "b"] {
            originals.append(
                try #require(
                    try await store.buy(customer, items: [.init(productId: "pro_monthly")]).transactions[0]
                        .originalTransactionId))
        }
        // b has had its two extensions this year: Apple's limit.
        _ = try await store.extendRenewalDate(originals[1], days: 1, requestIdentifier: "r1")
        _ = try await store.extendRenewalDate(originals[1], days: 1, requestIdentifier: "r2")
        // A repeated request identifier is the same request: answered again, not applied.
        let again = try await store.extendRenewalDate(originals[1], days: 1, requestIdentifier: "r2")
        #expect(again.success == true)
        await #expect(throws: LocalAppStore.ExtensionRefusal.self) {
            _ = try await store.extendRenewalDate(originals[1], days: 1, requestIdentifier: "r3")
        }
        let id = UUID().uuidString
        try await store.massExtend(productId: "pro_monthly", days: 3, requestIdentifier: id, storefronts: nil)
        let status = try #require(await store.massExtensionStatus(id))
        #expect(status.complete == true && status.succeededCount == 1 && status.failedCount == 1)
        let tail = await store.notifications.suffix(3).map {
            "\($0.payload.notificationType?.rawValue ?? "")/\($0.payload.subtype?.rawValue ?? "")"
        }
        #expect(tail == ["RENEWAL_EXTENDED/", "RENEWAL_EXTENSION/FAILURE", "RENEWAL_EXTENSION/SUMMARY"])
        #expect(await store.notifications.last?.payload.summary?.succeededCount == 1)
    }

    /// A V2 JWS holds exactly the claims §2 lists, in JSON Foundation reads back the same (hostile
    /// characters included), and checks out under the key its `kid` names.
    @Test func v2OfferJWSHeaderAndClaims() throws {
        let signer = try OfferSigner(
            privateKeyPEM: Self.key.pemRepresentation, keyId: "KEY1", issuerId: "issuer/1", bundleId: "com.example.app")
        let checker = OfferSignatureChecker(keys: ["KEY1": Self.key.publicKey])
        let nonce = UUID()
        let hostile = "pro\"\\/\n\u{1}é😀"
        let promotional = try signer.promotionalOfferJWS(
            productId: hostile, offerId: "promo", transactionId: "2000000000000001", nonce: nonce,
            issuedAt: Date(timeIntervalSince1970: 1_767_225_600))
        let parts = promotional.split(separator: ".").map(String.init)
        let header = try JSONSerialization.jsonObject(with: Data(Base64.decodeURL(parts[0]) ?? [])) as? [String: String]
        #expect(header == ["alg": "ES256", "kid": "KEY1", "typ": "JWT"])
        let body = try JSONSerialization.jsonObject(with: Data(Base64.decodeURL(parts[1]) ?? [])) as? [String: Any]
        #expect(
            Set(body?.keys.map { $0 } ?? [])
                == ["iss", "iat", "aud", "bid", "nonce", "productId", "offerIdentifier", "transactionId"])
        let claims = checker.verifyV2(promotional)
        #expect(claims?.keyId == "KEY1" && claims?.iss == "issuer/1" && claims?.iat == 1_767_225_600)
        #expect(claims?.aud == "promotional-offer" && claims?.bid == "com.example.app")
        #expect(claims?.nonce == nonce.uuidString.lowercased() && claims?.productId == hostile)
        #expect(claims?.offerIdentifier == "promo" && claims?.transactionId == "2000000000000001")
        let eligibility = try signer.introductoryEligibilityJWS(
            productId: "pro_monthly", allowed: false, transactionId: "7", nonce: nonce, issuedAt: Date())
        let eligible = checker.verifyV2(eligibility)
        #expect(eligible?.aud == "introductory-offer-eligibility" && eligible?.allowIntroductoryOffer == false)
        #expect(eligible?.transactionId == "7" && eligible?.productId == "pro_monthly")
        var tampered = eligibility.split(separator: ".").map(String.init)
        tampered[2] = (tampered[2].hasPrefix("A") ? "B" : "A") + tampered[2].dropFirst()
        #expect(checker.verifyV2(tampered.joined(separator: ".")) == nil)
    }

    @Test func aPromotionalOfferRedeemedBySubscriberAppliesAtTheNextRenewal() async throws {
        let store = Self.store()
        let first = try await store.buy("pat", items: [.init(productId: "pro_monthly")]).transactions[0]
        let signer = try OfferSigner(
            privateKeyPEM: Self.key.pemRepresentation, keyId: "KEY1", issuerId: "issuer", bundleId: "com.example.app")
        let jws = try signer.promotionalOfferJWS(
            productId: "pro_monthly", offerId: "promo", transactionId: first.transactionId, nonce: UUID(),
            issuedAt: LocalAppStoreEngineTests.start)
        _ = try await store.buy(
            "pat", items: [.init(productId: "pro_monthly")], offers: .init(promotional: .init(id: "promo", jws: jws)))
        #expect(await store.notifications.last?.payload.notificationType == .offerRedeemed)
        await store.advance(by: 32 * 86_400)
        let renewal = await store.transactions.values.map(\.payload).first { $0.transactionReason == .renewal }
        #expect(renewal?.offerType == .promotionalOffer && renewal?.price == 1_990)
    }

    @Test func retentionMessagesFollowApplesRules() async throws {
        let store = Self.store()
        let id = UUID().uuidString.lowercased()
        try await store.uploadMessage(id, header: "Stay", body: "Please")
        await #expect(throws: LocalAppStore.RetentionRefusal(status: 409, code: 4_090_001)) {
            try await store.uploadMessage(id, header: "Stay", body: "Please")
        }
        await #expect(throws: LocalAppStore.RetentionRefusal(status: 400, code: 4_000_162)) {
            try await store.uploadMessage(UUID().uuidString, header: String(repeating: "h", count: 67), body: "b")
        }
        await #expect(throws: LocalAppStore.RetentionRefusal(status: 404, code: 4_040_015)) {
            try await store.setDefaultMessage(productId: "pro_monthly", locale: "en-US", messageId: "missing")
        }
        try await store.setDefaultMessage(productId: "pro_monthly", locale: "en-US", messageId: id)
        #expect(await store.defaultMessage(productId: "pro_monthly", locale: "en-US") == id)
        #expect(await store.messageList().map(\.messageState) == ["APPROVED"])
    }
}
