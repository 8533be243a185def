import Foundation

/// Subscription analytics (docs/analytics.md): the metrics, their calendar (intervals in the
/// operator's time zone), currency conversion and how stored facts become points. The database
/// sums; everything here is pure.
public enum AnalyticsMetric: String, Sendable, CaseIterable, Codable {
    case mrr
    case activeSubscriptions = "active_subscriptions"
    case activeTrials = "active_trials"
    case newSubscriptions = "new_subscriptions"
    case churnedSubscriptions = "churned_subscriptions"
    case trialConversion = "trial_conversion"
    case refundRate = "refund_rate"
    case proceeds
    case realizedLTV = "realized_ltv"

    /// Money metrics answer a converted `value` and `byCurrency`.
    public var isMoney: Bool { self == .mrr || self == .proceeds || self == .realizedLTV }
    /// Ratios answer `value` = numerator ÷ denominator (0 when nothing is in the denominator).
    public var isRatio: Bool { self == .trialConversion || self == .refundRate }
    /// Stock metrics are read at the end of each interval; the others count what happened in it.
    public var isStock: Bool { self == .mrr || self == .activeSubscriptions || self == .activeTrials }
}

public enum AnalyticsInterval: String, Sendable, CaseIterable, Codable {
    case day, week, month
}

/// Quarter hours since 1970: every time zone's midnight is a whole quarter hour, so facts summed
/// per quarter hour by the database fall into local days, weeks and months exactly.
public enum QuarterHour {
    public static let milliseconds: Int64 = 900_000

    public static func of(_ milliseconds: Int64) -> Int64 {
        milliseconds >= 0
            ? milliseconds / Self.milliseconds : (milliseconds - Self.milliseconds + 1) / Self.milliseconds
    }
}

/// A calendar date (no time zone of its own).
public struct CalendarDay: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var year: Int
    public var month: Int
    public var day: Int

    public init(year: Int, month: Int, day: Int) {
        self.year = year
        self.month = month
        self.day = day
    }

    /// `YYYY-MM-DD`, a real date (2026-02-30 is refused).
    public init?(_ text: String) {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard text.utf8.count == 10, parts.count == 3, parts[0].count == 4, parts[1].count == 2, parts[2].count == 2,
            let year = Int(parts[0]), let month = Int(parts[1]), let day = Int(parts[2]),
            parts.allSatisfy({ $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) }),
            (1970...9999).contains(year), (1...12).contains(month),
            (1...CalendarDay.days(inMonth: month, year: year)).contains(day)
        else { return nil }
        self.init(year: year, month: month, day: day)
    }

    public static func days(inMonth month: Int, year: Int) -> Int {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    public var description: String {
        String(format: "%04d-%02d-%02d", year, month, day)
    }

    public static func < (lhs: CalendarDay, rhs: CalendarDay) -> Bool {
        (lhs.year, lhs.month, lhs.day) < (rhs.year, rhs.month, rhs.day)
    }
}

/// Intervals in a time zone (the operator's; UTC by default).
public struct AnalyticsCalendar: Sendable {
    public struct Bucket: Sendable, Hashable {
        /// The interval's first day, clipped to the query's `from`.
        public var start: CalendarDay
        /// Milliseconds since 1970 of the interval's start and (exclusive) end.
        public var startMilliseconds: Int64
        public var endMilliseconds: Int64
    }

    public let timeZone: TimeZone
    private let calendar: Calendar

    public init(timeZone: TimeZone) {
        self.timeZone = timeZone
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        calendar.firstWeekday = 2  // ISO weeks start on Monday
        calendar.minimumDaysInFirstWeek = 4
        self.calendar = calendar
    }

    /// Local midnight starting `day`.
    public func start(of day: CalendarDay) -> Date {
        calendar.date(from: DateComponents(year: day.year, month: day.month, day: day.day))
            ?? Date(timeIntervalSince1970: 0)
    }

