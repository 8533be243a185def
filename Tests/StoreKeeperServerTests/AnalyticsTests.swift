import AppStoreModels
import CSV
import Foundation
import HTTPTypes
import HummingbirdTesting
import LocalAppStore
import SQLKit
import StoreKeeperCatalog
import StoreKeeperSimulator
import StoreKeeperStorage
import Synchronization
import Testing

@testable import StoreKeeperServer

/// Issue 35: months of subscriptions generated on the local App Store's clock (trials,
/// renewals, cancellations, billing failures, refunds, upgrades, two currencies, consumables);
/// every metric of `GET /v1/analytics/{metric}` compared exactly with the same metric computed
/// here from the store's own history — not from StoreKeeper's tables.
@Suite struct AnalyticsTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static let catalog = try! Catalog.parse(
        yaml: """
            products:
              - id: coins_60
                type: consumable
                grants: { currency: coins, amount: 60 }
                prices: { USA: { currency: USD, price: 0.99 }, JPN: { currency: JPY, price: 160 } }
              - id: pro_yearly
                type: auto_renewable
                group: pro
                period: P1Y
                grants: { entitlement: pro }
                prices: { USA: { currency: USD, price: 49.99 }, JPN: { currency: JPY, price: 7800 } }
              - id: pro_monthly
                type: auto_renewable
                group: pro
                period: P1M
                grants: { entitlement: pro }
                prices: { USA: { currency: USD, price: 4.99 }, JPN: { currency: JPY, price: 780 } }
                introductoryOffer: { discountType: free_trial, period: P1W }
              - id: lite_weekly
                type: auto_renewable
                group: lite
                period: P1W
                grants: { entitlement: lite }
                prices: { USA: { currency: USD, price: 1.99 } }
            """)

    struct Customer {
        var account: String
        var appleId: String
        var original: String?
        var product: String?
    }

    /// Generates `days` days of business; returns the customers and the store's final time.
    static func generate(_ relay: Relay, seed: UInt64, days: Int) async throws -> [Customer] {
        let store = relay.store
        var random = SeededRandom(seed: seed)
        var customers: [Customer] = []
        for day in 0..<days {
            // Newcomers: a subscription (the monthly's first week is a free trial), or coins.
            for _ in 0..<(random.chance(0.6) ? 1 : 0) + (random.chance(0.3) ? 1 : 0) {
                let index = customers.count
                var customer = Customer(account: "acct-\(index)", appleId: "apple-\(seed)-\(index)")
                if random.chance(0.25) { await store.customer(customer.appleId, storefront: "JPN") }
                let products = ["pro_monthly", "pro_monthly", "pro_yearly", "lite_weekly", "coins_60"]
                let product = products[random.below(products.count)]
                let (_, transaction) = try await relay.buy(customer.account, product, appleId: customer.appleId)
                if product != "coins_60" {
                    customer.original = transaction.originalTransactionId
                    customer.product = product
                }
                customers.append(customer)
            }
            // Now and then, existing customers buy coins, cancel, fail to pay, get a refund or upgrade.
            for index in customers.indices {
                let customer = customers[index]
                if random.chance(0.03) {
                    _ = try await relay.buy(customer.account, "coins_60", appleId: customer.appleId)
                }
                guard let original = customer.original, let subscription = await store.subscription(original),
                    subscription.status == .active
                else { continue }
                if random.chance(0.03) {
                    try await store.setAutoRenew(original, false)
                } else if random.chance(0.015) {
                    await store.setBillingFails(customer.appleId, true)
                } else if random.chance(0.01) {
                    try await store.refund(subscription.lastTransactionId, percentage: nil)
                } else if random.chance(0.02), subscription.productId == "pro_monthly" {
                    try await store.changeProduct(original, to: "pro_yearly")
                    customers[index].product = "pro_yearly"
                } else if random.chance(0.02), day % 7 == 0 {
                    // A refund of a coin purchase.
                    if let coins = await store.history(of: customer.appleId).last(where: {
                        $0.payload.productId == "coins_60" && $0.payload.revocationDate == nil
                    }) {
                        try await store.refund(coins.payload.transactionId!, percentage: nil)
                    }
                }
            }
            await store.advance(by: 86_400)
            try await relay.deliver(settled: true)
        }
        return customers
    }

    // MARK: The independent computation, from the store's history

    struct Period {
        var original: String
        var account: String
        var product: String
        var start: Int64
        var end: Int64
        var trial: Bool
        var refunded: Bool
        var price: Int64
        var currency: String
    }

    struct Truth {
        var periods: [Period] = []
        /// Every priced transaction: (account, product, purchase date, price, currency, refunded).
        var sales: [(account: String, product: String, at: Int64, price: Int64, currency: String, refunded: Bool)] = []
        var statuses: [String: (status: AppStoreModels.SubscriptionStatus, autoRenew: Bool)] = [:]
    }

    static func truth(_ relay: Relay, _ customers: [Customer]) async throws -> Truth {
        var truth = Truth()
        var byOriginal: [String: [JWSTransactionDecodedPayload]] = [:]
        for customer in customers {
            for stored in await relay.store.history(of: customer.appleId) {
                let t = stored.payload
                guard let price = t.price, let currency = t.currency, let at = t.purchaseDate else { continue }
                truth.sales.append(
                    (customer.account, t.productId ?? "", at, price, currency, t.revocationDate != nil))
                if t.type == .autoRenewable { byOriginal[t.originalTransactionId!, default: []].append(t) }
            }
            if let original = customer.original, let subscription = await relay.store.subscription(original) {
                truth.statuses[original] = (subscription.status, subscription.autoRenew)
            }
        }
        for customer in customers {
            guard let original = customer.original else { continue }
            let all = (byOriginal[original] ?? []).sorted { $0.purchaseDate! < $1.purchaseDate! }
            for (index, t) in all.enumerated() {
                // An upgrade's new period cuts the one before it short.
                let next = all[(index + 1)...].map { $0.purchaseDate! }.filter { $0 > t.purchaseDate! }.min()
                truth.periods.append(
                    Period(
                        original: original, account: customer.account, product: t.productId!, start: t.purchaseDate!,
                        end: min(t.expiresDate!, next ?? Int64.max), trial: t.offerDiscountType == .freeTrial,
                        refunded: t.revocationDate != nil, price: t.price!, currency: t.currency!))
            }
        }
        return truth
    }

    struct Expected {
        var value: Double
        var byCurrency: [String: Double]? = nil
        var numerator: Int64? = nil
        var denominator: Int64? = nil
        var byReason: [String: Int64]? = nil
    }

    /// Each metric per bucket, by the definitions of docs/analytics.md.
    static func expected(
        _ metric: String, truth: Truth, buckets: [(start: Int64, end: Int64)], now: Int64, rates: [String: Double],
        periodLengths: [String: (start: Int64, end: Int64)]
    ) -> [Expected] {
        let quarter: Int64 = 900_000
        let nowQ = now / quarter * quarter
        func convert(_ milli: [String: Int64]) -> Double {
            var total = Decimal(0)
            for (code, amount) in milli {
                total += Decimal(amount) * Decimal(string: String(rates[code] ?? (code == "USD" ? 1 : 0)))!
            }
            var value = total / 1000
            var rounded = Decimal()
            NSDecimalRound(&rounded, &value, 2, .plain)
            return Double("\(rounded)")!
        }
        func major(_ milli: [String: Int64]) -> [String: Double] {
            milli.filter { $0.value != 0 }.mapValues { Double($0) / 1000 }
        }
        return buckets.map { bucket in
            switch metric {
            case "mrr", "active_subscriptions", "active_trials":
                // The interval under way is read now: started by the end of this quarter hour,
                // not ended before its start.
                let (startedBy, endedBy) =
                    bucket.end <= nowQ ? (bucket.end, bucket.end) : (nowQ == now ? nowQ : nowQ + quarter, nowQ)
                let live = truth.periods.filter {
                    !$0.refunded && $0.start < startedBy && $0.end >= endedBy && $0.trial == (metric == "active_trials")
                }
                if metric != "mrr" { return Expected(value: Double(live.count)) }
                var milli: [String: Int64] = [:]
                for period in live {
                    let billed = periodLengths["\(period.original)@\(period.start)"]!
                    let length = billed.end - billed.start
                    let amount: Int64
                    if length < 25 * 86_400_000 {
                        let weeks = Swift.max(1, Int64((Double(length) / 604_800_000).rounded()))
                        amount = period.price * 52 / (12 * weeks)
                    } else {
                        let months = Swift.max(1, Int64((Double(length) / (30.4375 * 86_400_000)).rounded()))
                        amount = period.price / months
                    }
                    milli[period.currency, default: 0] += amount
                }
                return Expected(value: convert(milli), byCurrency: major(milli))
            case "new_subscriptions":
                var first: [String: Int64] = [:]
                for period in truth.periods {
                    first[period.original] = Swift.min(first[period.original] ?? .max, period.start)
                }
                return Expected(value: Double(first.values.filter { $0 >= bucket.start && $0 < bucket.end }.count))
            case "churned_subscriptions":
                var count = 0
                var reasons: [String: Int64] = [:]
                for period in truth.periods where !period.trial {
                    let later = truth.periods.contains { $0.original == period.original && $0.start > period.start }
                    let state = truth.statuses[period.original]
                    guard !later, period.end >= bucket.start, period.end < bucket.end, period.end < nowQ,
                        state?.status != .billingGracePeriod
                    else { continue }
                    count += 1
                    // Why, from the store's own final state (docs/analytics.md).
                    let reason =
                        if period.refunded || state?.status == .revoked {
                            "refund"
                        } else if state?.status == .billingRetry
                            || (state?.status == .expired && state?.autoRenew == true)
                        {
                            "billing"
                        } else {
                            "voluntary"
                        }
                    reasons[reason, default: 0] += 1
                }
                return Expected(value: Double(count), byReason: reasons)
            case "trial_conversion":
                let trials = truth.periods.filter {
                    $0.trial && $0.start >= bucket.start && $0.start < bucket.end && $0.end <= nowQ
                }
                let converted = trials.filter { trial in
                    truth.periods.contains {
                        $0.original == trial.original && !$0.trial && !$0.refunded && $0.start >= trial.start
                    }
                }
                let value =
                    trials.isEmpty ? 0 : (Double(converted.count) / Double(trials.count) * 10_000).rounded() / 10_000
                return Expected(
                    value: value, numerator: Int64(converted.count), denominator: Int64(trials.count))
            case "refund_rate":
                let sold = truth.sales.filter { $0.price > 0 && $0.at >= bucket.start && $0.at < bucket.end }
                let refunded = sold.filter(\.refunded).count
                let value = sold.isEmpty ? 0 : (Double(refunded) / Double(sold.count) * 10_000).rounded() / 10_000
                return Expected(value: value, numerator: Int64(refunded), denominator: Int64(sold.count))
            case "proceeds":
                var milli: [String: Int64] = [:]
                for sale in truth.sales where sale.at >= bucket.start && sale.at < bucket.end && !sale.refunded {
                    milli[sale.currency, default: 0] += sale.price * 70 / 100
                }
                return Expected(value: convert(milli), byCurrency: major(milli))
            default:  // realized_ltv
                var first: [String: Int64] = [:]
                for sale in truth.sales { first[sale.account] = Swift.min(first[sale.account] ?? .max, sale.at) }
                let cohort = Set(first.filter { $0.value >= bucket.start && $0.value < bucket.end }.keys)
                var milli: [String: Int64] = [:]
                for sale in truth.sales where cohort.contains(sale.account) && !sale.refunded {
                    milli[sale.currency, default: 0] += sale.price * 70 / 100
                }
                guard !cohort.isEmpty else { return Expected(value: 0, byCurrency: [:], denominator: 0) }
                var total = Decimal(0)
                for (code, amount) in milli {
                    total += Decimal(amount) * Decimal(string: String(rates[code] ?? (code == "USD" ? 1 : 0)))!
                }
                var value = total / 1000 / Decimal(cohort.count)
                var rounded = Decimal()
                NSDecimalRound(&rounded, &value, 2, .plain)
                var perCurrency: [String: Double] = [:]
                for (code, amount) in milli where amount != 0 {
                    var share = Decimal(amount) / 1000 / Decimal(cohort.count)
                    var roundedShare = Decimal()
                    NSDecimalRound(&roundedShare, &share, 3, .plain)
                    perCurrency[code] = Double("\(roundedShare)")!
                }
                return Expected(
                    value: Double("\(rounded)")!, byCurrency: perCurrency,
                    denominator: Int64(cohort.count))
            }
        }
    }

    static let rates: [String: Double] = ["JPY": 0.0065]
    /// What the server under test reads analytics with, by database (each read per request).
    static let scanPolicy = Mutex([String: AnalyticsScanPolicy]())

    @Test(arguments: ServerAPITests.databases)
    func everyMetricMatchesTheStoresOwnHistory(kind: String) async throws {
        try await NotificationTests.withRelay(
            kind,
            configure: {
                $0.catalog = Self.catalog
                $0.analyticsRates = Self.rates
            },
            prepare: { app in
                let clock = app.localAppStore!.clock
                app.analyticsClock = { clock.now() }
                app.analyticsScan = { Self.scanPolicy.withLock { $0[kind] ?? AnalyticsScanPolicy() } }
            }
        ) { relay in
            let start = relay.store.clock.now()
            let customers = try await Self.generate(relay, seed: 35, days: 75)
            let now = relay.store.clock.now()
            let truth = try await Self.truth(relay, customers)
            #expect(truth.periods.count > 60, "a history worth the name: \(truth.periods.count) periods")
            #expect(truth.periods.contains { $0.trial } && truth.periods.contains { $0.refunded })
            // Each period's billed length (what monthly normalisation divides by), before any upgrade cut it.
            var lengths: [String: (start: Int64, end: Int64)] = [:]
            for customer in customers {
                for stored in await relay.store.history(of: customer.appleId)
                where stored.payload.type == .autoRenewable {
                    let t = stored.payload
                    lengths["\(t.originalTransactionId!)@\(t.purchaseDate!)"] = (t.purchaseDate!, t.expiresDate!)
                }
            }
            let metrics = [
                "mrr", "active_subscriptions", "active_trials", "new_subscriptions", "churned_subscriptions",
                "trial_conversion", "refund_rate", "proceeds", "realized_ltv",
            ]
            var compared = 0
            var nonZero: Set<String> = []
            var reasonsSeen: Set<String> = []
            // As planned (these windows span the whole history: SQLite scans in one part,
            // PostgreSQL plans with its corrections), through the indexes (as a short window
            // reads), then with SQLite's scan in parts forced: rowid ranges, and accounts for
            // realized LTV.
            for (zone, policy) in [
                ("UTC", AnalyticsScanPolicy()), ("Asia/Kolkata", AnalyticsScanPolicy()),
                ("UTC", AnalyticsScanPolicy(alwaysIndex: true)),
                ("UTC", AnalyticsScanPolicy(alwaysScan: true, rowsPerPart: 1)),
                ("Asia/Kolkata", AnalyticsScanPolicy(alwaysScan: true, rowsPerPart: 1)),
            ] {
                Self.scanPolicy.withLock { $0[kind] = policy }
                for interval in ["day", "week", "month"] {
                    let (from, to, buckets) = Self.buckets(zone: zone, from: start, to: now, interval: interval)
                    for metric in metrics {
                        let reply = try await API.call(
                            relay.client, .get,
                            "/v1/analytics/\(metric)?from=\(from)&to=\(to)&interval=\(interval)&timeZone=\(zone)")
                        #expect(reply.status == .ok, "\(reply.json)")
                        let points = try #require(reply.json["points"] as? [[String: Any]])
                        let expected = Self.expected(
                            metric, truth: truth, buckets: buckets.map { ($0.start, $0.end) },
                            now: Int64(now.timeIntervalSince1970 * 1000), rates: Self.rates, periodLengths: lengths)
                        #expect(points.map { $0["start"] as? String } == buckets.map(\.label), "\(metric) \(interval)")
                        for (point, want) in zip(points, expected) {
                            let value = (point["value"] as? NSNumber)?.doubleValue
                            #expect(value == want.value, "\(metric) \(interval) \(zone) \(point)")
                            if want.value != 0 { nonZero.insert(metric) }
                            if let byCurrency = want.byCurrency {
                                let got = (point["byCurrency"] as? [String: Any] ?? [:]).mapValues {
                                    ($0 as? NSNumber)?.doubleValue ?? .nan
                                }
                                #expect(got == byCurrency, "\(metric) \(interval) \(zone) \(point)")
                            }
                            if let numerator = want.numerator {
                                #expect(
                                    (point["numerator"] as? NSNumber)?.int64Value == numerator, "\(metric) \(point)")
                            }
                            if let byReason = want.byReason {
                                let got = (point["byReason"] as? [String: Any] ?? [:]).mapValues {
                                    ($0 as? NSNumber)?.int64Value ?? -1
                                }
                                #expect(
                                    got.filter { $0.value != 0 } == byReason, "\(metric) \(interval) \(zone) \(point)")
                                reasonsSeen.formUnion(byReason.keys)
                            }
                            if let denominator = want.denominator {
                                #expect(
                                    (point["denominator"] as? NSNumber)?.int64Value == denominator, "\(metric) \(point)"
                                )
                            }
                            compared += 1
                        }
                    }
                }
            }
            #expect(compared > 500)
            // Every metric saw something: a comparison of zeros proves nothing.
            #expect(nonZero == Set(metrics), "\(Set(metrics).subtracting(nonZero))")
            // Churn's reasons compared too, each seen at least once.
            #expect(reasonsSeen == ["refund", "billing", "voluntary"], "\(reasonsSeen)")
        }
    }

    /// Calendar intervals in `zone` from `from`'s day to `to`'s, clipped (docs/analytics.md).
    static func buckets(zone: String, from: Date, to: Date, interval: String) -> (
        String, String, [(label: String, start: Int64, end: Int64)]
    ) {
        var calendar = Calendar(identifier: .iso8601)
        calendar.timeZone = TimeZone(identifier: zone)!
        let firstDay = calendar.startOfDay(for: from)
        let end = calendar.date(byAdding: .day, value: 1, to: calendar.startOfDay(for: to))!
        let formatter = DateFormatter()
        formatter.calendar = calendar
        formatter.timeZone = calendar.timeZone
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyy-MM-dd"
        var result: [(String, Int64, Int64)] = []
        var cursor = firstDay
        while cursor < end {
            var next: Date
            switch interval {
            case "day": next = calendar.date(byAdding: .day, value: 1, to: cursor)!
            case "week":
                let weekday = calendar.component(.weekday, from: cursor)  // Sunday 1 … Saturday 7
                let daysToMonday = (9 - weekday) % 7 == 0 ? 7 : (9 - weekday) % 7
                next = calendar.date(byAdding: .day, value: daysToMonday, to: cursor)!
            default:
                let parts = calendar.dateComponents([.year, .month], from: cursor)
                next = calendar.date(byAdding: .month, value: 1, to: calendar.date(from: parts)!)!
            }
            next = min(next, end)
            result.append(
                (
                    formatter.string(from: cursor), Int64(cursor.timeIntervalSince1970 * 1000),
                    Int64(next.timeIntervalSince1970 * 1000)
                ))
            cursor = next
        }
        return (formatter.string(from: from), formatter.string(from: to), result)
    }
}

