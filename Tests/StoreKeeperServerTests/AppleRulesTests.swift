import AppStoreAdapter
import AppStoreModels
import AppStoreSigning
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// Apple's 2025–2026 rules on the real server (SQLite and PostgreSQL), driven by the local App
/// Store as Apple sends them — docs/scenarios.md A1–A5.
@Suite struct AppleRulesTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static func outbox(_ relay: Relay, _ type: String) async throws -> [[String: Any]] {
        try await OutboxStore(database: relay.app.database).all().map(\.event).filter { $0.type == type }.compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
    }

    static func balance(_ relay: Relay, _ account: String) async throws -> Int? {
        (try await relay.account(account)["balances"] as? [String: Int])?["coins"]
    }

    // MARK: A2: prorated refunds

    @Test(arguments: ServerAPITests.databases)
    func aProratedRefundTakesBackItsShareOnce(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            let (order, coins) = try await relay.buy("halver", "coins_60")
            _ = try await relay.deliver()
            try await store.refund(coins.transactionId!, percentage: 50_000)
            // Apple retries (the same notification three times): taken back once.
            #expect(try await relay.deliver(times: 3) == ["REFUND"])
            #expect(try await Self.balance(relay, "halver") == 30)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "partially_refunded")
            // A second REFUND of the same share (a new notification) takes nothing more.
            try await store.refund(coins.transactionId!, percentage: 50_000)
            _ = try await relay.deliver()
            #expect(try await Self.balance(relay, "halver") == 30)
            // Rounded down: 33.333 % of 300 coins is 99.
            let (_, more) = try await relay.buy("halver", "coins_300")
            _ = try await relay.deliver()
            try await store.refund(more.transactionId!, percentage: 33_333)
            _ = try await relay.deliver()
            #expect(try await Self.balance(relay, "halver") == 30 + 300 - 99)
            // Then a full refund of the first takes the other 30; its reversal gives back 60.
            try await store.refund(coins.transactionId!)
            _ = try await relay.deliver()
            #expect(try await Self.balance(relay, "halver") == 231 - 30)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "refunded")
            try await store.reverseRefund(coins.transactionId!)
            _ = try await relay.deliver(times: 2)
            #expect(try await Self.balance(relay, "halver") == 261)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "delivered")

            let refunds = try await Self.outbox(relay, "refund")
            #expect(refunds.map { $0["amount"] as? Int } == [-30, -99, -30])
            #expect(refunds.first?["revocationType"] as? String == "REFUND_PRORATED")
            #expect(refunds.first?["refundedShare"] as? Int == 50_000)
            #expect(refunds.first?["orderStatus"] as? String == "partially_refunded")
            #expect(try await Self.outbox(relay, "refund_reversed").first?["amount"] as? Int == 60)

            // Revenue counts what Apple kept: coins_60 (USD 0.99) whole again, coins_300 (USD 4.99) less 33.333 %.
            let revenue = try await API.call(relay.client, .get, "/v1/revenue?since=2000-01-01").json
            #expect(revenue["partiallyRefundedTransactions"] as? Int == 1)
            let usd = (revenue["currencies"] as? [[String: Any]])?.first { $0["currency"] as? String == "USD" }
            #expect(usd?["grossMilli"] as? Int == 990 + (4990 - 4990 * 33_333 / 100_000))
            #expect(usd?["transactions"] as? Int == 2)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aProratedRefundKeepsANonConsumableBelowThePolicyAndShortensAPass(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            let (adsOrder, ads) = try await relay.buy("keeper", "remove_ads")
            let (_, pass) = try await relay.buy("keeper", "season_pass")
            _ = try await relay.deliver()
            func expiry(_ id: String) async throws -> String? {
                try await relay.entitlements("keeper").first { $0["id"] as? String == id }?["expiresAt"] as? String
            }
            let fullWindow = try #require(try await expiry("season"))
            try await store.refund(ads.transactionId!, percentage: 30_000)
            try await store.refund(pass.transactionId!, percentage: 50_000)
            _ = try await relay.deliver()
            // 30 % < the default 50 %: the unlock stays; the order says partially refunded.
            #expect(try await relay.entitlements("keeper").contains { $0["id"] as? String == "no_ads" })
            #expect(try await ScenarioTests.status(relay.client, order: adsOrder) == "partially_refunded")
            // The 30-day pass keeps 15 days.
            let shortened = try #require(try await expiry("season"))
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            func date(_ text: String) -> Date? { formatter.date(from: text) ?? ISO8601DateFormatter().date(from: text) }
            let purchased = Date(milliseconds: pass.purchaseDate!)
            let kept = try #require(date(shortened)).timeIntervalSince(purchased)
            #expect(abs(kept - 15 * 86_400) < 2, "\(shortened) from \(purchased)")
            // The reversal restores the whole window; a full refund of the unlock removes it.
            try await store.reverseRefund(pass.transactionId!)
            try await store.refund(ads.transactionId!)
            _ = try await relay.deliver()
            #expect(try await expiry("season") == fullWindow)
            #expect(try await relay.entitlements("keeper").contains { $0["id"] as? String == "no_ads" } == false)
        }
    }

    // MARK: A4: consent

    @Test(arguments: ServerAPITests.databases)
    func aParentRescindingConsentIsVerifiedRecordedAndSentToTheBackend(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            // Two app accounts on one Apple Account (its appTransactionId), another elsewhere.
            _ = try await relay.buy("kid", "coins_60", appleId: "apple-family")
            _ = try await relay.buy("kid-alt", "remove_ads", appleId: "apple-family")
            _ = try await relay.buy("stranger", "coins_60")
            _ = try await relay.deliver()
            let granted = try await API.call(
                relay.client, .put, "/v1/accounts/kid/consent", body: #"{"consumptionData":true}"#)
            #expect(granted.json["consumptionData"] as? Bool == true && granted.json["source"] as? String == "backend")

            try await store.rescindConsent("apple-family")
            #expect(try await relay.deliver(times: 2) == ["RESCIND_CONSENT"])
            let events = try await Self.outbox(relay, "consent.rescinded")
            #expect(events.count == 1)
            #expect(events.first?["accountIds"] as? [String] == ["kid", "kid-alt"])
            #expect(
                events.first?["environment"] as? String == "Sandbox"
                    || events.first?["environment"] as? String == "Production")
            #expect((events.first?["appTransactionId"] as? String)?.isEmpty == false)
            let consent = try await API.call(relay.client, .get, "/v1/accounts/kid/consent").json
            #expect(consent["consumptionData"] as? Bool == false)
            #expect(consent["source"] as? String == "rescind_consent")
            // Purchases stay: Apple says nothing about refunding them.
            #expect(try await Self.balance(relay, "kid") == 60)
            #expect(try await relay.entitlements("kid-alt").count == 1)
            let rescissions = try await relay.app.store.accounts.consentRescissions()
            #expect(rescissions.map(\.accountIds) == [["kid", "kid-alt"]])
            // The stranger's consent is untouched.
            #expect(
                try await API.call(relay.client, .get, "/v1/accounts/stranger/consent").json["consumptionData"]
                    is NSNull)

            // A RESCIND_CONSENT signed by someone else is refused and records nothing.
            let forged = try Self.forgedRescind(relay)
            let reply = try await relay.post(forged)
            #expect(reply.status == .badRequest)
            #expect(try await relay.app.store.accounts.consentRescissions().count == 1)
        }
    }

    /// A RESCIND_CONSENT whose app transaction is signed by a key Apple never certified.
    static func forgedRescind(_ relay: Relay) throws -> String {
        let signer = try ApplePKI.generate(name: "Forger").jwsSigner
        let app = AppTransaction(
            appAppleId: 1_234_567_890, appTransactionId: "705000000000000001", bundleId: "com.example.app",
            receiptType: .sandbox)
        let payload = ResponseBodyV2DecodedPayload(
            notificationType: .rescindConsent, subtype: nil, notificationUUID: UUID().uuidString.lowercased(),
            version: "2.0", signedDate: Int64(Date().timeIntervalSince1970 * 1000),
            appData: NotificationAppData(
                appAppleId: 1_234_567_890, bundleId: "com.example.app", environment: .sandbox,
                signedAppTransactionInfo: try signer.sign(app)))
        return try signer.sign(payload)
    }

    @Test(arguments: ServerAPITests.databases)
    func consentIsTheCustomersAndAClientTokenMaySetOnlyItsOwn(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let token = try await ServerAPITests.clientToken("maria")
            let own = try await API.call(
                client, .put, "/v1/accounts/maria/consent", token: token, body: #"{"consumptionData":true}"#)
            #expect(own.status == .ok && own.json["source"] as? String == "app")
            let other = try await API.call(
                client, .put, "/v1/accounts/juan/consent", token: token, body: #"{"consumptionData":true}"#)
            #expect(other.status == .forbidden)
            for body in [#"{}"#, #"{"consumptionData":"yes"}"#, #"[true]"#, "", #"{"consumptionData":true"#] {
                let bad = try await API.call(client, .put, "/v1/accounts/maria/consent", token: token, body: body)
                #expect(bad.status == .badRequest, "\(body)")
            }
            let withdrawn = try await API.call(
                client, .put, "/v1/accounts/maria/consent", token: token, body: #"{"consumptionData":false}"#)
            #expect(withdrawn.json["consumptionData"] as? Bool == false)
            let audit = try await app.store.anomalies.audit().map(\.action)
            #expect(audit.filter { $0 == "consent_given" || $0 == "consent_withdrawn" }.count == 2)
        }
    }

    // MARK: Consumption information V2, by consent and policy

    @Test(arguments: ServerAPITests.databases)
    func consumptionIsSentOnlyWithConsentAndStatesThePolicysPreference(kind: String) async throws {
        try await NotificationTests.withRelay(
            kind,
            configure: {
                $0.consumptionEnabled = true
                var catalog = Catalog.demo
                catalog.refunds = RefundPolicy(preference: [
                    .init(
                        name: "spent_coins", when: .init(productType: .consumable, consumedAtLeast: 50),
                        preference: .decline),
                    .init(name: "unspent_first", when: .init(purchase: .first), preference: .grantFull),
                    .init(name: "the_rest", preference: .grantProrated),
                ])
                $0.catalog = catalog
            }
        ) { relay in
            let store = relay.store
            // No consent: Apple gets no answer, and the record says why.
            let (_, silent) = try await relay.buy("quiet", "coins_60")
            try await store.requestRefund(silent.transactionId!)
            _ = try await relay.deliver()
            #expect(try await store.transaction(silent.transactionId!)?.consumptionReceived.isEmpty == true)
            let recorded = try await relay.app.notifications.notifications(subject: silent.originalTransactionId!)
            #expect(recorded.first { $0.type == "CONSUMPTION_REQUEST" }?.status == "ignored")
            #expect(recorded.first { $0.type == "CONSUMPTION_REQUEST" }?.outcome?.contains("never consented") == true)
            #expect(try await relay.app.store.anomalies.audit().contains { $0.action == "consumption_withheld" })

            // Consented: the first purchase, unspent → GRANT_FULL by rule unspent_first.
            _ = try await API.call(relay.client, .put, "/v1/accounts/gamer/consent", body: #"{"consumptionData":true}"#)
            let (_, first) = try await relay.buy("gamer", "coins_60")
            try await store.requestRefund(first.transactionId!)
            _ = try await relay.deliver()
            let firstAnswer = try #require(await store.transaction(first.transactionId!)?.consumptionReceived.first)
            #expect(firstAnswer.customerConsented == true)
            #expect(firstAnswer.refundPreference == .grantFull)
            #expect(firstAnswer.consumptionPercentage == 0)
            #expect(firstAnswer.deliveryStatus == .delivered)
            // A repeat purchase, 75 % spent → DECLINE by rule spent_coins.
            let (_, second) = try await relay.buy("gamer", "coins_300")
            _ = try await API.call(
                relay.client, .post, "/v1/accounts/gamer/balances/coins/debit",
                body: #"{"amount":285,"idempotencyKey":"potion"}"#)
            try await store.requestRefund(second.transactionId!)
            _ = try await relay.deliver()
            let secondAnswer = try #require(await store.transaction(second.transactionId!)?.consumptionReceived.first)
            #expect(secondAnswer.refundPreference == .decline)
            #expect(secondAnswer.consumptionPercentage == 75_000)
            let sent = try await relay.app.store.anomalies.audit().filter { $0.action == "consumption_sent" }.map(
                \.detail)
            #expect(sent.contains { $0.contains("rule 'spent_coins'") })
            #expect(sent.contains { $0.contains("rule 'unspent_first'") })

            // Withdrawn after the request was queued: nothing is sent.
            let (_, third) = try await relay.buy("gamer", "remove_ads")
            try await store.requestRefund(third.transactionId!)
            for notification in await relay.take() { _ = try await relay.post(notification.signedPayload) }
            let runner = JobRunner(app: relay.app)
            // Apply the notifications (queues the answer), withdraw, then run the answer.
            await runner.applyNotifications(
                try await relay.app.jobs.claimDue(now: Date(), limit: 100).filter {
                    $0.kind == NotificationStore.jobKind
                }, now: Date())
            _ = try await API.call(
                relay.client, .put, "/v1/accounts/gamer/consent", body: #"{"consumptionData":false}"#)
            await relay.apply()
            #expect(try await store.transaction(third.transactionId!)?.consumptionReceived.isEmpty == true)
        }
    }

    // MARK: A3: purchases made outside the app

    @Test(arguments: ServerAPITests.databases)
    func anOfferCodeRedeemedOutsideTheAppIsClaimedAndAppleIsGivenTheAccountsToken(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            // Redeemed on the App Store: no order, no token. Held until an account claims it.
            let coins = try await store.buy(
                "apple-redeemer", items: [.init(productId: "coins_60")],
                offers: .init(offerCode: .init(code: "SPRING_COINS", price: 0.49)))
            let pro = try await store.buy(
                "apple-redeemer", items: [.init(productId: "pro_monthly")],
                offers: .init(offerCode: .init(code: "PRO_FREE_MONTH")))
            #expect(coins.transactions[0].offerDiscountType?.rawValue == "ONE_TIME")
            #expect(coins.transactions[0].offerType == .offerCode)
            #expect(coins.transactions[0].price == 490)
            _ = try await relay.deliver()
            #expect(try await relay.statuses()["unattributed"] == 2)

            // The app forwards the redeemed transactions: the account claims them.
            for signed in coins.signedTransactions + pro.signedTransactions {
                let reply = try await API.submit(relay.client, account: "redeemer", signedTransaction: signed)
                #expect(reply.status == .ok, "\(reply.json)")
            }
            await relay.apply()
            #expect(try await Self.balance(relay, "redeemer") == 60)
            let token = try await relay.app.store.appleAccounts.accountToken("redeemer", now: Date()).uuidString
                .lowercased()
            // Apple now holds the account's token on both; the next renewal carries it.
            #expect(await store.transaction(coins.transactions[0].transactionId!)?.payload.appAccountToken == token)
            #expect(await store.subscription(pro.transactions[0].originalTransactionId!)?.appAccountToken == token)
            // Stable: the same token for the account's next claim.
            #expect(
                try await relay.app.store.appleAccounts.accountToken("redeemer", now: Date()).uuidString.lowercased()
                    == token)
            let audit = try await relay.app.store.anomalies.audit().filter { $0.action == "app_account_token_set" }
            #expect(audit.count == 2)

            await store.advance(by: 32 * 86_400)
            _ = try await relay.deliver()
            let renewal = await store.notifications.last { $0.payload.notificationType == .didRenew }
            #expect(renewal != nil)
            #expect(try await relay.subscription("redeemer")?["status"] as? String == "active")

            // A purchase with the order's token needs no call.
            _ = try await relay.buy("redeemer", "coins_300")
            await relay.apply()
            #expect(
                try await relay.app.store.anomalies.audit().filter { $0.action == "app_account_token_set" }.count == 2)

            // Revenue counts the discounted price Apple charged, not the catalog's.
            let revenue = try await API.call(relay.client, .get, "/v1/revenue?since=2000-01-01").json
            #expect(revenue["sandboxTransactions"] != nil)
        }
    }

    /// Claims run as a batch: Apple's final refusal of one (a transaction it does not know) is
    /// audited and fails that job only, in the same database transaction as the others' success.
    @Test(arguments: ServerAPITests.databases)
    func aBatchOfClaimsRecordsAppleRefusingOneBesideTheOthers(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let redeemed = try await relay.store.buy(
                "apple-claimer", items: [.init(productId: "coins_60")],
                offers: .init(offerCode: .init(code: "SPRING_COINS", price: 0.49)))
            // Signed with the store's key but never bought there: Apple answers "not found".
            let unknown = TransactionIssuer().transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(4_100_000_000_000_000 + UInt64.random(in: 0..<1_000_000)))
            for signed in redeemed.signedTransactions + [try relay.store.pki.jwsSigner.sign(unknown)] {
                let reply = try await API.submit(relay.client, account: "claimer", signedTransaction: signed)
                #expect(reply.status == .ok, "\(reply.json)")
            }
            let claims = try await relay.app.jobs.claimDue(now: Date(), limit: 100).filter {
                $0.kind == AppleAccountStore.setTokenJobKind
            }
            #expect(claims.count == 2)
            await JobRunner(app: relay.app).setAppAccountTokens(claims, now: Date())
            let audit = try await relay.app.store.anomalies.audit()
            #expect(audit.filter { $0.action == "app_account_token_set" }.count == 1)
            let refused = audit.filter { $0.action == "app_account_token_set_refused" }
            #expect(refused.count == 1 && refused.first?.subject == unknown.originalTransactionId, "\(refused)")
            let statuses = try await relay.app.database.read { sql in
                try await sql.raw(
                    "SELECT status, last_error FROM jobs WHERE kind = \(bind: AppleAccountStore.setTokenJobKind)"
                )
                .all().map {
                    (
                        try $0.decode(column: "status", as: String.self),
                        try $0.decode(column: "last_error", as: String?.self)
                    )
                }
            }
            #expect(statuses.map(\.0).sorted() == ["done", "failed"], "\(statuses)")
            #expect(statuses.first { $0.0 == "failed" }?.1?.isEmpty == false)
            // Both delivered all the same.
            #expect(try await Self.balance(relay, "claimer") == 120)
        }
    }

    /// The bucket: `burst` calls at once, then `perSecond`; each environment its own.
    @Test func applesCallRateIsABucketPerEnvironment() {
        let rate = AppleCallRate(
            production: .init(perSecond: 0.001, burst: 3), sandbox: .init(perSecond: 0.001, burst: 1))
        #expect(!rate.spent)
        #expect(rate.take(5, sandbox: false) == 3)
        #expect(rate.take(1, sandbox: false) == 0)
        #expect(rate.spent)
        #expect(rate.take(2, sandbox: true) == 1)
        #expect(rate.take(1, sandbox: true) == 0)
        #expect(rate.spent)
        // Set App Account Token: 20 a second, the sandbox 10 % of it.
        let apple = AppleCallRate()
        #expect(apple.limit(sandbox: false).perSecond == 20 && apple.limit(sandbox: true).perSecond == 2)
    }

    /// Claims keep to Apple's rate for Set App Account Token: a burst over it waits pending (no
    /// attempt counted) and is sent as the rate allows; every purchase was delivered already.
    @Test(arguments: ServerAPITests.databases)
    func claimsKeepToApplesRateAndTheRestWaitTheirTurn(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let count = Int(relay.app.setAppAccountTokenRate.limit(sandbox: false).burst) + 3
            for index in 0..<count {
                let redeemed = try await relay.store.buy(
                    "apple-burst", items: [.init(productId: "coins_60")],
                    offers: .init(offerCode: .init(code: "SPRING_COINS", price: 0.49)))
                let reply = try await API.submit(
                    relay.client, account: "burst\(index % 2)", signedTransaction: redeemed.signedTransactions[0])
                #expect(reply.status == .ok, "\(reply.json)")
            }
            let first = try await Self.balance(relay, "burst0") ?? 0
            let second = try await Self.balance(relay, "burst1") ?? 0
            let balances = first + second
            #expect(balances == 60 * count)
            let environment = try await relay.app.database.read { sql in
                try await sql.raw("SELECT payload FROM jobs WHERE kind = \(bind: AppleAccountStore.setTokenJobKind)")
                    .first()?
                    .decode(column: "payload", as: String.self)
            }.flatMap { try? JSONDecoder().decode(AppleAccountStore.ClaimJob.self, from: Data($0.utf8)).environment }
            let burst = Int(relay.app.setAppAccountTokenRate.limit(sandbox: environment == "Sandbox").burst)
            let runner = JobRunner(app: relay.app)
            _ = await runner.runDueCounting(now: Date())
            func claims() async throws -> [(status: String, attempts: Int)] {
                try await relay.app.database.read { sql in
                    try await sql.raw(
                        "SELECT status, attempts FROM jobs WHERE kind = \(bind: AppleAccountStore.setTokenJobKind)"
                    ).all().map {
                        (
                            try $0.decode(column: "status", as: String.self),
                            try $0.decode(column: "attempts", as: Int.self)
                        )
                    }
                }
            }
            let sent = try await claims()
            #expect(sent.filter { $0.status == "done" }.count == burst, "\(sent)")
            #expect(sent.filter { $0.status == "pending" && $0.attempts == 0 }.count == count - burst, "\(sent)")
            #expect(
                try await relay.app.store.anomalies.audit().filter { $0.action == "app_account_token_set" }.count
                    == burst)
            // As the rate allows (the sandbox's 2 a second), the rest go too.
            let deadline = Date().addingTimeInterval(60)
            while try await claims().contains(where: { $0.status == "pending" }), Date() < deadline {
                try await Task.sleep(for: .milliseconds(300))
                _ = await runner.runDueCounting(now: Date())
            }
            #expect(try await claims().allSatisfy { $0.status == "done" })
            #expect(
                try await relay.app.store.anomalies.audit().filter { $0.action == "app_account_token_set" }.count
                    == count)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func setAppAccountTokenRetriesWhileAppleIsDown(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let store = relay.store
            let bought = try await store.buy("apple-x", items: [.init(productId: "remove_ads")])
            var faults = Faults()
            faults.endpoints["appAccountToken"] = .init(status: 503, count: 2)
            await store.setFaults(faults)
            _ = try await API.submit(relay.client, account: "x", signedTransaction: bought.signedTransactions[0])
            let runner = JobRunner(app: relay.app)
            // Two failures, each rescheduled; then Apple answers.
            for hour in 1...3 { _ = await runner.runDueCounting(now: Date().addingTimeInterval(Double(hour) * 3600)) }
            #expect(await store.transaction(bought.transactions[0].transactionId!)?.payload.appAccountToken != nil)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func finishTransactionRunsOnTheServerOnlyWhenSwitchedOn(kind: String) async throws {
        for enabled in [false, true] {
            try await NotificationTests.withRelay(kind, configure: { $0.finishTransactions = enabled }) { relay in
                let (_, coins) = try await relay.buy("finisher", "coins_60")
                if enabled {
                    let queued = try await relay.app.store.appleAccounts.queueFinishes(
                        delay: 0, now: Date().addingTimeInterval(1))
                    #expect(queued == 1)
                    #expect(
                        try await relay.app.store.appleAccounts.queueFinishes(
                            delay: 0, now: Date().addingTimeInterval(2)) == 0)
                }
                _ = await JobRunner(app: relay.app).runDueCounting(now: Date().addingTimeInterval(10))
                let finished = await relay.store.isFinished(coins.transactionId!)
                #expect(finished == enabled)
            }
        }
    }

    // MARK: External purchases

    static func web(_ relay: Relay, _ body: String, token: String? = ServerAPITests.secret) async throws -> API.Reply {
        try await API.call(relay.client, .post, "/v1/purchases", token: token, body: body)
    }

    @Test(arguments: ServerAPITests.databases)
    func webPurchasesShareTheLedgerAndAreReportedToAppleOnce(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: { $0.externalPurchaseReporting = true }) { relay in
            let store = relay.store
            let token = await store.issueExternalPurchaseToken()
            let body =
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"pay_1","price":"1.19","currency":"EUR","taxAmount":"0.19","taxCountry":"DEU","externalPurchaseToken":"\#(token)"}"#
            let first = try await Self.web(relay, body)
            #expect(first.status == .ok, "\(first.json)")
            #expect(first.json["status"] as? String == "delivered")
            #expect((first.json["transactions"] as? [[String: Any]])?.first?["transactionId"] as? String == "web:pay_1")
            // The backend retries: delivered once.
            let again = try await Self.web(relay, body)
            #expect(again.json["status"] as? String == "already_delivered")
            #expect(try await Self.balance(relay, "webber") == 60)
            // The same paymentId with other facts, a client token, bad input: refused.
            let conflict = try await Self.web(relay, body.replacingOccurrences(of: "1.19", with: "2.19"))
            #expect(
                conflict.status == .conflict
                    && (conflict.json["error"] as? [String: Any])?["code"] as? String == "idempotency_conflict")
            let client = try await Self.web(relay, body, token: try await ServerAPITests.clientToken("webber"))
            #expect(client.status == .forbidden)
            for bad in [
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":"-1","currency":"EUR"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":"1e400","currency":"EUR"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":"1.2.3","currency":"EUR"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":".5","currency":"EUR"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":1e400,"currency":"EUR"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":1,"currency":"euro"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","price":1,"currency":"EUR"}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":1,"currency":"EUR","taxAmount":2}"#,
                #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"p","price":1,"currency":"EUR","signedTransaction":"x"}"#,
                #"{"store":"nope","accountId":"webber","productId":"coins_60","paymentId":"p","price":1,"currency":"EUR"}"#,
            ] {
                let reply = try await Self.web(relay, bad)
                #expect(reply.status == .badRequest, "\(bad) → \(reply.status)")
            }
            // An auto-renewable product needs the period it paid for.
            let subscription = try await Self.web(
                relay,
                #"{"store":"web","accountId":"webber","productId":"pro_monthly","paymentId":"p2","price":5,"currency":"EUR"}"#
            )
            #expect(subscription.status == .badRequest)

            // The report: one BUY line item, accepted by Apple, never sent twice.
            await relay.apply()
            let reported = try #require(await store.externalToken(token))
            #expect(reported.reports.count == 1)
            let report = try #require(await store.externalReport(reported.reports[0]))
            #expect(report.status == "LINE_ITEM")
            #expect(report.lineItems?.first?.amountTaxInclusive == 1190)
            #expect(report.lineItems?.first?.taxAmount == 190)
            #expect(report.lineItems?.first?.netAmountTaxExclusive == 1000)
            #expect(report.lineItems?.first?.eventType == "BUY")
            await relay.apply()
            #expect(await store.externalToken(token)?.reports.count == 1)

            // Refunded by the payment provider: the credit reversed through the refund path, and
            // a new report with a REFUND line item that references the buy.
            let refund = try await API.call(relay.client, .post, "/v1/purchases/web/pay_1/refund")
            #expect(refund.status == .ok, "\(refund.json)")
            #expect(try await Self.balance(relay, "webber") == 0)
            await relay.apply()
            let reports = try #require(await store.externalToken(token)?.reports)
            #expect(reports.count == 2)
            let second = try #require(await store.externalReport(reports[1]))
            #expect(second.lineItems?.map(\.eventType) == ["REFUND"])
            #expect(second.lineItems?.first?.referenceLineItemId == report.lineItems?.first?.lineItemId)
            #expect(try await API.call(relay.client, .post, "/v1/purchases/web/nope/refund").status == .notFound)

            // Apple's UNREPORTED nag, ten days on, about a token nobody here knew:
            // UNRECOGNIZED_TOKEN. The reported token gets no nag.
            let stranger = await store.issueExternalPurchaseToken()
            await store.advance(by: 11 * 86_400)
            #expect(try await relay.deliver() == ["EXTERNAL_PURCHASE_TOKEN"])
            let nag = try #require(await store.externalToken(stranger)?.reports.first)
            #expect(await store.externalReport(nag)?.status == "UNRECOGNIZED_TOKEN")
            let listed =
                try await API.call(relay.client, .get, "/v1/external-purchases/tokens").json["tokens"]
                as? [[String: Any]]
            #expect(listed?.count == 2)
            #expect(
                listed?.contains {
                    $0["externalPurchaseId"] as? String == stranger && $0["unreportedNotices"] as? Int == 1
                } == true)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aWebSubscriptionRenewsLapsesAndIsReportedWithItsPeriods(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: { $0.externalPurchaseReporting = true }) { relay in
            let store = relay.store
            let token = await store.issueExternalPurchaseToken()
            let now = Date()
            func iso(_ days: Double) -> String { StoreKeeperApp.iso(now.addingTimeInterval(days * 86_400)) }
            func body(_ payment: String, expires: String, original: String? = nil, account: String = "subscriber")
                -> String
            {
                let originalField = original.map { #","originalPaymentId":"\#($0)""# } ?? ""
                let tokenField = account == "subscriber" ? #","externalPurchaseToken":"\#(token)""# : ""
                return
                    #"{"store":"web","accountId":"\#(account)","productId":"pro_monthly","paymentId":"\#(payment)","price":"5.99","currency":"EUR","taxAmount":"0.99","taxCountry":"DEU","expiresAt":"\#(expires)"\#(originalField)\#(tokenField)}"#
            }
            // The first payment starts the subscription: access until its period's end.
            let first = try await Self.web(relay, body("sub_1", expires: iso(30)))
            #expect(first.status == .ok, "\(first.json)")
            var shown = try #require(try await relay.subscription("subscriber"))
            #expect(shown["originalTransactionId"] as? String == "web:sub_1")
            #expect(shown["status"] as? String == "active")
            #expect(try await relay.entitlements("subscriber").map { $0["id"] as? String } == ["pro"])

            // The renewal names the first payment; the period moves on. Retried: once.
            let renewal = try await Self.web(relay, body("sub_2", expires: iso(60), original: "sub_1"))
            #expect(renewal.status == .ok, "\(renewal.json)")
            #expect(
                try await Self.web(relay, body("sub_2", expires: iso(60), original: "sub_1")).json["status"] as? String
                    == "already_delivered")
            shown = try #require(try await relay.subscription("subscriber"))
            #expect(
                (shown["expiresAt"] as? String).flatMap(StoreKeeperApp.parseDate).map { Int($0.timeIntervalSince1970) }
                    == Int(now.addingTimeInterval(60 * 86_400).timeIntervalSince1970))
            #expect((try await relay.account("subscriber")["subscriptions"] as? [Any])?.count == 1)

            // Wrong originals and periods: refused, nothing recorded.
            let stranger = try await Self.web(relay, body("sub_x", expires: iso(30), account: "other"))
            #expect(stranger.status == .ok)
            for (bad, code) in [
                (body("sub_3", expires: iso(90), original: "nope"), "invalid_original_payment"),
                (body("sub_3", expires: iso(90), original: "sub_2"), "invalid_original_payment"),
                (body("sub_3", expires: iso(90), original: "sub_x"), "invalid_original_payment"),
                (body("sub_3", expires: iso(-1)), "bad_request"),
                (body("sub_3", expires: iso(401)), "bad_request"),
                (body("sub_3", expires: "yesterday"), "bad_request"),
                (
                    #"{"store":"web","accountId":"subscriber","productId":"coins_60","paymentId":"sub_3","price":1,"currency":"EUR","expiresAt":"\#(iso(30))"}"#,
                    "bad_request"
                ),
            ] {
                let reply = try await Self.web(relay, bad)
                #expect((reply.json["error"] as? [String: Any])?["code"] as? String == code, "\(bad) → \(reply.json)")
            }
            // Apple extends only its own subscriptions.
            let extend = try await API.call(
                relay.client, .post, "/v1/subscriptions/web:sub_1/extend",
                body: #"{"days":7,"reason":"customer_satisfaction"}"#)
            #expect((extend.json["error"] as? [String: Any])?["code"] as? String == "not_extendable", "\(extend.json)")

            // Reported with their periods: the start, then the renewal referencing it.
            await relay.apply()
            let reports = try #require(await store.externalToken(token)?.reports)
            var items: [ExternalPurchaseLineItem] = []
            for report in reports { items += await store.externalReport(report)?.lineItems ?? [] }
            let start = try #require(items.first { $0.subscriptionEvent == "SUBSCRIPTION_START" })
            let renewed = try #require(items.first { $0.subscriptionEvent == "RENEWAL" })
            #expect(start.productType == "SUBSCRIPTION" && renewed.productType == "SUBSCRIPTION")
            #expect(renewed.referenceLineItemId == start.lineItemId)
            #expect(renewed.subscriptionDaysOfPaidService == 60)
            #expect(start.subscriptionDaysOfPaidService == 30)
            #expect(renewed.amountTaxInclusive == 5990 && renewed.netAmountTaxExclusive == 5000)

            // A refund of the older period keeps the current one (A1, on the web rail too).
            let refund = try await API.call(relay.client, .post, "/v1/purchases/web/sub_1/refund")
            #expect(refund.status == .ok, "\(refund.json)")
            #expect(try await relay.subscription("subscriber")?["status"] as? String == "active")
            #expect(try await relay.entitlements("subscriber").count == 1)

            // No payment for the next period: the minute's sweep lapses it, once.
            let later = now.addingTimeInterval(61 * 86_400)
            #expect(
                try await relay.app.store.reconciliation.lapseWebSubscriptions(catalog: relay.app.catalog, now: now)
                    == 0)
            #expect(
                try await relay.app.store.reconciliation.lapseWebSubscriptions(catalog: relay.app.catalog, now: later)
                    == 2)
            #expect(
                try await relay.app.store.reconciliation.lapseWebSubscriptions(catalog: relay.app.catalog, now: later)
                    == 0)
            #expect(try await relay.subscription("subscriber")?["status"] as? String == "expired")
            #expect(try await relay.entitlements("subscriber").isEmpty)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aSecondCustomLinkTokenOfTheSameTypeIsReportedAsADuplicate(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: { $0.externalPurchaseReporting = true }) { relay in
            let store = relay.store
            let first = await store.issueExternalPurchaseToken(tokenType: "ACQUISITION")
            await store.advance(by: 3600)
            let second = await store.issueExternalPurchaseToken(tokenType: "ACQUISITION")
            let services = await store.issueExternalPurchaseToken(tokenType: "SERVICES")
            let client = try await ServerAPITests.clientToken("linked")
            for (id, type) in [(first, "ACQUISITION"), (second, "ACQUISITION"), (services, "SERVICES")] {
                let reply = try await API.call(
                    relay.client, .post, "/v1/external-purchases/tokens", token: client,
                    body: #"{"accountId":"linked","externalPurchaseId":"\#(id)","tokenType":"\#(type)"}"#)
                #expect(reply.status == .ok, "\(reply.json)")
                #expect(reply.json["accountId"] as? String == "linked")
            }
            // Another account's token, a bad type, someone else's account: refused.
            let taken = try await API.call(
                relay.client, .post, "/v1/external-purchases/tokens",
                body: #"{"accountId":"someone","externalPurchaseId":"\#(first)"}"#)
            #expect((taken.json["error"] as? [String: Any])?["code"] as? String == "token_of_another_account")
            let badType = try await API.call(
                relay.client, .post, "/v1/external-purchases/tokens",
                body: #"{"accountId":"linked","externalPurchaseId":"x","tokenType":"OTHER"}"#)
            #expect(badType.status == .badRequest)
            let foreign = try await API.call(
                relay.client, .post, "/v1/external-purchases/tokens", token: client,
                body: #"{"accountId":"someone","externalPurchaseId":"y"}"#)
            #expect(foreign.status == .forbidden)

            // Apple nags about all three (nothing bought): the first and the SERVICES token are
            // NO_LINE_ITEM; the second ACQUISITION token, created while the first was active,
            // DUPLICATE_TOKEN.
            await store.advance(by: 11 * 86_400)
            _ = try await relay.deliver()
            await relay.apply()
            func status(_ id: String) async -> String? {
                guard let report = await store.externalToken(id)?.reports.first else { return nil }
                return await store.externalReport(report)?.status
            }
            #expect(await status(first) == "NO_LINE_ITEM")
            #expect(await status(second) == "DUPLICATE_TOKEN")
            #expect(await status(services) == "NO_LINE_ITEM")
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aReportAppleRejectsIsKeptAndOneThatFailedIsResentWithItsIdentifier(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: { $0.externalPurchaseReporting = true }) { relay in
            let store = relay.store
            let token = await store.issueExternalPurchaseToken()
            var faults = Faults()
            faults.endpoints["externalReport"] = .init(status: 503, count: 1)
            await store.setFaults(faults)
            _ = try await Self.web(
                relay,
                #"{"store":"web","accountId":"w2","productId":"remove_ads","paymentId":"pay_9","price":2.99,"currency":"USD","externalPurchaseToken":"\#(token)"}"#
            )
            let runner = JobRunner(app: relay.app)
            for hour in 0...2 { _ = await runner.runDueCounting(now: Date().addingTimeInterval(Double(hour) * 3600)) }
            let journal = try await ExternalPurchaseStore(database: relay.app.database).reports(token: token)
            // One report: failed once (503), then sent with the same requestIdentifier.
            #expect(journal.count == 1)
            #expect(journal.first?.state == "sent")
            #expect(await store.externalToken(token)?.reports == journal.map(\.requestIdentifier))
        }
    }

    // MARK: A5: monthly billing with a 12-month commitment

    @Test(arguments: ServerAPITests.databases)
    func aCommitmentCancelledInMonthFourRenewsToMonthTwelveThenEnds(kind: String) async throws {
        try await NotificationTests.withRelay(kind, configure: { $0.environments = [.production, .sandbox] }) { relay in
            let store = relay.store
            let order = try await ScenarioTests.order(relay.client, account: "committed", product: "pro_yearly")
            let bought = try await store.buy(
                "apple-committed", items: [.init(productId: "pro_yearly", billingPlan: "MONTHLY")],
                appAccountToken: order.token)
            let first = bought.transactions[0]
            #expect(first.billingPlanType == .monthly)
            #expect(first.commitmentInfo?.billingPeriodNumber == 1)
            #expect(first.price == Int64(49_990 / 12))
            _ = try await API.submit(
                relay.client, account: "committed", signedTransaction: bought.signedTransactions[0])
            _ = try await relay.deliver()
            let original = try #require(first.originalTransactionId)
            func state() async throws -> SubscriptionState? {
                try await SubscriptionStore.state(original, database: relay.app.database)
            }
            // Months 2 and 3 bill; in month 4 the customer cancels.
            for _ in 0..<3 {
                await store.advance(by: 31 * 86_400)
                _ = try await relay.deliver()
            }
            #expect(try await state()?.commitment?.period == 4)
            try await store.setAutoRenew(original, false)
            _ = try await relay.deliver()
            let cancelled = try #require(try await state())
            #expect(cancelled.commitment?.renews == false)
            #expect(cancelled.willRenew)
            #expect(cancelled.endsAt == cancelled.commitment?.expiresAt)
            #expect(try await relay.subscription("committed")?["autoRenew"] as? Bool == true)
            let shown = try #require(try await relay.subscription("committed")?["commitment"] as? [String: Any])
            #expect(shown["billingPeriod"] as? Int == 4 && shown["totalBillingPeriods"] as? Int == 12)
            #expect(shown["renews"] as? Bool == false)
            #expect(shown["expiresAt"] is String)
            // It keeps billing monthly to period 12…
            for _ in 0..<8 {
                await store.advance(by: 31 * 86_400)
                _ = try await relay.deliver()
                #expect(try await relay.subscription("committed")?["status"] as? String == "active")
            }
            #expect(try await state()?.commitment?.period == 12)
            #expect(try await state()?.willRenew == false)
            // …then ends.
            await store.advance(by: 31 * 86_400)
            _ = try await relay.deliver()
            #expect(try await relay.subscription("committed")?["status"] as? String == "expired")
            #expect(try await relay.entitlements("committed").allSatisfy { $0["active"] as? Bool == false })
            // Twelve monthly deliveries, each booked at the monthly price (not the commitment's).
            let deliveries = try await relay.app.store.accounts.deliveries(of: "committed")
            #expect(deliveries.count == 12)
            let revenue = try await API.call(relay.client, .get, "/v1/revenue?since=2000-01-01").json
            let usd = (revenue["currencies"] as? [[String: Any]])?.first { $0["currency"] as? String == "USD" }
            // Sandbox deliveries are counted apart; Production ones at the monthly price.
            #expect((revenue["sandboxTransactions"] as? Int ?? 0) + (usd?["transactions"] as? Int ?? 0) == 12)
            if let usd { #expect(usd["grossMilli"] as? Int == 12 * (49_990 / 12)) }
        }
    }

    @Test func theMachineKeepsACommitmentBillingThroughACancel() {
        let start = Date(timeIntervalSince1970: 1_767_225_600)
        func transaction(_ period: Int32) -> StoreTransaction {
            StoreTransaction.appStore(
                transactionId: "t\(period)", originalTransactionId: "t1", productId: "pro_yearly",
                expiresDate: Int64(start.timeIntervalSince1970 * 1000) + Int64(period) * 2_592_000_000,
                billingPlanType: .monthly,
                commitmentInfo: .init(
                    billingPeriodNumber: period, totalBillingPeriods: 12,
                    commitmentExpiresDate: Int64(start.timeIntervalSince1970 * 1000) + 31_536_000_000))
        }
        var (state, _) = SubscriptionMachine.apply(
            nil,
            SubscriptionEvent(.apple(.subscribed, .initialBuy), signedDate: start, transaction: transaction(1)))
        #expect(state?.commitment?.period == 1)
        (state, _) = SubscriptionMachine.apply(
            state,
            SubscriptionEvent(
                .apple(.didChangeRenewalStatus, .autoRenewDisabled), signedDate: start.addingTimeInterval(60),
                transaction: transaction(1)))
        #expect(state?.autoRenew == true)
        #expect(state?.commitment?.renews == false)
        #expect(state?.willRenew == true)
        (state, _) = SubscriptionMachine.apply(
            state,
            SubscriptionEvent(
                .apple(.didRenew), signedDate: start.addingTimeInterval(2_592_000),
                transaction: transaction(2)))
        #expect(state?.commitment?.period == 2)
        #expect(state?.status == .active)
        #expect(state?.commitment?.renews == false)
        // A plan billed up front has no commitment: a cancel stops it at its period's end.
        var upfront = transaction(1)
        upfront.billingPlan = .billedUpfront
        upfront.commitment = nil
        (state, _) = SubscriptionMachine.apply(
            state,
            SubscriptionEvent(
                .apple(.didRenew), signedDate: start.addingTimeInterval(5_184_000),
                transaction: {
                    var next = upfront
                    next.transactionId = "t99"
                    next.expiresDate = Int64(start.timeIntervalSince1970 * 1000) + 40_000_000_000
                    return next
                }()))
        #expect(state?.commitment == nil)
    }

    @Test(arguments: ServerAPITests.databases)
    func getAppTransactionInfoAnswersSupportWithoutTheDevice(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let (_, coins) = try await relay.buy("helped", "coins_60", appleId: "apple-helped")
            let reply = try await API.call(relay.client, .get, "/v1/app-transactions/\(coins.transactionId!)")
            #expect(reply.status == .ok, "\(reply.json)")
            #expect(reply.json["appTransactionId"] as? String == coins.appTransactionId)
            #expect(reply.json["bundleId"] as? String == "com.example.app")
            #expect(reply.json["accountIds"] as? [String] == ["helped"])
            #expect(reply.json["originalApplicationVersion"] as? String == "1")
            // By the appTransactionId itself (anyTransactionId), too.
            let byApp = try await API.call(relay.client, .get, "/v1/app-transactions/\(coins.appTransactionId!)")
            #expect(byApp.json["appTransactionId"] as? String == coins.appTransactionId)
            #expect(try await API.call(relay.client, .get, "/v1/app-transactions/999999999").status == .notFound)
            // The dashboard's account page lists the Apple Account and shows its app transaction.
            let browser = DashboardTests.Browser(relay.client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let page = try await browser.get("/dashboard/accounts/helped?appTransaction=\(coins.appTransactionId!)")
            #expect(page.body.contains("<code>\(coins.appTransactionId!)</code>"))
            #expect(page.body.contains(#"<table id="app-transaction">"#))
            #expect(page.body.contains("<tr><th>Original version</th><td>1</td></tr>"))
            #expect(try await API.call(relay.client, .get, "/v1/app-transactions/abc").status == .badRequest)
            let client = try await ServerAPITests.clientToken("helped")
            #expect(
                try await API.call(relay.client, .get, "/v1/app-transactions/\(coins.transactionId!)", token: client)
                    .status == .forbidden)
        }
    }
}

extension Date {
    fileprivate init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