    public func day(of date: Date) -> CalendarDay {
        let parts = calendar.dateComponents([.year, .month, .day], from: date)
        return CalendarDay(year: parts.year ?? 1970, month: parts.month ?? 1, day: parts.day ?? 1)
    }

    public func adding(days: Int, to day: CalendarDay) -> CalendarDay {
        self.day(of: calendar.date(byAdding: .day, value: days, to: start(of: day)) ?? start(of: day))
    }

    /// The calendar intervals meeting [from, to] (both days included), the first and last
    /// clipped to them.
    public func buckets(from: CalendarDay, to: CalendarDay, interval: AnalyticsInterval) -> [Bucket] {
        guard from <= to else { return [] }
        let end = start(of: adding(days: 1, to: to))
        var buckets: [Bucket] = []
        var cursor = start(of: from)
        while cursor < end {
            let next: Date
            switch interval {
            case .day:
                next = calendar.date(byAdding: .day, value: 1, to: cursor) ?? end
            case .week:
                let weekStart = calendar.dateInterval(of: .weekOfYear, for: cursor)?.start ?? cursor
                next = calendar.date(byAdding: .day, value: 7, to: weekStart) ?? end
            case .month:
                let monthStart = calendar.dateInterval(of: .month, for: cursor)?.start ?? cursor
                next = calendar.date(byAdding: .month, value: 1, to: monthStart) ?? end
            }
            let bucketEnd = min(next, end)
            buckets.append(
                Bucket(
                    start: day(of: cursor),
                    startMilliseconds: Int64((cursor.timeIntervalSince1970 * 1000).rounded(.down)),
                    endMilliseconds: Int64((bucketEnd.timeIntervalSince1970 * 1000).rounded(.down)))
            )
            guard bucketEnd > cursor else { break }
            cursor = bucketEnd
        }
        return buckets
    }
}

/// Conversion of each currency into the reporting one (`analytics.currency`), by rates the
/// operator configures (`analytics.rates` or `analytics.ratesFile`): one unit of the currency is
/// worth `rate` units of the reporting currency. The reporting currency's own rate is 1.
public struct ExchangeRates: Sendable, Equatable {
    public var currency: String
    public var rates: [String: Decimal]
    /// Where the rates came from (a file's path, "configuration" or "none").
    public var source: String

    public init(currency: String = "USD", rates: [String: Decimal] = [:], source: String = "none") {
        self.currency = currency
        self.rates = rates
        self.source = source
    }

    public func rate(_ code: String) -> Decimal? {
        code == currency ? 1 : rates[code]
    }

    /// The converted total of milliunits per currency, in major units rounded to the cent; the
    /// currencies without a rate are left out and named.
    public func convert(_ milli: [String: Int64]) -> (value: Decimal, unconverted: [String]) {
        var total: Decimal = 0
        var unconverted: [String] = []
        for (code, amount) in milli.sorted(by: { $0.key < $1.key }) {
            guard let rate = rate(code) else {
                if amount != 0 { unconverted.append(code) }
                continue
            }
            total += Decimal(amount) * rate
        }
        return (Analytics.rounded(total / 1000, scale: 2), unconverted)
    }

    /// A rates file: `{"currency"?: "USD", "rates": {"EUR": 1.08, …}}` or a flat `{"EUR": 1.08}`.
    public static func parse(_ data: Data, currency: String, source: String) throws -> ExchangeRates {
        struct File: Decodable {
            var currency: String?
            var rates: [String: Double]
        }
        let table: [String: Double]
        if let file = try? JSONDecoder().decode(File.self, from: data) {
            if let declared = file.currency, declared != currency {
                throw Invalid(reason: "its rates are in \(declared), not analytics.currency \(currency)")
            }
            table = file.rates
        } else if let flat = try? JSONDecoder().decode([String: Double].self, from: data) {
            table = flat
        } else {
            throw Invalid(reason: "must be a JSON object of rates: {\"rates\": {\"EUR\": 1.08}}")
        }
        return try ExchangeRates(currency: currency, table: table, source: source)
    }

