import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Mustache
import NIOCore
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// The operator dashboard at `/dashboard`: server-rendered HTML (Mustache templates compiled
/// into the binary), a stylesheet, SVG charts, no script. Sign-in with a secret key opens a
/// signed session cookie (HttpOnly, SameSite=Strict, Secure behind TLS); every form that
/// changes state carries the session's CSRF token and is refused from another origin. Its
/// actions are the API's own code paths (`resolve(anomaly:…)`, the outbox's replay).
/// The operator dashboard: its pages over the features' own services (sessions, the purchase
/// store, support's actions and grants, exports, analytics, the anomaly queue), never the app.
struct DashboardController {
    let dashboardSessions: DashboardSessions
    let store: PurchaseStore
    let database: Database
    let configuration: ServerConfiguration
    let notifications: NotificationStore
    let catalog: Catalog
    /// Support's refunds and transfers, shared with the API.
    let supportActions: SupportActions
    /// The account views, shared with the API.
    let accountBook: AccountBook
    let grants: Grants
    let exportController: ExportController
    let analyticsController: AnalyticsController
    let anomaliesController: AnomaliesController
    /// Extending a subscription through its store (Apple or Google), as `POST /v1/support/.../extend`.
    let extend: @Sendable (String, StoreKeeperApp.ExtendBody, Caller) async throws -> Response
    /// What Apple's app transaction says of a transaction's customer.
    let appTransactionFacts: @Sendable (String) async throws -> StoreKeeperApp.AppTransactionAnswer

    /// Every template renders `{{x}}` through `HTMLEscaping` (scalar-safe), not swift-mustache's
    /// own escaper: the content type is registered first, then named by each template's pragma.
    static let library: MustacheLibrary = {
        MustacheContentTypes.register(HTMLEscaping.ContentType(), named: HTMLEscaping.ContentType.name)
        var library = MustacheLibrary()
        for (name, text) in DashboardTemplates.all {
            // The templates are constants of this file's module: a parse error is a bug the
            // dashboard tests catch on the first page.
            if let template = try? MustacheTemplate(string: HTMLEscaping.ContentType.pragma + text) {
                library.register(template, named: name)
            }
        }
        return library
    }()

