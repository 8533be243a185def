import Foundation
import StoreKeeperCore
import StoreKeeperStorage

/// Server-side SVG bar charts for the dashboard: no chart library, no script. Each chart has a
/// title, y-axis ticks with values, x-axis labels, a legend when there are several series, and
/// a `<title>` on every bar with its exact value (the tooltip); the page puts a plain table
/// beside it.
struct BarChart: Sendable {
    struct Series: Sendable {
        var name: String
        /// The stylesheet class that colours it (`s1`, `s2`, …).
        var cssClass: String
        var values: [Double]
    }

    var title: String
    var labels: [String]
    var series: [Series]
    /// How a value is written on the axis and in tooltips.
    var format: @Sendable (Double) -> String = { BarChart.integer($0) }
    /// Counts: the axis ticks are whole numbers.
    var integers = true

    static let width = 640.0
    static let height = 240.0
    static let left = 56.0
    static let right = 12.0
    static let top = 28.0
    static let bottom = 44.0

    func svg() -> String {
        let plotWidth = Self.width - Self.left - Self.right
        let plotHeight = Self.height - Self.top - Self.bottom
        let nice = Self.niceCeiling(series.flatMap(\.values).max() ?? 0)
        let maximum = integers ? max(4, 4 * (nice / 4).rounded(.up)) : nice
        let slot = labels.isEmpty ? plotWidth : plotWidth / Double(labels.count)
        let barWidth = max(1, (slot * 0.8) / Double(max(series.count, 1)))
        var out =
            #"<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 \#(Self.number(Self.width)) \#(Self.number(Self.height))" role="img" aria-label="\#(Self.escape(title))">"#
        out += "<title>\(Self.escape(title))</title>"
        out += #"<text class="chart-title" x="\#(Self.number(Self.left))" y="16">\#(Self.escape(title))</text>"#
        // Horizontal grid lines and y-axis values at 0, ¼, ½, ¾ and the top.
        for step in 0...4 {
            let value = maximum * Double(step) / 4
            let y = Self.top + plotHeight - plotHeight * Double(step) / 4
            out +=
                #"<line class="grid" x1="\#(Self.number(Self.left))" x2="\#(Self.number(Self.width - Self.right))" y1="\#(Self.number(y))" y2="\#(Self.number(y))"/>"#
            out +=
                #"<text class="axis" x="\#(Self.number(Self.left - 6))" y="\#(Self.number(y + 4))" text-anchor="end">\#(Self.escape(format(value)))</text>"#
        }
        out +=
            #"<line class="axis-line" x1="\#(Self.number(Self.left))" x2="\#(Self.number(Self.left))" y1="\#(Self.number(Self.top))" y2="\#(Self.number(Self.top + plotHeight))"/>"#
        // At most ~12 x labels, so they never overlap.
        let every = max(1, Int((Double(labels.count) / 12).rounded(.up)))
        for (index, label) in labels.enumerated() {
            let x = Self.left + slot * Double(index)
            for (position, serie) in series.enumerated() {
                let value = index < serie.values.count ? serie.values[index] : 0
                let barHeight = maximum > 0 ? plotHeight * max(value, 0) / maximum : 0
                let barX = x + slot * 0.1 + barWidth * Double(position)
                out +=
                    #"<rect class="\#(Self.escape(serie.cssClass))" x="\#(Self.number(barX))" y="\#(Self.number(Self.top + plotHeight - barHeight))" width="\#(Self.number(barWidth))" height="\#(Self.number(barHeight))"><title>\#(Self.escape("\(label) · \(serie.name): \(format(value))"))</title></rect>"#
            }
            if index % every == 0 {
                out +=
                    #"<text class="axis" x="\#(Self.number(x + slot / 2))" y="\#(Self.number(Self.top + plotHeight + 16))" text-anchor="middle">\#(Self.escape(label))</text>"#
            }
        }
        if series.count > 1 {
            var legendX = Self.left
            for serie in series {
                out +=
                    #"<rect class="\#(Self.escape(serie.cssClass))" x="\#(Self.number(legendX))" y="\#(Self.number(Self.height - 14))" width="10" height="10"/>"#
                out +=
                    #"<text class="axis" x="\#(Self.number(legendX + 14))" y="\#(Self.number(Self.height - 5))">\#(Self.escape(serie.name))</text>"#
                legendX += 24 + Double(serie.name.count) * 7
            }
        }
        return out + "</svg>"
    }

