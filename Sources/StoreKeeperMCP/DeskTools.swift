import Foundation
import MCP

/// One call of StoreKeeper's HTTP API that a tool makes: what the support desk's agent asks is
/// answered by the same routes, checks and audit log as the dashboard and the API.
public struct APICall: Sendable, Equatable {
    public var method: String
    /// Already percent-encoded.
    public var path: String
    public var query: [String: String]
    public var body: [String: Value]?

    public init(method: String, path: String, query: [String: String] = [:], body: [String: Value]? = nil) {
        self.method = method
        self.path = path
        self.query = query
        self.body = body
    }
}

/// A tool's arguments that do not fit its schema: answered as the tool's error, not a crash.
public struct ToolArgumentError: Error, CustomStringConvertible {
    public var description: String
}

/// One tool of the desk: its schema, the scope a key needs to be offered it, and the API call it
/// makes of its arguments.
public struct DeskTool: Sendable {
    public enum Scope: String, Sendable, Comparable, CaseIterable {
        case read, support, admin
        var rank: Int { Self.allCases.firstIndex(of: self)! }
        public static func < (lhs: Scope, rhs: Scope) -> Bool { lhs.rank < rhs.rank }
    }

    public var name: String
    public var title: String
    public var description: String
    public var scope: Scope
    public var properties: [String: Value]
    public var required: [String]
    /// The free-text field of its call (a note or a reason) that says it came through this desk,
    /// as the dashboard's say `(dashboard)`: the audit log then tells an agent's actions apart.
    public var marks: String? = nil
    /// MCP's hints for a write: it may take away what a player has (a refund, a debit, a transfer,
    /// ending a grant), and whether calling it twice with the same arguments does what once does.
    public var destructive: Bool { Self.destructiveTools.contains(name) }
    public var idempotent: Bool { !Self.repeatingTools.contains(name) }
    public var call: @Sendable (Arguments) throws -> APICall

    /// `call` with `marks` ending in ` (mcp)`, within the field's length — counted in Unicode
    /// scalars as the API counts it, cut only between whole characters.
    func marked(_ made: APICall) -> APICall {
        guard let marks, var body = made.body else { return made }
        var limit = 2000
        if case .object(let schema)? = properties[marks], case .int(let max)? = schema["maxLength"] { limit = max }
        let given = body[marks]?.stringValue.map { Self.prefix($0, scalars: limit - 6) + " " } ?? ""
        body[marks] = .string(given + "(mcp)")
        var call = made
        call.body = body
        return call
    }

    /// The longest run of whole characters of `text` within `scalars` Unicode scalars.
    static func prefix(_ text: String, scalars limit: Int) -> String {
        var kept = 0
        var end = text.startIndex
        for character in text {
            kept += character.unicodeScalars.count
            guard kept <= limit else { break }
            end = text.index(after: end)
        }
        return String(text[..<end])
    }

    var tool: Tool {
        Tool(
            name: name, title: title, description: description,
            inputSchema: .object([
                "type": "object", "properties": .object(properties),
                "required": .array(required.map { .string($0) }), "additionalProperties": false,
            ]),
            annotations: .init(
                title: title, readOnlyHint: scope == .read, destructiveHint: scope == .read ? nil : destructive,
                idempotentHint: scope == .read ? nil : idempotent, openWorldHint: false))
    }
}

/// A tool call's arguments, checked against what the tool declares.
public struct Arguments: Sendable {
    var values: [String: Value]

    init(_ values: [String: Value]?, of tool: DeskTool) throws {
        self.values = values ?? [:]
        if let unknown = self.values.keys.sorted().first(where: { tool.properties[$0] == nil }) {
            let known = tool.properties.keys.sorted().joined(separator: ", ")
            throw ToolArgumentError(
                description: "unknown argument '\(unknown.prefix(64))' (\(tool.name) takes \(known))")
        }
        if let missing = tool.required.first(where: { self.values[$0] == nil || self.values[$0] == .null }) {
            throw ToolArgumentError(description: "\(tool.name) needs '\(missing)'")
        }
    }

    func string(_ name: String) throws -> String {
        guard let value = try optionalString(name) else {
            throw ToolArgumentError(description: "'\(name)' is required")
        }
        return value
    }

    func optionalString(_ name: String) throws -> String? {
        switch values[name] {
        case nil, .null?: return nil
        case .string(let text)?:
            guard !text.isEmpty else { throw ToolArgumentError(description: "'\(name)' must not be empty") }
            return text
        default: throw ToolArgumentError(description: "'\(name)' must be a string")
        }
    }

    func bool(_ name: String) throws -> Bool? {
        switch values[name] {
        case nil, .null?: return nil
        case .bool(let value)?: return value
        default: throw ToolArgumentError(description: "'\(name)' must be true or false")
        }
    }

