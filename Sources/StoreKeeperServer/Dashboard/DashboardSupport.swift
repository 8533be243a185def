import Foundation
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage

/// The account page's support actions: credit any catalog currency, debit it, grant an
/// entitlement for some days — each through the API's own code path, audited as the dashboard's
/// operator with the reason, idempotent by a key the page issued (a form sent twice credits once).
extension DashboardController {
    func addSupportRoutes(to group: RouterGroup<StoreKeeperContext>) {
        group.post("accounts/:accountId/credit") { request, context in
            try await withSession(request, context, form: true) { session, form in
                try await balanceAction(credit: true, context: context, form: form, actor: actor(session))
            }
        }
        group.post("accounts/:accountId/debit") { request, context in
            try await withSession(request, context, form: true) { session, form in
                try await balanceAction(credit: false, context: context, form: form, actor: actor(session))
            }
        }
        addNoteRoute(to: group)
        addGrantEndRoute(to: group)
        addPurchaseRoutes(to: group)
        group.post("accounts/:accountId/grant") { request, context in
            try await withSession(request, context, form: true) { session, form in
                let accountId = try StoreKeeperApp.parameter(context, "accountId")
                try StoreKeeperApp.validateAccountId(accountId)
                // For some days, or for good (the box ticked).
                var until: Date?
                if form["forever"] == nil {
                    guard let days = Int(form["days"] ?? ""), (1...3_650).contains(days) else {
                        throw APIError.badRequest("days must be 1…3650 (or tick “for good”)")
                    }
                    until = Date().addingTimeInterval(TimeInterval(days) * 86_400)
                }
                _ = try await grants.grant(
                    account: accountId, entitlement: form["entitlement"] ?? "", expiresAt: until,
                    note: (form["note"] ?? "") + " (dashboard)", actor: actor(session))
                return Self.redirect("/dashboard/accounts/\(Self.pathComponent(accountId))?done=granted")
            }
        }
    }

    func addNoteRoute(to group: RouterGroup<StoreKeeperContext>) {
        group.post("accounts/:accountId/note") { request, context in
            try await withSession(request, context, form: true) { session, form in
                let accountId = try StoreKeeperApp.parameter(context, "accountId")
                try StoreKeeperApp.validateAccountId(accountId)
                let text = (form["text"] ?? "").trimmingCharacters(in: .whitespaces)
                guard !text.isEmpty, text.unicodeScalars.count <= 2000 else {
                    throw APIError.badRequest("a note needs text (1…2000 characters)")
                }
                try StoreKeeperApp.validateText(text, field: "text", requireNFC: false)
                let ticket = (form["ticket"] ?? "").trimmingCharacters(in: .whitespaces)
                if !ticket.isEmpty {
                    guard ticket.unicodeScalars.count <= 100 else {
                        throw APIError.badRequest("a ticket reference is at most 100 characters")
                    }
                    try StoreKeeperApp.validateText(ticket, field: "ticket", requireNFC: false)
                }
                _ = try await store.accounts.addNote(
                    accountId: accountId, text: text, ticket: ticket.isEmpty ? nil : ticket,
                    author: actor(session), now: Date())
                return Self.redirect("/dashboard/accounts/\(Self.pathComponent(accountId))?done=noted#notes")
            }
        }
    }

    func addGrantEndRoute(to group: RouterGroup<StoreKeeperContext>) {
        group.post("accounts/:accountId/grants/:grantId/end") { request, context in
            try await withSession(request, context, form: true) { session, _ in
                let accountId = try StoreKeeperApp.parameter(context, "accountId")
                try StoreKeeperApp.validateAccountId(accountId)
                let grantId = try StoreKeeperApp.parameter(context, "grantId")
                try StoreKeeperApp.validateText(grantId, field: "grantId")
                let path = "/dashboard/accounts/\(Self.pathComponent(accountId))"
                // Says what happened: ended now, or nothing to end (ended or run out already).
                guard
                    try await store.support.endGrant(
                        account: accountId, grantId: grantId, actor: actor(session), now: Date())
                else { return Self.redirect(path + "?done=grant_not_running#grants") }
                return Self.redirect(path + "?done=grant_ended#grants")
            }
        }
    }

    /// The account page's grants (with their notes, whether each still runs) and notes.
    func grantValues(_ accountId: String) async throws -> [String: Any] {
        let now = Date()
        let grants: [[String: Any]] = try await store.support.grants(of: accountId).map {
            let running = $0.endedAt == nil && $0.expiresAt > now
            return [
                "grantId": $0.grantId, "entitlement": $0.entitlementId, "note": $0.note,
                "createdAt": StoreKeeperApp.iso($0.createdAt),
                "expiresAt": $0.forGood ? "for good" : StoreKeeperApp.iso($0.expiresAt),
                "state": running ? "running" : $0.endedAt.map { "ended \(StoreKeeperApp.iso($0))" } ?? "run out",
                "running": running,
            ]
        }
        return ["grants": grants, "hasGrants": !grants.isEmpty]
    }

