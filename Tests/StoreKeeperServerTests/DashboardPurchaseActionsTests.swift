import Foundation
import HTTPTypes
import Testing

@testable import StoreKeeperServer

/// The account page's purchase actions — refund, transfer, extend — through the API's own
/// functions: each says what happened, is audited as the signed-in key on the dashboard, acts on
/// this account's purchases only, and is not offered to (nor taken from) a read key.
@Suite struct DashboardPurchaseActionsTests {
    typealias API = ServerAPITests
    typealias Play = GooglePlayServerTests
    typealias Browser = DashboardTests.Browser
    static let reader = "rk_dash_reader_0123456789abcdefghijk"
    static let desk = "sk_dash_desk_0123456789abcdefghijklm"

    @Test(arguments: API.databases)
    func supportRefundsTransfersAndExtendsFromTheAccountPage(kind: String) async throws {
        try await Play.withPlay(
            kind,
            configure: {
                $0.operatorKeys = [
                    OperatorKey(label: "bi", scope: .read, secret: Self.reader),
                    OperatorKey(label: "desk-kim", scope: .support, secret: Self.desk),
                ]
            }
        ) { play in
            func buy(_ account: String, _ product: String) async throws -> (token: String, order: String) {
                let order = try await play.order(account, product)
                let token = try await play.store.buy(product, obfuscatedAccountId: order.token)
                #expect(try await play.submit(account, product, token, orderId: order.id).status == .ok)
                return (token, try #require(await play.store.purchase(token)?.orders.last))
            }
            let coins = try await buy("gamer", "coins_60")
            let pro = try await buy("gamer", "pro_monthly")
            let ads = try await buy("gamer", "remove_ads")
            let other = try await buy("someone", "coins_60")

            let browser = Browser(play.client)
            _ = try await browser.post("/dashboard/login", ["key": Self.desk])
            let page = try await browser.get("/dashboard/accounts/gamer")
            #expect(page.status == .ok)
            #expect(page.body.contains(#"id="purchase-form""#), "\(page.body)")
            for order in [coins.order, pro.order, ads.order] {
                #expect(page.body.contains(#"<option value="gp:\#(order)">"#), "\(order)")
            }
            #expect(!page.body.contains(other.order))
            let csrf = try #require(page.csrf)
            func act(_ action: String, _ fields: [String: String]) async throws -> Browser.Page {
                try await browser.post(
                    "/dashboard/accounts/gamer/purchases/\(action)", fields.merging(["_csrf": csrf]) { $1 })
            }

            // Refund the coins: Google refunds, the coins are taken back, the page says so.
            let refunded = try await act("refund", ["transactionId": "gp:" + coins.order, "reason": "ticket 7"])
            #expect(refunded.status == .seeOther && refunded.location?.contains("done=refund_refunded") == true)
            #expect(try await play.balance("gamer") == 0)
            #expect(await play.store.purchase(coins.token)?.voided == true)
            let after = try await browser.get(refunded.location ?? "")
            #expect(after.body.contains("Refunded at the store"))
            // Asked again: nothing asked of Google, and the page says that instead.
            let again = try await act("refund", ["transactionId": "gp:" + coins.order, "reason": "ticket 7"])
            #expect(again.location?.contains("done=refund_already_refunded") == true, "\(again.location ?? "")")

            // Extend the subscription at Google by 7 days.
            let before = try #require(await play.store.purchase(pro.token)?.expiry)
            let extended = try await act(
                "extend", ["transactionId": "gp:" + pro.order, "reason": "outage", "days": "7"])
            #expect(extended.location?.contains("done=extend_extended") == true, "\(extended.location ?? "")")
            let moved = try #require(await play.store.purchase(pro.token)?.expiry)
            #expect(abs(moved.timeIntervalSince(before) - 7 * 86_400) < 1)

            // Transfer remove_ads to the player's other account.
            let moving = try await act(
                "transfer", ["transactionId": "gp:" + ads.order, "reason": "old account", "toAccountId": "gamer-new"])
            #expect(moving.location?.contains("done=transfer_transferred") == true, "\(moving.location ?? "")")
            #expect(try await play.entitlements("gamer-new").contains("no_ads"))
            #expect(!(try await play.entitlements("gamer").contains("no_ads")))

            // Another account's purchase, a bad refund type, a consumable transfer: refused, named.
            let stranger = try await act("refund", ["transactionId": "gp:" + other.order, "reason": "x"])
            #expect(stranger.status == .badRequest && stranger.body.contains("this account"), "\(stranger.body)")
            #expect(await play.store.purchase(other.token)?.voided == false)
            let badType = try await act(
                "refund", ["transactionId": "gp:" + pro.order, "reason": "x", "refundType": "half"])
            #expect(badType.status == .badRequest)

            // Each action audited under the key's label, marked as the dashboard's.
            let audit = try await play.app.store.anomalies.audit()
            for action in ["support_refund", "subscription_deferred", "ownership_transfer"] {
                let rows = audit.filter { $0.action == action }
                #expect(
                    !rows.isEmpty
                        && rows.allSatisfy { $0.actor.contains("desk-kim (") && $0.actor.contains(", dashboard)") },
                    "\(action): \(rows.map(\.actor))")
            }

            // A read key sees no purchase form, and a form it forges changes nothing.
            let reader = Browser(play.client)
            _ = try await reader.post("/dashboard/login", ["key": Self.reader])
            let readPage = try await reader.get("/dashboard/accounts/gamer")
            #expect(readPage.status == .ok && !readPage.body.contains(#"id="purchase-form""#))
            let forged = try await reader.post(
                "/dashboard/accounts/gamer/purchases/refund",
                ["_csrf": readPage.csrf ?? "", "transactionId": "gp:" + pro.order, "reason": "x"])
            #expect(forged.status == .forbidden)
            #expect(try await play.entitlements("gamer") == ["pro"])
        }
    }
}
