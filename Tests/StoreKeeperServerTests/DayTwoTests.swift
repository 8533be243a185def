import Foundation
import Testing

@testable import StoreKeeperServer

/// The operator's day two: a purchase found by the ids players and support quote, and an
/// account-less order that says `paid`, then `redeemed`.
@Suite struct DayTwoTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func aPurchaseIsFoundByOurOrderIdItsTokenAndStripesOwnId(kind: String) async throws {
        try await StripeTests.withStripe(kind) { web in
            let reply = try await web.order("w-find", "coins_60")
            let orderId = try #require(reply.json["orderId"] as? String)
            let token = try #require(reply.json["appAccountToken"] as? String)
            let session = try #require((reply.json["checkout"] as? [String: Any])?["sessionId"] as? String)
            _ = try web.stripe.pay(session: session)
            try await web.deliver()
            let intent = try #require(try web.stripe.session(session, expand: [])["payment_intent"] as? String)
            for id in [orderId, token, token.uppercased(), intent, "stripe:\(intent)"] {
                let found = try await API.call(web.client, .get, "/v1/transactions/\(id)")
                #expect(found.status == .ok, "\(id): \(found.json)")
                #expect(found.json["accountId"] as? String == "w-find", "\(id)")
                #expect(
                    (found.json["transaction"] as? [String: Any])?["transactionId"] as? String == "stripe:\(intent)")
            }
            #expect(try await API.call(web.client, .get, "/v1/transactions/pi_nothing_here").status == .notFound)
        }
    }

    @Test(arguments: API.databases)
    func anAccountlessOrderSaysPaidThenRedeemed(kind: String) async throws {
        try await StripeTests.withStripe(kind) { web in
            let (order, _) = try await web.buy(nil, "coins_60")
            let before = try await API.call(web.client, .get, "/v1/orders/\(order)")
            #expect(before.json["status"] as? String == "created")
            try await web.deliver()
            let paid = try await API.call(web.client, .get, "/v1/orders/\(order)")
            #expect(paid.json["status"] as? String == "paid", "\(paid.json)")
            #expect(paid.json["transactionId"] as? String != nil)
            let code = try #require(paid.json["redemptionCode"] as? String)
            let redeemed = try await API.call(
                web.client, .post, "/v1/redemptions/\(code)", token: try await API.clientToken("w-later"), body: "{}")
            #expect(redeemed.status == .ok)
            let after = try await API.call(web.client, .get, "/v1/orders/\(order)")
            #expect(after.json["status"] as? String == "redeemed", "\(after.json)")
            #expect(after.json["accountId"] as? String == "w-later")
            #expect(after.json["redemptionCode"] == nil)
            // Found by its order id, with its holder.
            let found = try await API.call(web.client, .get, "/v1/transactions/\(order)")
            #expect(found.status == .ok && found.json["accountId"] as? String == "w-later", "\(found.json)")
        }
    }
}

extension DayTwoTests {
    /// The id an iOS player quotes is Apple's Order ID from the receipt e-mail: looked up through
    /// Apple's Look Up Order ID (the local App Store serves it), by the API, the MCP desk's
    /// `find_transaction` (the same route) and the dashboard's search — one resolver.
    @Test(arguments: API.databases)
    func applesOrderIdFromTheReceiptEmailFindsThePurchase(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p-mail", items: [.init(productId: "coins_60")])
            let orderId = try #require(bought.orderId)
            #expect(orderId.count == 10 && orderId.allSatisfy { $0.isUppercase || $0.isNumber })
            #expect(
                try await API.submit(client, account: "mail", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            for quoted in [orderId, orderId.lowercased()] {
                let found = try await API.call(client, .get, "/v1/transactions/\(quoted)")
                #expect(found.status == .ok, "\(found.json)")
                #expect(found.json["accountId"] as? String == "mail")
                #expect(
                    (found.json["transaction"] as? [String: Any])?["transactionId"] as? String
                        == bought.transactions[0].transactionId)
            }
            // An Order ID Apple does not know: 404, never a crash or a hang.
            #expect(try await API.call(client, .get, "/v1/transactions/ZZZZ9999QQ").status == .notFound)
            // The dashboard's search takes it too: straight to the account.
            let browser = DashboardTests.Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": ServerAPITests.secret])
            let search = try await browser.get("/dashboard/search?q=\(orderId)")
            #expect(search.location == "/dashboard/accounts/mail", "\(search.status) \(search.body.prefix(300))")
        }
    }
}
