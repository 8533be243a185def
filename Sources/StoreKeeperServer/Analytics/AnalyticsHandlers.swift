import Foundation
import GooglePlay
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// `GET /v1/analytics/{metric}` (docs/api.md, "Analytics and exports"; docs/analytics.md) and
/// the one computation behind it and the dashboard: built with only what analytics read.
struct AnalyticsController {
    let reports: ReportStore
    /// Analytics' "now" (the server's clock; the local App Store's in tests and the demo).
    let clock: @Sendable () -> Date
    /// `analytics.timeZone`, the zone a query without `timeZone` counts days in.
    let timeZone: TimeZone
    /// The configured apps' ids (`appId` must name one).
    let appIds: Set<String>
    let smallBusinessProgram: Bool
    let scan: @Sendable () -> AnalyticsScanPolicy
    let rates: AnalyticsRatesSource
    let exports: ExportController

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("analytics/:metric") { request, context in
            let caller = try context.caller()
            try caller.requireScope(.read)
            let metric = try context.parameters.require("metric")
            let parameters = request.uri.queryParameters
            try caller.requireAppFilter(parameters.get("appId"))
            let now = clock()
            let query = try self.query(metric, now: now) { parameters.get($0) }
            return try StoreKeeperApp.json(try await report(query, now: now))
        }
        exports.addRoutes(to: v1)
    }

    /// A query checked against this server's zone and apps.
    func query(_ metric: String, now: Date, parameter: (String) -> String?) throws -> AnalyticsRequest {
        try AnalyticsRequest(metric: metric, timeZone: timeZone, appIds: appIds, now: now, parameter: parameter)
    }

    /// Every metric for one set of query parameters (the dashboard's analytics page), in
    /// `AnalyticsMetric.allCases` order, two computed at a time: a metric's statement mostly
    /// waits on the database, and a long window on SQLite is already read in parts on both cores.
    func reports(now: Date, parameter: (String) -> String?) async throws -> [AnalyticsReportJSON] {
        let queries = try AnalyticsMetric.allCases.map { metric in
            try query(metric.rawValue, now: now, parameter: parameter)
        }
        return try await withThrowingTaskGroup(of: (Int, AnalyticsReportJSON).self) { group in
            var reports = [AnalyticsReportJSON?](repeating: nil, count: queries.count)
            var next = 0
            func start() {
                guard next < queries.count else { return }
                let (index, query) = (next, queries[next])
                group.addTask { (index, try await self.report(query, now: now)) }
                next += 1
            }
            start()
            start()
            for try await (index, report) in group {
                reports[index] = report
                start()
            }
            return reports.map { $0! }
        }
    }
}

/// A checked analytics query: the metric, the period in the operator's time zone, the filters.
struct AnalyticsRequest: Sendable {
    static let maximumPoints = 1_100

    var metric: AnalyticsMetric
    var timeZone: TimeZone
    var interval: AnalyticsInterval
    var from: CalendarDay
    var to: CalendarDay
    var filter: AnalyticsFilter

