import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Crypto
import Foundation
import LocalAppStore
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// Several App Store apps in one deployment (docs/api.md "Several apps, two stores"): each app's
/// signed data verified against its own bundle and App Store id, its purchases landing in the
/// one account with their app recorded on every row, answer and webhook event.
@Suite struct SeveralAppsTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static let ipadAppleId: Int64 = 987_654_321

    static func configure(_ configuration: inout ServerConfiguration) {
        configuration.appStoreAppId = "ios"
        configuration.otherAppStoreApps = [
            AppStoreAppConfiguration(id: "ipad", bundleId: "com.example.ipad", appAppleId: ipadAppleId)
        ]
    }

    /// The iPad app's App Store: the trusted (local) chain, its own bundle and App Store id.
    static func ipadStore(_ app: StoreKeeperApp) -> LocalAppStore {
        LocalAppStore(
            configuration: .init(bundleId: "com.example.ipad", appAppleId: ipadAppleId, catalog: app.catalog),
            pki: app.localAppStore!.pki)
    }

    static func order(_ relay: Relay, _ account: String, _ product: String, app appId: String?) async throws
        -> API.Reply
    {
        let app = appId.map { #","appId":"\#($0)""# } ?? ""
        return try await API.call(
            relay.client, .post, "/v1/orders",
            body: #"{"accountId":"\#(account)","productId":"\#(product)"\#(app)}"#)
    }

    @Test(arguments: API.databases)
    func twoAppStoreAppsFillOneAccountEachRowNamingItsApp(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: Self.configure) { relay in
            let app = relay.app
            let ipad = Self.ipadStore(app)
            // Orders name the app: required with two, an unknown one refused.
            let missing = try await Self.order(relay, "kim", "coins_60", app: nil)
            #expect(missing.status == .badRequest)
            #expect("\(missing.json)".contains("ios, ipad"))
            let unknown = try await Self.order(relay, "kim", "coins_60", app: "watch")
            #expect(unknown.status == .badRequest)
            #expect((unknown.json["error"] as? [String: Any])?["code"] as? String == "unknown_app")

            // Coins bought on the iPhone and on the iPad: one balance, each purchase its app.
            let phoneOrder = try await Self.order(relay, "kim", "coins_60", app: "ios")
            #expect(phoneOrder.json["appId"] as? String == "ios")
            let ipadOrder = try await Self.order(relay, "kim", "coins_300", app: "ipad")
            #expect(ipadOrder.json["appId"] as? String == "ipad")
            let phoneBuy = try await relay.store.buy(
                "apple-kim", items: [.init(productId: "coins_60")],
                appAccountToken: UUID(uuidString: phoneOrder.json["appAccountToken"] as? String ?? ""))
            let ipadBuy = try await ipad.buy(
                "apple-kim", items: [.init(productId: "coins_300")],
                appAccountToken: UUID(uuidString: ipadOrder.json["appAccountToken"] as? String ?? ""))
            let first = try await API.submit(
                relay.client, account: "kim", signedTransaction: phoneBuy.signedTransactions[0])
            let second = try await API.submit(
                relay.client, account: "kim", signedTransaction: ipadBuy.signedTransactions[0])
            for (reply, appId, orderReply) in [(first, "ios", phoneOrder), (second, "ipad", ipadOrder)] {
                #expect(reply.status == .ok, "\(reply.json)")
                let transaction = try #require((reply.json["transactions"] as? [[String: Any]])?.first)
                #expect(transaction["outcome"] as? String == "delivered")
                #expect(transaction["appId"] as? String == appId)
                #expect(transaction["store"] as? String == "app_store")
                #expect(transaction["orderId"] as? String == orderReply.json["orderId"] as? String)
            }
            #expect((try await relay.account("kim")["balances"] as? [String: Int])?["coins"] == 360)

            // A subscription bought on the iPad is the account's `pro`, shown as the iPad's;
            // its renewal notification (signed for the iPad app) is accepted and applied.
            let proOrder = try await Self.order(relay, "kim", "pro_monthly", app: "ipad")
            let pro = try await ipad.buy(
                "apple-kim", items: [.init(productId: "pro_monthly")],
                appAccountToken: UUID(uuidString: proOrder.json["appAccountToken"] as? String ?? ""))
            let proReply = try await API.submit(
                relay.client, account: "kim", signedTransaction: pro.signedTransactions[0])
            #expect(proReply.status == .ok, "\(proReply.json)")
            await ipad.advance(by: 32 * 86_400)
            let renewals = await ipad.notifications.filter { $0.payload.notificationType == .didRenew }
            #expect(renewals.count == 1)
            for notification in renewals {
                let reply = try await relay.post(notification.signedPayload)
                #expect(reply.status == .ok, "\(reply.json)")
            }
            await relay.apply()
            let subscription = try #require(try await relay.subscription("kim"))
            #expect(subscription["appId"] as? String == "ipad")
            #expect(subscription["store"] as? String == "app_store")
            #expect(try await app.store.accounts.deliveries(of: "kim").count == 4)
            #expect(
                try await relay.entitlements("kim").contains {
                    $0["id"] as? String == "pro" && $0["active"] as? Bool == true
                })

            // Stored with their app: every delivery and the subscription.
            let rows = try await app.database.read { sql in
                try await sql.raw("SELECT transaction_id, app_id FROM deliveries ORDER BY delivered_at").all().map {
                    try $0.decode(column: "app_id", as: String?.self)
                }
            }
            #expect(rows == ["ios", "ipad", "ipad", "ipad"])
            let subscriptionApp = try await app.database.read { sql in
                try await sql.raw("SELECT app_id FROM subscriptions").first()?.decode(
                    column: "app_id", as: String?.self)
            }
            #expect(subscriptionApp == "ipad")
            // Webhook events carry it: deliveries and status changes.
            let events = try await OutboxStore(database: app.database).all().map(\.event)
            let deliveries = events.filter { $0.type == "delivery" }.map(\.payload)
            #expect(deliveries.count == 4)
            #expect(deliveries.filter { $0.contains(#""appId":"ipad""#) }.count == 3)
            #expect(deliveries.filter { $0.contains(#""appId":"ios""#) }.count == 1)
            let changes = events.filter { $0.type == "subscription_status_changed" }.map(\.payload)
            #expect(!changes.isEmpty)
            #expect(changes.allSatisfy { $0.contains(#""appId":"ipad""#) }, "\(changes)")

            // The iPad's coins refunded after they were spent: the refund event and the
            // operator's anomaly name the iPad app too.
            let spend = try await API.call(
                relay.client, .post, "/v1/accounts/kim/balances/coins/debit",
                body: #"{"amount":360,"idempotencyKey":"spend-all"}"#)
            #expect(spend.status == .ok || spend.status == .created, "\(spend.json)")
            let before = await ipad.notifications.count
            try await ipad.refund(ipadBuy.transactions[0].transactionId ?? "")
            for notification in await ipad.notifications[before...] {
                #expect(try await relay.post(notification.signedPayload).status == .ok)
            }
            await relay.apply()
            let refunds = try await OutboxStore(database: app.database).all().map(\.event)
                .filter { $0.type == "refund" }.map(\.payload)
            #expect(refunds.count == 1)
            #expect(refunds.first?.contains(#""appId":"ipad""#) == true, "\(refunds)")
            let anomalies =
                try await API.call(relay.client, .get, "/v1/anomalies").json["anomalies"] as? [[String: Any]]
            let spent = try #require(anomalies?.first { $0["kind"] as? String == "refunded_after_delivery" })
            #expect(spent["appId"] as? String == "ipad")
            #expect(spent["store"] as? String == "app_store")
            let opened = try await OutboxStore(database: app.database).all().map(\.event)
                .filter { $0.type == "anomaly_opened" }.map(\.payload)
            #expect(opened.contains { $0.contains(#""appId":"ipad""#) }, "\(opened)")
        }
    }

    @Test(arguments: API.databases)
    func dataOfAnAppNotConfiguredOrWithAnotherAppsIdIsRefused(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: Self.configure) { relay in
            let app = relay.app
            let order = try await Self.order(relay, "lee", "coins_60", app: "ipad")
            let token = UUID(uuidString: order.json["appAccountToken"] as? String ?? "")
            // A third app of the same team: signed by the trusted chain, not this deployment's.
            let stranger = LocalAppStore(
                configuration: .init(bundleId: "com.example.stranger", appAppleId: 555, catalog: app.catalog),
                pki: app.localAppStore!.pki)
            let foreign = try await stranger.buy(
                "apple-lee", items: [.init(productId: "coins_60")], appAccountToken: token)
            let refused = try await API.submit(
                relay.client, account: "lee", signedTransaction: foreign.signedTransactions[0])
            #expect(refused.status == .unprocessableContent || refused.status == .badRequest, "\(refused.json)")
            #expect("\(refused.json)".contains("wrong_bundle"))
            let notification = await stranger.notifications[0].signedPayload
            let refusedNotification = try await relay.post(notification)
            #expect(refusedNotification.status == .badRequest)
            #expect("\(refusedNotification.json)".contains("wrong_bundle"))
            // The iPad's bundle with the iPhone app's App Store id, in Production: wrong_app.
            let impostor = LocalAppStore(
                configuration: .init(bundleId: "com.example.ipad", appAppleId: 1_234_567_890, catalog: app.catalog),
                pki: app.localAppStore!.pki)
            let swapped = try await impostor.buy(
                "apple-lee", items: [.init(productId: "coins_60")], appAccountToken: token)
            let wrongApp = try await relay.post(await impostor.notifications[0].signedPayload)
            #expect(wrongApp.status == .badRequest)
            #expect("\(wrongApp.json)".contains("wrong_app"))
            _ = swapped
            #expect((try await relay.account("lee")["balances"] as? [String: Int])?["coins"] == nil)
            #expect(try await app.store.accounts.deliveries(of: "lee").isEmpty)
        }
    }

    @Test(arguments: API.databases)
    func offersAreSignedForTheOrdersApp(kind: String) async throws {
        try await NotificationTests.withRelay(
            kind,
            configure: {
                Self.configure(&$0)
                $0.introductoryOffers = .oncePerAccount
            }
        ) { relay in
            // The signature covers the bundle id: each order's is its own app's.
            for (appId, bundleId) in [("ipad", "com.example.ipad"), ("ios", "com.example.app")] {
                let reply = try await API.call(
                    relay.client, .post, "/v1/orders",
                    body:
                        #"{"accountId":"max","productId":"pro_monthly","appId":"\#(appId)","appTransactionId":"2000000000000001"}"#
                )
                #expect(reply.status == .created, "\(reply.json)")
                let eligibility = try #require(reply.json["introductoryOfferEligibility"] as? [String: Any])
                let jws = try #require(eligibility["jws"] as? String)
                let payload = try #require(
                    try JSONSerialization.jsonObject(
                        with: Data(Base64.decodeURL(String(jws.split(separator: ".")[1])) ?? [])) as? [String: Any])
                #expect(payload["bid"] as? String == bundleId)
            }
        }
    }
}