    func addRoutes(to router: Router<StoreKeeperContext>) {
        let group = router.group("dashboard")
        addSupportRoutes(to: group)
        addDataRoutes(to: group)
        group.get("static/style.css") { _, _ in
            var headers = Self.securityHeaders
            headers[.contentType] = "text/css; charset=utf-8"
            headers[.cacheControl] = "public, max-age=3600"
            return Response(
                status: .ok, headers: headers,
                body: .init(byteBuffer: ByteBuffer(string: DashboardTemplates.stylesheet)))
        }
        group.get("login") { request, _ in
            let expired = request.uri.queryParameters.get("expired") != nil
            return page(
                "login", title: "Sign in",
                values: expired ? ["error": "Your session has expired. Sign in again."] : [:], session: nil,
                status: expired ? .unauthorized : .ok)
        }
        group.post("login") { request, context in try await signIn(request, context) }
        group.post("logout") { request, context in
            try await withSession(request, context, form: true, renew: false, needs: .read) { session, _ in
                // Ended on the server: the cookie, kept or copied, is refused from now on.
                try await sessionStore.end(
                    nonce: session.nonce, expires: dashboardSessions.expiry(session), now: Date())
                context.logger.notice("dashboard: signed out")
                var response = Self.redirect("/dashboard/login")
                response.headers[values: .setCookie] = [Self.cookie("", request: request, maxAge: 0)]
                return response
            }
        }
        group.post("logout-everywhere") { request, context in
            try await withSession(request, context, form: true, renew: false, needs: .read) { session, _ in
                try await sessionStore.endAll(keyId: dashboardSessions.keyIds[session.keyIndex], now: Date())
                context.logger.notice("dashboard: every session of this secret key signed out")
                try await store.anomalies.recordAudit(
                    actor: actor(session), action: "dashboard_sign_out_everywhere", subject: nil,
                    detail: "every dashboard session of this secret key ended", now: Date())
                var response = Self.redirect("/dashboard/login")
                response.headers[values: .setCookie] = [Self.cookie("", request: request, maxAge: 0)]
                return response
            }
        }
        group.get { request, context in
            try await withSession(request, context) { session, _ in try await overview(session) }
        }
        group.get("analytics") { request, context in
            try await withSession(request, context) { session, _ in try await analytics(request, session) }
        }
        group.get("anomalies") { request, context in
            try await withSession(request, context) { session, _ in try await anomalies(request, session) }
        }
        group.post("anomalies/:id/resolve") { request, context in
            try await withSession(request, context, form: true) { session, form in
                let id = try StoreKeeperApp.parameter(context, "id")
                // Another app's anomaly is as if it did not exist for a key limited to some apps.
                let role = dashboardSessions.role(session)
                if role.apps != nil, !role.covers(app: try await store.anomalies.anomaly(id)?.appId) {
                    throw APIError.notFound("no anomaly '\(id.prefix(64))'")
                }
                let action = form["action"] ?? ""
                let account = form["accountId"].flatMap { $0.isEmpty ? nil : $0 }
                let (resolved, outcome) = try await anomaliesController.resolve(
                    anomaly: id, action: action, accountId: account, note: (form["note"] ?? "") + " (dashboard)",
                    actor: actor(session))
                context.logger.notice(
                    "dashboard: anomaly resolved",
                    metadata: ["anomaly": "\(id)", "action": "\(action)", "outcome": "\(outcome?.outcome ?? "-")"])
                // Each answer says what happened: never "Delivered" when nothing was.
                switch outcome?.outcome {
                case "delivered":
                    let holder = outcome?.accountId ?? account ?? resolved.accountId ?? ""
                    return Self.redirect("/dashboard/accounts/\(Self.pathComponent(holder))?done=delivered")
                case "already_delivered":
                    let holder = outcome?.accountId ?? ""
                    return Self.redirect("/dashboard/accounts/\(Self.pathComponent(holder))?done=already_delivered")
                case "refused":
                    return Self.redirect(
                        "/dashboard/anomalies?done=refused_\(outcome?.code ?? "not_delivered")")
                default:
                    return Self.redirect("/dashboard/anomalies?done=dismissed")
                }
            }
        }
        group.get("search") { request, context in
            try await withSession(request, context) { session, _ in try await search(request, session) }
        }
        group.get("accounts/:accountId") { request, context in
            try await withSession(request, context) { session, _ in
                let accountId = try StoreKeeperApp.parameter(context, "accountId")
                try StoreKeeperApp.validateAccountId(accountId)
                return try await account(accountId, request: request, session: session)
            }
        }
        group.get("webhooks") { request, context in
            try await withSession(request, context) { session, _ in try await webhooks(request, session) }
        }
        // Any other address under /dashboard: a page, not the API's JSON.
        group.get("**") { _, _ in
            page(
                "message", title: "Not found",
                values: [
                    "heading": "Not found", "message": "There is no dashboard page at this address.",
                    "link": "/dashboard", "linkText": "Overview",
                ], session: nil, status: .notFound)
        }
        group.post("webhooks/dead-letters/:id/replay") { request, context in
            try await withSession(request, context, form: true) { session, _ in
                guard dashboardSessions.role(session).apps == nil else {
                    return forbidden("Webhooks are the whole server's: this key is limited to some apps.")
                }
                let id = try StoreKeeperApp.parameter(context, "id")
                guard try await OutboxStore(database: database).replay(id, now: Date()) else {
                    throw APIError.notFound("no dead letter '\(id.prefix(64))'")
                }
                try await store.anomalies.recordAudit(
                    actor: actor(session), action: "webhook_replay", subject: id,
                    detail: "dead letter queued again (dashboard)", now: Date())
                return Self.redirect("/dashboard/webhooks?done=replayed")
            }
        }
    }

    // MARK: Sessions

    var sessionStore: DashboardSessionStore { DashboardSessionStore(database: database) }

