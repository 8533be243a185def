import Foundation
import Testing

@testable import StoreKeeperServer

/// `GET /v1/revenue` (secret key): gross and proceeds per currency from each delivery's
/// revenue facts — 70 % by default, 85 % under `apple.smallBusinessProgram`, Sandbox and
/// refunded deliveries left out.
@Suite struct RevenueEndpointTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases, [false, true])
    func proceedsPerCurrencyFollowTheProgram(kind: String, smallBusiness: Bool) async throws {
        try await API.withServer(kind, configure: { $0.smallBusinessProgram = smallBusiness }) { app, client in
            let store = try #require(app.localAppStore)
            for (index, quantity) in [1, 3].enumerated() {
                let bought = try await store.buy(
                    "payer-\(index)", items: [.init(productId: "coins_60", quantity: Int32(quantity))])
                let price = try #require(bought.transactions[0].price)
                #expect(price == 990 * Int64(quantity))
                let reply = try await API.submit(
                    client, account: "u\(index)", signedTransaction: bought.signedTransactions[0])
                #expect(reply.status == .ok)
            }
            let revenue = try await API.call(client, .get, "/v1/revenue?since=2000-01-01")
            #expect(revenue.status == .ok)
            let usd = try #require((revenue.json["currencies"] as? [[String: Any]])?.first)
            #expect(usd["currency"] as? String == "USD")
            #expect(usd["transactions"] as? Int == 2)
            #expect(usd["grossMilli"] as? Int == 3_960)
            // Per transaction, rounded down: 990 × 70 % = 693, 2,970 × 70 % = 2,079.
            #expect(usd["proceedsMilli"] as? Int == (smallBusiness ? 841 + 2_524 : 693 + 2_079))
            #expect(revenue.json["smallBusinessProgram"] as? Bool == smallBusiness)
            // A range that holds nothing, and a bad date.
            let none = try await API.call(client, .get, "/v1/revenue?until=2000-01-01")
            #expect((none.json["currencies"] as? [Any])?.isEmpty == true)
            let bad = try await API.call(client, .get, "/v1/revenue?since=yesterday")
            #expect(bad.status == .badRequest)
            #expect(bad.errorCode == "bad_request")
            // Operators only.
            let token = try await API.clientToken("u0")
            #expect(try await API.call(client, .get, "/v1/revenue", token: token).status == .forbidden)
        }
    }
}