    func integer(_ name: String) throws -> Int? {
        switch values[name] {
        case nil, .null?: return nil
        case .int(let number)?: return number
        case .double(let number)? where number.rounded() == number && abs(number) < 1e15: return Int(number)
        case .string(let text)?:
            guard let number = Int(text) else { throw ToolArgumentError(description: "'\(name)' must be an integer") }
            return number
        default: throw ToolArgumentError(description: "'\(name)' must be an integer")
        }
    }

    /// The given string arguments among `names`, as a JSON body or a query.
    func passing(_ names: [String]) throws -> [String: Value] {
        var body: [String: Value] = [:]
        for name in names { if let value = try optionalString(name) { body[name] = .string(value) } }
        return body
    }
}

/// A path segment as the API's router reads it: everything but unreserved characters escaped, so
/// an id with `/`, `?`, `#` or `%` stays one segment.
func segment(_ text: String) -> String {
    var allowed = CharacterSet.alphanumerics.intersection(
        CharacterSet(charactersIn: Unicode.Scalar(0)..<Unicode.Scalar(128)))
    allowed.insert(charactersIn: "-._~")
    return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
}

private func text(_ description: String, maxLength: Int? = nil) -> Value {
    var schema: [String: Value] = ["type": "string", "description": .string(description)]
    if let maxLength { schema["maxLength"] = .int(maxLength) }
    return .object(schema)
}

private func integer(_ description: String, minimum: Int, maximum: Int) -> Value {
    .object([
        "type": "integer", "description": .string(description), "minimum": .int(minimum), "maximum": .int(maximum),
    ])
}

private func oneOf(_ description: String, _ values: [String]) -> Value {
    .object(["type": "string", "description": .string(description), "enum": .array(values.map { .string($0) })])
}

extension DeskTool {
    /// Writes that take something away from a player or end what they had.
    static let destructiveTools: Set<String> = [
        "debit_balance", "end_grant", "refund_purchase", "transfer_purchase", "resolve_anomaly",
    ]
    /// Writes whose second identical call does something again (each note is a note of its own).
    static let repeatingTools: Set<String> = ["add_account_note", "extend_subscription", "grant_entitlement"]

    static let metrics = [
        "mrr", "active_subscriptions", "active_trials", "new_subscriptions", "churned_subscriptions",
        "trial_conversion", "refund_rate", "proceeds", "realized_ltv",
    ]