    func signIn(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        guard Self.sameOrigin(request) else { return forbidden("This sign-in came from another site.") }
        if let wait = dashboardSessions.signIns.admit(address: context.peerAddress) {
            context.logger.warning("dashboard: sign-in refused (too many attempts)")
            var response = page(
                "login", title: "Sign in",
                values: ["error": "Too many sign-in attempts. Try again in \(wait) s."], session: nil,
                status: .tooManyRequests)
            response.headers[.retryAfter] = String(wait)
            return response
        }
        let form = try await Self.form(request)
        guard let key = form["key"], let index = dashboardSessions.keyIndex(of: key) else {
            context.logger.warning("dashboard: sign-in refused (wrong key)")
            // A moment's pause per refused key: guessing is slow, a typo is not.
            try await Task.sleep(for: .milliseconds(300))
            return page(
                "login", title: "Sign in",
                values: ["error": "That key is not one of this server's secret keys or operator keys."],
                session: nil, status: .unauthorized)
        }
        context.logger.notice(
            "dashboard: signed in", metadata: ["key": "\(dashboardSessions.roles[index].label)"])
        var response = Self.redirect("/dashboard")
        response.headers[values: .setCookie] = [
            Self.cookie(dashboardSessions.issue(keyIndex: index, now: Date()), request: request)
        ]
        return response
    }

    /// Runs `body` for a valid session: a GET without one goes to the sign-in page; a POST
    /// without one, from another origin, or without the session's CSRF token is refused.
    /// Errors become an HTML page with the API's status (404, 400, 503 with Retry-After).
    func withSession(
        _ request: Request, _ context: StoreKeeperContext, form: Bool = false, renew: Bool = true,
        needs scope: KeyScope = .support,
        _ body: (DashboardSessions.Session, [String: String]) async throws -> Response
    ) async throws -> Response {
        let cookie = Self.cookieValue(request, DashboardSessions.cookieName)
        let now = Date()
        var check = dashboardSessions.check(cookie, now: now)
        if case .valid(let valid) = check {
            do {
                if try await sessionStore.isEnded(
                    nonce: valid.nonce, keyId: dashboardSessions.keyIds[valid.keyIndex], issued: valid.issued)
                {
                    check = .invalid
                }
            } catch  where StorageUnavailable.classify(error) != nil {
                // Whether it was signed out cannot be known: not signed in, for now.
                context.logger.warning("dashboard: storage unavailable", metadata: ["error": "\(error)"])
                var response = page(
                    "message", title: "Unavailable",
                    values: [
                        "heading": "Unavailable", "message": "The database does not answer; try again in a moment.",
                    ],
                    session: nil, status: .serviceUnavailable)
                response.headers[.retryAfter] = "2"
                return response
            }
        }
        let session: DashboardSessions.Session
        switch check {
        case .valid(let valid): session = valid
        case .expired where !form: return Self.redirect("/dashboard/login?expired=1")
        case .invalid where !form: return Self.redirect("/dashboard/login")
        case .expired, .invalid:
            context.logger.warning("dashboard: form post without a valid session refused")
            return page(
                "message", title: "Signed out",
                values: [
                    "heading": "Signed out",
                    "message": "Your session has expired or is not valid; nothing was changed.",
                    "link": "/dashboard/login", "linkText": "Sign in again",
                ], session: nil, status: .unauthorized)
        }
        var fields: [String: String] = [:]
        if form {
            guard Self.sameOrigin(request) else {
                context.logger.warning("dashboard: cross-origin form post refused")
                return forbidden("This form came from another site; nothing was changed.")
            }
            fields = try await Self.form(request)
            guard dashboardSessions.csrfValid(fields["_csrf"], session: session) else {
                context.logger.warning("dashboard: form post with a missing or wrong CSRF token refused")
                return forbidden("This form is not one this dashboard issued (CSRF check failed); nothing was changed.")
            }
            // What the key may do: a read key reads, support acts (as the API's own scopes).
            let role = dashboardSessions.role(session)
            guard role.scope >= scope else {
                context.logger.warning("dashboard: action refused by scope", metadata: ["key": "\(role.label)"])
                return forbidden(
                    "Key '\(role.label)' has the \(role.scope.rawValue) scope; this needs \(scope.rawValue). Nothing was changed."
                )
            }
        }
        var response: Response
        do {
            response = try await body(session, fields)
        } catch let error as APIError {
            response = page(
                "message", title: "Error",
                values: [
                    "heading": "Not done", "message": error.message, "link": "/dashboard", "linkText": "Overview",
                ],
                session: session, status: error.status)
            if let retry = error.headers[.retryAfter] { response.headers[.retryAfter] = retry }
        } catch  where StorageUnavailable.classify(error) != nil {
            context.logger.warning("dashboard: storage unavailable", metadata: ["error": "\(error)"])
            response = page(
                "message", title: "Unavailable",
                values: ["heading": "Unavailable", "message": "The database does not answer; try again in a moment."],
                session: session, status: .serviceUnavailable)
            response.headers[.retryAfter] = "2"
        }
        if renew, let renewed = dashboardSessions.renewed(session, now: now) {
            response.headers[values: .setCookie] += [Self.cookie(renewed, request: request)]
        }
        return response
    }

