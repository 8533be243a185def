import Foundation
import SQLKit
import StoreKeeperCore
import StoreKeeperServer
import StoreKeeperStorage

/// `bench --analytics`: `--transactions` deliveries (default one million) written straight into
/// the database — a year of monthly and yearly subscriptions (a tenth starting with a free
/// trial), weekly ones, consumables, refunds, three currencies, each subscription's state — then the dashboard's overview
/// and every metric of `GET /v1/analytics/{metric}` through the real server, each the median of
/// three, beside a full scan of the deliveries (`SELECT SUM(price_milli)`) in the same run. Fails when
/// one takes a second or more.
struct AnalyticsBench {
    let databaseURL: String?
    let transactions: Int

    func run() async throws {
        let server = try await PurchaseBench.Server.start(databaseURL: databaseURL, runJobs: false)
        let app = server.app
        let now = Date()
        FileHandle.standardError.write(Data("writing \(transactions) deliveries…\n".utf8))
        let written = ContinuousClock.now
        let count = try await Self.prefill(app, transactions: transactions, now: now)
        let writeSeconds = BenchCommand.seconds(ContinuousClock.now - written)
        FileHandle.standardError.write(Data("written in \(Int(writeSeconds)) s; measuring…\n".utf8))

        func median(_ body: () async throws -> Void) async throws -> Double {
            var times: [Double] = []
            for _ in 0..<3 {
                let started = ContinuousClock.now
                try await body()
                times.append(BenchCommand.seconds(ContinuousClock.now - started))
            }
            return times.sorted()[1]
        }
        let scan = try await median {
            _ = try await app.database.read { sql in
                try await sql.raw("SELECT SUM(price_milli) AS n FROM deliveries").first()
            }
        }
        var results: [(String, Double)] = []
        results.append(
            (
                "dashboard overview (14 days of figures, subscriptions by status)",
                try await median {
                    _ = try await app.store.reports.dashboardOverview(days: 14, now: now, smallBusinessProgram: false)
                }
            ))
        for (query, label) in [
            ("", "last 30 days by day"), ("interval=month&from=\(Self.yearAgo(now))", "12 months by month"),
        ] {
            for metric in AnalyticsMetric.allCases {
                let seconds = try await median {
                    let phase = try await server.send(
                        concurrency: 1, "/v1/analytics/\(metric.rawValue)?\(query)", [""], method: "GET",
                        expect: #""points""#)
                    guard phase.accepted == 1 else {
                        throw BenchFailure(description: "\(metric.rawValue) did not answer")
                    }
                }
                results.append(("`\(metric.rawValue)`, \(label)", seconds))
            }
        }
        // The dashboard's analytics page: all nine at once (not one answer, so not held to 1 s).
        var pages: [(String, Double)] = []
        for (parameters, label) in [
            ([String: String](), "last 30 days by day"),
            (["interval": "month", "from": Self.yearAgo(now)], "12 months by month"),
        ] {
            let seconds = try await median {
                _ = try await app.analyticsReports(now: now) { parameters[$0] }
            }
            pages.append(("dashboard analytics page (the nine metrics), \(label)", seconds))
        }
        await server.stop()

        print("## Analytics over \(count) transactions — \(app.database.kind.rawValue)")
        print("")
        print(
            "machine: \(BenchCommand.machine()), \(ProcessInfo.processInfo.activeProcessorCount) cores; "
                + "written in \(String(format: "%.0f", writeSeconds)) s; each figure the median of three")
        print("")
        print("| measurement | time | vs a full scan | under 1 s |")
        print("|---|---:|---:|---|")
        print("| `SELECT SUM(price_milli) FROM deliveries` (baseline: one full scan) | \(Self.ms(scan)) | 1.00 | |")
        for (name, seconds) in results {
            print(
                "| \(name) | \(Self.ms(seconds)) | \(String(format: "%.2f", seconds / max(scan, 1e-6))) | \(seconds < 1 ? "yes" : "**no**") |"
            )
        }
        for (name, seconds) in pages {
            print("| \(name) | \(Self.ms(seconds)) | \(String(format: "%.2f", seconds / max(scan, 1e-6))) | — |")
        }
        print("")
        let slow = results.filter { $0.1 >= 1 }
        if !slow.isEmpty {
            throw BenchFailure(description: "a second or more: \(slow.map(\.0).joined(separator: "; "))")
        }
    }

    /// Writes about `transactions` deliveries straight into the database (a year of
    /// subscriptions, consumables, refunds, three currencies) and each subscription's state;
    /// returns how many.
    static func prefill(_ app: StoreKeeperApp, transactions: Int, now: Date) async throws -> Int {
        let nowMs = Int64(now.timeIntervalSince1970 * 1000)
        var random = SystemRandomNumberGenerator()
        let day: Int64 = 86_400_000
        var rows: [[any Encodable & Sendable]] = []
        // Each subscription's current state (churn reads its reason there).
        var states: [[any Encodable & Sendable]] = []
        var count = 0
        var subscription = 0
        // Distinct from an earlier run's ids, so a run can add to an existing database.
        let runId = String(format: "%04d", Int.random(in: 0..<10_000, using: &random))
        func flush() async throws {
            guard !rows.isEmpty else { return }
            let batch = rows
            let subscriptionBatch = states
            rows.removeAll(keepingCapacity: true)
            states.removeAll(keepingCapacity: true)
            try await app.database.transaction { sql in
                var insert = sql.insert(into: "deliveries").columns(
                    "transaction_id", "original_transaction_id", "account_id", "product_id", "quantity", "environment",
                    "delivered_at", "price_milli", "currency", "proceeds_percent", "period_start", "period_end",
                    "purchased_at", "storefront", "trial", "refunded_at", "app_id")
                for row in batch { insert = insert.values(row) }
                try await insert.run()
                guard !subscriptionBatch.isEmpty else { return }
                var subscriptions = sql.insert(into: "subscriptions").columns(
                    "original_transaction_id", "account_id", "product_id", "status", "expires_at", "auto_renew",
                    "latest_transaction_id", "signed_at", "updated_at", "app_id")
                for state in subscriptionBatch { subscriptions = subscriptions.values(state) }
                try await subscriptions.run()
            }
        }
        let currencies: [(String, String, Int64)] = [("USD", "USA", 1), ("EUR", "FRA", 1), ("JPY", "JPN", 150)]
        while count < transactions {
            subscription += 1
            let account = "acct\(subscription / 2)"
            let (currency, storefront, scale) = currencies[Int.random(in: 0..<3, using: &random)]
            let kind = Int.random(in: 0..<10, using: &random)
            let started = nowMs - Int64.random(in: 0..<(365 * day), using: &random)
            let original = "9\(subscription)r\(runId)"
            if kind < 3 {
                // Consumables: one to five purchases.
                for index in 0..<Int.random(in: 1...5, using: &random) where count < transactions {
                    let at = started + Int64(index) * 3 * day
                    guard at < nowMs else { break }
                    let refunded: Int64? = Int.random(in: 0..<50, using: &random) == 0 ? at + day : nil
                    rows.append([
                        "\(original)-\(index)", "\(original)-\(index)", account, "coins_60", 1, "Production", at,
                        990 * scale, currency, 70, nil as Int64?, nil as Int64?, at, storefront, 0, refunded,
                        "app_store",
                    ])
                    count += 1
                }
            } else {
                let (product, length, price): (String, Int64, Int64) =
                    kind < 8
                    ? ("pro_monthly", 30 * day, 4_990)
                    : kind < 9 ? ("pro_yearly", 365 * day, 49_990) : ("lite_weekly", 7 * day, 1_990)
                let trial = kind < 8 && Int.random(in: 0..<10, using: &random) == 0
                let renewals = Int.random(in: 1...14, using: &random)
                var start = started
                var latest = original
                for index in 0..<renewals where count < transactions && start < nowMs {
                    let isTrial = trial && index == 0
                    let end = start + (isTrial ? 7 * day : length)
                    let refunded: Int64? = Int.random(in: 0..<100, using: &random) == 0 ? start + day : nil
                    rows.append([
                        index == 0 ? original : "\(original)-\(index)", original, account, product, 1, "Production",
                        start, isTrial ? 0 : price * scale, currency, 70, start, end, start, storefront,
                        isTrial ? 1 : 0,
                        refunded, "app_store",
                    ])
                    count += 1
                    latest = index == 0 ? original : "\(original)-\(index)"
                    start = end
                }
                // Ended: a third did not renew for a billing failure, the rest turned renewal off.
                let renews = start >= nowMs || Int.random(in: 0..<3, using: &random) == 0
                states.append([
                    original, account, product, start >= nowMs ? "active" : "expired", start, renews ? 1 : 0, latest,
                    start, start, "app_store",
                ])
            }
            if rows.count >= 500 { try await flush() }
        }
        try await flush()
        return count
    }

    static func ms(_ seconds: Double) -> String { String(format: "%.0f ms", seconds * 1000) }

    static func yearAgo(_ now: Date) -> String {
        let calendar = AnalyticsCalendar(timeZone: TimeZone(identifier: "UTC")!)
        return calendar.adding(days: -364, to: calendar.day(of: now)).description
    }
}
