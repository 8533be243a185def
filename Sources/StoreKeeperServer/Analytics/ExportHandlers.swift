import Foundation
import HTTPTypes
import Hummingbird
import StoreKeeperStorage

/// `GET /v1/export/{events|transactions|subscriptions}?since=…&cursor=…&format=csv|ndjson&limit=…`:
/// a page of rows and, while more follow, `Next-Cursor` (docs/api.md).
struct ExportController {
    let reports: ReportStore
    /// How far back rows are held as possibly still committing: a request's deadline plus 5 s
    /// (`limits.requestTimeoutSeconds`), or what a read replica may lag, plus 5 s.
    let settleSeconds: Double
    static let defaultLimit = 1_000
    static let maximumLimit = 10_000

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("export/:kind") { request, context in
            try context.caller().requireScope(.read)
            let name = try context.parameters.require("kind")
            guard let kind = ExportKind(rawValue: name) else {
                throw APIError(
                    .notFound, "unknown_export",
                    "no export '\(name.prefix(64))'; one of events, transactions, subscriptions, orders")
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
            // `until` (exclusive): the export stops before it.
            var until: Date?
            if let text = parameters.get("until"), !text.isEmpty {
                guard text.utf8.count <= 64, let date = StoreKeeperApp.parseDate(text) else {
                    throw APIError.badRequest("'until' must be an ISO 8601 date or date-time")
                }
                until = date
            }
            if let since, let until, until <= since {
                throw APIError.badRequest("'until' must be after 'since'")
            }
            var limit = Self.defaultLimit
            if let text = parameters.get("limit") {
                guard let value = Int(text), (1...Self.maximumLimit).contains(value) else {
                    throw APIError.badRequest("'limit' must be 1…\(Self.maximumLimit)")
                }
                limit = value
            }
            var page = try await exportPage(kind, since: since, until: until, cursor: cursor, limit: limit)
            // A key limited to some apps exports those apps' rows only (a page may then hold
            // fewer than `limit`; the cursor goes on as before).
            let caller = try context.caller()
            if let column = page.columns.firstIndex(of: "app_id"), !caller.covers(app: nil) {
                page.rows = page.rows.filter { row in
                    if case .text(let appId) = row[column] { return caller.covers(app: appId) }
                    return false
                }
            }
            var headers: HTTPFields = [
                .contentType: format == "csv" ? "text/csv; charset=utf-8" : "application/x-ndjson",
                .cacheControl: "no-store",
            ]
            if let next = page.next { headers[HTTPField.Name("Next-Cursor")!] = next.token }
            if format == "csv" {
                headers[.contentDisposition] = "attachment; filename=\"storekeeper-\(kind.rawValue).csv\""
            }
            let body = format == "csv" ? ExportFormat.csv(page) : ExportFormat.ndjson(page)
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: body)))
        }
    }
}

extension ExportController {
    /// One page of an export — the API's and the dashboard's. Rows still being committed are held
    /// back; on a replica, also what it may lag behind; `until` is exclusive.
    func exportPage(_ kind: ExportKind, since: Date?, until: Date?, cursor: ExportCursor?, limit: Int) async throws
        -> ExportPage
    {
        var settled = Date().addingTimeInterval(-settleSeconds)
        if let until { settled = min(settled, until) }
        return try await reports.export(kind, since: since, cursor: cursor, limit: limit, settled: settled)
    }
}

extension StoreKeeperApp {
    /// Exports: the API's route and the dashboard's downloads.
    var exportController: ExportController {
        ExportController(
            reports: store.reports,
            settleSeconds: max(
                exportSettleSeconds ?? Double(configuration.requestTimeoutSeconds + 5),
                database.readReplica.map { $0.maxLag + 5 } ?? 0))
    }
}

enum ExportFormat {
    static func time(_ milliseconds: Int64) -> String {
        Date(timeIntervalSince1970: Double(milliseconds) / 1000).formatted(
            .iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: true)
                .timeSeparator(.colon).timeZone(separator: .omitted))
    }

    /// RFC 4180, a header line first. Every text field is quoted and its `"` bytes doubled —
    /// decided on UTF-8 bytes, never on `Character`s (`",\u{301}"` is one grapheme cluster equal
    /// to no comma, yet a CSV reader splits on its first byte). Text a spreadsheet would run as a
    /// formula (`=`, `+`, `-`, `@`, tab, CR first, in any cell) is prefixed with `'`; numbers and
    /// times are never text.
    static func csv(_ page: ExportPage) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(64 * (page.rows.count + 1))
        for (index, column) in page.columns.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: column.utf8)
        }
        out.append(contentsOf: [0x0D, 0x0A])
        for row in page.rows {
            for (index, value) in row.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                switch value {
                case .null: break
                case .integer(let number): out.append(contentsOf: String(number).utf8)
                case .time(let milliseconds): out.append(contentsOf: time(milliseconds).utf8)
                case .text(let text): appendCSVField(text, to: &out)
                }
            }
            out.append(contentsOf: [0x0D, 0x0A])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The first bytes a spreadsheet reads as the start of a formula.
    static let formulaStarts: Set<UInt8> = [
        UInt8(ascii: "="), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "@"), 0x09, 0x0D,
    ]

    /// One text cell: always quoted, `"` doubled, the formula guard first.
    static func appendCSVField(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        if let first = text.utf8.first, formulaStarts.contains(first) { out.append(UInt8(ascii: "'")) }
        for byte in text.utf8 {
            if byte == UInt8(ascii: "\"") { out.append(byte) }
            out.append(byte)
        }
        out.append(UInt8(ascii: "\""))
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