    func forbidden(_ message: String) -> Response {
        page(
            "message", title: "Refused",
            values: ["heading": "Refused", "message": message, "link": "/dashboard", "linkText": "Overview"],
            session: nil, status: .forbidden)
    }

    // MARK: Pages

    /// Every metric as a chart with its table, for the form's period and filters.
    func analytics(_ request: Request, _ session: DashboardSessions.Session) async throws -> Response {
        let parameters = request.uri.queryParameters
        func field(_ name: String) -> String? { parameters.get(name).map { String($0.prefix(200)) } }
        let analytics = analyticsController
        let now = analytics.clock()
        let interval = field("interval") ?? "day"
        // A key limited to some apps sees one of them at a time (the first unless it picks).
        let role = dashboardSessions.role(session)
        let shownApps = configuration.allApps.map(\.id).filter { role.covers(app: $0) }
        var appId = field("appId").flatMap { $0.isEmpty ? nil : $0 }
        if role.apps != nil, appId.map({ !shownApps.contains($0) }) ?? true { appId = shownApps.first }
        var values: [String: Any] = [
            "from": field("from") ?? "", "to": field("to") ?? "", "productId": field("productId") ?? "",
            "country": field("country") ?? "", "limited": role.apps != nil,
            "intervals": ["day", "week", "month"].map { ["value": $0, "selected": $0 == interval] },
            "apps": shownApps.map { ["value": $0, "selected": $0 == appId] },
            "stores": Store.allCases.map(\.rawValue).map { ["value": $0, "selected": $0 == field("store")] },
        ]
        var charts: [[String: Any]] = []
        var status = HTTPResponse.Status.ok
        do {
            let reports = try await analytics.reports(now: now) { name in
                name == "interval" ? interval : name == "appId" ? appId : field(name)
            }
            for (metric, report) in zip(AnalyticsMetric.allCases, reports) {
                if values["timeZone"] == nil {
                    values["timeZone"] = report.timeZone
                    values["from"] = report.from
                    values["to"] = report.to
                }
                if let currency = report.currency {
                    values["currency"] = currency
                    values["ratesSource"] = report.ratesSource ?? "none"
                    if let missing = report.unconverted, !missing.isEmpty {
                        values["unconverted"] = missing.joined(separator: ", ")
                    }
                }
                charts.append(Self.metricChart(metric, report))
            }
        } catch let error as APIError {
            values["error"] = error.message
            status = .badRequest
        }
        values["charts"] = charts
        return page(
            "analytics", title: "Analytics", values: values, session: session, status: status, nav: "navAnalytics")
    }

    static let metricTitles: [AnalyticsMetric: String] = [
        .mrr: "MRR", .activeSubscriptions: "Active subscriptions", .activeTrials: "Active trials",
        .newSubscriptions: "New subscriptions", .churnedSubscriptions: "Churned subscriptions",
        .trialConversion: "Trial conversion", .refundRate: "Refund rate", .proceeds: "Proceeds",
        .realizedLTV: "Realized LTV per customer, by cohort of first purchase",
    ]

    func anomalies(_ request: Request, _ session: DashboardSessions.Session) async throws -> Response {
        let status = request.uri.queryParameters.get("status") ?? "open"
        let filter: String? = ["open", "resolved"].contains(status) ? status : nil
        let csrf = dashboardSessions.csrfToken(session)
        let role = dashboardSessions.role(session)
        let listed = try await store.anomalies.anomalies(status: filter, limit: 500, newestFirst: true)
            .filter { role.covers(app: $0.appId) }
        let items: [[String: Any]] = listed.map { anomaly in
            var item: [String: Any] = [
                "id": anomaly.id, "kind": anomaly.kind, "detail": anomaly.detail,
                "createdAt": StoreKeeperApp.iso(anomaly.createdAt), "isOpen": anomaly.status == "open",
                "deliverable": anomaly.transaction != nil, "csrf": csrf,
            ]
            if let transactionId = anomaly.transactionId {
                item["transactionId"] = transactionId
                if let store = anomaly.store { item["store"] = Self.storeName(store) }
            }
            if let appId = anomaly.appId { item["appId"] = appId }
            if let orderId = anomaly.orderId { item["orderId"] = orderId }
            if let accountId = anomaly.accountId {
                item["accountId"] = accountId
                item["accountPath"] = Self.pathComponent(accountId)
            }
            if let productId = anomaly.transaction?.productId { item["productId"] = productId }
            if let resolution = anomaly.resolution {
                item["resolution"] = resolution
                item["resolvedAt"] = anomaly.resolvedAt.map(StoreKeeperApp.iso) ?? ""
            }
            return item
        }
        return page(
            "anomalies", title: "Anomalies",
            values: ["items": items, "open": status == "open", "resolved": status == "resolved"], session: session,
            nav: "navAnomalies", request: request)
    }