    /// Every tool, in the order a client lists them. A key is offered those its scope includes.
    public static let all: [DeskTool] = [
        DeskTool(
            name: "find_transaction", title: "Find a purchase",
            description:
                "Looks a purchase up by any id a player or a store quotes: an App Store transaction or original "
                + "transaction id, a Google Play order id as printed (GPA.…), a Google Play purchase token, a web "
                + "payment id. Answers the transaction, who holds it, its order, its refunds and its anomalies.",
            scope: .read, properties: ["id": text("any id of the purchase", maxLength: 4096)], required: ["id"]
        ) { arguments in APICall(method: "GET", path: "/v1/transactions/\(segment(try arguments.string("id")))") },
        DeskTool(
            name: "get_account", title: "An account's view",
            description:
                "An account as the player's app sees it: entitlements (with their source: purchase, subscription or "
                + "grant), balances, subscriptions, purchases, grants.",
            scope: .read, properties: ["accountId": text("the app's account id", maxLength: 128)],
            required: ["accountId"]
        ) { arguments in
            APICall(method: "GET", path: "/v1/accounts/\(segment(try arguments.string("accountId")))")
        },
        DeskTool(
            name: "list_account_notes", title: "Support's notes on an account",
            description: "The notes support left on an account, newest first, with who wrote them and the ticket.",
            scope: .read, properties: ["accountId": text("the app's account id", maxLength: 128)],
            required: ["accountId"]
        ) { arguments in
            APICall(method: "GET", path: "/v1/accounts/\(segment(try arguments.string("accountId")))/notes")
        },
        DeskTool(
            name: "list_anomalies", title: "Anomalies",
            description:
                "Purchases that could not be delivered by themselves (no account, another account's token, a "
                + "refund before delivery…), with who holds each purchase now.",
            scope: .read,
            properties: [
                "status": oneOf("which anomalies (default open)", ["open", "resolved", "all"]),
                "limit": integer("at most this many (default 100)", minimum: 1, maximum: 1000),
            ], required: []
        ) { arguments in
            var query = ["status": try arguments.optionalString("status") ?? "open"]
            query["limit"] = String(try arguments.integer("limit") ?? 100)
            return APICall(method: "GET", path: "/v1/anomalies", query: query)
        },
        DeskTool(
            name: "analytics", title: "A subscription metric over time",
            description:
                "One metric per day, week or month (money in major units, per currency and converted): mrr, "
                + "active_subscriptions, active_trials, new_subscriptions, churned_subscriptions, trial_conversion, "
                + "refund_rate, proceeds, realized_ltv.",
            scope: .read,
            properties: [
                "metric": oneOf("the metric", metrics),
                "from": text("first day, YYYY-MM-DD (default: 29 days before `to`)"),
                "to": text("last day included, YYYY-MM-DD (default today)"),
                "interval": oneOf("default day", ["day", "week", "month"]),
                "appId": text("one app's id"), "store": oneOf("one store", ["app_store", "google_play", "web"]),
                "productId": text("one product"), "country": text("ISO 3166-1 alpha-3, e.g. USA"),
            ], required: ["metric"]
        ) { arguments in
            let query = try arguments.passing(["from", "to", "interval", "appId", "store", "productId", "country"])
                .compactMapValues(\.stringValue)
            return APICall(
                method: "GET", path: "/v1/analytics/\(segment(try arguments.string("metric")))", query: query)
        },
        DeskTool(
            name: "revenue", title: "Proceeds by store and currency",
            description: "What was sold, refunded and kept (after each store's commission), by store and currency.",
            scope: .read,
            properties: [
                "since": text("ISO 8601 date or date-time"), "until": text("ISO 8601 date or date-time"),
            ], required: []
        ) { arguments in
            APICall(
                method: "GET", path: "/v1/revenue",
                query: try arguments.passing(["since", "until"]).compactMapValues(\.stringValue))
        },
        DeskTool(
            name: "credit_balance", title: "Credit coins (or any catalog currency)",
            description:
                "Compensates a player: adds to a balance of a currency the catalog grants, audited with the reason "
                + "and this key's label. The idempotency key makes a repeated call credit once.",
            scope: .support,
            properties: [
                "accountId": text("the app's account id", maxLength: 128), "currency": text("e.g. coins"),
                "amount": integer("how much", minimum: 1, maximum: 1_000_000_000_000),
                "reason": text("shown in the audit log, e.g. the ticket", maxLength: 500),
                "idempotencyKey": text("one per intended credit, e.g. the ticket number", maxLength: 200),
            ], required: ["accountId", "currency", "amount", "reason", "idempotencyKey"], marks: "reason"
        ) { arguments in try balanceCall(arguments, "credit") },
        DeskTool(
            name: "debit_balance", title: "Debit coins (or any catalog currency)",
            description: "Takes from a balance (never below zero), audited with the reason; idempotent by its key.",
            scope: .support,
            properties: [
                "accountId": text("the app's account id", maxLength: 128), "currency": text("e.g. coins"),
                "amount": integer("how much", minimum: 1, maximum: 1_000_000_000_000),
                "reason": text("shown in the audit log", maxLength: 500),
                "idempotencyKey": text("one per intended debit", maxLength: 200),
            ], required: ["accountId", "currency", "amount", "reason", "idempotencyKey"], marks: "reason"
        ) { arguments in try balanceCall(arguments, "debit") },
        DeskTool(
            name: "grant_entitlement", title: "Grant an entitlement",
            description:
                "Gives an account an entitlement of the catalog (a typo is refused with the valid ids) for some days, "
                + "until a date or for good (exactly one), audited with the note.",
            scope: .support,
            properties: [
                "accountId": text("the app's account id", maxLength: 128),
                "entitlement": text("an entitlement id of the catalog", maxLength: 128),
                "days": integer("for this many days from now", minimum: 1, maximum: 36_500),
                "expiresAt": text("or until this ISO 8601 date-time"),
                "forever": .object(["type": "boolean", "description": "or true: for good"]),
                "note": text("why, shown on the account", maxLength: 1000),
            ], required: ["accountId", "entitlement"], marks: "note"
        ) { arguments in
            // The API checks that exactly one of days, expiresAt and forever is given.
            var body = try arguments.passing(["entitlement", "note", "expiresAt"])
            if let days = try arguments.integer("days") { body["days"] = .int(days) }
            if let forever = try arguments.bool("forever") { body["forever"] = .bool(forever) }
            return APICall(
                method: "POST", path: "/v1/accounts/\(segment(try arguments.string("accountId")))/grants", body: body)
        },
        DeskTool(
            name: "end_grant", title: "End a grant",
            description: "Ends a grant now (the account view lists grants with their ids).", scope: .support,
            properties: [
                "accountId": text("the app's account id", maxLength: 128), "grantId": text("the grant's id"),
            ], required: ["accountId", "grantId"]
        ) { arguments in
            APICall(
                method: "DELETE",
                path:
                    "/v1/accounts/\(segment(try arguments.string("accountId")))/grants/"
                    + segment(try arguments.string("grantId")))
        },
        DeskTool(
            name: "refund_purchase", title: "Refund a Google Play or web purchase",
            description:
                "Refunds on the store that lets a developer refund (Google Play orders, web payments) and takes "
                + "back what was delivered. App Store refunds are Apple's to grant: the answer says so and the "
                + "player asks at reportaproblem.apple.com. Audited; idempotent by its key.",
            scope: .support,
            properties: [
                "id": text("any id of the purchase (as find_transaction takes)", maxLength: 4096),
                "reason": text("why", maxLength: 500), "note": text("more detail", maxLength: 2000),
                "idempotencyKey": text("one per intended refund", maxLength: 200),
                "refundType": oneOf(
                    "a Google Play subscription: refund the whole period (default) or what is left of it; access ends now",
                    ["full", "prorated"]),
            ], required: ["id", "reason"], marks: "note"
        ) { arguments in
            APICall(
                method: "POST", path: "/v1/transactions/\(segment(try arguments.string("id")))/refund",
                body: try arguments.passing(["reason", "note", "idempotencyKey", "refundType"]))
        },
        DeskTool(
            name: "transfer_purchase", title: "Move a purchase to another account",
            description:
                "Moves a non-consumable or a subscription (\"I bought it on my old account\") to another account, "
                + "audited with the note. A consumable cannot move.",
            scope: .support,
            properties: [
                "id": text("any id of the purchase", maxLength: 4096),
                "toAccountId": text("the account to hold it", maxLength: 128), "note": text("why", maxLength: 2000),
            ], required: ["id", "toAccountId"], marks: "note"
        ) { arguments in
            APICall(
                method: "POST", path: "/v1/transactions/\(segment(try arguments.string("id")))/transfer",
                body: try arguments.passing(["toAccountId", "note"]))
        },
        DeskTool(
            name: "extend_subscription", title: "Extend a subscription",
            description:
                "Moves a subscription's renewal date later, free (Apple's renewal-date extension; Google Play's "
                + "defer), audited.",
            scope: .support,
            properties: [
                "originalTransactionId": text("the subscription's original transaction id (or Google token)"),
                "days": integer("days to add", minimum: 1, maximum: 90),
                "reason": oneOf(
                    "Apple's reason code", ["undeclared", "customer_satisfaction", "other", "service_issue"]),
                "note": text("why", maxLength: 1000),
            ], required: ["originalTransactionId", "days", "reason"], marks: "note"
        ) { arguments in
            var body = try arguments.passing(["reason", "note"])
            body["days"] = .int(try arguments.integer("days") ?? 0)
            return APICall(
                method: "POST",
                path: "/v1/subscriptions/\(segment(try arguments.string("originalTransactionId")))/extend", body: body)
        },
        DeskTool(
            name: "add_account_note", title: "Note on an account",
            description: "Leaves a note on an account for the next agent (never shown to the player).",
            scope: .support,
            properties: [
                "accountId": text("the app's account id", maxLength: 128),
                "text": text("one line", maxLength: 2000), "ticket": text("the ticket's reference", maxLength: 100),
            ], required: ["accountId", "text"]
        ) { arguments in
            APICall(
                method: "POST", path: "/v1/accounts/\(segment(try arguments.string("accountId")))/notes",
                body: try arguments.passing(["text", "ticket"]))
        },
        DeskTool(
            name: "resolve_anomaly", title: "Resolve an anomaly",
            description:
                "Delivers an anomaly's purchase to an account (the answer says exactly what happened: delivered, "
                + "already delivered to whom, or refused and why) or dismisses it.",
            scope: .support,
            properties: [
                "id": text("the anomaly's id"), "action": oneOf("what to do", ["deliver", "dismiss"]),
                "accountId": text("for deliver: the account to deliver to", maxLength: 128),
                "note": text("why", maxLength: 1000),
            ], required: ["id", "action"], marks: "note"
        ) { arguments in
            APICall(
                method: "POST", path: "/v1/anomalies/\(segment(try arguments.string("id")))/resolve",
                body: try arguments.passing(["action", "accountId", "note"]))
        },
    ]

    private static func balanceCall(_ arguments: Arguments, _ verb: String) throws -> APICall {
        var body = try arguments.passing(["reason", "idempotencyKey"])
        body["amount"] = .int(try arguments.integer("amount") ?? 0)
        return APICall(
            method: "POST",
            path:
                "/v1/accounts/\(segment(try arguments.string("accountId")))/balances/"
                + "\(segment(try arguments.string("currency")))/\(verb)",
            body: body)
    }
}