    /// The account page's refunds and App Store refund requests, as the stores report them.
    func refundValues(_ accountId: String) async throws -> [String: Any] {
        let refunds: [[String: Any]] = try await store.reports.refundHistory(of: accountId).map {
            [
                "at": StoreKeeperApp.iso($0.at),
                "store": Store(rawValue: $0.store).map(Self.storeName) ?? $0.store,
                "transactionId": $0.transactionId, "productId": $0.productId ?? "—", "event": $0.event,
                "detail": $0.detail,
            ]
        }
        return ["refunds": refunds, "hasRefunds": !refunds.isEmpty]
    }

    /// The account page's notes, newest first.
    func noteValues(_ accountId: String) async throws -> [String: Any] {
        let notes: [[String: Any]] = try await store.accounts.notes(of: accountId).map {
            [
                "createdAt": StoreKeeperApp.iso($0.createdAt), "text": $0.text, "ticket": $0.ticket ?? "",
                "author": $0.author,
            ]
        }
        return ["notes": notes, "hasNotes": !notes.isEmpty]
    }

    func balanceAction(credit: Bool, context: StoreKeeperContext, form: [String: String], actor: String) async throws
        -> Response
    {
        let accountId = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(accountId)
        let currency = form["currency"] ?? ""
        try accountBook.requireCatalogCurrency(currency)
        guard let amount = Int64(form["amount"] ?? ""), (1...1_000_000_000_000).contains(amount) else {
            throw APIError.badRequest("amount must be a whole number 1…1000000000000")
        }
        let reason = (form["reason"] ?? "").trimmingCharacters(in: .whitespaces)
        guard !reason.isEmpty, reason.unicodeScalars.count <= 500 else {
            throw APIError.badRequest("a reason is required (1…500 characters): it is shown on the account's audit")
        }
        try StoreKeeperApp.validateText(reason, field: "reason")
        guard let key = form["idempotencyKey"], !key.isEmpty, key.unicodeScalars.count <= 200 else {
            throw APIError.badRequest("the form has no idempotency key: reload the page")
        }
        let path = "/dashboard/accounts/\(Self.pathComponent(accountId))"
        if credit {
            switch try await accountBook.supportCredit(
                accountId: accountId, currency: currency, amount: amount, idempotencyKey: key,
                reason: reason + " (dashboard)", actor: actor)
            {
            case .credited: return Self.redirect(path + "?done=credited")
            case .idempotencyConflict: return Self.redirect(path + "?done=resubmitted")
            }
        }
        switch try await store.accounts.debit(
            accountId: accountId, currency: currency, amount: amount, idempotencyKey: key,
            reason: reason + " (dashboard)", actor: actor, now: Date())
        {
        case .debited: return Self.redirect(path + "?done=debited")
        case .insufficient: return Self.redirect(path + "?done=insufficient")
        case .idempotencyConflict: return Self.redirect(path + "?done=resubmitted")
        }
    }

    /// Who acted, for the audit: the signed-in key's label, from the dashboard.
    func actor(_ session: DashboardSessions.Session) -> String {
        caller(session).auditActor
    }

    /// The signed-in role as the API's caller: its key, from the dashboard.
    func caller(_ session: DashboardSessions.Session) -> Caller {
        let role = dashboardSessions.role(session)
        return Caller.key(OperatorKey(label: role.label, scope: role.scope, apps: role.apps, secret: "")).through(
            "dashboard")
    }

    /// The support forms' values: the catalog's currencies and entitlements, a fresh key.
    func supportValues() -> [String: Any] {
        let currencies = Set(catalog.products.compactMap(\.grants.currency)).sorted()
        let entitlements = Set(catalog.products.compactMap(\.grants.entitlement)).sorted()
        return [
            "currencies": currencies.map { ["currency": $0] }, "grantable": entitlements.map { ["entitlement": $0] },
            "idempotencyKey": UUID().uuidString.lowercased(),
        ]
    }

    static let supportFlashes = [
        "refund_refunded": "Refunded at the store; what it delivered was taken back (the refunds below).",
        "refund_already_refunded": "Nothing asked: the store had refunded it already.",
        "refund_pending":
            "Google Play does not answer now: the refund is asked again until it does, and applied then.",
        "transfer_transferred": "Transferred: the purchase and what it gives now belong to the other account.",
        "transfer_already_held": "Nothing moved: the other account holds it already.",
        "extend_extended": "Extended at Google Play: the subscription's new expiry is below.",
        "extend_pending":
            "Extension asked of Apple: it applies when Apple answers (the subscription below then moves).",
        "credited": "Credited; the ledger below shows it with its reason.",
        "debited": "Debited; the ledger below shows it with its reason.",
        "insufficient": "Not debited: the balance is lower than the amount.",
        "resubmitted": "This form was already sent: nothing was done twice.",
        "granted": "Granted; the entitlement below shows it as a grant.",
        "noted": "Note added.",
        "grant_ended": "Grant ended; its entitlement is gone unless something else gives it.",
        "grant_not_running": "Nothing ended: that grant had already ended or run out.",
    ]
}

