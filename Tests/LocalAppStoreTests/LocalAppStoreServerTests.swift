import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import AsyncHTTPClient
import Crypto
import Foundation
import Hummingbird
import HummingbirdTesting
import JWTKit
import NIOCore
import NIOHTTP1
import StoreKeeperCatalog
import Synchronization
import Testing

@testable import LocalAppStore

/// The local App Store over HTTP, driven by StoreKeeper's own Apple clients.
@Suite struct LocalAppStoreServerTests {
    static let apiKey = P256.Signing.PrivateKey()
    static let issuerId = "57246542-96fe-1a63-e053-0824d011072a"
    static let keyId = "LOCAL12345"

    static func makeStore(
        environment: AppStoreEnvironment = .production, notificationURL: String? = nil, sharedSecret: String? = nil
    ) -> LocalAppStore {
        LocalAppStore(
            configuration: .init(
                environment: environment, catalog: LocalAppStoreEngineTests.catalog, notificationURL: notificationURL,
                serverAPIKey: .init(issuerId: issuerId, keyId: keyId, publicKeyPEM: apiKey.publicKey.pemRepresentation),
                sharedSecret: sharedSecret),
            pki: LocalAppStoreEngineTests.pki, clock: StoreClock(start: LocalAppStoreEngineTests.start, scale: 0))
    }

    static func client(port: Int, environment: AppStoreEnvironment = .production, timeout: Duration = .seconds(30))
        async throws -> AppStoreServerAPIClient
    {
        try await AppStoreServerAPIClient(
            configuration: .init(
                credentials: .init(
                    issuerId: issuerId, keyId: keyId, privateKeyPEM: apiKey.pemRepresentation,
                    bundleId: "com.example.app"),
                environment: environment, baseURL: "http://127.0.0.1:\(port)", timeout: timeout, retryPolicy: .none))
    }

    /// Runs `body` with the store listening on a free port.
    static func withServer(
        _ store: LocalAppStore, _ body: @Sendable (Int) async throws -> Void
    ) async throws {
        let server = try await LocalAppStoreServer(store: store)
        let app = Application(router: server.router(), configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await app.test(.live) { client in try await body(client.port!) }
    }

    static let verifier = LocalAppStoreEngineTests.verifier

    @Test func serverAPIRoundTripsEveryEndpoint() async throws {
        let store = Self.makeStore(notificationURL: "http://127.0.0.1:9/unused")
        let coins = try await store.buy("ann", items: [.init(productId: "coins_60")]).transactions[0]
        for _ in 0..<24 { _ = try await store.buy("ann", items: [.init(productId: "coins_60")]) }
        let pro = try await store.buy("ann", items: [.init(productId: "pro_monthly")]).transactions[0]
        try await Self.withServer(store) { port in
            let client = try await Self.client(port: port)
            let info = try await client.getTransactionInfo(coins.transactionId!)
            #expect(
                try await Self.verifier.verifyTransaction(info.signedTransactionInfo!).transactionId
                    == coins.transactionId)

            let history = try await client.getAllTransactionHistory(coins.transactionId!)
            #expect(history.count == 26)
            let firstPage = try await client.getTransactionHistory(coins.transactionId!)
            #expect(firstPage.signedTransactions?.count == 20)
            #expect(firstPage.hasMore == true)
            let onlySubscriptions = try await client.getAllTransactionHistory(
                coins.transactionId!, filter: .init(productTypes: [.autoRenewable]))
            #expect(onlySubscriptions.count == 1)

            let statuses = try await client.getAllSubscriptionStatuses(pro.originalTransactionId!)
            let item = try #require(statuses.data?.first?.lastTransactions?.first)
            #expect(item.status == .active)
            #expect(
                try await Self.verifier.verifyRenewalInfo(item.signedRenewalInfo!).autoRenewProductId == "pro_monthly")
            #expect(
                try await client.getAllSubscriptionStatuses(pro.originalTransactionId!, status: [.expired]).data?
                    .isEmpty == true)

            try await store.refund(coins.transactionId!)
            let refunds = try await client.getRefundHistory(coins.transactionId!)
            #expect(refunds.signedTransactions?.count == 1)

            let extended = try await client.extendSubscriptionRenewalDate(
                pro.originalTransactionId!,
                .init(extendByDays: 7, extendReasonCode: .customerSatisfaction, requestIdentifier: "r-1"))
            #expect(extended.success == true)

