import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import StoreKeeperStorage

/// The dashboard's data page: transactions, subscriptions and webhook events between two dates,
/// a hundred rows a page (the exports' own reads and order), and the whole range as one CSV file
/// (the exports' own CSV, formula-guarded) — for a support agent or an accountant without a key.
extension DashboardController {
    static let dataPageSize = 100
    /// A CSV download stops here (a larger range: the API's paged export).
    static let dataDownloadLimit = 100_000

    func addDataRoutes(to group: RouterGroup<StoreKeeperContext>) {
        group.get("data") { request, context in
            try await withSession(request, context) { session, _ in try await dataPage(request, session) }
        }
        group.get("data/:file") { request, context in
            try await withSession(request, context) { session, _ in try await dataDownload(request, context, session) }
        }
    }

    struct DataQuery {
        var kind: ExportKind
        var since: Date?
        var until: Date?
        var sinceText: String
        var untilText: String

        init(_ request: Request, kind name: String?) throws {
            let parameters = request.uri.queryParameters
            let kindName = name ?? parameters.get("kind").map { String($0) } ?? "transactions"
            guard let kind = ExportKind(rawValue: kindName) else {
                throw APIError.badRequest("kind must be transactions, subscriptions, orders or events")
            }
            self.kind = kind
            func date(_ field: String) throws -> (Date?, String) {
                guard let text = parameters.get(field).map({ String($0) }), !text.isEmpty else { return (nil, "") }
                guard text.utf8.count <= 64, let date = StoreKeeperApp.parseDate(text) else {
                    throw APIError.badRequest("'\(field)' must be a date such as 2026-11-01")
                }
                return (date, text)
            }
            (since, sinceText) = try date("since")
            (until, untilText) = try date("until")
            if let since, let until, until <= since { throw APIError.badRequest("'until' must be after 'since'") }
        }

        var queryString: String {
            var parts: [String] = []
            if !sinceText.isEmpty { parts.append("since=\(Self.escape(sinceText))") }
            if !untilText.isEmpty { parts.append("until=\(Self.escape(untilText))") }
            return parts.joined(separator: "&")
        }

        static func escape(_ text: String) -> String {
            text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        }
    }

    static func cell(_ value: ExportValue) -> String {
        switch value {
        case .null: ""
        case .integer(let number): String(number)
        case .time(let milliseconds): ExportFormat.time(milliseconds)
        case .text(let text): text
        }
    }

    func dataPage(_ request: Request, _ session: DashboardSessions.Session) async throws -> Response {
        let query = try DataQuery(request, kind: nil)
        var cursor: ExportCursor?
        if let token = request.uri.queryParameters.get("cursor"), !token.isEmpty {
            guard let parsed = ExportCursor(token: String(token)) else {
                throw APIError(.badRequest, "invalid_cursor", "'cursor' is not a cursor this server gave")
            }
            cursor = parsed
        }
        var rows = try await exportController.exportPage(
            query.kind, since: query.since, until: query.until, cursor: cursor, limit: Self.dataPageSize)
        rows.rows = Self.covered(rows, by: dashboardSessions.role(session))
        let base = query.queryString
        var next: String?
        if let token = rows.next?.token {
            next =
                "/dashboard/data?kind=\(query.kind.rawValue)&\(base)\(base.isEmpty ? "" : "&")cursor=\(DataQuery.escape(token))"
        }
        let values: [String: Any] = [
            "kinds": ExportKind.allCases.map { ["value": $0.rawValue, "selected": $0 == query.kind] },
            "since": query.sinceText, "until": query.untilText,
            "columns": rows.columns, "rows": rows.rows.map { ["cells": $0.map(Self.cell)] },
            "hasRows": !rows.rows.isEmpty, "next": next ?? "", "hasNext": next != nil,
            "download": "/dashboard/data/\(query.kind.rawValue).csv\(base.isEmpty ? "" : "?" + base)",
            "kindName": query.kind.rawValue,
        ]
        return page("data", title: "Data", values: values, session: session, nav: "navData", request: request)
    }

    /// The rows a key limited to some apps may see (a row of no app: only a key of every app).
    static func covered(_ page: ExportPage, by role: DashboardSessions.Role) -> [[ExportValue]] {
        guard role.apps != nil, let column = page.columns.firstIndex(of: "app_id") else { return page.rows }
        return page.rows.filter { row in
            if case .text(let appId) = row[column] { return role.covers(app: appId) }
            return false
        }
    }

    func dataDownload(
        _ request: Request, _ context: StoreKeeperContext, _ session: DashboardSessions.Session
    ) async throws -> Response {
        let file = try StoreKeeperApp.parameter(context, "file")
        guard file.hasSuffix(".csv") else { throw APIError.notFound("no download '\(file.prefix(64))'") }
        let query = try DataQuery(request, kind: String(file.dropLast(4)))
        var rows: [[ExportValue]] = []
        var columns: [String] = []
        var cursor: ExportCursor?
        repeat {
            let page = try await exportController.exportPage(
                query.kind, since: query.since, until: query.until, cursor: cursor, limit: ExportController.maximumLimit
            )
            columns = page.columns
            rows += Self.covered(page, by: dashboardSessions.role(session))
            cursor = page.next
        } while cursor != nil && rows.count < Self.dataDownloadLimit
        var headers = Self.securityHeaders
        headers[.contentType] = "text/csv; charset=utf-8"
        headers[.cacheControl] = "no-store"
        let range = [query.sinceText, query.untilText].filter { !$0.isEmpty }.joined(separator: "_")
        headers[.contentDisposition] =
            "attachment; filename=\"storekeeper-\(query.kind.rawValue)\(range.isEmpty ? "" : "-" + range.filter { $0.isNumber || $0 == "-" || $0 == "_" }).csv\""
        let csv = ExportFormat.csv(
            ExportPage(columns: columns, rows: Array(rows.prefix(Self.dataDownloadLimit)), next: nil))
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: csv)))
    }
}
