import AppStoreModels
import AppStoreSigning
import ArgumentParser
import AsyncHTTPClient
import Foundation
import LocalAppStore
import LocalGooglePlay
import NIOCore
import NIOHTTP1
import SQLKit
import StoreKeeperKitCore
import StoreKeeperServer
import StoreKeeperSimulator
import StoreKeeperStorage
import Synchronization

extension DemoStory {
    // MARK: Two stores (the built-in local Google Play beside the local App Store)

    var googlePlay: LocalGooglePlay {
        get throws {
            guard let play = app.localGooglePlay?.store else { throw DemoFailure("no local Google Play") }
            return play
        }
    }

    /// An Android purchase as the Kotlin client contract does it (docs/android-integration.md).
    func androidPurchase(_ account: String, _ product: String, quantity: Int = 1) async throws -> String {
        let reply = try await call(
            .POST, "/v1/orders", ["accountId": account, "productId": product, "appId": "android"])
        guard reply.status == 201, let orderId = reply.json["orderId"] as? String,
            let token = reply.json["appAccountToken"] as? String
        else { throw DemoFailure("POST /v1/orders answered \(reply.status) \(reply.json)") }
        let purchaseToken = try await googlePlay.buy(product, obfuscatedAccountId: token, quantity: quantity)
        let submitted = try await call(
            .POST, "/v1/purchases",
            [
                "store": "google_play", "appId": "android", "accountId": account, "orderId": orderId,
                "productId": product, "purchaseToken": purchaseToken,
            ])
        guard submitted.status == 200 else {
            throw DemoFailure("POST /v1/purchases (google_play) answered \(submitted.status) \(submitted.json)")
        }
        return purchaseToken
    }

    func androidCoinsSpentOnIOS() async throws -> String {
        androidToken = try await androidPurchase("nova", "coins_60", quantity: 2)
        try await expectBalance("nova", 120)
        let phone = device("demo-apple-nova", "nova")
        try await phone.launch()
        guard case .success = try await phone.purchase(productId: "coins_60") else {
            throw DemoFailure("the iOS purchase did not complete")
        }
        await phone.stop()
        try await expectBalance("nova", 180)
        let spent = try await call(
            .POST, "/v1/accounts/nova/balances/coins/debit", ["amount": 150, "idempotencyKey": "nova-sword"])
        guard spent.status == 200 else { throw DemoFailure("the debit answered \(spent.status)") }
        try await expectBalance("nova", 30)
        guard let token = androidToken else { throw DemoFailure("no Android purchase") }
        try await eventually("the Android purchase consumed at Google by the server") {
            try await self.googlePlay.purchase(token)?.consumed == true
        }
        return "120 coins on Android + 60 on iOS → one balance; 150 spent on iOS; Google told (consumed) by the server"
    }

    func subscriptionSeenOnAndroid() async throws -> String {
        // Ivy subscribes on her iPhone…
        appleIds.append("apple-ivy")
        let (orderId, token) = try await order("ivy", "pro_monthly")
        let payment = try await control.pay(
            appleId: "apple-ivy", items: [("pro_monthly", 1)], appAccountToken: token, askToBuy: false)
        let reply = try await call(
            .POST, "/v1/purchases",
            ["accountId": "ivy", "orderId": orderId, "signedTransaction": payment.signedTransactions[0]])
        guard reply.status == 200 else { throw DemoFailure("the subscription answered \(reply.status)") }
        // …and her Android tablet reads the same account (its own client token does the same).
        let ivy = try await account("ivy")
        let entitlements = (ivy["entitlements"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        let stores = (ivy["subscriptions"] as? [[String: Any]] ?? []).compactMap { $0["store"] as? String }
        guard entitlements.contains("pro"), stores == ["app_store"] else {
            throw DemoFailure("ivy's account shows \(entitlements) from \(stores)")
        }
        return "subscribed on iOS; GET /v1/accounts/ivy from Android: pro (store app_store) — one entitlement"
    }

    func googleRefund() async throws -> String {
        guard let token = androidToken else { throw DemoFailure("no Android purchase") }
        try await googlePlay.refund(token, quantity: 1)
        try await eventually("the voided purchase applied") { try await self.balance("nova") == -30 }
        return "Google voids 1 of 2 → 60 coins taken back (30 − 60 = −30, refunded_after_delivery), once"
    }

    func acknowledgementSweeper() async throws -> String {
        let play = try googlePlay
        // Google fails every acknowledgement from now on (reads still work).
        play.failNextAcknowledgements(1_000_000)
        let reply = try await call(
            .POST, "/v1/orders", ["accountId": "rex", "productId": "remove_ads", "appId": "android"])
        guard let orderId = reply.json["orderId"] as? String, let token = reply.json["appAccountToken"] as? String
        else { throw DemoFailure("no order") }
        let purchaseToken = try await play.buy("remove_ads", obfuscatedAccountId: token)
        // The app submits: read and delivered; the acknowledgement fails and backs off.
        let submitted = try await call(
            .POST, "/v1/purchases",
            [
                "store": "google_play", "appId": "android", "accountId": "rex", "orderId": orderId,
                "productId": "remove_ads", "purchaseToken": purchaseToken,
            ])
        guard submitted.status == 200 else { throw DemoFailure("the submission answered \(submitted.status)") }
        try await Task.sleep(for: .seconds(3))
        guard await play.purchase(purchaseToken)?.acknowledged == false else {
            throw DemoFailure("acknowledged while Google was down")
        }
        // Google is back; two hours on, the sweeper acknowledges — long before Google's 3 days.
        play.failNextAcknowledgements(0)
        let later = Date().addingTimeInterval(2 * 3600)
        await app.runGoogleHousekeeping(now: later)
        _ = await JobRunner(app: app).runDue(now: later)
        try await eventually("acknowledged by the sweeper") {
            await play.purchase(purchaseToken)?.acknowledged == true
        }
        await play.advance(by: 4 * 86_400)
        guard await play.purchase(purchaseToken)?.voided == false else {
            throw DemoFailure("Google refunded the unacknowledged purchase")
        }
        return "acknowledgement failed while Google was down → swept and acknowledged → not refunded at day 3"
    }
}
