import AppStoreModels
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// App Store Server Notifications through `POST /v1/notifications/apple` on the real server
/// (SQLite and PostgreSQL), sent by the local App Store as Apple sends them, applied by the
/// job runner — docs/scenarios.md S1–S7.
@Suite struct NotificationTests {
    typealias API = ServerAPITests

    /// Apple's side of the wire: POSTs what the local App Store queued since last time, and
    /// runs the server's jobs so it is applied.
    final class Relay: @unchecked Sendable {
        let app: StoreKeeperApp
        let client: any TestClientProtocol
        var sent = 0

        init(_ app: StoreKeeperApp, _ client: any TestClientProtocol) {
            self.app = app
            self.client = client
        }

        var store: LocalAppStore { app.localAppStore! }

        /// The notifications queued and not yet relayed.
        func take() async -> [LocalAppStore.SentNotification] {
            let all = await store.notifications
            defer { sent = all.count }
            return Array(all[sent...])
        }

        @discardableResult
        func post(_ signedPayload: String) async throws -> API.Reply {
            try await API.call(client, .post, "/v1/notifications/apple", token: nil, body: Self.body(signedPayload))
        }

        static func body(_ signedPayload: String) -> String {
            #"{"signedPayload":"\#(signedPayload)"}"#
        }

        /// Sends everything new (each `times` times, newest first when `reversed`) and applies
        /// it — all together, or each as it arrives (`applyEach`).
        @discardableResult
        /// `settled`: until no notification job is left pending (a loaded machine's storage
        /// deadline reschedules a job for seconds later; a long history must not lose one).
        func deliver(times: Int = 1, reversed: Bool = false, applyEach: Bool = false, settled: Bool = false)
            async throws -> [String]
        {
            var due = await take()
            if reversed { due.reverse() }
            for notification in due {
                for _ in 0..<times {
                    let reply = try await post(notification.signedPayload)
                    #expect(reply.status == .ok, "\(reply.json)")
                }
                if applyEach { await apply() }
            }
            await apply(settled: settled)
            return due.compactMap { $0.payload.notificationType?.rawValue }
        }

        func apply(settled: Bool = false) async {
            let runner = JobRunner(app: app)
            let bound = Date().addingTimeInterval(120)
            repeat {
                while await runner.runDueCounting(now: Date()).claimed > 0 {}
                guard settled else { return }
                let left = (try? await app.jobs.pending(kind: NotificationStore.jobKind, limit: 1).count) ?? 1
                if left == 0 { return }
                try? await Task.sleep(for: .milliseconds(250))
            } while Date() < bound
        }

        func account(_ id: String) async throws -> [String: Any] {
            try await API.call(client, .get, "/v1/accounts/\(id)").json
        }

        func subscription(_ id: String) async throws -> [String: Any]? {
            (try await account(id)["subscriptions"] as? [[String: Any]])?.first
        }

        func entitlements(_ id: String) async throws -> [[String: Any]] {
            try await account(id)["entitlements"] as? [[String: Any]] ?? []
        }

        /// An order for `product`, paid in the local App Store with its token, submitted.
        func buy(_ account: String, _ product: String, appleId: String? = nil) async throws -> (
            order: String, transaction: JWSTransactionDecodedPayload
        ) {
            let order = try await ScenarioTests.order(client, account: account, product: product)
            let bought = try await store.buy(
                appleId ?? "apple-\(account)", items: [.init(productId: product)], appAccountToken: order.token)
            let reply = try await API.submit(client, account: account, signedTransaction: bought.signedTransactions[0])
            #expect(reply.status == .ok, "\(reply.json)")
            return (order.id, bought.transactions[0])
        }

        func statuses() async throws -> [String: Int] { try await app.notifications.counts() }
    }

    static func withRelay(
        _ kind: String, configure: @Sendable (inout ServerConfiguration) -> Void = { _ in },
        prepare: @Sendable (inout StoreKeeperApp) -> Void = { _ in },
        _ body: @Sendable (Relay) async throws -> Void
    ) async throws {
        try await API.withServer(kind, configure: configure, prepare: prepare) { app, client in
            try await body(Relay(app, client))
        }
    }