    func search(_ request: Request, _ session: DashboardSessions.Session) async throws -> Response {
        let raw: String = request.uri.queryParameters.get("q").map { String($0) } ?? ""
        let query = raw.trimmingCharacters(in: .whitespaces)
        guard !query.isEmpty else { return Self.redirect("/dashboard") }
        guard query.unicodeScalars.count <= 200 else { throw APIError.badRequest("a search is at most 200 characters") }
        try StoreKeeperApp.validateText(query, field: "q", requireNFC: false)
        var hits = try await store.reports.search(query)
        // Nothing by name: the API's resolver (a Stripe id without its prefix, an order's token,
        // Apple's Order ID from the receipt e-mail).
        if hits.isEmpty, let record = try? await supportActions.resolve(query), record.accountId != nil {
            hits.append(ReportStore.SearchHit(kind: .transaction, accountId: record.accountId))
        }
        // A key limited to some apps finds its apps' purchases, orders and anomalies only.
        let role = dashboardSessions.role(session)
        if role.apps != nil {
            let transactionApp = try await supportActions.resolve(query)?.appId
            let orderApp = try await store.orders.order(query)?.appId
            var kept: [ReportStore.SearchHit] = []
            for hit in hits {
                switch hit.kind {
                case .account: kept.append(hit)
                case .transaction, .originalTransaction: if role.covers(app: transactionApp) { kept.append(hit) }
                case .order: if role.covers(app: orderApp ?? transactionApp) { kept.append(hit) }
                case .anomaly:
                    if let id = hit.anomalyId, role.covers(app: try await store.anomalies.anomaly(id)?.appId) {
                        kept.append(hit)
                    }
                }
            }
            hits = kept
        }
        // One account and nothing open to look at: straight to that account.
        let accounts = Set(
            hits.filter { (hit: ReportStore.SearchHit) in hit.kind != .anomaly }.compactMap(\.accountId))
        if accounts.count == 1, let only = accounts.first, !hits.contains(where: \.open) {
            return Self.redirect("/dashboard/accounts/\(Self.pathComponent(only))")
        }
        let items: [[String: Any]] = hits.map { hit in
            var item: [String: Any] = ["kind": hit.kind.rawValue]
            if let accountId = hit.accountId {
                item["accountId"] = accountId
                item["accountPath"] = Self.pathComponent(accountId)
            }
            if let anomalyId = hit.anomalyId { item["anomalyId"] = anomalyId }
            return item
        }
        return page("search", title: "Search", values: ["hits": items, "query": query], session: session)
    }

    /// How the dashboard names a store.
    static func storeName(_ store: String) -> String { storeName(Store(rawValue: store) ?? .appStore) }

    static func storeName(_ store: Store) -> String {
        switch store {
        case .appStore: "App Store"
        case .googlePlay: "Google Play"
        case .web: "Web"
        case .stripe: "Stripe"
        }
    }

