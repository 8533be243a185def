import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Mustache
import NIOCore
import StoreKeeperCore
import StoreKeeperStorage

/// The overview page: headline figures from analytics, the last days' deliveries, money and
/// refunds, subscriptions by status and the queues an operator watches.
extension DashboardController {
    func overview(_ session: DashboardSessions.Session) async throws -> Response {
        let days = 14
        let role = dashboardSessions.role(session)
        let figures = try await store.reports.dashboardOverview(
            days: days, now: Date(), smallBusinessProgram: configuration.smallBusinessProgram, apps: role.apps)
        let labels = figures.days.map { Self.dayLabel($0.day) }
        var charts: [[String: Any]] = []
        let deliveries = figures.days.map { Double($0.deliveries) }
        charts.append(
            Self.chart(
                BarChart(
                    title: "Deliveries per day (UTC)", labels: labels,
                    series: [.init(name: "deliveries", cssClass: "s1", values: deliveries)]),
                labelHeader: "Day"))
        // Proceeds and refunds per currency, the three largest currencies.
        var totals: [String: Int64] = [:]
        for day in figures.days {
            for (currency, amount) in day.proceedsMilli { totals[currency, default: 0] += amount }
            for (currency, amount) in day.refundedMilli { totals[currency, default: 0] += amount }
        }
        for currency in totals.sorted(by: { ($0.value, $1.key) > ($1.value, $0.key) }).prefix(3).map(\.key) {
            charts.append(
                Self.chart(
                    BarChart(
                        title: "Proceeds and refunds per day, \(currency)", labels: labels,
                        series: [
                            .init(
                                name: "proceeds", cssClass: "s1",
                                values: figures.days.map { Double($0.proceedsMilli[currency] ?? 0) / 1000 }),
                            .init(
                                name: "refunded", cssClass: "s2",
                                values: figures.days.map { Double($0.refundedMilli[currency] ?? 0) / 1000 }),
                        ], format: { String(format: "%.2f", $0) }, integers: false),
                    labelHeader: "Day"))
        }
        charts.append(
            Self.chart(
                BarChart(
                    title: "Refunds per day (count)", labels: labels,
                    series: [.init(name: "refunds", cssClass: "s2", values: figures.days.map { Double($0.refunds) })]),
                labelHeader: "Day"))
        let statuses = ["active", "grace_period", "billing_retry", "expired", "revoked"]
        let extra = figures.subscriptionsByStatus.keys.filter { !statuses.contains($0) }.sorted()
        let allStatuses = statuses + extra
        charts.append(
            Self.chart(
                BarChart(
                    title: "Subscriptions by status", labels: allStatuses,
                    series: [
                        .init(
                            name: "subscriptions", cssClass: "s3",
                            values: allStatuses.map { Double(figures.subscriptionsByStatus[$0] ?? 0) })
                    ]),
                labelHeader: "Status"))
        let deliveriesTotal = figures.days.reduce(0) { $0 + $1.deliveries }
        // The headline money figures: the analytics computation itself (one code path), by the
        // analytics time zone's day and month, converted into its currency.
        let analytics = analyticsController
        let now = analytics.clock()
        let calendar = AnalyticsCalendar(timeZone: analytics.timeZone)
        let today = calendar.day(of: now)
        // A key limited to some apps: the sum of its apps' figures (each converted alike).
        let apps: [String?] = role.apps.map { $0.sorted().map { Optional($0) } } ?? [nil]
        func figure(_ metric: AnalyticsMetric, interval: String, from: CalendarDay) async throws -> String {
            var parameters = ["from": from.description, "to": today.description, "interval": interval]
            var total: Decimal = 0
            var currency = ""
            for appId in apps {
                parameters["appId"] = appId
                let query = try analytics.query(metric.rawValue, now: now) { parameters[$0] }
                let report = try await analytics.report(query, now: now)
                total += report.points.last?.value ?? 0
                currency = report.currency ?? currency
            }
            return "\(Self.money(total)) \(currency)"
        }
        let monthStart = CalendarDay(year: today.year, month: today.month, day: 1)
        let headline: [String: Any] = [
            "mrr": try await figure(.mrr, interval: "day", from: today),
            "proceedsToday": try await figure(.proceeds, interval: "day", from: today),
            "proceedsMonth": try await figure(.proceeds, interval: "month", from: monthStart),
            "timeZone": configuration.analyticsTimeZone.identifier == "GMT"
                ? "UTC" : configuration.analyticsTimeZone.identifier,
        ]
        let empty =
            deliveriesTotal == 0 && figures.subscriptionsByStatus.values.reduce(0, +) == 0 && figures.openAnomalies == 0
        let values: [String: Any] = [
            "openAnomalies": figures.openAnomalies, "deliveriesTotal": deliveriesTotal,
            "headline": headline, "empty": empty, "hasData": !empty,
            "days": days,
            "activeSubscriptions": (figures.subscriptionsByStatus["active"] ?? 0)
                + (figures.subscriptionsByStatus["grace_period"] ?? 0),
            "pendingJobs": figures.pendingJobs, "pendingNotifications": figures.pendingNotifications,
            "pendingWebhooks": figures.pendingWebhooks, "deadLetters": figures.deadLetters, "charts": charts,
        ]
        return page("overview", title: "Overview", values: values, session: session, nav: "navOverview")
    }

    /// A converted amount as the dashboard shows it: two decimals, thousands grouped.
    static func money(_ value: Decimal) -> String {
        let rounded = NSDecimalNumber(decimal: value).doubleValue
        let cents = Int64((rounded * 100).rounded())
        let whole = abs(cents) / 100
        var digits = String(whole)
        var grouped = ""
        while digits.count > 3 {
            grouped = "," + digits.suffix(3) + grouped
            digits = String(digits.dropLast(3))
        }
        let fraction = abs(cents) % 100
        return (cents < 0 ? "−" : "") + digits + grouped + "." + (fraction < 10 ? "0" : "") + String(fraction)
    }
}
