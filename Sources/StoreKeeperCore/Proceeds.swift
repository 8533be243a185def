import Foundation

/// What the developer keeps of a transaction's price, for revenue figures: 70 % by default;
/// 85 % for an auto-renewable subscription's periods after one year of paid service (a lapse
/// of more than 60 days starts the year again), or for everything under the Small Business
/// Program. Sandbox transactions earn nothing and are left out.
public enum Proceeds {
    /// One paid period of a subscription.
    public struct Period: Sendable, Hashable {
        public var start: Date
        public var end: Date

        public init(start: Date, end: Date) {
            self.start = start
            self.end = end
        }
    }

    /// Percent of the price kept (integers: 990 × 70 % is 693, not 692.999…).
    public static let standardPercent = 70
    public static let reducedCommissionPercent = 85
    /// A gap between paid periods longer than this resets the year of paid service.
    public static let maximumGap: TimeInterval = 60 * 86_400
    public static let oneYear: TimeInterval = 365 * 86_400

    /// Seconds of paid service before `date`, counted back to the last gap of more than 60 days.
    public static func paidService(before date: Date, periods: [Period]) -> TimeInterval {
        var total: TimeInterval = 0
        var previousEnd: Date?
        for period in periods.sorted(by: { $0.start < $1.start }) where period.start < date {
            if let previousEnd, period.start.timeIntervalSince(previousEnd) > maximumGap { total = 0 }
            let end = min(period.end, date)
            total += max(0, end.timeIntervalSince(period.start))
            previousEnd = max(previousEnd ?? end, end)
        }
        if let previousEnd, date.timeIntervalSince(previousEnd) > maximumGap { total = 0 }
        return total
    }

    /// Whether the store dates each period itself (Apple: each transaction's purchase date is
    /// its period's start; Google names the subscription's start: a renewal's period starts
    /// where the one before it ended).
    public static func datesEachPeriod(_ store: Store) -> Bool {
        switch store {
        case .appStore, .web, .stripe: true
        case .googlePlay: false
        }
    }

    /// The percent of the price the developer keeps; nil for Sandbox and Xcode.
    /// Each store's economics, in one place (a new store is a new case here, which the
    /// compiler asks for).
    public static func percent(
        of transaction: StoreTransaction, earlierPeriods: [Period] = [], smallBusinessProgram: Bool = false
    ) -> Int? {
        if transaction.environment == .sandbox || transaction.environment == .xcode { return nil }
        switch transaction.store {
        case .stripe:
            // Stripe's fee is known per charge: `amount(of:)` takes the balance transaction's
            // net when the adapter read it; until then the gross is the developer's.
            return 100
        case .web:
            // A web payment is the developer's own (Apple's commission on link-outs, where one
            // applies, is invoiced apart and not modelled here).
            return 100
        case .googlePlay:
            // Google Play's service fee: 15 % on subscriptions from the first day; 30 % on
            // one-time products beyond the 15 % tier (the first USD 1M a year, for an enrolled
            // developer — what `smallBusinessProgram` says here too).
            if smallBusinessProgram { return reducedCommissionPercent }
            return transaction.kind == .autoRenewable ? reducedCommissionPercent : standardPercent
        case .appStore:
            break
        }
        if smallBusinessProgram { return reducedCommissionPercent }
        guard transaction.kind == .autoRenewable, let purchased = transaction.purchaseDate else {
            return standardPercent
        }
        let start = Date(timeIntervalSince1970: Double(purchased) / 1000)
        return paidService(before: start, periods: earlierPeriods) >= oneYear
            ? reducedCommissionPercent : standardPercent
    }

    /// The proceeds in Apple's price unit (milliunits of `currency`), rounded down; nil for
    /// Sandbox or a transaction without a price.
    public static func amount(
        of transaction: StoreTransaction, earlierPeriods: [Period] = [], smallBusinessProgram: Bool = false
    ) -> Int64? {
        if transaction.environment == .sandbox || transaction.environment == .xcode { return nil }
        if let net = transaction.proceeds { return net }
        guard let price = transaction.price, price >= 0,
            let percent = percent(
                of: transaction, earlierPeriods: earlierPeriods, smallBusinessProgram: smallBusinessProgram)
        else { return nil }
        let (product, overflow) = price.multipliedReportingOverflow(by: Int64(percent))
        return overflow ? price / 100 * Int64(percent) : product / 100
    }
}
