import Foundation
import HTTPTypes
import LocalGooglePlay
import SQLKit
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// "One core for every store", findings 2–5 on Google Play: a subscription notification names
/// no product (Google's `SubscriptionNotification` is `{version, notificationType,
/// purchaseToken}`); a chain of linked tokens is one subscription, attributed to the account
/// holding the token it replaces; a replacement retires that token only once paid; and an
/// upgrade is a change of product in analytics, not a churn and a new subscription.
@Suite struct GoogleSubscriptionChainTests {
    typealias API = ServerAPITests
    typealias Play = GooglePlayServerTests

    static func today() -> String { String(ISO8601DateFormatter().string(from: Date()).prefix(10)) }

    static func metric(_ play: Play.Play, _ name: String) async throws -> Int? {
        let reply = try await API.call(
            play.client, .get, "/v1/analytics/\(name)?from=\(today())&to=\(today())&store=google_play")
        #expect(reply.status == .ok, "\(reply.json)")
        return (reply.json["points"] as? [[String: Any]])?.last?["value"] as? Int
    }

    @Test(arguments: API.databases)
    func aSubscriptionNotificationForAnUnseenTokenIsApplied(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            // Bought in the app, which died before submitting: only Google's notification comes.
            let order = try await play.order("quiet", "pro_monthly")
            _ = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            #expect(try await play.push() == [.noContent])
            await play.runJobs()
            #expect(try await play.entitlements("quiet") == ["pro"])
            #expect(try await play.subscriptions("quiet").first?["status"] as? String == "active")
        }
    }

    @Test(arguments: API.databases)
    func aPlayStorePlanChangeFollowsTheChainToItsAccount(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("chain", "pro_monthly")
            let monthly = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            #expect(try await play.submit("chain", "pro_monthly", monthly, orderId: order.id).status == .ok)
            _ = try await play.push()
            await play.runJobs()
            // In the Play Store's subscription center: no obfuscated account id on the new token.
            let yearly = try await play.store.buy("pro_yearly", obfuscatedAccountId: nil, linkedPurchaseToken: monthly)
            #expect(try await play.push() == [.noContent])
            await play.runJobs()
            let subscriptions = try await play.subscriptions("chain")
            #expect(subscriptions.count == 1, "\(subscriptions)")
            #expect(subscriptions.first?["productId"] as? String == "pro_yearly")
            #expect(subscriptions.first?["status"] as? String == "active")
            #expect(try await play.entitlements("chain") == ["pro"])
            let anomalies = try await API.call(play.client, .get, "/v1/anomalies").json["anomalies"] as? [[String: Any]]
            #expect(anomalies?.contains { $0["kind"] as? String == "unattributed_transaction" } == false)
            // Another account submitting the new token gets nothing of the chain.
            let thief = try await play.submit("thief", "pro_yearly", yearly)
            #expect(thief.errorCode == "owned_by_other_account", "\(thief.json)")
            // Analytics: one subscription that changed product, not a churn and a new one.
            #expect(try await Self.metric(play, "new_subscriptions") == 1)
            #expect(try await Self.metric(play, "active_subscriptions") == 1)
            let views = try await play.app.database.read { sql in
                try await sql.raw("SELECT COUNT(*) AS n FROM subscriptions").first()?.decode(column: "n", as: Int.self)
            }
            #expect(views == 1)
        }
    }

    @Test(arguments: API.databases)
    func aPendingUpgradeLeavesThePaidSubscriptionUntilItIsPaid(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("slow", "pro_monthly")
            let monthly = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            #expect(try await play.submit("slow", "pro_monthly", monthly, orderId: order.id).status == .ok)
            // An upgrade paid by a slow method: pending.
            let upgradeOrder = try await play.order("slow", "pro_yearly")
            let pending = try await play.store.buy(
                "pro_yearly", obfuscatedAccountId: upgradeOrder.token, pending: true, linkedPurchaseToken: monthly)
            let submitted = try await play.submit("slow", "pro_yearly", pending, orderId: upgradeOrder.id)
            #expect(submitted.status == .accepted, "\(submitted.json)")
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.entitlements("slow") == ["pro"])
            #expect(try await play.subscriptions("slow").first?["productId"] as? String == "pro_monthly")
            // Abandoned: the paid monthly subscription goes on, and keeps renewing.
            try await play.store.completePending(pending, paid: false)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.submit("slow", "pro_monthly", monthly).status == .ok)
            await play.store.advance(by: 32 * 86_400)
            _ = try await play.push()
            await play.runJobs(now: Date().addingTimeInterval(32 * 86_400))
            let subscription = try #require(try await play.subscriptions("slow").first)
            #expect(subscription["status"] as? String == "active", "\(subscription)")
            #expect(subscription["productId"] as? String == "pro_monthly")
            #expect(try await play.entitlements("slow") == ["pro"])
        }
    }

    @Test(arguments: API.databases)
    func aPendingUpgradeOncePaidReplacesTheOldToken(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("paid", "pro_monthly")
            let monthly = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            #expect(try await play.submit("paid", "pro_monthly", monthly, orderId: order.id).status == .ok)
            let upgradeOrder = try await play.order("paid", "pro_yearly")
            let pending = try await play.store.buy(
                "pro_yearly", obfuscatedAccountId: upgradeOrder.token, pending: true, linkedPurchaseToken: monthly)
            try await play.store.completePending(pending, paid: true)
            _ = try await play.push()
            await play.runJobs()
            let subscriptions = try await play.subscriptions("paid")
            #expect(subscriptions.count == 1 && subscriptions.first?["productId"] as? String == "pro_yearly")
            #expect(try await play.submit("paid", "pro_monthly", monthly).errorCode == "revoked")
        }
    }

    @Test(arguments: API.databases)
    func aPlayStoreResubscriptionAfterExpiryReachesTheAccountThatHadIt(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("back", "pro_monthly")
            let first = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            #expect(try await play.submit("back", "pro_monthly", first, orderId: order.id).status == .ok)
            try await play.store.cancel(first)
            await play.store.advance(by: 40 * 86_400)
            _ = try await play.push()
            await play.runJobs()
            #expect(try await play.subscriptions("back").first?["status"] as? String == "expired")
            #expect(try await play.entitlements("back").isEmpty)
            // Back in the Play Store weeks later: a new token, no link, no account id.
            _ = try await play.store.resubscribeInPlayStore(first)
            #expect(try await play.push() == [.noContent])
            await play.runJobs()
            let subscriptions = try await play.subscriptions("back")
            #expect(
                subscriptions.count == 1 && subscriptions.first?["status"] as? String == "active", "\(subscriptions)")
            #expect(try await play.entitlements("back") == ["pro"])
            let anomalies = try await API.call(play.client, .get, "/v1/anomalies").json["anomalies"] as? [[String: Any]]
            #expect(anomalies?.contains { $0["kind"] as? String == "unattributed_transaction" } == false)
        }
    }
}