            let token = UUID()
            try await client.setAppAccountToken(pro.originalTransactionId!, appAccountToken: token)
            let updated = try await client.getTransactionInfo(pro.originalTransactionId!)
            #expect(
                try await Self.verifier.verifyTransaction(updated.signedTransactionInfo!).appAccountToken
                    == token.uuidString.lowercased())

            try await client.sendConsumptionInformation(
                coins.transactionId!,
                .init(customerConsented: true, sampleContentProvided: false, deliveryStatus: .delivered))
            try await client.finishTransaction(coins.transactionId!)

            let test = try await client.requestTestNotification()
            let status = try await client.getTestNotificationStatus(test.testNotificationToken!)
            #expect(try await Self.verifier.verifyNotification(status.signedPayload!).payload.notificationType == .test)

            let notifications = try await client.getAllNotificationHistory(
                .init(startDate: 0, endDate: Date().addingTimeInterval(86_400 * 400).milliseconds))
            #expect(notifications.count >= 27)
            let refundsOnly = try await client.getAllNotificationHistory(
                .init(startDate: 0, endDate: Int64.max / 2, notificationType: .refund))
            #expect(refundsOnly.count == 1)
        }
    }

    @Test func appleErrorsForUnknownAndMalformedIds() async throws {
        try await Self.withServer(Self.makeStore()) { port in
            let client = try await Self.client(port: port)
            await expectAPIError({ $0.errorCode == 4_040_010 && $0.httpStatus == 404 }) {
                _ = try await client.getTransactionInfo("2000000000000999")
            }
            await expectAPIError({ $0.errorCode == 4_000_006 && $0.httpStatus == 400 }) {
                _ = try await client.getTransactionInfo("abc")
            }
            await expectAPIError({ $0.errorCode == 4_000_035 }) {
                try await client.sendConsumptionInformation("2000000000000999", .init(customerConsented: false))
            }
            await expectAPIError({ $0.errorCode == 4_040_007 }) { _ = try await client.requestTestNotification() }
        }
    }

    @Test func bearerTokensAreCheckedAsAppleDoes() async throws {
        try await Self.withServer(Self.makeStore()) { port in
            func status(_ token: String?) async throws -> Int {
                var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/inApps/v1/transactions/1")
                if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
                let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
                let body = try await response.body.collect(upTo: 1024)
                if response.status.code == 401 { #expect(body.readableBytes == 0) }
                return Int(response.status.code)
            }
            func token(
                key: P256.Signing.PrivateKey = Self.apiKey, kid: String = Self.keyId, bid: String = "com.example.app",
                iat: Date = Date(), lifetime: TimeInterval = 300, aud: String = "appstoreconnect-v1"
            ) async throws -> String {
                var claims = ServerAPIClaims(issuerId: Self.issuerId, bundleId: bid, issuedAt: iat, lifetime: lifetime)
                claims.aud = AudienceClaim(value: [aud])
                let keys = await JWTKeyCollection().add(
                    ecdsa: try ES256PrivateKey(pem: key.pemRepresentation), kid: JWKIdentifier(string: kid))
                return try await keys.sign(claims, kid: JWKIdentifier(string: kid))
            }
            #expect(try await status(try await token()) == 404)  // authenticated; transaction unknown
            #expect(try await status(nil) == 401)
            #expect(try await status("garbage") == 401)
            #expect(try await status(try await token(key: P256.Signing.PrivateKey())) == 401)
            #expect(try await status(try await token(kid: "OTHERKEY")) == 401)
            #expect(try await status(try await token(bid: "com.other.app")) == 401)
            #expect(try await status(try await token(aud: "appstoreconnect-v2")) == 401)
            #expect(try await status(try await token(iat: Date().addingTimeInterval(-7200))) == 401)  // expired
            // A forged 2-hour lifetime: ServerAPIClaims caps lifetime at 60 minutes when signing, so
            // build the claims by hand.
            var long = ServerAPIClaims(issuerId: Self.issuerId, bundleId: "com.example.app", issuedAt: Date())
            long.exp = ExpirationClaim(value: Date().addingTimeInterval(7200))
            let keys = await JWTKeyCollection().add(
                ecdsa: try ES256PrivateKey(pem: Self.apiKey.pemRepresentation), kid: JWKIdentifier(string: Self.keyId))
            #expect(try await status(try await keys.sign(long, kid: JWKIdentifier(string: Self.keyId))) == 401)
        }
    }

    @Test func faultsOnDemand() async throws {
        let store = Self.makeStore()
        let id = try await store.buy("bo", items: [.init(productId: "remove_ads")]).transactions[0].transactionId!
        try await Self.withServer(store) { port in
            // Generous for a loaded machine (CI runs every suite at once).
            let client = try await Self.client(port: port, timeout: .seconds(60))
            var faults = Faults()
            faults.endpoints["transactionInfo"] = .init(status: 503, count: 1)
            await store.setFaults(faults)
            await expectAPIError({ $0.httpStatus == 503 && $0.isRetryable }) {
                _ = try await client.getTransactionInfo(id)
            }
            _ = try await client.getTransactionInfo(id)  // count 1: used up

            faults.endpoints["transactionInfo"] = .init(status: 429, retryAfterSeconds: 30, count: 1)
            await store.setFaults(faults)
            // Measured from when it was asked: a loaded machine may take a while to check it.
            let asked = Date()
            await expectAPIError({
                $0.kind == .rateLimited && ($0.retryAfter?.timeIntervalSince(asked) ?? 0) > 29
            }) {
                _ = try await client.getTransactionInfo(id)
            }

            // A client that gives up after 2 s, against a 10 s delay: a timeout however loaded
            // the machine is.
            let impatient = try await Self.client(port: port, timeout: .seconds(2))
            faults = Faults()
            faults.endpoints["*"] = .init(latencyMilliseconds: 10000, count: 1)
            await store.setFaults(faults)
            await expectAPIError({ $0.kind == .timeout }) { _ = try await impatient.getTransactionInfo(id) }
        }
    }

    @Test func verifyReceiptFollowsApplesEnvironmentRules() async throws {
        for environment in [AppStoreEnvironment.production, .sandbox] {
            let store = Self.makeStore(environment: environment, sharedSecret: "s3cret")
            let bought = try await store.buy("cy", items: [.init(productId: "pro_monthly")])
            try await Self.withServer(store) { port in
                let client = VerifyReceiptClient(
                    configuration: .init(
                        productionURL: "http://127.0.0.1:\(port)/verifyReceipt",
                        sandboxURL: "http://127.0.0.1:\(port)/sandbox/verifyReceipt", sharedSecret: "s3cret",
                        retryPolicy: RetryPolicy(
                            maxAttempts: 2, baseDelay: .milliseconds(1), maxDelay: .milliseconds(2))))
                let result = try await client.verify(receiptData: Data(bought.receipt).base64EncodedString())
                #expect(result.environment == environment)
                #expect(result.response.receipt?.inApp?.first?.productId == "pro_monthly")
                #expect(result.response.latestReceiptInfo?.count == 1)
                #expect(result.response.pendingRenewalInfo?.first?.autoRenewStatus?.boolValue == true)
                #expect(result.response.latestReceipt != nil)

                let wrongSecret = VerifyReceiptClient(
                    configuration: .init(
                        productionURL: "http://127.0.0.1:\(port)/verifyReceipt",
                        sandboxURL: "http://127.0.0.1:\(port)/sandbox/verifyReceipt", sharedSecret: "nope",
                        retryPolicy: .none))
                await expectAPIError({ $0.errorCode == 21004 }) {
                    _ = try await wrongSecret.verify(receiptData: Data(bought.receipt).base64EncodedString())
                }
                await expectAPIError({ $0.errorCode == 21002 }) { _ = try await client.verify(receiptData: "!!!") }
                let foreign = try await LocalAppStore(
                    configuration: .init(catalog: LocalAppStoreEngineTests.catalog),
                    pki: try ApplePKI.generate(name: "Other")
                ).buy("x", items: [.init(productId: "coins_60")]).receipt
                await expectAPIError({ $0.errorCode == 21003 }) {
                    _ = try await client.verify(receiptData: Data(foreign).base64EncodedString())
                }

                var faults = Faults()
                faults.endpoints["verifyReceipt"] = .init(receiptStatus: 21005, count: 1)
                await store.setFaults(faults)
                #expect(
                    try await client.verify(receiptData: Data(bought.receipt).base64EncodedString()).response.status
                        == 0)
            }
        }
    }

    @Test func notificationsFollowApplesRetrySchedule() async throws {
        let failures = Mutex(2)
        let received = Mutex<[String]>([])
        let receiver = Router()
        receiver.post("hook") { request, context -> Response in
            let body = try await request.decode(as: ResponseBodyV2.self, context: context)
            received.withLock { $0.append(body.signedPayload ?? "") }
            let fail = failures.withLock { remaining in
                guard remaining > 0 else { return false }
                remaining -= 1
                return true
            }
            return Response(status: fail ? .serviceUnavailable : .ok)
        }
        let hook = Application(router: receiver, configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await hook.test(.live) { hookClient in
            let store = Self.makeStore(notificationURL: "http://127.0.0.1:\(hookClient.port!)/hook")
            let sender = NotificationSender(store: store, timeout: .seconds(60))
            _ = try await store.buy("dee", items: [.init(productId: "coins_60")])
            await sender.deliverDue()  // attempt 1 fails
            await sender.deliverDue()  // nothing due yet
            await store.advance(by: 3599)
            await sender.deliverDue()
            #expect(received.withLock { $0.count } == 1)
            await store.advance(by: 1)  // +1 h: attempt 2 fails
            await sender.deliverDue()
            await store.advance(by: 12 * 3600)  // +12 h: attempt 3 succeeds
            await sender.deliverDue()
            await store.advance(by: 100 * 3600)
            await sender.deliverDue()  // delivered: no more attempts
            let notification = await store.notifications[0]
            #expect(
                notification.attempts.map(\.sendAttemptResult) == [
                    .unsuccessfulHTTPResponseCode, .unsuccessfulHTTPResponseCode, .success,
                ])
            let dates = notification.attempts.compactMap(\.attemptDate)
            #expect(dates[1] - dates[0] == 3_600_000)
            #expect(dates[2] - dates[1] == 12 * 3_600_000)
            #expect(received.withLock { $0 }.count == 3)
            #expect(Set(received.withLock { $0 }).count == 1)  // the same signed payload each time
            #expect(
                try await Self.verifier.verifyNotification(received.withLock { $0[0] }).payload.notificationType
                    == .oneTimeCharge)

            // A receiver that never answers 2xx sees the whole schedule: 1 + 5 attempts.
            failures.withLock { $0 = 100 }
            _ = try await store.buy("dee", items: [.init(productId: "coins_60")])
            for hours in [0, 1, 12, 24, 48, 72, 500] {
                await store.advance(by: Double(hours) * 3600)
                await sender.deliverDue()
            }
            #expect(await store.notifications[1].attempts.count == 6)
            #expect(await store.notifications[1].nextAttempt == nil)

            // Faults: dropped, duplicated.
            failures.withLock { $0 = 0 }
            var faults = Faults()
            faults.dropNotifications = 1
            faults.duplicateNotifications = true
            await store.setFaults(faults)
            let before = received.withLock { $0.count }
            _ = try await store.buy("dee", items: [.init(productId: "remove_ads")])
            await sender.deliverDue()  // dropped
            #expect(received.withLock { $0.count } == before)
            await store.advance(by: 3600)
            await sender.deliverDue()  // retried, and sent twice
            #expect(received.withLock { $0.count } == before + 2)
        }
    }

    @Test func scaledClockRunsTheRetryScheduleByItself() async throws {
        let attempts = Mutex<[Date]>([])
        let receiver = Router()
        receiver.post("hook") { _, _ -> Response in
            let count = attempts.withLock {
                $0.append(Date())
                return $0.count
            }
            return Response(status: count < 3 ? .internalServerError : .ok)
        }
        let hook = Application(router: receiver, configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await hook.test(.live) { hookClient in
            // One store hour is 0.05 s of real time: the +1 h and +12 h retries take ~0.65 s.
            let store = LocalAppStore(
                configuration: .init(
                    catalog: LocalAppStoreEngineTests.catalog,
                    notificationURL: "http://127.0.0.1:\(hookClient.port!)/hook"),
                pki: LocalAppStoreEngineTests.pki,
                clock: StoreClock(start: LocalAppStoreEngineTests.start, scale: 72_000))
            _ = try await store.buy("sal", items: [.init(productId: "coins_60")])
            let sender = NotificationSender(store: store, pollInterval: .milliseconds(10), timeout: .seconds(60))
            let running = Task { try await sender.run() }
            let deadline = ContinuousClock.now + .seconds(60)
            while await store.notifications[0].delivered == false, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            running.cancel()
            let recorded = await store.notifications[0].attempts
            #expect(
                recorded.map(\.sendAttemptResult) == [
                    .unsuccessfulHTTPResponseCode, .unsuccessfulHTTPResponseCode, .success,
                ])
            let dates = recorded.compactMap(\.attemptDate)
            // Store time between attempts: at least Apple's +1 h, then +12 h. How much more depends
            // on how busy the machine is (the exact spacing is checked on the frozen clock above).
            #expect(dates[1] - dates[0] >= 3_600_000)
            #expect(dates[2] - dates[1] >= 12 * 3_600_000)
        }
    }
}

func expectAPIError(
    _ check: (AppStoreAPIError) -> Bool, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async {
    do {
        try await body()
        Issue.record("expected an AppStoreAPIError", sourceLocation: sourceLocation)
    } catch let error as AppStoreAPIError {
        #expect(check(error), "\(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("unexpected \(error)", sourceLocation: sourceLocation)
    }
}
