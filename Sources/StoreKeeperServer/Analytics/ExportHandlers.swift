import Foundation
import HTTPTypes
import Hummingbird
import StoreKeeperStorage

/// `GET /v1/export/{events|transactions|subscriptions}?since=…&cursor=…&format=csv|ndjson&limit=…`:
/// a page of rows and, while more follow, `Next-Cursor` (API.md).
struct ExportController {
    let app: StoreKeeperApp
    static let defaultLimit = 1_000
    static let maximumLimit = 10_000

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("export/:kind") { request, context in
            try context.caller().requireSecretKey()
            let name = try context.parameters.require("kind")
            guard let kind = ExportKind(rawValue: name) else {
                throw APIError(
                    .notFound, "unknown_export",
                    "no export '\(name.prefix(64))'; one of events, transactions, subscriptions")
            }
            let parameters = request.uri.queryParameters
            let format = parameters.get("format") ?? "csv"
            guard format == "csv" || format == "ndjson" else {
                throw APIError.badRequest("'format' must be csv or ndjson")
            }
            var cursor: ExportCursor?
            if let token = parameters.get("cursor"), !token.isEmpty {
                guard let parsed = ExportCursor(token: token) else {
                    throw APIError(.badRequest, "invalid_cursor", "'cursor' is not a cursor this server gave")
                }
                cursor = parsed
            }
            var since: Date?
            if let text = parameters.get("since"), !text.isEmpty {
                guard text.utf8.count <= 64, let date = StoreKeeperApp.parseDate(text) else {
                    throw APIError.badRequest("'since' must be an ISO 8601 date or date-time")
                }
                since = date
            }
            var limit = Self.defaultLimit
            if let text = parameters.get("limit") {
                guard let value = Int(text), (1...Self.maximumLimit).contains(value) else {
                    throw APIError.badRequest("'limit' must be 1…\(Self.maximumLimit)")
                }
                limit = value
            }
            let settled = Date().addingTimeInterval(
                -(app.exportSettleSeconds ?? Double(app.configuration.requestTimeoutSeconds + 5)))
            let page = try await app.store.export(kind, since: since, cursor: cursor, limit: limit, settled: settled)
            var headers: HTTPFields = [
                .contentType: format == "csv" ? "text/csv; charset=utf-8" : "application/x-ndjson",
                .cacheControl: "no-store",
            ]
            if let next = page.next { headers[HTTPField.Name("Next-Cursor")!] = next.token }
            let body = format == "csv" ? ExportFormat.csv(page) : ExportFormat.ndjson(page)
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: body)))
        }
    }
}

enum ExportFormat {
    static func time(_ milliseconds: Int64) -> String {
        Date(timeIntervalSince1970: Double(milliseconds) / 1000).formatted(
            .iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: true)
                .timeSeparator(.colon).timeZone(separator: .omitted))
    }

    /// RFC 4180, a header line first. Text a spreadsheet would run as a formula (`=`, `+`,
    /// `-`, `@`, tab, CR first) is prefixed with `'`; numbers and times are never text.
    static func csv(_ page: ExportPage) -> String {
        var out = page.columns.joined(separator: ",") + "\r\n"
        for row in page.rows {
            out += row.map { value -> String in
                switch value {
                case .null: return ""
                case .integer(let number): return String(number)
                case .time(let milliseconds): return time(milliseconds)
                case .text(var text):
                    if let first = text.unicodeScalars.first, "=+-@\t\r".unicodeScalars.contains(first) {
                        text = "'" + text
                    }
                    if text.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" }) {
                        return "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\""
                    }
                    return text
                }
            }.joined(separator: ",")
            out += "\r\n"
        }
        return out
    }

    /// One JSON object per line, the columns as keys (null kept), times as ISO 8601.
    static func ndjson(_ page: ExportPage) -> String {
        var out = ""
        for row in page.rows {
            out += "{"
            for (index, (name, value)) in zip(page.columns, row).enumerated() {
                if index > 0 { out += "," }
                out += "\"\(name)\":"
                switch value {
                case .null: out += "null"
                case .integer(let number): out += String(number)
                case .time(let milliseconds): out += "\"\(time(milliseconds))\""
                case .text(let text): PurchaseStore.appendJSONString(text, to: &out)
                }
            }
            out += "}\n"
        }
        return out
    }
}
