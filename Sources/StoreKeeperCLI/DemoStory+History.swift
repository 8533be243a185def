import AppStoreModels
import Foundation
import LocalAppStore
import LocalGooglePlay
import SQLKit
import StoreKeeperSimulator

/// `demo --keep`: months of history behind the story, so every chart of the dashboard and every
/// metric of `/v1/analytics` has a shape. Apple's side runs on a second local App Store with the
/// same keys and the server as its notification URL, its clock starting months ago and moved a
/// day at a time: players from several storefronts subscribe (monthly, yearly), renew, turn
/// auto-renew off and expire, buy coins, get refunds — each purchase submitted as the app would
/// and each renewal, expiry and refund reaching the server as Apple's signed notification. Google
/// Play's side: coin purchases dated over the period in several regions, and subscriptions of
/// the last month, some cancelled. Everything is drawn from the seed.
extension DemoStory {
    struct HistoryFigures {
        var subscribers = 0
        var renewals = 0
        var churned = 0
        var refunds = 0
        var coinPurchases = 0
        var googlePurchases = 0
        var transactionIds: [String] = []
    }

    func history(months: Int, seed: UInt64) async throws -> String {
        let now = Date()
        let days = months * 30
        let clock = StoreClock(start: now.addingTimeInterval(-Double(days) * 86_400), scale: 0)
        let apple = LocalAppStore(configuration: store.configuration, pki: store.pki, clock: clock)
        let sender = NotificationSender(store: apple)
        var random = SeededRandom(seed: seed ^ 0x4849_5354_4F52_59)
        var figures = HistoryFigures()
        let storefronts = ["USA", "USA", "USA", "DEU", "GBR", "JPN", "BRA", "FRA"]
        var active: [(original: String, monthly: Bool)] = []
        var refundable: [String] = []

        for day in 0..<days {
            // More players join as the game grows: about 0.3 a day at first, 1 at the end.
            let joinChance = 0.3 + 0.7 * Double(day) / Double(max(days, 1))
            if random.chance(joinChance) {
                figures.subscribers += 1
                let appleId = "history-apple-\(figures.subscribers)"
                let monthly = !random.chance(0.2)
                _ = await apple.customer(appleId, storefront: storefronts[random.below(storefronts.count)])
                let bought = try await apple.buy(
                    appleId, items: [.init(productId: monthly ? "pro_monthly" : "pro_yearly")])
                try await submitHistory("history-\(figures.subscribers)", bought.signedTransactions[0])
                if let original = bought.transactions.first?.originalTransactionId {
                    active.append((original, monthly))
                }
                figures.transactionIds += bought.transactions.compactMap(\.transactionId)
            }
            // Coins: a few purchases a day, from any storefront.
            for _ in 0..<random.below(3) {
                figures.coinPurchases += 1
                let appleId = "history-coins-\(random.below(40))"
                _ = await apple.customer(appleId, storefront: storefronts[random.below(storefronts.count)])
                let product = random.chance(0.7) ? "coins_60" : "coins_300"
                let bought = try await apple.buy(appleId, items: [.init(productId: product)])
                try await submitHistory(
                    appleId.replacingOccurrences(of: "-apple", with: ""), bought.signedTransactions[0])
                figures.transactionIds += bought.transactions.compactMap(\.transactionId)
                refundable += bought.transactions.compactMap(\.transactionId)
            }
            // Churn: a monthly subscriber turns auto-renew off now and then (it expires at the end
            // of the period, Apple says EXPIRED); yearly ones rarely.
            for index in active.indices.reversed() where random.chance(active[index].monthly ? 0.006 : 0.001) {
                try await apple.setAutoRenew(active[index].original, false)
                figures.churned += 1
                active.remove(at: index)
            }
            // A refund every few weeks: Apple's REFUND of a coin purchase.
            if random.chance(0.06), !refundable.isEmpty {
                let id = refundable.remove(at: random.below(refundable.count))
                try await apple.refund(id)
                figures.refunds += 1
            }
            await apple.advance(by: 86_400)
            await sender.deliverDue()
        }
        await sender.deliverDue()
        figures.renewals = await apple.notifications.filter { $0.payload.notificationType == .didRenew }.count
        figures.googlePurchases = try await googleHistory(days: min(days, 90), random: &random)

        // Every renewal, expiry and refund notification reached the server and was applied.
        let sent = await apple.notifications.count
        try await eventually("the history's \(sent) notifications applied", seconds: 120) {
            let failed = await apple.notifications.filter { !$0.delivered }.count
            if failed > 0 {
                // Apple's retry is due an hour on (store time).
                await apple.advance(by: 3_600)
                await sender.deliverDue()
            }
            return failed == 0
        }
        let ids = figures.transactionIds
        let delivered: Int = try await app.database.read { sql in
            var found = 0
            for chunk in stride(from: 0, to: ids.count, by: 200) {
                let part = Array(ids[chunk..<min(ids.count, chunk + 200)])
                found +=
                    try await sql.select().column(SQLFunction("COUNT", args: SQLLiteral.all), as: "n")
                    .from("deliveries").where(SQLColumn("transaction_id"), .in, SQLBind.group(part)).first()?
                    .decode(column: "n", as: Int.self) ?? 0
            }
            return found
        }
        guard delivered == figures.transactionIds.count else {
            throw DemoFailure("history: \(figures.transactionIds.count) purchases, \(delivered) delivered")
        }
        return
            "\(months) months: \(figures.subscribers) subscribers in 6 storefronts (\(figures.renewals) renewals, "
            + "\(figures.churned) churned), \(figures.coinPurchases) coin purchases, \(figures.refunds) refunds; "
            + "\(figures.googlePurchases) Google Play purchases"
    }

