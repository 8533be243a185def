import AsyncHTTPClient
import Crypto
import CryptoExtras
import Foundation
import Hummingbird
import JWTKit
import LocalAppStore
import LocalGooglePlay
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle
import StoreKeeperCatalog
import Synchronization
import Testing

@testable import GooglePlay

/// The local Google Play through Google's own client path: service-account tokens, the
/// Developer API's resources at Google's paths and field names, acknowledgement and its
/// 3-day refund, subscriptions' states, voided purchases, refund reviews, push tokens.
@Suite struct LocalGooglePlayTests {
    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 }, storeProducts: { google_play: coins.sixty }, prices: { USA: { currency: USD, price: 0.99 }, DEU: { currency: EUR, price: 1.09 } } }
              - { id: remove_ads, type: non_consumable, grants: { entitlement: no_ads } }
              - id: pro_monthly
                type: auto_renewable
                group: pro
                period: P1M
                grants: { entitlement: pro }
                prices: { USA: { currency: USD, price: 4.99 } }
              - { id: pro_yearly, type: auto_renewable, group: pro, period: P1Y, grants: { entitlement: pro } }
            """)

    struct Harness {
        let store: LocalGooglePlay
        let server: LocalGooglePlayServer
        let baseURL: String
        let client: GooglePlayClient
    }

    static func withPlay(_ body: (Harness) async throws -> Void) async throws {
        let store = LocalGooglePlay(
            configuration: .init(packageName: "com.example.app", catalog: catalog),
            clock: StoreClock(start: Date(), scale: 0))
        let server = try await LocalGooglePlayServer(store: store)
        let running = try await server.start()
        let tokens = try await AccessTokenSource(key: server.serviceAccountKey(baseURL: running.baseURL))
        let client = GooglePlayClient(packageName: "com.example.app", baseURL: running.baseURL, tokens: tokens)
        do {
            try await body(Harness(store: store, server: server, baseURL: running.baseURL, client: client))
        } catch {
            await running.stop()
            throw error
        }
        await running.stop()
    }

    static func raw(_ method: HTTPMethod, _ url: String, body: String? = nil, headers: [String: String] = [:])
        async throws -> (Int, String)
    {
        var request = HTTPClientRequest(url: url)
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(ByteBuffer(string: body)) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
        return (Int(response.status.code), String(buffer: try await response.body.collect(upTo: 1 << 20)))
    }

    /// Replacements made with a slow payment method leave the replaced subscription running
    /// until paid; a resubscription in the Play Store after expiry names the expired token in
    /// `outOfAppPurchaseContext` until acknowledged — both reachable from the control API.
    @Test func pendingReplacementsAndPlayStoreResubscriptions() async throws {
        try await Self.withPlay { play in
            let monthly = try await play.store.buy("pro_monthly", obfuscatedAccountId: "r1")
            let (status, created) = try await Self.raw(
                .POST, play.baseURL + "/control/purchases",
                body: #"{"productId":"pro_monthly","pending":true,"linkedPurchaseToken":"\#(monthly)"}"#,
                headers: ["Content-Type": "application/json"])
            #expect(status == 200, "\(created)")
            let pending = try #require(
                (try JSONSerialization.jsonObject(with: Data(created.utf8)) as? [String: String])?["purchaseToken"])
            #expect(await play.store.purchase(monthly)?.subscriptionState == SubscriptionState.active)
            _ = try await Self.raw(
                .POST, play.baseURL + "/control/purchases/complete",
                body: #"{"purchaseToken":"\#(pending)","paid":false}"#, headers: ["Content-Type": "application/json"])
            #expect(await play.store.purchase(monthly)?.subscriptionState == SubscriptionState.active)

            try await play.store.cancel(monthly)
            await play.store.advance(by: 40 * 86_400)
            let (resubscribed, answer) = try await Self.raw(
                .POST, play.baseURL + "/control/purchases/resubscribe", body: #"{"purchaseToken":"\#(monthly)"}"#,
                headers: ["Content-Type": "application/json"])
            #expect(resubscribed == 200, "\(answer)")
            let token = try #require(
                (try JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: String])?["newPurchaseToken"])
            let resource = try await play.client.subscriptionPurchase(token: token)
            #expect(resource.outOfAppPurchaseContext?.expiredPurchaseToken == monthly)
            #expect(resource.linkedPurchaseToken == nil && resource.externalAccountIdentifiers == nil)
            #expect(
                resource.outOfAppPurchaseContext?.expiredExternalAccountIdentifiers?.obfuscatedExternalAccountId == "r1"
            )
            try await play.client.acknowledgeSubscription(productId: "pro_monthly", token: token)
            #expect(try await play.client.subscriptionPurchase(token: token).outOfAppPurchaseContext == nil)
        }
    }

    @Test func onlyTheServiceAccountsOwnAssertionGetsATokenAndOnlyATokenReadsPurchases() async throws {
        try await Self.withPlay { play in
            // A key Google never issued: invalid_grant.
            let stranger = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            var forged = play.server.serviceAccountKey(baseURL: play.baseURL)
            forged.privateKey = stranger.pkcs8PEMRepresentation
            let forgedTokens = try await AccessTokenSource(key: forged)
            await #expect(throws: GooglePlayError.self) { _ = try await forgedTokens.token() }
            let (status, body) = try await Self.raw(
                .POST, play.baseURL + "/token", body: "grant_type=password&assertion=x",
                headers: ["Content-Type": "application/x-www-form-urlencoded"])
            #expect(status == 400 && body.contains("unsupported_grant_type"))
            // No token, a made-up token, another package: Google's errors.
            let token = try await play.store.buy("coins.sixty", obfuscatedAccountId: "acc")
            let path = "/androidpublisher/v3/applications/com.example.app/purchases/productsv2/tokens/\(token)"
            #expect(try await Self.raw(.GET, play.baseURL + path).0 == 401)
            #expect(
                try await Self.raw(.GET, play.baseURL + path, headers: ["Authorization": "Bearer ya29.nope"]).0 == 401)
            let access = try await AccessTokenSource(key: play.server.serviceAccountKey(baseURL: play.baseURL)).token()
            let other = path.replacingOccurrences(of: "com.example.app", with: "com.other.app")
            #expect(
                try await Self.raw(.GET, play.baseURL + other, headers: ["Authorization": "Bearer \(access)"]).0 == 404)
            let (ok, json) = try await Self.raw(
                .GET, play.baseURL + path, headers: ["Authorization": "Bearer \(access)"])
            #expect(ok == 200)
            // Google's field names and shapes.
            let object = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
            #expect(object["kind"] as? String == "androidpublisher#productPurchaseV2")
            #expect((object["purchaseStateContext"] as? [String: Any])?["purchaseState"] as? String == "PURCHASED")
            #expect(object["acknowledgementState"] as? String == "ACKNOWLEDGEMENT_STATE_PENDING")
            #expect(object["obfuscatedExternalAccountId"] as? String == "acc")
            #expect((object["orderId"] as? String)?.hasPrefix("GPA.") == true)
            let item = try #require((object["productLineItem"] as? [[String: Any]])?.first)
            #expect(item["productId"] as? String == "coins.sixty")
        }
    }

    @Test func aPurchaseIsReadAcknowledgedConsumedAndAnUnacknowledgedOneIsRefundedAfterThreeDays() async throws {
        try await Self.withPlay { play in
            let kept = try await play.store.buy("coins.sixty", obfuscatedAccountId: "a1", quantity: 3)
            let forgotten = try await play.store.buy("remove_ads", obfuscatedAccountId: "a2")
            let read = try await play.client.productPurchase(token: kept)
            #expect(read.productLineItem?.first?.productOfferDetails?.quantity == 3)
            #expect(GoogleTime.parse(read.purchaseCompletionTime) != nil)
            try await play.client.consumeProduct(productId: "coins.sixty", token: kept)
            #expect(
                try await play.client.productPurchase(token: kept).acknowledgementState
                    == AcknowledgementState.acknowledged)
            // Consumed twice: Google's invalidPurchaseState, a final refusal.
            await #expect(throws: GooglePlayError.self) {
                try await play.client.consumeProduct(productId: "coins.sixty", token: kept)
            }
            do {
                try await play.client.consumeProduct(productId: "coins.sixty", token: kept)
            } catch let error as GooglePlayError {
                #expect(error.kind == .refused && error.reason == "invalidPurchaseState")
            }
            do {
                _ = try await play.client.productPurchase(token: "no-such-token")
                Issue.record("an unknown token was read")
            } catch let error as GooglePlayError {
                #expect(error.kind == .notFound)
            }
            // Three days without acknowledgement: Google refunds (voidedReason 8).
            await play.store.advance(by: 3 * 86_400 + 1)
            let voided = try await play.client.voidedPurchases(startTime: nil, pageToken: nil)
            #expect(voided.voidedPurchases?.map(\.purchaseToken) == [forgotten])
            #expect(voided.voidedPurchases?.first?.voidedReason == 8)
        }
    }

    @Test func anOutageCutsTheServerOffGoogleAndHoldsPushesUntilItEnds() async throws {
        try await Self.withPlay { play in
            let token = try await play.store.buy("coins.sixty", obfuscatedAccountId: "a1", quantity: 1)
            _ = await play.store.takeDuePushes()
            let faults = play.baseURL + "/control/faults"
            let (bad, _) = try await Self.raw(.POST, faults, body: #"{"failAPICalls":-1}"#)
            #expect(bad == 400)
            let (down, answer) = try await Self.raw(.POST, faults, body: #"{"outage":true}"#)
            #expect(down == 200 && answer.contains("true"))
            // Google cannot be reached; what Google has to say waits.
            do {
                _ = try await play.client.productPurchase(token: token)
                Issue.record("read during the outage")
            } catch let error as GooglePlayError {
                #expect(error.kind == .unavailable)
            }
            _ = try await play.store.buy("coins.sixty", obfuscatedAccountId: "a2", quantity: 1)
            #expect(await play.store.takeDuePushes().isEmpty)
            let (up, _) = try await Self.raw(.POST, faults, body: #"{"outage":false}"#)
            #expect(up == 200)
            #expect(await play.store.takeDuePushes().count == 1)
            #expect(try await play.client.productPurchase(token: token).orderId != nil)
            // The next n calls only.
            _ = try await Self.raw(.POST, faults, body: #"{"failAPICalls":1}"#)
            await #expect(throws: GooglePlayError.self) { _ = try await play.client.productPurchase(token: token) }
            #expect(try await play.client.productPurchase(token: token).orderId != nil)
        }
    }

    @Test func pendingPurchasesArePaidLaterAndPartialRefundsAreListedByQuantityAndPaged() async throws {
        try await Self.withPlay { play in
            let pending = try await play.store.buy("coins.sixty", obfuscatedAccountId: "p", pending: true)
            #expect(
                try await play.client.productPurchase(token: pending).purchaseStateContext?.purchaseState == "PENDING")
            await #expect(throws: GooglePlayError.self) {
                try await play.client.acknowledgeProduct(productId: "coins.sixty", token: pending)
            }
            try await play.store.completePending(pending)
            #expect(
                try await play.client.productPurchase(token: pending).purchaseStateContext?.purchaseState == "PURCHASED"
            )
            var tokens: [String] = []
            for index in 0..<5 {
                let token = try await play.store.buy("coins.sixty", obfuscatedAccountId: "r\(index)", quantity: 2)
                try await play.client.acknowledgeProduct(productId: "coins.sixty", token: token)
                tokens.append(token)
            }
            try await play.store.refund(tokens[0], quantity: 1)
            try await play.store.refund(tokens[0], quantity: 1)
            for token in tokens.dropFirst() { try await play.store.refund(token) }
            // Pages of two: every record once, the first two partial.
            var seen: [VoidedPurchase] = []
            var page: String?
            repeat {
                let answer = try await play.client.voidedPurchases(startTime: nil, pageToken: page, maxResults: 2)
                seen += answer.voidedPurchases ?? []
                page = answer.tokenPagination?.nextPageToken
            } while page != nil
            #expect(seen.count == 6)
            #expect(seen.prefix(2).map(\.voidedQuantity) == [1, 1])
            #expect(Set(seen.compactMap(\.purchaseToken)) == Set(tokens))
            let notes = await play.store.pendingPushes().compactMap(\.notification.voidedPurchaseNotification)
            #expect(notes.map(\.refundType) == [2, 1, 1, 1, 1, 1])
        }
    }

    @Test func aSubscriptionRenewsFallsIntoGraceAndHoldRecoversIsCanceledAndUpgraded() async throws {
        try await Self.withPlay { play in
            let token = try await play.store.buy("pro_monthly", obfuscatedAccountId: "s1")
            var read = try await play.client.subscriptionPurchase(token: token)
            #expect(read.subscriptionState == SubscriptionState.active)
            #expect(read.lineItems?.first?.autoRenewingPlan?.recurringPrice?.milliunits == 4990)
            #expect(read.externalAccountIdentifiers?.obfuscatedExternalAccountId == "s1")
            try await play.client.acknowledgeSubscription(productId: "pro_monthly", token: token)
            await play.store.advance(by: 32 * 86_400)
            read = try await play.client.subscriptionPurchase(token: token)
            #expect(read.latestOrderId?.hasSuffix("..0") == true)
            try await play.store.setBillingFails(token, true)
            await play.store.advance(by: 31 * 86_400)
            #expect(
                try await play.client.subscriptionPurchase(token: token).subscriptionState
                    == SubscriptionState.inGracePeriod)
            await play.store.advance(by: 4 * 86_400)
            #expect(
                try await play.client.subscriptionPurchase(token: token).subscriptionState == SubscriptionState.onHold)
            try await play.store.setBillingFails(token, false)
            await play.store.advance(by: 60)
            #expect(
                try await play.client.subscriptionPurchase(token: token).subscriptionState == SubscriptionState.active)
            try await play.store.cancel(token)
            read = try await play.client.subscriptionPurchase(token: token)
            #expect(read.subscriptionState == SubscriptionState.canceled)
            #expect(read.canceledStateContext?.userInitiatedCancellation != nil)
            // Upgrade: a new token names the old one, which ends now.
            let upgraded = try await play.store.buy("pro_yearly", obfuscatedAccountId: "s1", linkedPurchaseToken: token)
            #expect(try await play.client.subscriptionPurchase(token: upgraded).linkedPurchaseToken == token)
            #expect(
                try await play.client.subscriptionPurchase(token: token).subscriptionState == SubscriptionState.expired)
            let types = await play.store.pendingPushes().compactMap(
                \.notification.subscriptionNotification?.notificationType)
            #expect(types == [4, 2, 6, 5, 1, 3, 4])
        }
    }

    /// `orders.get`: what each order charged (a one-time purchase's units at the price of the
    /// buyer's country, each renewal a period), its refund state; `regionCode` as bought.
    /// `purchases.subscriptionsv2.revoke`: exactly one refund context; access ends now; a full
    /// refund voids the purchase, a prorated one does not; nothing left to revoke is refused.
    @Test func revokeEndsASubscriptionNowWithAFullOrProratedRefund() async throws {
        try await Self.withPlay { play in
            let access = try await AccessTokenSource(key: play.server.serviceAccountKey(baseURL: play.baseURL)).token()
            func revoke(_ token: String, _ body: String) async throws -> (Int, String) {
                try await Self.raw(
                    .POST,
                    play.baseURL
                        + "/androidpublisher/v3/applications/com.example.app/purchases/subscriptionsv2/tokens/\(token):revoke",
                    body: body, headers: ["Authorization": "Bearer \(access)", "Content-Type": "application/json"])
            }
            let prorated = try await play.store.buy("pro_monthly", obfuscatedAccountId: "a1")
            let full = try await play.store.buy("pro_monthly", obfuscatedAccountId: "a2")
            for bad in [
                "{}", #"{"revocationContext":{}}"#, #"{"revocationContext":{"fullRefund":{},"proratedRefund":{}}}"#,
            ] {
                #expect(try await revoke(prorated, bad).0 == 400, "\(bad)")
            }
            #expect(try await revoke("no-such-token", #"{"revocationContext":{"fullRefund":{}}}"#).0 == 404)
            try await play.client.revokeSubscription(token: prorated, .proratedRefund)
            try await play.client.revokeSubscription(token: full, .fullRefund)
            for token in [prorated, full] {
                let read = try await play.client.subscriptionPurchase(token: token)
                #expect(read.subscriptionState == "SUBSCRIPTION_STATE_EXPIRED")
                #expect(read.lineItems?.first?.autoRenewingPlan?.autoRenewEnabled == false)
            }
            #expect(await play.store.purchase(prorated)?.voided == false)
            #expect(await play.store.purchase(full)?.voided == true)
            let voided = try await play.client.voidedPurchases(startTime: nil, pageToken: nil)
            #expect(voided.voidedPurchases?.map(\.purchaseToken) == [full])
            // Revoked: nothing left to revoke.
            await #expect(throws: GooglePlayError.self) {
                try await play.client.revokeSubscription(token: prorated, .fullRefund)
            }
        }
    }

    /// `orders.batchGet`: several orders in one call, each as `orders.get` says it; one unknown
    /// id fails the whole call (404), repeated ids are refused (400).
    @Test func ordersAreReadSeveralAtATime() async throws {
        try await Self.withPlay { play in
            var ids: [String] = []
            for quantity in 1...3 {
                let token = try await play.store.buy("coins.sixty", obfuscatedAccountId: nil, quantity: quantity)
                ids.append(try #require(try await play.client.productPurchase(token: token).orderId))
            }
            let orders = try await play.client.orders(orderIds: ids)
            #expect(Set(orders.compactMap(\.orderId)) == Set(ids))
            for order in orders {
                #expect(try await play.client.order(orderId: try #require(order.orderId)) == order)
            }
            do {
                _ = try await play.client.orders(orderIds: [ids[0], "GPA.0000-nope"])
                Issue.record("an unknown id must fail the call")
            } catch let error as GooglePlayError {
                #expect(error.kind == .notFound)
            }
            do {
                _ = try await play.client.orders(orderIds: [ids[0], ids[0]])
                Issue.record("repeated ids must be refused")
            } catch let error as GooglePlayError {
                #expect(error.status == 400)
            }
        }
    }

    @Test func ordersSayWhatEachChargeCostInTheBuyersCountry() async throws {
        try await Self.withPlay { play in
            let coins = try await play.store.buy(
                "coins.sixty", obfuscatedAccountId: "o1", quantity: 3, regionCode: "de")
            let read = try await play.client.productPurchase(token: coins)
            #expect(read.regionCode == "DE")
            let orderId = try #require(read.orderId)
            var order = try await play.client.order(orderId: orderId)
            #expect(order.orderId == orderId && order.purchaseToken == coins)
            #expect(order.state == GoogleOrder.State.processed)
            #expect(order.total == GoogleMoney(currencyCode: "EUR", milliunits: 3270))
            #expect(order.lineItems?.first?.listingPrice == GoogleMoney(currencyCode: "EUR", milliunits: 1090))
            #expect(order.lineItems?.first?.oneTimePurchaseDetails?.quantity == 3)
            #expect(order.developerRevenueInBuyerCurrency?.milliunits == 2289)
            try await play.store.refund(coins, quantity: 1)
            order = try await play.client.order(orderId: orderId)
            #expect(order.state == GoogleOrder.State.partiallyRefunded)
            try await play.store.refund(coins)
            #expect(try await play.client.order(orderId: orderId).state == GoogleOrder.State.refunded)

            // A country without its own price pays the USA's; a subscription's orders are periods.
            let pro = try await play.store.buy("pro_monthly", obfuscatedAccountId: "o1", regionCode: "JP")
            #expect(try await play.client.subscriptionPurchase(token: pro).regionCode == "JP")
            try await play.client.acknowledgeSubscription(productId: "pro_monthly", token: pro)
            await play.store.advance(by: 32 * 86_400)
            let orders = try #require(await play.store.purchase(pro)?.orders)
            try #require(orders.count == 2)
            let first = try await play.client.order(orderId: orders[0])
            let renewal = try await play.client.order(orderId: orders[1])
            #expect(first.total == GoogleMoney(currencyCode: "USD", milliunits: 4990))
            let period = try #require(first.lineItems?.first?.subscriptionDetails)
            #expect(
                period.servicePeriodEndTime == renewal.lineItems?.first?.subscriptionDetails?.servicePeriodStartTime)
            #expect(first.developerRevenueInBuyerCurrency?.milliunits == 4241)

            // An unknown order is Google's 404; a made-up country is refused.
            await #expect(throws: GooglePlayError.self) { try await play.client.order(orderId: "GPA.0000-nope") }
            do {
                _ = try await play.client.order(orderId: "GPA.0000-nope")
            } catch let error as GooglePlayError {
                #expect(error.kind == .notFound)
            }
            await #expect(throws: LocalGooglePlay.Refusal.self) {
                try await play.store.buy("coins.sixty", obfuscatedAccountId: nil, regionCode: "XX")
            }
            #expect(
                RegionCode.alpha3("us") == "USA" && RegionCode.alpha3("USA") == nil && RegionCode.alpha3(nil) == nil)
            #expect(RegionCode.table.count == 249 && RegionCode.reverse.count == 249)
            #expect(RegionCode.alpha2("JPN") == "JP")
        }
    }

    @Test func timesAreRFC3339AndInt64sAreStringsBothWays() throws {
        let date = Date(timeIntervalSince1970: 1_795_514_400.5)
        let text = GoogleTime.format(date)
        #expect(text == "2026-11-24T10:00:00.500Z")
        #expect(GoogleTime.parse(text).map { abs($0.timeIntervalSince(date)) < 0.001 } == true)
        // Google's nine fraction digits and no fraction at all.
        #expect(GoogleTime.parse("2026-11-24T10:00:00.123456789Z") != nil)
        #expect(GoogleTime.parse("2026-11-24T10:00:00Z") != nil)
        #expect(GoogleTime.parse("yesterday") == nil)
        let voided = try JSONDecoder().decode(
            VoidedPurchase.self,
            from: Data(#"{"purchaseTimeMillis":"1795514400000","voidedTimeMillis":1795600800000}"#.utf8))
        #expect(voided.purchaseTimeMillis?.value == 1_795_514_400_000)
        #expect(voided.voidedTimeMillis?.value == 1_795_600_800_000)
        let encoded = String(decoding: try JSONEncoder().encode(voided), as: UTF8.self)
        #expect(encoded.contains(#""purchaseTimeMillis":"1795514400000""#))
        #expect(throws: DecodingError.self) {
            _ = try JSONDecoder().decode(VoidedPurchase.self, from: Data(#"{"purchaseTimeMillis":"12x"}"#.utf8))
        }
        #expect(GoogleMoney(currencyCode: "EUR", units: 9, nanos: 990_000_000).milliunits == 9990)
    }

    /// Anyone can POST a push: a failing certificates URL is not fetched once per request.
    @Test func aFailingCertificatesURLIsAskedAtMostEveryTenSeconds() async throws {
        let verifier = PushVerifier(audience: "a", serviceAccount: "b", certificatesURL: "http://127.0.0.1:1/certs")
        let token = "eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.e30.c2ln"
        for _ in 0..<5 {
            await #expect(throws: PushVerifier.Refusal.self) {
                _ = try await verifier.verify(authorization: "Bearer \(token)")
            }
        }
        #expect(await verifier.fetches == 1)
    }

    @Test func pushTokensVerifyAgainstTheJWKSAndNothingElseDoes() async throws {
        try await Self.withPlay { play in
            let verifier = PushVerifier(
                audience: "https://storekeeper.example/v1/notifications/google",
                serviceAccount: "pubsub@project.iam.gserviceaccount.com",
                certificatesURL: play.baseURL + "/oauth2/v3/certs")
            let good = try await play.server.pushToken(
                audience: "https://storekeeper.example/v1/notifications/google",
                serviceAccount: "pubsub@project.iam.gserviceaccount.com")
            let claims = try await verifier.verify(authorization: "Bearer \(good)")
            #expect(claims.email == "pubsub@project.iam.gserviceaccount.com")
            let wrongAudience = try await play.server.pushToken(
                audience: "https://elsewhere", serviceAccount: "pubsub@project.iam.gserviceaccount.com")
            let expired = try await play.server.pushToken(
                audience: "https://storekeeper.example/v1/notifications/google",
                serviceAccount: "pubsub@project.iam.gserviceaccount.com", issuedAt: Date().addingTimeInterval(-7200))
            let wrongAccount = try await play.server.pushToken(
                audience: "https://storekeeper.example/v1/notifications/google", serviceAccount: "x@y")
            // Signed by a key not in Google's set.
            let stranger = try await JWTKeyCollection().add(
                rsa: try Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048)),
                digestAlgorithm: .sha256, kid: "other")
            let forged = try await stranger.sign(
                PushTokenClaims(
                    audience: "https://storekeeper.example/v1/notifications/google",
                    email: "pubsub@project.iam.gserviceaccount.com", issuedAt: Date()), kid: "other")
            for bad in [
                nil, "Basic abc", "Bearer ", "Bearer \(wrongAudience)", "Bearer \(wrongAccount)", "Bearer \(forged)",
                "Bearer \(expired)", "Bearer \(good.dropLast(4))AAAA", "Bearer eyJhbGciOiJub25lIn0.e30.",
            ] {
                await #expect(throws: PushVerifier.Refusal.self) { _ = try await verifier.verify(authorization: bad) }
            }
        }
    }
}