    func account(_ accountId: String, request: Request, session: DashboardSessions.Session) async throws -> Response {
        let shown = try await accountBook.account(accountId)
        let records = try await store.reports.accountRecords(accountId)
        let stores = try await store.reports.stores(
            of: shown.entitlements.compactMap(\.originalTransactionId) + records.orders.compactMap(\.transactionId))
        var subscriptions: [[String: Any]] = []
        let role = dashboardSessions.role(session)
        for subscription in shown.subscriptions where role.covers(app: subscription.appId) {
            let events = try await notifications.notifications(subject: subscription.originalTransactionId)
                .suffix(100)
                .map { event -> [String: Any] in
                    [
                        "signedDate": StoreKeeperApp.iso(event.signedDate), "type": event.type,
                        "subtype": event.subtype ?? "", "status": event.status, "outcome": event.outcome ?? "",
                    ]
                }
            subscriptions.append([
                "store": Self.storeName(subscription.store), "appId": subscription.appId ?? "—",
                "productId": subscription.productId, "status": subscription.status,
                "originalTransactionId": subscription.originalTransactionId,
                "expiresAt": subscription.expiresAt ?? "—", "autoRenew": subscription.autoRenew ? "on" : "off",
                "events": events, "hasEvents": !events.isEmpty,
            ])
        }
        let balances: [[String: Any]] = shown.balances.sorted { $0.key < $1.key }.map {
            ["currency": $0.key, "amount": $0.value]
        }
        let entitlements: [[String: Any]] = shown.entitlements.map {
            [
                "id": $0.id, "active": $0.active ? "yes" : "no", "productId": $0.productId ?? "—",
                "source": $0.source, "expiresAt": $0.expiresAt ?? "never",
                "store": $0.originalTransactionId.flatMap { stores[$0] }.map(Self.storeName) ?? "—",
            ]
        }
        let ledger: [[String: Any]] = records.ledger.map {
            [
                "createdAt": StoreKeeperApp.iso($0.createdAt), "entryKey": $0.entryKey, "currency": $0.currency,
                "amount": $0.amount, "reason": $0.reason ?? "",
            ]
        }
        let orders: [[String: Any]] = records.orders.filter { role.covers(app: $0.appId) }.map {
            [
                "createdAt": StoreKeeperApp.iso($0.createdAt), "orderId": $0.orderId, "productId": $0.productId,
                "quantity": $0.quantity, "status": $0.status, "transactionId": $0.transactionId ?? "",
                "store": $0.transactionId.flatMap { stores[$0] }.map(Self.storeName) ?? "—",
                "appId": $0.appId ?? "—",
            ]
        }
        let audit: [[String: Any]] = records.audit.map {
            [
                "createdAt": StoreKeeperApp.iso($0.createdAt), "actor": $0.actor, "action": $0.action,
                "subject": $0.subject ?? "", "detail": $0.detail,
            ]
        }
        let consent = try await store.accounts.consent(of: accountId)
        let appleAccounts = try await store.accounts.appTransactionIds(of: accountId)
        let rescissions: [[String: Any]] = try await store.accounts.consentRescissions(
            appTransactionIds: appleAccounts
        )
        .map {
            [
                "receivedAt": StoreKeeperApp.iso($0.receivedAt), "appTransactionId": $0.appTransactionId ?? "—",
                "environment": $0.environment ?? "—",
            ]
        }
        var appTransaction: [String: Any]?
        var appTransactionError: String?
        if let wanted = request.uri.queryParameters.get("appTransaction").map({ String($0) }),
            appleAccounts.contains(wanted)
        {
            // Asked for: Apple is called now (Get App Transaction Info, verified), with a deadline.
            do {
                let answer = try await appTransactionFacts(wanted)
                appTransaction = [
                    "appTransactionId": answer.appTransactionId ?? "—", "environment": answer.environment ?? "—",
                    "originalApplicationVersion": answer.originalApplicationVersion ?? "—",
                    "originalPurchaseDate": answer.originalPurchaseDate ?? "—",
                    "originalPlatform": answer.originalPlatform ?? "—",
                    "accounts": answer.accountIds.joined(separator: ", "),
                ]
            } catch {
                appTransactionError = "Apple's app transaction is not available now: \(error)"
            }
        }
        var values: [String: Any] = [
            "appleAccounts": appleAccounts.map { ["id": $0] },
            "consent": consent.consumptionData.map { $0 ? "yes" : "no" } ?? "not asked",
            "consentSource": consent.source ?? "", "rescissions": rescissions, "hasRescissions": !rescissions.isEmpty,
            "accountId": accountId, "balances": balances, "hasBalances": !balances.isEmpty,
            "entitlements": entitlements, "hasEntitlements": !entitlements.isEmpty, "subscriptions": subscriptions,
            "orders": orders, "hasOrders": !orders.isEmpty, "ledger": ledger, "hasLedger": !ledger.isEmpty,
            "audit": audit, "hasAudit": !audit.isEmpty,
        ]
        values.merge(try await supportPageValues(accountId, session)) { current, _ in current }
        values["csrf"] = dashboardSessions.csrfToken(session)
        values["accountPath"] = Self.pathComponent(accountId)
        if let appTransaction { values["appTransaction"] = appTransaction }
        if let appTransactionError { values["appTransactionError"] = appTransactionError }
        return page("account", title: "Account \(accountId)", values: values, session: session, request: request)
    }