    /// Rates from numbers (a file's or the configuration's), each checked.
    public init(currency: String, table: [String: Double], source: String) throws {
        var rates: [String: Decimal] = [:]
        for (code, value) in table {
            guard Self.isCurrencyCode(code) else {
                throw Invalid(reason: "'\(code)' is not an ISO 4217 currency code")
            }
            guard value > 0, value.isFinite else {
                throw Invalid(reason: "the rate of \(code) must be a positive number")
            }
            rates[code] = Decimal(string: String(value)) ?? Decimal(value)
        }
        self.init(currency: currency, rates: rates, source: source)
    }

    public static func isCurrencyCode(_ code: String) -> Bool {
        code.utf8.count == 3 && code.utf8.allSatisfy { (65...90).contains($0) }
    }

    public struct Invalid: Error, CustomStringConvertible {
        public var reason: String
        public var description: String { reason }
    }
}

/// Sums the database gives per quarter hour (or per cohort): a count, a denominator for ratios,
/// and milliunits per currency.
public struct AnalyticsTally: Sendable, Equatable {
    public var count: Int64 = 0
    public var total: Int64 = 0
    public var milli: [String: Int64] = [:]
    public var byReason: [String: Int64] = [:]

    public init(count: Int64 = 0, total: Int64 = 0, milli: [String: Int64] = [:], byReason: [String: Int64] = [:]) {
        self.count = count
        self.total = total
        self.milli = milli
        self.byReason = byReason
    }

    public mutating func add(_ other: AnalyticsTally) {
        count += other.count
        total += other.total
        for (code, amount) in other.milli { milli[code, default: 0] += amount }
        for (reason, amount) in other.byReason { byReason[reason, default: 0] += amount }
    }

    public mutating func subtract(_ other: AnalyticsTally) {
        count -= other.count
        total -= other.total
        for (code, amount) in other.milli { milli[code, default: 0] -= amount }
    }
}

public struct AnalyticsPoint: Sendable, Equatable {
    public var start: CalendarDay
    public var value: Decimal
    public var byCurrency: [String: Decimal]?
    public var numerator: Int64?
    public var denominator: Int64?
    public var byReason: [String: Int64]?
}

public enum Analytics {
    /// Milliunits per month of a period's price: a week's × 52 ÷ 12, n months' ÷ n, a year's
    /// ÷ 12. Weeks and months are counted from the period's length, rounded to the nearest
    /// (periods under 25 days are weeks; a month is 30.4375 days), so Apple's and Google's
    /// periods need no catalog. Integer arithmetic, rounded down — as the SQL views do.
    public static func monthlyMilli(priceMilli: Int64, periodStart: Int64, periodEnd: Int64) -> Int64 {
        let length = periodEnd - periodStart
        if length < 25 * 86_400_000 {
            let weeks = max(1, (length + 302_400_000) / 604_800_000)
            return priceMilli * 52 / (12 * weeks)
        }
        let months = max(1, (length + 1_314_900_000) / 2_629_800_000)
        return priceMilli / months
    }

    public static func rounded(_ value: Decimal, scale: Int) -> Decimal {
        var input = value
        var result = Decimal()
        NSDecimalRound(&result, &input, scale, .plain)
        return result
    }

    /// The instants a stock metric is read at: each interval's end, or — for the interval under
    /// way — now, taken generously: what started in the current quarter hour counts, and so
    /// does what ended in it (a purchase shows at once; an expiry a few minutes later).
    public static func instants(_ buckets: [AnalyticsCalendar.Bucket], now: Int64) -> [(starts: Int64, ends: Int64)] {
        let floor = QuarterHour.of(now) * QuarterHour.milliseconds
        let ceiling = floor == now ? floor : floor + QuarterHour.milliseconds
        return buckets.map { $0.endMilliseconds <= floor ? ($0.endMilliseconds, $0.endMilliseconds) : (ceiling, floor) }
    }