/// Exports page by cursor through every row once; bad queries are clear 4xx answers.
@Suite struct ExportTests {
    typealias API = ServerAPITests

    static func text(_ client: any TestClientProtocol, _ path: String) async throws -> (
        status: HTTPResponse.Status, body: String, next: String?
    ) {
        try await client.execute(
            uri: path, method: .get, headers: [.authorization: "Bearer \(API.secret)"], body: nil
        ) { response in
            (
                response.status, String(buffer: response.body),
                response.headers[HTTPField.Name("Next-Cursor")!]
            )
        }
    }

    @Test(arguments: ServerAPITests.databases)
    func exportsResumeByCursorAndRefuseNonsense(kind: String) async throws {
        try await NotificationTests.withRelay(kind, prepare: { $0.exportSettleSeconds = 3 }) { relay in
            var bought: Set<String> = []
            for index in 0..<4 {
                let (_, transaction) = try await relay.buy(
                    "buyer-\(index % 2)", index == 3 ? "pro_monthly" : "coins_60")
                bought.insert(transaction.transactionId!)
            }
            try await relay.deliver()
            // Rows newer than the request deadline (+ 5 s; 3 s here) wait for a later call.
            let (_, last) = try await relay.buy("buyer-1", "coins_60")
            bought.insert(last.transactionId!)
            let early = try await Self.text(relay.client, "/v1/export/transactions?format=ndjson")
            #expect(early.status == .ok && !early.body.contains(last.transactionId!))
            try await Task.sleep(for: .seconds(3.5))

            for format in ["ndjson", "csv"] {
                var seen: [String] = []
                var cursor: String?
                var pages = 0
                repeat {
                    let page = try await Self.text(
                        relay.client,
                        "/v1/export/transactions?format=\(format)&limit=2" + (cursor.map { "&cursor=\($0)" } ?? ""))
                    #expect(page.status == .ok)
                    if format == "ndjson" {
                        for line in page.body.split(separator: "\n") {
                            let row = try #require(
                                try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                            seen.append(try #require(row["transaction_id"] as? String))
                            #expect(row["store"] as? String == "app_store")
                            #expect((row["purchased_at"] as? String)?.hasSuffix("Z") == true)
                        }
                    } else {
                        let lines = page.body.split(separator: "\r\n")
                        #expect(lines.first?.hasPrefix("transaction_id,original_transaction_id,account_id") == true)
                        let reader = try CSVReader(string: page.body, hasHeaderRow: true)
                        while let row = reader.next() { seen.append(row[0]) }
                    }
                    cursor = page.next
                    pages += 1
                } while cursor != nil && pages < 10
                #expect(Set(seen) == bought && seen.count == bought.count, "\(format): \(seen)")
                #expect(pages == 3)
            }
            let events = try await Self.text(relay.client, "/v1/export/events?format=ndjson&limit=1000")
            #expect(events.status == .ok)
            let types = events.body.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["type"] as? String
            }
            #expect(types.filter { $0 == "delivery" }.count == 5)
            #expect(types.contains("notification"))
            let subscriptions = try await Self.text(relay.client, "/v1/export/subscriptions?since=2020-01-01")
            // The SQL views BI tools read, on this database: every row there, each view answering.
            let counts = try await relay.app.database.read { sql in
                var counts: [String: Int] = [:]
                for view in [
                    "storekeeper_transactions", "storekeeper_subscription_periods", "storekeeper_subscriptions",
                    "storekeeper_events",
                ] {
                    counts[view] =
                        try await sql.raw("SELECT COUNT(*) AS n FROM \(ident: view)").first()?.decode(
                            column: "n", as: Int.self) ?? -1
                }
                let mrr = try await sql.raw(
                    "SELECT CAST(SUM(monthly_milli) AS BIGINT) AS m FROM storekeeper_subscription_periods WHERE counts = 1 AND trial = 0"
                ).first()?.decode(column: "m", as: Int64?.self)
                counts["monthly_milli"] = Int(mrr ?? -1)
                return counts
            }
            #expect(counts["storekeeper_transactions"] == 5 && counts["storekeeper_subscription_periods"] == 1)
            #expect(counts["storekeeper_subscriptions"] == 1 && (counts["storekeeper_events"] ?? 0) >= 5)
            #expect(counts["monthly_milli"] == 4_990, "\(counts)")
            #expect(subscriptions.body.split(separator: "\r\n").count == 2, "\(subscriptions.body)")

            for (path, status, code) in [
                ("/v1/export/everything", HTTPResponse.Status.notFound, "unknown_export"),
                ("/v1/export/events?cursor=%21%21", .badRequest, "invalid_cursor"),
                ("/v1/export/events?cursor=OTk6OTk6eA", .badRequest, "invalid_cursor"),
                ("/v1/export/events?format=xml", .badRequest, "bad_request"),
                ("/v1/export/events?limit=0", .badRequest, "bad_request"),
                ("/v1/export/events?limit=10001", .badRequest, "bad_request"),
                ("/v1/export/events?since=yesterday", .badRequest, "bad_request"),
                ("/v1/analytics/arpu", .notFound, "unknown_metric"),
                ("/v1/analytics/mrr?from=2026-02-30", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?from=2026-03-02&to=2026-03-01", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?interval=year", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?from=2020-01-01&to=2026-01-01", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?appId=nope", .badRequest, "unknown_app"),
                ("/v1/analytics/mrr?store=steam", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?country=xx", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?country=U5A", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?country=USAA", .badRequest, "bad_request"),
                ("/v1/analytics/mrr?timeZone=Mars/Olympus", .badRequest, "bad_request"),
            ] {
                let reply = try await API.call(relay.client, .get, path)
                #expect(reply.status == status && reply.errorCode == code, "\(path): \(reply.json)")
            }
            // A country by either ISO code, in either case: the same filter.
            for country in ["JPN", "jp", "JP"] {
                let reply = try await API.call(relay.client, .get, "/v1/analytics/mrr?country=\(country)")
                #expect(reply.status == .ok && (reply.json["filters"] as? [String: String])?["country"] == "JPN")
            }
            // A month interval over six years is fine; a client token is not a secret key.
            #expect(
                try await API.call(relay.client, .get, "/v1/analytics/mrr?from=2020-01-01&to=2026-01-01&interval=month")
                    .status == .ok)
            let token = try await API.clientToken("buyer-0")
            #expect(try await API.call(relay.client, .get, "/v1/analytics/mrr", token: token).status == .forbidden)
            #expect(try await API.call(relay.client, .get, "/v1/export/events", token: token).status == .forbidden)
        }
    }