    /// The smallest of 1, 2, 2.5 or 5 × 10ⁿ at or above `value` (1 for nothing), so the
    /// axis ticks are round numbers.
    static func niceCeiling(_ value: Double) -> Double {
        guard value > 0, value.isFinite else { return 1 }
        let magnitude = pow(10, floor(log10(value)))
        for factor in [1.0, 2.0, 2.5, 5.0, 10.0] where factor * magnitude >= value { return factor * magnitude }
        return 10 * magnitude
    }

    static func integer(_ value: Double) -> String {
        value == value.rounded() ? String(Int64(value)) : String(format: "%.1f", value)
    }

    static func number(_ value: Double) -> String { String(format: "%.1f", value) }

    /// Scalar-safe (`HTMLEscaping`): never per `Character`.
    static func escape(_ text: String) -> String { HTMLEscaping.escape(text) }
}

/// The dashboard's charts as its templates show them.
extension DashboardController {
    static func metricChart(_ metric: AnalyticsMetric, _ report: AnalyticsReportJSON) -> [String: Any] {
        // Short axis labels (MM-DD; a month's YYYY-MM); the table keeps the full date.
        let labels = report.points.map {
            report.interval == "month" ? String($0.start.prefix(7)) : String($0.start.dropFirst(5))
        }
        let values = report.points.map { Double("\($0.value)") ?? 0 }
        var title = metricTitles[metric] ?? metric.rawValue
        if let currency = report.currency { title += " (\(currency))" }
        if metric.isRatio { title += " (%)" }
        let decimals = metric.isMoney ? 2 : metric.isRatio ? 1 : 0
        let format: @Sendable (Double) -> String = { value in
            decimals == 0 ? BarChart.integer(value) : String(format: "%.\(decimals)f", value)
        }
        let chart = BarChart(
            title: title, labels: labels,
            series: [
                .init(name: metric.rawValue, cssClass: "s1", values: metric.isRatio ? values.map { $0 * 100 } : values)
            ],
            format: format, integers: !(metric.isMoney || metric.isRatio))
        var table = Self.chart(chart, labelHeader: report.interval.capitalized)
        table["rows"] = zip(table["rows"] as? [[String: Any]] ?? [], report.points).map { row, point in
            var row = row
            row["label"] = point.start
            return row
        }
        // The table says more than the bars: each currency, the counts behind a ratio, churn's reasons.
        let currencies = Set(report.points.flatMap { $0.byCurrency?.keys.map { $0 } ?? [] }).sorted()
        var columns = table["columns"] as? [String] ?? []
        // ARR beside MRR: 12 × MRR (docs/analytics.md).
        if metric == .mrr { columns.append("ARR") }
        columns += currencies
        if metric.isRatio || metric == .realizedLTV {
            columns += metric == .realizedLTV ? ["customers"] : ["of", "in"]
        }
        if metric == .churnedSubscriptions { columns += ["voluntary", "billing", "refund"] }
        table["columns"] = columns
        table["rows"] = zip(table["rows"] as? [[String: Any]] ?? [], report.points).map { row, point in
            var row = row
            var cells = row["cells"] as? [String] ?? []
            if metric == .mrr { cells.append("\(point.value * 12)") }
            cells += currencies.map { point.byCurrency?[$0].map { "\($0)" } ?? "" }
            if metric == .realizedLTV { cells.append(point.denominator.map(String.init) ?? "") }
            if metric.isRatio {
                cells += [point.numerator.map(String.init) ?? "", point.denominator.map(String.init) ?? ""]
            }
            if metric == .churnedSubscriptions {
                cells += ["voluntary", "billing", "refund"].map { String(point.byReason?[$0] ?? 0) }
            }
            row["cells"] = cells
            return row
        }
        table["metric"] = metric.rawValue
        return table
    }

    static func chart(_ chart: BarChart, labelHeader: String) -> [String: Any] {
        let rows: [[String: Any]] = chart.labels.enumerated().map { index, label in
            [
                "label": label,
                "cells": chart.series.map { index < $0.values.count ? chart.format($0.values[index]) : "" },
            ]
        }
        return ["svg": chart.svg(), "labelHeader": labelHeader, "columns": chart.series.map(\.name), "rows": rows]
    }

    static func dayLabel(_ day: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let parts = calendar.dateComponents([.month, .day], from: day)
        return String(format: "%02d-%02d", parts.month ?? 0, parts.day ?? 0)
    }
}