    /// Stock metrics: each instant's sum of what started before it less what ended before it,
    /// from per-quarter-hour sums of starts and ends (instants on quarter hours).
    public static func stock(
        starts: [Int64: AnalyticsTally], ends: [Int64: AnalyticsTally], at instants: [(starts: Int64, ends: Int64)]
    ) -> [AnalyticsTally] {
        let startKeys = starts.keys.sorted()
        let endKeys = ends.keys.sorted()
        var running = AnalyticsTally()
        var startIndex = 0
        var endIndex = 0
        var values: [AnalyticsTally] = []
        for instant in instants {
            let limit = QuarterHour.of(instant.starts)
            while startIndex < startKeys.count, startKeys[startIndex] < limit {
                running.add(starts[startKeys[startIndex]]!)
                startIndex += 1
            }
            let endLimit = QuarterHour.of(instant.ends)
            while endIndex < endKeys.count, endKeys[endIndex] < endLimit {
                running.subtract(ends[endKeys[endIndex]]!)
                endIndex += 1
            }
            values.append(running)
        }
        return values
    }

    /// Flow metrics: the quarter hours' sums falling in each bucket.
    public static func flow(_ tallies: [Int64: AnalyticsTally], into buckets: [AnalyticsCalendar.Bucket])
        -> [AnalyticsTally]
    {
        var values = [AnalyticsTally](repeating: AnalyticsTally(), count: buckets.count)
        guard !buckets.isEmpty else { return values }
        let starts = buckets.map { QuarterHour.of($0.startMilliseconds) }
        for (quarter, tally) in tallies {
            // The last bucket starting at or before this quarter hour.
            var low = 0
            var high = starts.count - 1
            guard quarter >= starts[0], quarter < QuarterHour.of(buckets[buckets.count - 1].endMilliseconds) else {
                continue
            }
            while low < high {
                let middle = (low + high + 1) / 2
                if starts[middle] <= quarter { low = middle } else { high = middle - 1 }
            }
            values[low].add(tally)
        }
        return values
    }

    /// A point from its tally: money converted (and per currency, per customer for LTV), counts
    /// as they are, ratios to four decimals.
    public static func point(
        _ metric: AnalyticsMetric, bucket: AnalyticsCalendar.Bucket, tally: AnalyticsTally, rates: ExchangeRates,
        unconverted: inout Set<String>
    ) -> AnalyticsPoint {
        var point = AnalyticsPoint(start: bucket.start, value: 0)
        switch metric {
        case .mrr, .proceeds, .realizedLTV:
            var milli = tally.milli.filter { $0.value != 0 }
            if metric == .realizedLTV {
                // Per customer of the cohort: each currency's sum ÷ the cohort's size.
                let size = Decimal(max(tally.count, 1))
                var byCurrency: [String: Decimal] = [:]
                var converted: Decimal = 0
                for (code, amount) in milli {
                    byCurrency[code] = rounded(Decimal(amount) / 1000 / size, scale: 3)
                    if let rate = rates.rate(code) {
                        converted += Decimal(amount) * rate
                    } else {
                        unconverted.insert(code)
                    }
                }
                point.value = tally.count == 0 ? 0 : rounded(converted / 1000 / size, scale: 2)
                point.byCurrency = byCurrency
                point.denominator = tally.count
                return point
            }
            milli = milli.filter { $0.value != 0 }
            let (value, missing) = rates.convert(milli)
            unconverted.formUnion(missing)
            point.value = value
            point.byCurrency = milli.mapValues { Decimal($0) / 1000 }
        case .activeSubscriptions, .activeTrials, .newSubscriptions:
            point.value = Decimal(tally.count)
        case .churnedSubscriptions:
            point.value = Decimal(tally.count)
            point.byReason = ["voluntary": 0, "billing": 0, "refund": 0].merging(tally.byReason) { $1 }
        case .trialConversion, .refundRate:
            point.value = tally.total == 0 ? 0 : rounded(Decimal(tally.count) / Decimal(tally.total), scale: 4)
            point.numerator = tally.count
            point.denominator = tally.total
        }
        return point
    }
}