    /// Audit 3, finding 1: text that is one grapheme cluster but holds a comma, a quote or a line
    /// break as its first scalar — the CSV is decided on bytes, so a real CSV reader reads back
    /// every cell whole and no row grows a column.
    static let forgedCells = [
        "mallory\u{600},=cmd|' /C calc'!A0\u{600},x", ",\u{301}", "\"\u{301}", "q\u{600},\"\u{301},x",
    ]

    @Test func csvCellsAreDecidedOnBytes() throws {
        let cells = Self.forgedCells + ["\r\n", "a\r\nb", "=1+1", "-2", "\u{301}=x"]
        let page = ExportPage(
            columns: ["id", "text", "n"], rows: cells.enumerated().map { [.text("r\($0)"), .text($1), .integer(7)] },
            next: nil)
        let reader = try CSVReader(string: ExportFormat.csv(page), hasHeaderRow: true)
        #expect(reader.headerRow == ["id", "text", "n"])
        var read: [[String]] = []
        while let row = reader.next() { read.append(row) }
        #expect(read.count == cells.count)
        for (row, cell) in zip(read, cells) {
            #expect(row.count == 3 && row[2] == "7", "\(row)")
            let expected =
                ["=", "+", "-", "@", "\t", "\r"].contains(where: {
                    cell.unicodeScalars.first == $0.unicodeScalars.first
                }) ? "'" + cell : cell
            #expect(row[1] == expected, "\(row)")
        }
    }