    /// The app's submission of one history purchase (its account made on the way).
    func submitHistory(_ account: String, _ signedTransaction: String) async throws {
        let reply = try await call(
            .POST, "/v1/purchases",
            ["accountId": account, "appId": appStoreAppId, "signedTransaction": signedTransaction])
        guard reply.status == 200 else {
            throw DemoFailure("history: POST /v1/purchases answered \(reply.status) \(reply.json)")
        }
    }

    /// Google Play: coins bought over `days` in several regions, subscriptions of the last month
    /// (a third of them cancelled), each through the Android client contract.
    func googleHistory(days: Int, random: inout SeededRandom) async throws -> Int {
        let play = try googlePlay
        let regions = ["US", "US", "DE", "GB", "JP", "BR", "IN"]
        var count = 0
        for index in 0..<(days / 3) {
            let account = "history-android-\(random.below(25))"
            let daysAgo = Double(days - index * 3) - 0.5
            let product = random.chance(0.75) ? "coins_60" : "coins_300"
            try await androidHistoryPurchase(
                account, product, region: regions[random.below(regions.count)],
                at: Date().addingTimeInterval(-daysAgo * 86_400))
            count += 1
        }
        for index in 0..<12 {
            let account = "history-android-pro-\(index)"
            let token = try await androidHistoryPurchase(
                account, "pro_monthly", region: regions[random.below(regions.count)],
                at: Date().addingTimeInterval(-Double(1 + random.below(20)) * 86_400))
            count += 1
            if random.chance(0.33) { try await play.cancel(token) }
        }
        return count
    }

    @discardableResult
    func androidHistoryPurchase(_ account: String, _ product: String, region: String, at date: Date) async throws
        -> String
    {
        // Bought back then, submitted now by the signed-in app (an order made today would
        // postdate its own purchase).
        let purchaseToken = try await googlePlay.buy(
            product, obfuscatedAccountId: nil, regionCode: region, purchasedAt: date)
        let submitted = try await call(
            .POST, "/v1/purchases",
            [
                "store": "google_play", "appId": "android", "accountId": account, "productId": product,
                "purchaseToken": purchaseToken,
            ])
        guard submitted.status == 200 else {
            throw DemoFailure(
                "history: POST /v1/purchases (google_play) answered \(submitted.status) \(submitted.json)")
        }
        return purchaseToken
    }
}