    // MARK: S2: the subscription's life

    @Test(arguments: ServerAPITests.databases)
    func renewalGraceRetryRecoveryCancelExpiryAndResubscribe(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            let (_, first) = try await relay.buy("sam", "pro_monthly")
            let original = try #require(first.originalTransactionId)
            // The SUBSCRIBED that arrives after the app's submission changes nothing new.
            #expect(try await relay.deliver() == ["SUBSCRIBED"])
            #expect(try await relay.subscription("sam")?["status"] as? String == "active")

            // Renewal ×2.
            await store.advance(by: 32 * 86_400)
            await store.advance(by: 31 * 86_400)
            #expect(try await relay.deliver() == ["DID_RENEW", "DID_RENEW"])
            let renewed = try #require(try await relay.subscription("sam"))
            #expect(renewed["status"] as? String == "active")
            let renewedExpiry = try #require(renewed["expiresAt"] as? String)
            #expect(try await relay.entitlements("sam").first?["expiresAt"] as? String == renewedExpiry)
            #expect(try await API.call(relay.client, .get, "/v1/accounts/sam").json["entitlements"] != nil)

            // The card fails: grace period (still entitled), then billing retry (not).
            await store.setBillingFails("apple-sam", true)
            await store.advance(by: 31 * 86_400)
            #expect(try await relay.deliver() == ["DID_FAIL_TO_RENEW"])
            #expect(try await relay.subscription("sam")?["status"] as? String == "grace_period")
            #expect(try await relay.entitlements("sam").count == 1)
            await store.advance(by: 17 * 86_400)
            #expect(try await relay.deliver() == ["GRACE_PERIOD_EXPIRED"])
            #expect(try await relay.subscription("sam")?["status"] as? String == "billing_retry")
            #expect(try await relay.entitlements("sam").isEmpty)

            // The card works again: billing recovery.
            await store.setBillingFails("apple-sam", false)
            await store.advance(by: 86_400)
            #expect(try await relay.deliver() == ["DID_RENEW"])
            #expect(try await relay.subscription("sam")?["status"] as? String == "active")
            #expect(try await relay.entitlements("sam").count == 1)

            // Voluntary cancel: auto-renew off, access until expiry, then expired.
            try await store.setAutoRenew(original, false)
            #expect(try await relay.deliver() == ["DID_CHANGE_RENEWAL_STATUS"])
            #expect(try await relay.subscription("sam")?["autoRenew"] as? Bool == false)
            #expect(try await relay.subscription("sam")?["status"] as? String == "active")
            await store.advance(by: 32 * 86_400)
            #expect(try await relay.deliver() == ["EXPIRED"])
            #expect(try await relay.subscription("sam")?["status"] as? String == "expired")
            #expect(try await relay.entitlements("sam").isEmpty)

            // Resubscribe from the app (a new order): the same subscription, active again.
            _ = try await relay.buy("sam", "pro_monthly")
            #expect(try await relay.deliver() == ["SUBSCRIBED"])
            let back = try #require(try await relay.subscription("sam"))
            #expect(back["originalTransactionId"] as? String == original)
            #expect(back["status"] as? String == "active")
            #expect(back["autoRenew"] as? Bool == true)
            #expect(try await relay.entitlements("sam").count == 1)
            let counts = try await relay.statuses()
            #expect(counts["pending"] == nil && counts["unattributed"] == nil, "\(counts)")
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func billingRetryEndsInExpiry(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            _ = try await relay.buy("ria", "pro_monthly")
            await store.setBillingFails("apple-ria", true)
            await store.advance(by: 32 * 86_400)
            await store.advance(by: 17 * 86_400)
            await store.advance(by: 60 * 86_400)
            #expect(
                try await relay.deliver() == ["SUBSCRIBED", "DID_FAIL_TO_RENEW", "GRACE_PERIOD_EXPIRED", "EXPIRED"])
            #expect(try await relay.subscription("ria")?["status"] as? String == "expired")
            #expect(try await relay.entitlements("ria").isEmpty)
        }
    }

    // MARK: S3, S4: duplicates and order

    @Test(arguments: ServerAPITests.databases)
    func duplicatesApplyOnceAndALateRenewalCannotUndoARefund(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            // A consumable Apple reports before the app submits it: delivered once, whatever
            // the retries.
            let order = try await ScenarioTests.order(relay.client, account: "dup", product: "coins_60")
            let bought = try await store.buy(
                "apple-dup", items: [.init(productId: "coins_60")], appAccountToken: order.token)
            #expect(try await relay.deliver(times: 6) == ["ONE_TIME_CHARGE"])
            #expect((try await relay.account("dup")["balances"] as? [String: Int])?["coins"] == 60)
            let late = try await API.submit(
                relay.client, account: "dup", signedTransaction: bought.signedTransactions[0])
            #expect(late.json["status"] as? String == "already_delivered")
            #expect((try await relay.account("dup")["balances"] as? [String: Int])?["coins"] == 60)
            #expect(try await ScenarioTests.status(relay.client, order: order.id) == "delivered")
            let recorded = try await relay.app.notifications.notifications()
            #expect(recorded.count == 1)

            // S4: a renewal and then a refund of it, delivered newest first.
            let (_, first) = try await relay.buy("ola", "pro_monthly")
            _ = try await relay.deliver()
            await store.advance(by: 32 * 86_400)
            let renewal = try #require(await store.subscription(first.originalTransactionId!)?.lastTransactionId)
            try await store.refund(renewal)
            #expect(try await relay.deliver(reversed: true, applyEach: true) == ["REFUND", "DID_RENEW"])
            #expect(try await relay.subscription("ola")?["status"] as? String == "revoked")
            #expect(try await relay.entitlements("ola").isEmpty)
            let stale = try await relay.app.notifications.notifications(subject: first.originalTransactionId!)
                .filter { $0.type == "DID_RENEW" }
            #expect(stale.map(\.status) == ["stale"])
            // The refunded period was never delivered: it is recorded as refunded with nothing,
            // so neither the late renewal nor the app's submission of it delivers it.
            let marker = try await relay.app.store.accounts.deliveries(of: "ola").filter { $0.transactionId == renewal }
            #expect(marker.map(\.quantity) == [0])
            #expect(marker.first?.refunded == true)
            let resubmitted = try await API.submit(
                relay.client, account: "ola", signedTransaction: try await store.signTransaction(renewal))
            #expect(resubmitted.status == .ok)
            #expect((resubmitted.json["transactions"] as? [[String: Any]])?.first?["outcome"] as? String == "refunded")
            #expect(try await relay.subscription("ola")?["status"] as? String == "revoked")
            #expect(try await relay.entitlements("ola").isEmpty)
            let noisy =
                try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []
            #expect(!noisy.contains { $0["kind"] as? String == "refunded_after_delivery" })
        }
    }

    // MARK: S5: refunds of what was spent, and their reversal

    @Test(arguments: ServerAPITests.databases)
    func refundOfASpentConsumableGoesNegativeAndItsReversalReinstates(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            let (order, transaction) = try await relay.buy("spender", "coins_60")
            _ = try await relay.deliver()
            let spent = try await API.call(
                relay.client, .post, "/v1/accounts/spender/balances/coins/debit",
                body: #"{"amount":50,"idempotencyKey":"sword"}"#)
            #expect(spent.json["balance"] as? Int == 10)
            try await store.refund(transaction.transactionId!)
            #expect(try await relay.deliver(times: 2) == ["REFUND"])
            #expect((try await relay.account("spender")["balances"] as? [String: Int])?["coins"] == -50)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "refunded")
            let anomalies =
                try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []
            #expect(anomalies.filter { $0["kind"] as? String == "refunded_after_delivery" }.count == 1)
            // The submission of a refunded transaction delivers nothing.
            #expect((try await relay.account("spender")["balances"] as? [String: Int])?["coins"] == -50)

            try await store.reverseRefund(transaction.transactionId!)
            #expect(try await relay.deliver(times: 3) == ["REFUND_REVERSED"])
            #expect((try await relay.account("spender")["balances"] as? [String: Int])?["coins"] == 10)
            #expect(try await ScenarioTests.status(relay.client, order: order) == "delivered")

            // A non-consumable refunded loses its entitlement; reversed, gets it back.
            let (adsOrder, ads) = try await relay.buy("spender", "remove_ads")
            _ = try await relay.deliver()
            #expect(try await relay.entitlements("spender").map { $0["id"] as? String } == ["no_ads"])
            try await store.refund(ads.transactionId!)
            #expect(try await relay.deliver() == ["REFUND"])
            #expect(try await relay.entitlements("spender").isEmpty)
            #expect(try await ScenarioTests.status(relay.client, order: adsOrder) == "refunded")
            try await store.reverseRefund(ads.transactionId!)
            #expect(try await relay.deliver() == ["REFUND_REVERSED"])
            #expect(try await relay.entitlements("spender").count == 1)
            // The webhook events, as docs/webhooks.md shows them.
            let events = try await OutboxStore(database: relay.app.database).all().map(\.event)
            func data(_ type: String) -> [[String: Any]] {
                events.filter { $0.type == type }.compactMap {
                    try? JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
                }
            }
            let refunds = data("refund")
            #expect(refunds.count == 2)
            #expect(refunds.first?["amount"] as? Int == -60)
            #expect(refunds.first?["currency"] as? String == "coins")
            #expect(refunds.first?["kind"] as? String == "refund")
            #expect(refunds.first?["orderId"] as? String == order)
            #expect(refunds.last?["amount"] is NSNull)
            #expect(data("refund_reversed").first?["amount"] as? Int == 60)
            let opened = data("anomaly_opened").filter { $0["kind"] as? String == "refunded_after_delivery" }
            #expect(opened.count == 1)
            #expect(opened.first?["status"] as? String == "open" && opened.first?["resolution"] is NSNull)
            #expect(opened.first?["accountId"] as? String == "spender")
            let audit = try await relay.app.store.anomalies.audit().map(\.action)
            #expect(audit.filter { $0 == "refund" }.count == 2)
            #expect(audit.filter { $0 == "refund_reversed" }.count == 2)
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func familySharingRevokeRemovesAccessAndRefundDeclinedIsRecorded(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            let (_, ads) = try await relay.buy("kid", "remove_ads")
            try await store.requestRefund(ads.transactionId!)
            try await store.declineRefund(ads.transactionId!)
            try await store.revokeFamilySharing(ads.transactionId!)
            #expect(
                try await relay.deliver() == ["ONE_TIME_CHARGE", "CONSUMPTION_REQUEST", "REFUND_DECLINED", "REVOKE"])
            #expect(try await relay.entitlements("kid").isEmpty)
            let recorded = try await relay.app.notifications.notifications(subject: ads.originalTransactionId!)
            // By type: the local App Store can sign two of them in the same millisecond, and the
            // record orders a tie by notificationUUID.
            #expect(
                Dictionary(uniqueKeysWithValues: recorded.map { ($0.type, $0.status) }) == [
                    "ONE_TIME_CHARGE": "applied", "CONSUMPTION_REQUEST": "ignored", "REFUND_DECLINED": "ignored",
                    "REVOKE": "applied",
                ],
                "\(recorded.map { ($0.type, $0.status, $0.outcome ?? "") })")
        }
    }

    // MARK: S6: consumption requests

    @Test(arguments: ServerAPITests.databases)
    func consumptionRequestsAreAnsweredFromTheLedgerWhenEnabled(kind: String) async throws {
        try await Self.withRelay(kind, configure: { $0.consumptionEnabled = true }) { relay in
            let store = relay.store
            _ = try await API.call(relay.client, .put, "/v1/accounts/gamer/consent", body: #"{"consumptionData":true}"#)
            let (_, coins) = try await relay.buy("gamer", "coins_300")
            _ = try await API.call(
                relay.client, .post, "/v1/accounts/gamer/balances/coins/debit",
                body: #"{"amount":75,"idempotencyKey":"potion"}"#)
            try await store.requestRefund(coins.transactionId!)
            #expect(try await relay.deliver(times: 2) == ["ONE_TIME_CHARGE", "CONSUMPTION_REQUEST"])
            let received = try #require(await store.transaction(coins.transactionId!)?.consumptionReceived)
            #expect(received.count == 1)
            #expect(received.first?.deliveryStatus == .delivered)
            #expect(received.first?.consumptionPercentage == 25_000)
            #expect(received.first?.customerConsented == true)
            #expect(try await relay.app.store.anomalies.audit().contains { $0.action == "consumption_sent" })
        }
    }

    // MARK: S7: upgrade, downgrade, crossgrade

    @Test(arguments: ServerAPITests.databases)
    func upgradeIsImmediateDowngradeAtRenewalWithOneEntitlement(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            let (_, first) = try await relay.buy("up", "pro_monthly")
            let original = first.originalTransactionId!
            try await store.changeProduct(original, to: "pro_yearly")  // higher level: immediate
            #expect(try await relay.deliver() == ["SUBSCRIBED", "DID_CHANGE_RENEWAL_PREF"])
            var subscription = try #require(try await relay.subscription("up"))
            #expect(subscription["productId"] as? String == "pro_yearly")
            var entitlements = try await relay.entitlements("up")
            #expect(entitlements.count == 1)
            #expect(entitlements.first?["productId"] as? String == "pro_yearly")
            #expect(entitlements.first?["expiresAt"] as? String == subscription["expiresAt"] as? String)

            try await store.changeProduct(original, to: "pro_monthly")  // lower level: at renewal
            #expect(try await relay.deliver() == ["DID_CHANGE_RENEWAL_PREF"])
            #expect(try await relay.subscription("up")?["productId"] as? String == "pro_yearly")
            await store.advance(by: 367 * 86_400)
            #expect(try await relay.deliver() == ["DID_RENEW"])
            subscription = try #require(try await relay.subscription("up"))
            #expect(subscription["productId"] as? String == "pro_monthly")
            entitlements = try await relay.entitlements("up")
            #expect(entitlements.count == 1)
            #expect(entitlements.first?["productId"] as? String == "pro_monthly")
        }
    }

    // MARK: S1: ownership

    @Test(arguments: ServerAPITests.databases)
    func renewalsCreditTheBoundAccountNeverWhoeverIsLoggedIn(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            let (_, first) = try await relay.buy("alice", "pro_monthly", appleId: "shared-id")
            _ = try await relay.deliver()
            await store.advance(by: 32 * 86_400)
            #expect(try await relay.deliver() == ["DID_RENEW"])
            let renewal = try #require(await store.subscription(first.originalTransactionId!)?.lastTransactionId)
            #expect(try await relay.app.store.accounts.deliveries(of: "alice").map(\.transactionId).contains(renewal))
            // Bob logs in on the same device and Apple ID: the app submits the renewal.
            let signed = try await store.signTransaction(renewal)
            let bob = try await API.submit(relay.client, account: "bob", signedTransaction: signed)
            #expect(bob.status == .conflict)
            #expect(bob.errorCode == "owned_by_other_account")
            #expect(try await relay.subscription("bob") == nil)
            #expect(try await relay.subscription("alice")?["status"] as? String == "active")
            let anomalies =
                try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []
            #expect(anomalies.contains { $0["kind"] as? String == "ownership_conflict" })
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func aSubscriptionNoAccountOwnsIsHeldUntilOneSubmitsIt(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            // Bought outside the app (an offer code): no order, no token.
            let bought = try await store.buy("stranger", items: [.init(productId: "pro_monthly")])
            let original = try #require(bought.transactions[0].originalTransactionId)
            #expect(try await relay.deliver() == ["SUBSCRIBED"])
            #expect(
                try await relay.app.notifications.notifications(subject: original).map(\.status) == ["unattributed"])
            var anomalies =
                try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []
            #expect(anomalies.contains { $0["kind"] as? String == "unattributed_transaction" })
            // A renewal meanwhile is held too.
            await store.advance(by: 32 * 86_400)
            #expect(try await relay.deliver() == ["DID_RENEW"])

            // The customer opens the app: it submits the first period, an account owns it now,
            // and what was held applies in order.
            let reply = try await API.submit(
                relay.client, account: "claire", signedTransaction: bought.signedTransactions[0])
            #expect(reply.status == .ok)
            await relay.apply()
            #expect(
                try await relay.app.notifications.notifications(subject: original).map(\.status) == [
                    "applied", "applied",
                ])
            let subscription = try #require(try await relay.subscription("claire"))
            #expect(subscription["status"] as? String == "active")
            let renewal = try #require(await store.subscription(original)?.lastTransactionId)
            #expect(try await relay.app.store.accounts.deliveries(of: "claire").map(\.transactionId).contains(renewal))
            // The unattributed anomaly closed itself: its purchase is delivered now.
            anomalies =
                try await API.call(relay.client, .get, "/v1/anomalies?status=open").json["anomalies"]
                as? [[String: Any]] ?? []
            #expect(!anomalies.contains { $0["kind"] as? String == "unattributed_transaction" })
            let resolved =
                try await API.call(relay.client, .get, "/v1/anomalies?status=resolved").json["anomalies"]
                as? [[String: Any]] ?? []
            #expect(
                resolved.contains {
                    $0["kind"] as? String == "unattributed_transaction"
                        && $0["resolution"] as? String == "delivered_later"
                })
        }
    }

    // MARK: Metrics

    @Test func metricsCountAcceptedRefusedAndTheBacklog() async throws {
        try await Self.withRelay("sqlite") { relay in
            func metrics() async throws -> String {
                try await relay.client.execute(
                    uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(API.secret)"]
                ) { String(buffer: $0.body) }
            }
            _ = try await relay.store.buy("m", items: [.init(productId: "coins_60")])
            let payload = try #require(await relay.take().first?.signedPayload)
            #expect(try await relay.post(payload).status == .ok)
            #expect(try await relay.post(payload).status == .ok)
            #expect(try await relay.post("x.y.z").status == .badRequest)
            var text = try await metrics()
            #expect(text.contains("storekeeper_notifications_accepted_total 2"))
            #expect(text.contains("storekeeper_notifications_rejected_total 1"))
            #expect(text.contains("storekeeper_notifications_pending 1"))
            await relay.apply()
            text = try await metrics()
            #expect(text.contains("storekeeper_notifications_pending 0"))
        }
    }

    // MARK: Types with nothing to apply, and the future

    @Test(arguments: ServerAPITests.databases)
    func testAndUnknownTypesAreStoredAndIgnored(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            let store = relay.store
            _ = try await store.sendTestNotification()
            try await store.append(
                ResponseBodyV2DecodedPayload(
                    notificationType: NotificationType(rawValue: "SOMETHING_NEW_IN_2027"), subtype: nil,
                    notificationUUID: UUID().uuidString.lowercased(), version: "2.0",
                    signedDate: Date().milliseconds,
                    data: NotificationData(
                        appAppleId: 1_234_567_890, bundleId: "com.example.app", environment: .sandbox)))
            #expect(try await relay.deliver() == ["TEST", "SOMETHING_NEW_IN_2027"])
            let recorded = try await relay.app.notifications.notifications()
            #expect(recorded.map(\.status) == ["ignored", "ignored"])
            #expect(recorded.allSatisfy { !($0.outcome ?? "").isEmpty })
        }
    }
}