/// The account page's purchase actions — refund (Google Play, web), transfer, extend — each
/// through the API's own function, as the signed-in key (its label marked `(dashboard)` in the
/// audit), on a purchase this account holds.
extension DashboardController {
    static let purchaseActions = ["refund", "transfer", "extend"]

    func addPurchaseRoutes(to group: RouterGroup<StoreKeeperContext>) {
        for action in Self.purchaseActions {
            group.post("accounts/:accountId/purchases/\(action)") { request, context in
                try await withSession(request, context, form: true) { session, form in
                    try await purchaseAction(action, context: context, form: form, session: session)
                }
            }
        }
    }

    func purchaseAction(
        _ action: String, context: StoreKeeperContext, form: [String: String], session: DashboardSessions.Session
    ) async throws -> Response {
        let accountId = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(accountId)
        let role = dashboardSessions.role(session)
        let transactionId = form["transactionId"] ?? ""
        guard !transactionId.isEmpty, transactionId.unicodeScalars.count <= 4096,
            let record = try await store.transactions.transaction(named: transactionId),
            record.accountId.map({ Identifiers.same($0, accountId) }) == true, role.covers(app: record.appId)
        else { throw APIError.badRequest("pick one of this account's purchases") }
        let caller = self.caller(session)
        let reason = (form["reason"] ?? "").trimmingCharacters(in: .whitespaces)
        let response: Response
        switch action {
        case "refund":
            let refundType = form["refundType"].flatMap { $0.isEmpty ? nil : $0 }
            let body = StoreKeeperApp.SupportRefundBody(
                reason: reason, note: nil, idempotencyKey: form["idempotencyKey"], refundType: refundType)
            try body.validate()
            response = try await supportActions.refund(id: record.transactionId, body: body, caller: caller)
        case "transfer":
            let body = StoreKeeperApp.TransferBody(
                toAccountId: (form["toAccountId"] ?? "").trimmingCharacters(in: .whitespaces),
                note: reason.isEmpty ? nil : reason)
            try body.validate()
            response = try await supportActions.transfer(id: record.transactionId, body: body, caller: caller)
        default:
            guard let days = Int(form["days"] ?? "") else { throw APIError.badRequest("days must be 1…90") }
            let body = StoreKeeperApp.ExtendBody(
                days: days, reason: form["extendReason"] ?? "customer_satisfaction", note: reason)
            try body.validate()
            response = try await extend(record.originalTransactionId, body, caller)
        }
        let status = (try await Self.fields(of: response)["status"] as? String) ?? "done"
        let path = "/dashboard/accounts/\(Self.pathComponent(accountId))"
        return Self.redirect(path + "?done=\(action)_\(status)#support")
    }

    /// Everything the account page's support sections show: the forms' choices and key, notes,
    /// grants, refunds, the purchases to act on.
    func supportPageValues(_ accountId: String, _ session: DashboardSessions.Session) async throws -> [String: Any] {
        var values = supportValues()
        values.merge(try await noteValues(accountId)) { current, _ in current }
        values.merge(try await grantValues(accountId)) { current, _ in current }
        values.merge(try await refundValues(accountId)) { current, _ in current }
        values.merge(try await purchaseValues(accountId, apps: dashboardSessions.role(session).apps)) {
            current, _ in current
        }
        return values
    }

    /// The account's purchases for the form: product, store, date, id.
    func purchaseValues(_ accountId: String, apps: Set<String>?) async throws -> [String: Any] {
        let purchases: [[String: Any]] = try await store.reports.purchases(of: accountId, apps: apps).map {
            [
                "transactionId": $0.transactionId,
                "label":
                    "\($0.productId) · \($0.store)\($0.purchasedAt.map { " · " + StoreKeeperApp.iso($0).prefix(10) } ?? "")"
                    + ($0.refunded ? " · refunded" : "") + " · \($0.transactionId)",
            ]
        }
        return ["purchases": purchases, "hasPurchases": !purchases.isEmpty]
    }

    /// A JSON answer's fields (what the API would have sent), for the page to say what happened.
    static func fields(of response: Response) async throws -> [String: Any] {
        final class Collected: @unchecked Sendable {  // written by one writer, then read
            var buffer = ByteBuffer()
        }
        struct Collector: ResponseBodyWriter {
            let collected: Collected
            mutating func write(_ buffer: ByteBuffer) async throws {
                var buffer = buffer
                collected.buffer.writeBuffer(&buffer)
            }
            consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
        }
        let collected = Collected()
        try await response.body.write(Collector(collected: collected))
        return (try? JSONSerialization.jsonObject(with: Data(buffer: collected.buffer))) as? [String: Any] ?? [:]
    }
}
