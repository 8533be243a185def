import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperCatalog
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// Offers on `POST /v1/orders` (docs/api.md, docs/offers-and-retention.md): signed by policy on the real
/// server, checked and redeemed at the local App Store as Apple would, then delivered with the
/// offer linked to its order — SQLite and PostgreSQL.
@Suite struct OfferTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - id: coins_60
                type: consumable
                grants: { currency: coins, amount: 60 }
                offerCodes: [{ id: SPRING_COINS, maxPerAccount: 1 }]
              - id: pro_monthly
                type: auto_renewable
                group: pro
                period: P1M
                grants: { entitlement: pro }
                prices: { USA: { currency: USD, price: 4.99 } }
                introductoryOffer: { discountType: free_trial, period: P1W }
                offers:
                  - { id: comeback, eligible: lapsed, maxPerAccount: 1, discountType: pay_as_you_go, price: 1.99 }
                  - { id: longgone, eligible: lapsed, lapsedAtLeast: P30D }
                  - { id: stay, eligible: active }
                  - { id: anyone, eligible: any_subscriber, discountType: pay_up_front, price: 0.49, period: P3M }
                winBackOffers:
                  - { id: winback, discountType: pay_up_front, price: 0.99, period: P1M, maxPerAccount: 1 }
              - { id: pro_yearly, type: auto_renewable, group: pro, period: P1Y, grants: { entitlement: pro } }
            retention:
              - id: yearly-switch
                when: { productId: pro_yearly }
                alternateProduct: { messageId: "11111111-1111-1111-1111-111111111111", productId: pro_monthly }
              - id: monthly-offer
                when: { productId: pro_monthly, sample: 0.5 }
                promotionalOffer: { messageId: "22222222-2222-2222-2222-222222222222", offerId: stay }
              - message: { messageId: "33333333-3333-3333-3333-333333333333" }
            """)

    static func withRelay(
        _ kind: String, configure: @escaping @Sendable (inout ServerConfiguration) -> Void = { _ in },
        _ body: @Sendable (Relay) async throws -> Void
    ) async throws {
        try await NotificationTests.withRelay(
            kind,
            configure: {
                $0.catalog = catalog
                configure(&$0)
            }, body)
    }

    static func order(
        _ relay: Relay, _ account: String, offer: String? = nil, product: String = "pro_monthly",
        appTransactionId: String? = nil
    ) async throws -> API.Reply {
        var body: [String: String] = ["accountId": account, "productId": product]
        if let offer { body["offerId"] = offer }
        if let appTransactionId { body["appTransactionId"] = appTransactionId }
        let text = String(decoding: try JSONSerialization.data(withJSONObject: body), as: UTF8.self)
        return try await API.call(relay.client, .post, "/v1/orders", body: text)
    }

    /// Subscribes `account` (Apple ID `apple-<account>`), then lets it lapse by a refund — not by
    /// running the store's clock ahead, which would put the server's signatures 24 hours and more
    /// in the store's past.
    static func subscribeThenLapse(_ relay: Relay, _ account: String) async throws -> String {
        let (_, first) = try await relay.buy(account, "pro_monthly")
        try await lapse(relay, account, first)
        return try #require(first.originalTransactionId)
    }

    static func lapse(_ relay: Relay, _ account: String, _ transaction: JWSTransactionDecodedPayload) async throws {
        try await relay.store.refund(try #require(transaction.transactionId), percentage: nil)
        try await relay.deliver()
        #expect(try await relay.subscription(account)?["status"] as? String == "revoked")
    }

    /// Pays an order at the local App Store with the offer it was signed for: V1 fields or the V2 JWS.
    static func pay(
        _ relay: Relay, appleId: String, reply: API.Reply, v2: Bool = false, token: UUID? = nil,
        signature: String? = nil
    ) async throws -> Result<LocalAppStore.PurchaseResult, LocalAppStore.OfferRefusal> {
        let offer = try #require(reply.json["offer"] as? [String: Any])
        let orderToken = try #require(UUID(uuidString: reply.json["appAccountToken"] as? String ?? ""))
        let request =
            v2
            ? LocalAppStore.OfferRequest(id: offer["id"] as! String, jws: offer["jws"] as? String)
            : LocalAppStore.OfferRequest(
                id: offer["id"] as! String, keyId: offer["keyId"] as? String, nonce: offer["nonce"] as? String,
                timestamp: (offer["timestamp"] as? NSNumber)?.int64Value,
                signature: signature ?? offer["signature"] as? String)
        do {
            return .success(
                try await relay.store.buy(
                    appleId, items: [.init(productId: reply.json["productId"] as! String)],
                    appAccountToken: token ?? orderToken, offers: .init(promotional: request)))
        } catch let refusal as LocalAppStore.OfferRefusal {
            return .failure(refusal)
        }
    }

    @Test(arguments: API.databases)
    func eachEligibilityRuleRefusesAndAllows(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            // Unknown offers: not in the catalog, or on a product that has none.
            let unknown = try await Self.order(relay, "nova", offer: "nope")
            #expect(unknown.status == .notFound)
            #expect(unknown.errorCode == "unknown_offer")
            #expect(
                try await Self.order(relay, "nova", offer: "stay", product: "coins_60").errorCode == "unknown_offer")
            // Never subscribed: every promotional offer is refused (Apple's floor), naming the rule.
            for offer in ["comeback", "stay", "anyone"] {
                let refused = try await Self.order(relay, "nova", offer: offer)
                #expect(refused.status == .forbidden)
                #expect(refused.errorCode == "offer_not_eligible")
            }
            // Active: `stay` and `anyone` are signed, `comeback` (lapsed) is not.
            let (_, first) = try await relay.buy("nova", "pro_monthly")
            try await relay.deliver()
            #expect(try await Self.order(relay, "nova", offer: "stay").status == .created)
            #expect(try await Self.order(relay, "nova", offer: "anyone").status == .created)
            let notLapsed = try await Self.order(relay, "nova", offer: "comeback")
            #expect(notLapsed.errorCode == "offer_not_eligible")
            #expect((notLapsed.errorMessage ?? "").contains("eligible: lapsed"), "\(notLapsed.json)")
            // Lapsed: `comeback` and `anyone` yes, `stay` no; `longgone` needs 30 days since expiry.
            try await relay.store.setAutoRenew(try #require(first.originalTransactionId), false)
            await relay.store.advance(by: 40 * 86_400)
            try await relay.deliver()
            #expect(try await Self.order(relay, "nova", offer: "comeback").status == .created)
            #expect(try await Self.order(relay, "nova", offer: "anyone").status == .created)
            let notActive = try await Self.order(relay, "nova", offer: "stay")
            #expect((notActive.errorMessage ?? "").contains("eligible: active"), "\(notActive.json)")
            // The store's clock ran 40 days ahead of the server's: expiry is in the server's future.
            let recent = try await Self.order(relay, "nova", offer: "longgone")
            #expect(recent.errorCode == "offer_not_eligible")
            #expect((recent.errorMessage ?? "").contains("lapsedAtLeast"), "\(recent.json)")
            // A client token may ask for its own account only; malformed ids are 400.
            let token = try await API.clientToken("nova")
            let own = try await API.call(
                relay.client, .post, "/v1/orders", token: token,
                body: #"{"accountId":"nova","productId":"pro_monthly","offerId":"anyone"}"#)
            #expect(own.status == .created)
            let other = try await API.call(
                relay.client, .post, "/v1/orders", token: token,
                body: #"{"accountId":"vega","productId":"pro_monthly","offerId":"anyone"}"#)
            #expect(other.status == .forbidden)
            let bad = try await API.call(
                relay.client, .post, "/v1/orders", body: #"{"accountId":"nova","productId":"pro_monthly","offerId":7}"#)
            #expect(bad.status == .badRequest)
        }
    }

    @Test(arguments: API.databases)
    func signedOffersAreRedeemedAtTheStoreAndLinkedToTheirOrder(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            _ = try await Self.subscribeThenLapse(relay, "lia")
            // V1: bound to the order's appAccountToken; the transaction carries the offer.
            let signed = try await Self.order(relay, "lia", offer: "comeback")
            #expect(signed.status == .created, "\(signed.json)")
            let offer = try #require(signed.json["offer"] as? [String: Any])
            #expect(offer["id"] as? String == "comeback")
            #expect(offer["keyId"] as? String != nil && offer["jws"] as? String != nil)
            #expect(Data(base64Encoded: offer["signature"] as? String ?? "")?.first == 0x30, "DER")
            let bought = try await Self.pay(relay, appleId: "apple-lia", reply: signed).get()
            let transaction = bought.transactions[0]
            #expect(transaction.offerType == .promotionalOffer)
            #expect(transaction.offerIdentifier == "comeback")
            #expect(transaction.offerDiscountType == .payAsYouGo)
            #expect(transaction.price == 1_990)
            let orderId = try #require(signed.json["orderId"] as? String)
            let reply = try await API.submit(
                relay.client, account: "lia", signedTransaction: bought.signedTransactions[0])
            #expect(reply.status == .ok, "\(reply.json)")
            let order = try await API.call(relay.client, .get, "/v1/orders/\(orderId)")
            #expect(order.json["status"] as? String == "delivered")
            #expect(order.json["offerId"] as? String == "comeback")
            #expect(order.json["offerRedeemed"] as? Bool == true)
            // maxPerAccount 1, counted from the Apple-signed transaction: lapse again, refused.
            try await relay.deliver()
            try await Self.lapse(relay, "lia", transaction)
            let again = try await Self.order(relay, "lia", offer: "comeback")
            #expect(again.errorCode == "offer_not_eligible")
            #expect((again.errorMessage ?? "").contains("maxPerAccount"), "\(again.json)")

            // V2: the JWS names the account's latest transaction in the group.
            let v2 = try await Self.order(relay, "lia", offer: "anyone")
            let jws = try #require((v2.json["offer"] as? [String: Any])?["jws"] as? String)
            let claims = try #require(
                try JSONSerialization.jsonObject(
                    with: Data(base64Encoded: Self.base64(String(jws.split(separator: ".")[1])))!) as? [String: Any])
            #expect(claims["aud"] as? String == "promotional-offer")
            #expect(claims["transactionId"] as? String == transaction.transactionId)
            #expect(claims["exp"] == nil && claims["iat"] is NSNumber)
            let redeemed = try await Self.pay(relay, appleId: "apple-lia", reply: v2, v2: true).get()
            #expect(redeemed.transactions[0].offerType == .promotionalOffer)
            #expect(redeemed.transactions[0].offerDiscountType == .payUpFront)
            #expect(redeemed.transactions[0].price == 490)
            let delivered = try await API.submit(
                relay.client, account: "lia", signedTransaction: redeemed.signedTransactions[0])
            #expect(delivered.status == .ok)
            let v2Order = try await API.call(relay.client, .get, "/v1/orders/\(v2.json["orderId"] as! String)")
            #expect(v2Order.json["offerRedeemed"] as? Bool == true)

            // An offer we did not sign for the order that paid — here redeemed in the App Store
            // by an account with no order, and an offer code — is recorded as such.
            let issuer = TransactionIssuer()
            var codes: [String] = []
            for (index, type) in [OfferType.promotionalOffer, .offerCode].enumerated() {
                var outside = issuer.transaction(
                    for: .init(
                        bundleId: "com.example.app", productId: "pro_monthly", type: .autoRenewable, unitPrice: 990,
                        subscriptionGroupIdentifier: "pro"),
                    at: Date(), id: "77000000000000\(index)")
                outside.offerType = type
                outside.offerIdentifier = "redeemed-outside"
                let reply = try await API.submit(
                    relay.client, account: "zed-\(index)", signedTransaction: try relay.store.signer.sign(outside))
                #expect(reply.status == .ok, "\(reply.json)")
                codes.append(outside.transactionId!)
            }
            let sources = try await relay.app.database.read { sql in
                try await sql.raw(
                    "SELECT transaction_id, offer_source FROM deliveries WHERE offer_type IS NOT NULL ORDER BY transaction_id"
                ).all().reduce(into: [String: String]()) {
                    $0[try $1.decode(column: "transaction_id", as: String.self)] =
                        try $1.decode(column: "offer_source", as: String?.self)
                }
            }
            #expect(sources[transaction.transactionId!] == "order")
            #expect(sources[redeemed.transactions[0].transactionId!] == "order")
            #expect(sources[codes[0]] == "not_signed_here")
            #expect(sources[codes[1]] == "apple")
        }
    }

    // Store-side or HTTP-level checks with no SQL of their own: SQLite is enough (keeps
    // the PostgreSQL suite's load within its deadlines on 2 cores).
    @Test(arguments: ["sqlite"])
    func theStoreRefusesTamperedExpiredReusedAndOtherTokenOffers(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            _ = try await Self.subscribeThenLapse(relay, "max")
            func code(_ result: Result<LocalAppStore.PurchaseResult, LocalAppStore.OfferRefusal>) -> String? {
                if case .failure(let refusal) = result { return refusal.code }
                return nil
            }
            // Tampered: one byte of the DER signature changed.
            let first = try await Self.order(relay, "max", offer: "anyone")
            var der = try #require(
                Data(base64Encoded: (first.json["offer"] as? [String: Any])?["signature"] as? String ?? ""))
            der[der.count - 3] ^= 0x01
            #expect(
                code(
                    try await Self.pay(relay, appleId: "apple-max", reply: first, signature: der.base64EncodedString()))
                    == "invalidSignature")
            // Another token than the one signed (a different order's), then the right one once,
            // then the same signature again: the nonce is used.
            #expect(
                code(try await Self.pay(relay, appleId: "apple-max", reply: first, token: UUID())) == "invalidSignature"
            )
            let paid = try await Self.pay(relay, appleId: "apple-max", reply: first)
            #expect(code(paid) == nil)
            try await Self.lapse(relay, "max", try paid.get().transactions[0])
            #expect(code(try await Self.pay(relay, appleId: "apple-max", reply: first)) == "invalidSignature")
            #expect(code(try await Self.pay(relay, appleId: "apple-max", reply: first, v2: true)) == "invalidSignature")
            // Expired: signed more than 24 hours before the purchase (store time).
            let late = try await Self.order(relay, "max", offer: "anyone")
            await relay.store.advance(by: 25 * 3600)
            #expect(code(try await Self.pay(relay, appleId: "apple-max", reply: late)) == "invalidSignature")
            #expect(code(try await Self.pay(relay, appleId: "apple-max", reply: late, v2: true)) == "invalidSignature")
            // An offer id the product does not have, and a JWS for another offer.
            let fresh = try await Self.order(relay, "max", offer: "anyone")
            var wrong = fresh
            var offer = try #require(wrong.json["offer"] as? [String: Any])
            offer["id"] = "comeback"
            wrong.json["offer"] = offer
            #expect(
                code(try await Self.pay(relay, appleId: "apple-max", reply: wrong, v2: true))
                    == "invalidOfferIdentifier")
            offer["id"] = "missing"
            wrong.json["offer"] = offer
            #expect(code(try await Self.pay(relay, appleId: "apple-max", reply: wrong)) == "invalidOfferIdentifier")
            // The same refusals over the control API: 400 with StoreKit's error name.
            let refused = try await API.call(
                relay.client, .post, "/local-app-store/control/purchases",
                body:
                    #"{"appleId":"apple-max","productId":"pro_monthly","offer":{"id":"anyone","keyId":"K","nonce":"\#(UUID())","timestamp":1,"signature":"AAAA"}}"#
            )
            #expect(refused.status == .badRequest)
            #expect(refused.errorCode == "invalidSignature")
        }
    }

    @Test(arguments: API.databases)
    func introductoryOffersOncePerAccountAcrossAppleIds(kind: String) async throws {
        try await Self.withRelay(kind, configure: { $0.introductoryOffers = .oncePerAccount }) { relay in
            let store = relay.store
            let firstAppleId = await store.customer("apple-ivy-1").appTransactionId
            // No transaction and no appTransactionId: nothing to sign for, the field is absent.
            #expect(try await Self.order(relay, "ivy").json["introductoryOfferEligibility"] == nil)
            let order = try await Self.order(relay, "ivy", appTransactionId: firstAppleId)
            let eligibility = try #require(order.json["introductoryOfferEligibility"] as? [String: Any])
            #expect(eligibility["allowed"] as? Bool == true)
            let token = try #require(UUID(uuidString: order.json["appAccountToken"] as? String ?? ""))
            let bought = try await store.buy(
                "apple-ivy-1", items: [.init(productId: "pro_monthly")], appAccountToken: token,
                offers: .init(introductoryEligibilityJWS: eligibility["jws"] as? String))
            #expect(bought.transactions[0].offerType == .introductoryOffer)
            #expect(bought.transactions[0].price == 0)
            #expect(
                try await API.submit(relay.client, account: "ivy", signedTransaction: bought.signedTransactions[0])
                    .status == .ok)
            try await relay.deliver()
            // Subscribed now: not allowed, whatever the Apple ID.
            let secondAppleId = await store.customer("apple-ivy-2").appTransactionId
            let whileActive = try await Self.order(relay, "ivy", appTransactionId: secondAppleId)
            #expect((whileActive.json["introductoryOfferEligibility"] as? [String: Any])?["allowed"] as? Bool == false)
            try await Self.lapse(relay, "ivy", bought.transactions[0])
            // A second Apple ID: Apple would give it another trial; the signed `allowed: false` removes it.
            let second = try await Self.order(relay, "ivy", appTransactionId: secondAppleId)
            let refusal = try #require(second.json["introductoryOfferEligibility"] as? [String: Any])
            #expect(refusal["allowed"] as? Bool == false)
            let withoutOverride = try await store.buy("apple-ivy-3", items: [.init(productId: "pro_monthly")])
            #expect(withoutOverride.transactions[0].offerType == .introductoryOffer, "Apple's own rule, per Apple ID")
            let paid = try await store.buy(
                "apple-ivy-2", items: [.init(productId: "pro_monthly")],
                appAccountToken: UUID(uuidString: second.json["appAccountToken"] as? String ?? ""),
                offers: .init(introductoryEligibilityJWS: refusal["jws"] as? String))
            #expect(paid.transactions[0].offerType == nil)
            #expect(paid.transactions[0].price == 4_990)
            // A forged eligibility JWS (signed by another key) is refused by the store.
            let forged = try OfferSigner(
                privateKeyPEM: P256Key.pem(), keyId: "FORGED", issuerId: "x", bundleId: "com.example.app")
            await #expect(throws: LocalAppStore.OfferRefusal.self) {
                _ = try await store.buy(
                    "apple-ivy-4", items: [.init(productId: "pro_monthly")],
                    offers: .init(
                        introductoryEligibilityJWS: try forged.introductoryEligibilityJWS(
                            productId: "pro_monthly", allowed: true, transactionId: firstAppleId, nonce: UUID(),
                            issuedAt: Date())))
            }
        }
    }

    @Test(arguments: API.databases)
    func oneAppleAccountOnManyAccountsRaisesSharedAppleId(kind: String) async throws {
        try await Self.withRelay(kind, configure: { $0.sharedAppleIdAccounts = 2 }) { relay in
            let shared = await relay.store.customer("apple-family").appTransactionId
            for account in ["kid-1", "kid-2"] {
                #expect(
                    try await Self.order(relay, account, product: "coins_60", appTransactionId: shared).status
                        == .created)
            }
            func anomalies() async throws -> [[String: Any]] {
                (try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                    as? [[String: Any]]
                    ?? []).filter { $0["kind"] as? String == "shared_apple_id" }
            }
            #expect(try await anomalies().isEmpty)
            // A third account, seen through a delivered transaction of that Apple Account.
            let order = try await ScenarioTests.order(relay.client, account: "kid-3", product: "coins_60")
            let bought = try await relay.store.buy(
                "apple-family", items: [.init(productId: "coins_60")], appAccountToken: order.token)
            #expect(
                try await API.submit(relay.client, account: "kid-3", signedTransaction: bought.signedTransactions[0])
                    .status == .ok)
            let raised = try await anomalies()
            #expect(raised.count == 1)
            #expect((raised.first?["detail"] as? String ?? "").contains("kid-1"))
            // Once per Apple Account: a fourth account changes nothing.
            _ = try await Self.order(relay, "kid-4", product: "coins_60", appTransactionId: shared)
            #expect(try await anomalies().count == 1)
            let tooLong = try await Self.order(
                relay, "kid-5", product: "coins_60", appTransactionId: String(repeating: "9", count: 65))
            #expect(tooLong.status == .badRequest)
        }
    }

    /// Win-back offers by the catalog's policy (SCENARIOS A3's "offer policy"): an order names
    /// the offer; a subscriber is refused, a churned one allowed; Apple applies it; once
    /// redeemed (`offerType` 4, counted across Apple IDs) `maxPerAccount` refuses the next.
    @Test(arguments: API.databases)
    func aWinBackOfferFollowsTheCatalogsPolicyAcrossAppleIds(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            func winBackOrder(_ offer: String = "winback") async throws -> API.Reply {
                try await API.call(
                    relay.client, .post, "/v1/orders",
                    body: #"{"accountId":"wb","productId":"pro_monthly","winBackOfferId":"\#(offer)"}"#)
            }
            func code(_ reply: API.Reply) -> String? { (reply.json["error"] as? [String: Any])?["code"] as? String }
            // Never subscribed: nothing to win back.
            #expect(code(try await winBackOrder()) == "offer_not_eligible")
            let (_, first) = try await relay.buy("wb", "pro_monthly")
            let original = try #require(first.originalTransactionId)
            // Subscribed: refused, naming the rule.
            let active = try await winBackOrder()
            #expect(code(active) == "offer_not_eligible")
            #expect(
                ((active.json["error"] as? [String: Any])?["message"] as? String ?? "").contains("eligible: lapsed"))
            // Both offer kinds at once: a bad request.
            let both = try await API.call(
                relay.client, .post, "/v1/orders",
                body: #"{"accountId":"wb","productId":"pro_monthly","winBackOfferId":"winback","offerId":"stay"}"#)
            #expect(both.status == .badRequest)

            // Churned: allowed, Apple applies it, the redemption is counted.
            try await store.setAutoRenew(original, false)
            await store.advance(by: 32 * 86_400)
            _ = try await relay.deliver()
            #expect(try await relay.subscription("wb")?["status"] as? String == "expired")
            let allowed = try await winBackOrder()
            #expect(allowed.status == .created, "\(allowed.json)")
            #expect((allowed.json["winBackOffer"] as? [String: Any])?["id"] as? String == "winback")
            let token = try #require(UUID(uuidString: allowed.json["appAccountToken"] as? String ?? ""))
            let back = try await store.buy(
                "apple-wb", items: [.init(productId: "pro_monthly")], appAccountToken: token,
                offers: .init(winBackOfferId: "winback"))
            #expect(back.transactions[0].offerType == .winBackOffer)
            let submitted = try await API.submit(
                relay.client, account: "wb", signedTransaction: back.signedTransactions[0])
            #expect(submitted.status == .ok, "\(submitted.json)")

            // Churned again: the policy's one redemption is used (whatever Apple ID comes next).
            try await store.setAutoRenew(original, false)
            await store.advance(by: 32 * 86_400)
            _ = try await relay.deliver()
            #expect(try await relay.subscription("wb")?["status"] as? String == "expired")
            let again = try await winBackOrder()
            #expect(code(again) == "offer_not_eligible")
            #expect(((again.json["error"] as? [String: Any])?["message"] as? String ?? "").contains("maxPerAccount"))
            // An offer the catalog does not list has no policy here: Apple alone decides.
            #expect(try await winBackOrder("not_listed").status == .created)
        }
    }

    /// Offer codes are redeemed on the App Store, never asked for: one past the catalog's
    /// `maxPerAccount` (codes redeemed under several Apple IDs, claimed by one account) is
    /// delivered — Apple was paid — and raises `offer_limit_exceeded` for the operator.
    @Test(arguments: API.databases)
    func anOfferCodePastItsLimitIsDeliveredAndShownToTheOperator(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            var claimed: [String] = []
            for appleId in ["apple-farm-1", "apple-farm-2"] {
                let bought = try await relay.store.buy(
                    appleId, items: [.init(productId: "coins_60")],
                    offers: .init(offerCode: .init(code: "SPRING_COINS", price: 0)))
                #expect(bought.transactions[0].offerDiscountType?.rawValue == "ONE_TIME")
                let reply = try await API.submit(
                    relay.client, account: "farmer", signedTransaction: bought.signedTransactions[0])
                #expect(reply.status == .ok, "\(reply.json)")
                claimed.append(try #require(bought.transactions[0].transactionId))
            }
            #expect(try await AppleRulesTests.balance(relay, "farmer") == 120)
            let raised =
                (try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "offer_limit_exceeded" }
            #expect(raised.count == 1)
            #expect(raised.first?["transactionId"] as? String == claimed[1])
            #expect(raised.first?["accountId"] as? String == "farmer")
            // Free codes count nothing in proceeds.
            let revenue = try await API.call(relay.client, .get, "/v1/revenue")
            #expect(revenue.status == .ok)
        }
    }

    static func base64(_ url: String) -> String {
        var text = url.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        return text
    }
}

enum P256Key {
    static func pem() -> String { P256.Signing.PrivateKey().pemRepresentation }
}