    /// The same over HTTP: accounts named with those strings buy, and the transactions export,
    /// read by a CSV reader, has exactly the header's columns in every row and no cell that
    /// starts a formula.
    @Test(arguments: ServerAPITests.databases)
    func csvExportCannotBeForged(kind: String) async throws {
        try await NotificationTests.withRelay(kind, prepare: { $0.exportSettleSeconds = 0 }) { relay in
            for (index, account) in Self.forgedCells.enumerated() {
                let quoted = String(decoding: try JSONEncoder().encode(account), as: UTF8.self)
                let created = try await ServerAPITests.call(
                    relay.client, .post, "/v1/orders", body: #"{"accountId":\#(quoted),"productId":"coins_60"}"#)
                #expect(created.status == .created, "\(created.json)")
                let token = try #require(UUID(uuidString: created.json["appAccountToken"] as? String ?? ""))
                let bought = try await relay.store.buy(
                    "apple-forger-\(index)", items: [.init(productId: "coins_60")], appAccountToken: token)
                let reply = try await ServerAPITests.call(
                    relay.client, .post, "/v1/purchases",
                    body: #"{"accountId":\#(quoted),"signedTransaction":"\#(bought.signedTransactions[0])"}"#)
                #expect(reply.status == .ok, "\(reply.json)")
            }
            try await relay.deliver()
            for export in ["transactions", "events", "subscriptions"] {
                let page = try await ExportTests.text(relay.client, "/v1/export/\(export)?format=csv")
                #expect(page.status == .ok)
                let reader = try CSVReader(string: page.body, hasHeaderRow: true)
                let header = try #require(reader.headerRow)
                var accounts: Set<String> = []
                while let row = reader.next() {
                    #expect(row.count == header.count, "\(export): \(row)")
                    for cell in row { #expect(!cell.hasPrefix("=") && !cell.hasPrefix("@"), "\(export): \(row)") }
                    if let column = header.firstIndex(of: "account_id"), row.count == header.count {
                        accounts.insert(row[column])
                    }
                }
                if export == "transactions" { #expect(accounts == Set(Self.forgedCells), "\(accounts)") }
            }
        }
    }

    @Test func csvQuotesAndDisarmsFormulas() {
        let page = ExportPage(
            columns: ["a", "b", "c"],
            rows: [[.text("=HYPERLINK(\"x\")"), .text("a,b\nc"), .integer(-5)], [.null, .time(0), .text("@x")]],
            next: nil)
        #expect(
            ExportFormat.csv(page)
                == "a,b,c\r\n\"'=HYPERLINK(\"\"x\"\")\",\"a,b\nc\",-5\r\n,1970-01-01T00:00:00.000Z,\"'@x\"\r\n")
        #expect(
            ExportFormat.ndjson(page)
                == "{\"a\":\"=HYPERLINK(\\\"x\\\")\",\"b\":\"a,b\\nc\",\"c\":-5}\n{\"a\":null,\"b\":\"1970-01-01T00:00:00.000Z\",\"c\":\"@x\"}\n"
        )
    }
}