/// The Server API of several apps: a call about a transaction goes to the app that knows it.
@Suite struct SeveralAppsServerAPITests {
    static func client(_ bundleId: String, _ environment: AppStoreEnvironment) async throws -> AppStoreServerAPIClient {
        let key = P256.Signing.PrivateKey().pemRepresentation
        return try await AppStoreServerAPIClient(
            configuration: .init(
                credentials: .init(issuerId: "issuer", keyId: "KEY", privateKeyPEM: key, bundleId: bundleId),
                environment: environment, baseURL: "http://127.0.0.1:9", timeout: .seconds(1), retryPolicy: .none))
    }

    @Test func lookUpsTryEachAppsProductionThenSandboxAndStopAtTheFirstThatKnows() async throws {
        let phone = EnvironmentFallback(
            production: try await Self.client("com.example.app", .production),
            sandbox: try await Self.client("com.example.app", .sandbox))
        let ipad = EnvironmentFallback(
            production: try await Self.client("com.example.ipad", .production),
            sandbox: try await Self.client("com.example.ipad", .sandbox))
        let all = EnvironmentFallback(production: phone.production, sandbox: phone.sandbox, otherApps: [ipad])
        #expect(
            all.allClients.map(\.configuration.credentials.bundleId) == [
                "com.example.app", "com.example.app", "com.example.ipad", "com.example.ipad",
            ])
        #expect(all.clients("Sandbox").map(\.configuration.environment) == [.sandbox, .sandbox])
        #expect(all.clients(nil).map(\.configuration.credentials.bundleId) == ["com.example.app", "com.example.ipad"])