    init(
        metric name: String, timeZone defaultZone: TimeZone, appIds: Set<String>, now: Date,
        parameter: (String) -> String?
    ) throws {
        guard let metric = AnalyticsMetric(rawValue: name) else {
            throw APIError(
                .notFound, "unknown_metric",
                "no metric '\(name.prefix(64))'; one of \(AnalyticsMetric.allCases.map(\.rawValue).joined(separator: ", "))"
            )
        }
        self.metric = metric
        func text(_ name: String) throws -> String? {
            guard let value = parameter(name), !value.isEmpty else { return nil }
            guard value.utf8.count <= 200 else { throw APIError.badRequest("'\(name)' is too long") }
            return value
        }
        // `timeZone` (an extension of docs/api.md's query): another zone than analytics.timeZone.
        var timeZone = defaultZone
        if let zone = try text("timeZone") {
            guard let named = TimeZone(identifier: zone), zone.contains("/") || zone == "UTC" else {
                throw APIError.badRequest("'timeZone' must be an IANA time zone such as Europe/Paris or UTC")
            }
            timeZone = named
        }
        self.timeZone = timeZone
        let calendar = AnalyticsCalendar(timeZone: timeZone)
        func day(_ name: String) throws -> CalendarDay? {
            guard let value = try text(name) else { return nil }
            guard let day = CalendarDay(value) else {
                throw APIError.badRequest("'\(name)' must be a date YYYY-MM-DD, not '\(value.prefix(40))'")
            }
            return day
        }
        if let value = try text("interval") {
            guard let interval = AnalyticsInterval(rawValue: value) else {
                throw APIError.badRequest("'interval' must be day, week or month")
            }
            self.interval = interval
        } else {
            self.interval = metric == .realizedLTV ? .month : .day
        }
        let to = try day("to") ?? calendar.day(of: now)
        let defaultDays =
            switch interval {
            case .day: -29
            case .week: -83
            case .month: -364
            }
        let from = try day("from") ?? calendar.adding(days: defaultDays, to: to)
        guard from <= to else { throw APIError.badRequest("'from' must not be after 'to'") }
        self.from = from
        self.to = to
        var filter = AnalyticsFilter()
        if let appId = try text("appId") {
            guard appIds.contains(appId) else {
                throw APIError(.badRequest, "unknown_app", "no app '\(appId.prefix(64))' is configured")
            }
            filter.appId = appId
        }
        if let store = try text("store") {
            guard Store(rawValue: store) != nil else {
                throw APIError.badRequest(
                    "'store' must be \(Store.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            filter.store = store
        }
        filter.productId = try text("productId")
        if let given = try text("country") {
            // Stored as ISO 3166-1 alpha-3 (the App Store's storefronts; Google's alpha-2
            // converted): an alpha-2 code is converted the same way.
            let country = given.uppercased()
            guard (2...3).contains(country.utf8.count), country.utf8.allSatisfy({ (65...90).contains($0) }),
                let code = country.utf8.count == 3 ? country : RegionCode.alpha3(country)
            else {
                throw APIError.badRequest(
                    "'country' must be an ISO 3166-1 country code such as USA (or US), not '\(given.prefix(16))'")
            }
            filter.country = code
        }
        self.filter = filter
        // Cheap before any work: the number of intervals, bounded.
        let days = Int(calendar.start(of: to).timeIntervalSince(calendar.start(of: from)) / 86_400)
        let points =
            switch interval {
            case .day: days + 1
            case .week: days / 7 + 2
            case .month: days / 28 + 2
            }
        guard points <= Self.maximumPoints || interval == .month && days <= 366 * 50 else {
            throw APIError.badRequest(
                "the range holds more than \(Self.maximumPoints) \(interval.rawValue)s; shorten it or use a longer interval"
            )
        }
    }
}

/// The answer: docs/api.md's `{"metric", "interval", "points"}` and what a reader needs to trust it.
public struct AnalyticsReportJSON: Encodable, Sendable {
    struct Point: Encodable, Sendable {
        var start: String
        var value: Decimal
        var byCurrency: [String: Decimal]?
        var numerator: Int64?
        var denominator: Int64?
        var byReason: [String: Int64]?
    }
    var metric: String
    var interval: String
    var from: String
    var to: String
    var timeZone: String
    var filters: [String: String]
    var currency: String?
    var ratesSource: String?
    var unconverted: [String]?
    var points: [Point]
}

extension StoreKeeperApp {
    /// Analytics, for the API, the dashboard and `storekeeper bench --analytics`.
    var analyticsController: AnalyticsController {
        AnalyticsController(
            reports: store.reports, clock: analyticsClock, timeZone: configuration.analyticsTimeZone,
            appIds: Set(configuration.allApps.map(\.id)), smallBusinessProgram: configuration.smallBusinessProgram,
            scan: analyticsScan, rates: analyticsRates, exports: exportController)
    }

    /// Every metric for one set of query parameters (`AnalyticsController.reports`).
    public func analyticsReports(now: Date, parameter: (String) -> String?) async throws -> [AnalyticsReportJSON] {
        try await analyticsController.reports(now: now, parameter: parameter)
    }
}

extension AnalyticsController {
    /// The one computation behind the API and the dashboard.
    func report(_ query: AnalyticsRequest, now: Date) async throws -> AnalyticsReportJSON {
        let calendar = AnalyticsCalendar(timeZone: query.timeZone)
        let buckets = calendar.buckets(from: query.from, to: query.to, interval: query.interval)
        let tallies = try await reports.analytics(
            query.metric, filter: query.filter, buckets: buckets, now: now,
            smallBusinessProgram: smallBusinessProgram, policy: scan())
        let rates = self.rates.current()
        var unconverted = Set<String>()
        let points = zip(buckets, tallies).map { bucket, tally in
            let point = Analytics.point(
                query.metric, bucket: bucket, tally: tally, rates: rates, unconverted: &unconverted)
            return AnalyticsReportJSON.Point(
                start: point.start.description, value: point.value, byCurrency: point.byCurrency,
                numerator: point.numerator, denominator: point.denominator, byReason: point.byReason)
        }
        var filters: [String: String] = [:]
        if let appId = query.filter.appId { filters["appId"] = appId }
        if let store = query.filter.store { filters["store"] = store }
        if let productId = query.filter.productId { filters["productId"] = productId }
        if let country = query.filter.country { filters["country"] = country }
        return AnalyticsReportJSON(
            metric: query.metric.rawValue, interval: query.interval.rawValue, from: query.from.description,
            to: query.to.description, timeZone: query.timeZone.identifier == "GMT" ? "UTC" : query.timeZone.identifier,
            filters: filters,
            currency: query.metric.isMoney ? rates.currency : nil,
            ratesSource: query.metric.isMoney ? rates.source : nil,
            unconverted: query.metric.isMoney ? unconverted.sorted() : nil, points: points)
    }
}

/// The exchange rates now: the configuration's, or the rates file's (re-read when its
/// modification date changes; a file that stops parsing keeps the last good rates, logged).
public final class AnalyticsRatesSource: Sendable {
    private let configuration: ServerConfiguration
    private let cache = Mutex<(modified: Date?, rates: ExchangeRates)?>(nil)

    init(configuration: ServerConfiguration) {
        self.configuration = configuration
    }

    func current() -> ExchangeRates {
        let fixed =
            (try? ExchangeRates(
                currency: configuration.analyticsCurrency, table: configuration.analyticsRates,
                source: configuration.analyticsRates.isEmpty ? "none" : "configuration"))
            ?? ExchangeRates(currency: configuration.analyticsCurrency)
        guard let file = configuration.analyticsRatesFile else { return fixed }
        let modified = (try? FileManager.default.attributesOfItem(atPath: file))?[.modificationDate] as? Date
        if let cached = cache.withLock({ $0 }), cached.modified == modified { return cached.rates }
        let rates =
            (try? Data(contentsOf: URL(fileURLWithPath: file))).flatMap {
                try? ExchangeRates.parse($0, currency: configuration.analyticsCurrency, source: file)
            }
        return cache.withLock { cached in
            if let rates {
                cached = (modified, rates)
                return rates
            }
            // Unreadable now: the last good rates, or none.
            return cached?.rates
                ?? ExchangeRates(currency: configuration.analyticsCurrency, source: "\(file) (unreadable)")
        }
    }
}