    func webhooks(_ request: Request, _ session: DashboardSessions.Session) async throws -> Response {
        guard dashboardSessions.role(session).apps == nil else {
            return forbidden(
                "Webhooks are the whole server's: the key you signed in with is limited to some apps.")
        }
        let outbox = OutboxStore(database: database)
        let csrf = dashboardSessions.csrfToken(session)
        let letters: [[String: Any]] = try await outbox.deadLetters().map {
            [
                "id": $0.event.id, "type": $0.event.type, "createdAt": StoreKeeperApp.iso($0.event.createdAt),
                "deadAt": StoreKeeperApp.iso($0.deadAt), "attempts": $0.event.attempts, "lastError": $0.lastError ?? "",
                "csrf": csrf,
            ]
        }
        let pending = try await outbox.pendingCount()
        return page(
            "webhooks", title: "Webhooks",
            values: [
                "letters": letters, "hasLetters": !letters.isEmpty, "pending": pending,
                "configured": configuration.webhookURL != nil, "url": configuration.webhookURL ?? "",
            ],
            session: session, nav: "navWebhooks", request: request)
    }

    // MARK: Rendering

    static let flashes = [
        "delivered": "Delivered. The account below now holds it; the audit records who did it.",
        "already_delivered":
            "Nothing delivered: this purchase had already been delivered — to the account below, which holds it.",
        "refused_revoked": "Not delivered: the store refunded or revoked this purchase. The anomaly stays open.",
        "refused_owned_by_other_account":
            "Not delivered: another account owns this purchase (ownership policy). The anomaly stays open.",
        "refused_forbidden": "Not delivered: the order belongs to another account. The anomaly stays open.",
        "refused_order_of_another_app": "Not delivered: the order is another app's. The anomaly stays open.",
        "refused_unattributed": "Not delivered: no account to give it to. The anomaly stays open.",
        "refused_refunded": "Not delivered: the purchase is refunded. The anomaly stays open.",
        "refused_not_delivered": "Not delivered. The anomaly stays open.",
        "dismissed": "Dismissed.", "replayed": "Queued again: the webhook sender will try it now.",
    ]

    func page(
        _ template: String, title: String, values: [String: Any], session: DashboardSessions.Session?,
        status: HTTPResponse.Status = .ok, nav: String? = nil, request: Request? = nil
    ) -> Response {
        var values = values
        if let session {
            // Forms only for a key that may use them; the signed-in key named in the header.
            let role = dashboardSessions.role(session)
            values["canSupport"] = role.scope >= .support
            values["roleLabel"] = role.label
        }
        let body = Self.library.render(values, withTemplate: template) ?? ""
        var layout: [String: Any] = ["title": title, "body": body]
        if let session {
            let role = dashboardSessions.role(session)
            layout["signedIn"] = true
            layout["csrf"] = dashboardSessions.csrfToken(session)
            layout["signedInAs"] =
                "\(role.label) (\(role.scope.rawValue)\(role.apps.map { "; apps: " + $0.sorted().joined(separator: ", ") } ?? ""))"
            layout["limited"] = role.apps != nil
        }
        if let nav { layout[nav] = true }
        if let query = values["query"] as? String { layout["query"] = query }
        if let done = request?.uri.queryParameters.get("done"),
            let flash = Self.flashes[String(done)] ?? Self.supportFlashes[String(done)]
        {
            layout["flash"] = flash
        }
        var headers = Self.securityHeaders
        headers[.contentType] = "text/html; charset=utf-8"
        headers[.cacheControl] = "no-store"
        return Response(
            status: status, headers: headers,
            body: .init(byteBuffer: ByteBuffer(string: Self.library.render(layout, withTemplate: "layout") ?? "")))
    }

    static let securityHeaders: HTTPFields = {
        var headers = HTTPFields()
        headers[HTTPField.Name("Content-Security-Policy")!] =
            "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        headers[HTTPField.Name("X-Content-Type-Options")!] = "nosniff"
        headers[HTTPField.Name("Referrer-Policy")!] = "same-origin"
        headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        return headers
    }()
}