        let notFound = AppStoreAPIError(
            kind: .apple, httpStatus: 404, errorCode: AppStoreAPIError.transactionIdNotFound, message: "not found",
            isRetryable: false)
        // Known only to the iPad's Sandbox: asked in order, answered from there.
        var asked: [String] = []
        let found = try await EnvironmentFallback.first(all.allClients) { client -> String in
            let name = "\(client.configuration.credentials.bundleId)/\(client.configuration.environment.rawValue)"
            asked.append(name)
            guard name == "com.example.ipad/Sandbox" else { throw notFound }
            return name
        }
        #expect(found == "com.example.ipad/Sandbox")
        #expect(asked.count == 4)
        // Any other failure stops the search: it is not "another app's".
        asked = []
        await #expect(throws: AppStoreAPIError.self) {
            try await EnvironmentFallback.first(all.allClients) { client -> String in
                asked.append(client.configuration.credentials.bundleId)
                throw AppStoreAPIError(kind: .httpStatus, httpStatus: 500, message: "down", isRetryable: true)
            }
        }
        #expect(asked == ["com.example.app"])
        // Known to none: Apple's "not found".
        await #expect(throws: AppStoreAPIError.self) {
            try await EnvironmentFallback.first(all.allClients) { _ -> String in throw notFound }
        }
    }
}
