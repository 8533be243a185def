import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Foundation
import GooglePlay
import Hummingbird
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// Customer support (docs/api.md, secret key): renewal-date extensions through Apple (single and
/// mass, with their status) and operator grants.
extension StoreKeeperApp {
    public static let extendReasons = ["undeclared", "customer_satisfaction", "other", "service_issue"]

    struct ExtendBody: RequestBody {
        var days: Int
        var reason: String
        var note: String?

        func validate() throws { _ = try StoreKeeperApp.validateExtension(days: days, reason: reason, note: note) }
    }

    struct MassExtendBody: RequestBody {
        var productId: String
        var days: Int
        var reason: String
        var note: String?

        func validate() throws {
            try StoreKeeperApp.validateText(productId, field: "productId")
            _ = try StoreKeeperApp.validateExtension(days: days, reason: reason, note: note)
        }
    }

    /// A grant until a date (`expiresAt`), for some days (`days`), or for good (`forever: true`):
    /// exactly one of them.
    struct GrantBody: RequestBody {
        var entitlement: String
        var expiresAt: String?
        var days: Int?
        var forever: Bool?
        var note: String?

        func validate() throws {
            guard !entitlement.isEmpty, entitlement.unicodeScalars.count <= 128 else {
                throw APIError.badRequest("field 'entitlement' must be 1…128 characters")
            }
            try StoreKeeperApp.validateText(entitlement, field: "entitlement")
            _ = try until(now: Date())
            _ = try StoreKeeperApp.validateNote(note)
        }

        /// When it ends (nil: for good).
        func until(now: Date) throws -> Date? {
            switch (expiresAt, days, forever) {
            case (let text?, nil, nil), (let text?, nil, false?):
                guard let date = StoreKeeperApp.parseDate(text) else {
                    throw APIError.badRequest("field 'expiresAt' must be an ISO 8601 date-time")
                }
                return date
            case (nil, let days?, nil), (nil, let days?, false?):
                guard (1...36_500).contains(days) else { throw APIError.badRequest("field 'days' must be 1…36500") }
                return now.addingTimeInterval(Double(days) * 86_400)
            case (nil, nil, true?):
                return nil
            default:
                throw APIError.badRequest("give exactly one of 'expiresAt', 'days' and 'forever': true")
            }
        }
    }

    struct GrantJSON: Encodable {
        var grantId: String
        var accountId: String
        var entitlement: String
        /// nil (JSON null): for good.
        var expiresAt: String?
        var forGood: Bool
        var createdAt: String

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(grantId, forKey: .grantId)
            try container.encode(accountId, forKey: .accountId)
            try container.encode(entitlement, forKey: .entitlement)
            try container.encode(expiresAt, forKey: .expiresAt)
            try container.encode(forGood, forKey: .forGood)
            try container.encode(createdAt, forKey: .createdAt)
        }

        enum CodingKeys: String, CodingKey { case grantId, accountId, entitlement, expiresAt, forGood, createdAt }
    }

    struct ExtensionJSON: Encodable {
        var requestId: String
        var status: String
        var originalTransactionId: String?
        var productId: String?
        var accountId: String?
        var days: Int
        var reason: String
        var note: String
        var createdAt: String
        var completedAt: String?
        var effectiveDate: String?
        var succeededCount: Int?
        var failedCount: Int?
        var error: String?

        init(_ row: SupportStore.ExtensionRow) {
            requestId = row.requestId
            status = row.status
            originalTransactionId = row.originalTransactionId
            productId = row.productId
            accountId = row.accountId
            days = row.days
            reason = row.reason
            note = row.note
            createdAt = StoreKeeperApp.iso(row.createdAt)
            completedAt = row.completedAt.map(StoreKeeperApp.iso)
            effectiveDate = row.effectiveDate.map(StoreKeeperApp.iso)
            succeededCount = row.succeededCount
            failedCount = row.failedCount
            error = row.error
        }
    }

    static func validateExtension(days: Int, reason: String, note: String?) throws -> String {
        guard (1...90).contains(days) else { throw APIError.badRequest("field 'days' must be 1…90 (Apple's limit)") }
        guard extendReasons.contains(reason) else {
            throw APIError.badRequest("field 'reason' must be one of \(extendReasons.joined(separator: ", "))")
        }
        return try validateNote(note)
    }

    static func validateNote(_ note: String?) throws -> String {
        let note = note ?? ""
        guard note.unicodeScalars.count <= 1000 else {
            throw APIError.badRequest("field 'note' must be at most 1000 characters")
        }
        try validateText(note, field: "note", requireNFC: false)
        return note
    }

    /// The extension itself, for the API and the dashboard's account page alike.
    func extend(original: String, body: ExtendBody, caller: Caller) async throws -> Response {
        let note = try Self.validateExtension(days: body.days, reason: body.reason, note: body.note)
        // Google Play: its subscriptionsv2.defer, at once.
        if let purchase = try await GooglePlayStore(database: database).currentSubscription(original: original) {
            return try await deferGoogle(
                purchase, days: body.days, reason: body.reason, note: note, actor: caller.auditActor)
        }
        // Apple extends only subscriptions it issued: an Apple id is digits.
        guard Self.isAppleNumericId(original) else {
            throw APIError(
                .unprocessableContent, "not_extendable",
                "'\(original.prefix(64))' is neither an App Store nor a Google Play subscription recorded here (a web subscription: report its next period)"
            )
        }
        do {
            let row = try await store.support.requestExtension(
                originalTransactionId: original, days: body.days, reason: body.reason, note: note,
                actor: caller.auditActor,
                now: Date())
            return try Self.json(["requestId": row.requestId, "status": row.status], status: .accepted)
        } catch is SupportStore.UnknownSubscription {
            throw APIError.notFound("no subscription '\(original.prefix(64))'")
        } catch let limit as SupportStore.ExtensionLimit {
            throw APIError(
                .conflict, "extension_limit",
                "two extensions within 365 days already (\(limit.last.map(Self.iso).joined(separator: ", "))): Apple allows no more"
            )
        }
    }

    /// Google Play's `subscriptionsv2.defer` by `days` (read first for its etag), then the
    /// subscription re-read and applied like any of Google's snapshots, so the account's access
    /// moves now; audited. 200 with the new expiry.
    func deferGoogle(
        _ purchase: GooglePlayStore.Purchase, days: Int, reason: String, note: String, actor: String
    ) async throws -> Response {
        let app = try purchases.googleApp(purchase.appId)
        let before: Date?
        do {
            let resource = try await app.client.subscriptionPurchase(token: purchase.purchaseToken)
            before = resource.lineItems?.compactMap { GoogleTime.parse($0.expiryTime) }.max()
            try await app.client.deferSubscription(
                token: purchase.purchaseToken, seconds: days * 86_400, etag: resource.etag)
        } catch let error as GooglePlayError {
            if error.kind == .refused || error.kind == .notFound {
                throw APIError(
                    .unprocessableContent, "not_extendable", "Google Play refused to defer it: \(error.message)")
            }
            throw PurchasePipeline.googleAPIError(error)
        }
        let reading = try await purchases.readGoogle(
            app, token: purchase.purchaseToken, productId: nil, kind: "subscription")
        _ = try await purchases.applyGoogle(reading, submittingAccount: nil, orderId: nil, now: Date())
        let after = reading.transaction.expiresDate.map { Date(storeMilliseconds: $0) }
        try await store.anomalies.recordAudit(
            actor: actor, action: "subscription_deferred", subject: purchase.originalTransactionId,
            detail:
                "Google Play deferred by \(days) days (\(reason)\(note.isEmpty ? "" : " — \(note)")): expires \(after.map(Self.iso) ?? "?") (was \(before.map(Self.iso) ?? "?"))",
            now: Date())
        struct Deferred: Encodable {
            var status = "extended"
            var store = "google_play"
            var originalTransactionId: String?
            var expiresAt: String?
        }
        return try Self.json(
            Deferred(originalTransactionId: purchase.originalTransactionId, expiresAt: after.map(Self.iso)))
    }

}

/// Support's subscriptions, grants and notes: owns the support store, the account store (notes),
/// the grants and the body limit; extending a subscription (Apple's job or Google's `defer`, then
/// Google's snapshot applied) and reading an app transaction from Apple are handed in by the app
/// that owns those clients.
struct SupportController: RequestHandling {
    let support: SupportStore
    let accounts: AccountStore
    let transactions: TransactionStore
    let grants: Grants
    let maxBodyBytes: Int
    let extend:
        @Sendable (_ original: String, _ body: StoreKeeperApp.ExtendBody, _ caller: Caller) async throws -> Response
    let appTransaction: @Sendable (_ anyTransactionId: String) async throws -> Response

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.post("subscriptions/:originalTransactionId/extend") { request, context in
            try await extend(request, context)
        }
        v1.get("subscriptions/:originalTransactionId/extensions") { request, context in
            try await listExtensions(request, context)
        }
        v1.post("extensions/mass") { request, context in try await massExtend(request, context) }
        v1.get("extensions/:requestId") { request, context in try await getExtension(request, context) }
        v1.post("accounts/:accountId/grants") { request, context in try await createGrant(request, context) }
        v1.post("accounts/:accountId/notes") { request, context in try await addAccountNote(request, context) }
        v1.get("accounts/:accountId/notes") { request, context in try await listAccountNotes(request, context) }
        v1.get("app-transactions/:transactionId") { _, context in
            try context.caller().requireScope(.read)
            try context.caller().requireEveryApp("Apple's app transactions")
            let id = try StoreKeeperApp.parameter(context, "transactionId")
            guard StoreKeeperApp.isAppleNumericId(id) else {
                throw APIError.badRequest(
                    "transactionId must be an App Store transaction, original or app transaction id")
            }
            return try await appTransaction(id)
        }
        v1.delete("accounts/:accountId/grants/:grantId") { request, context in try await endGrant(request, context)
        }
    }

    func extend(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.support)
        let original = try StoreKeeperApp.parameter(context, "originalTransactionId")
        try StoreKeeperApp.validateText(original, field: "originalTransactionId")
        try await requireSubscriptionApp(original, caller: try context.caller())
        let body = try await decode(StoreKeeperApp.ExtendBody.self, request)
        return try await extend(original, body, try context.caller())
    }

    func listExtensions(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.read)
        let original = try StoreKeeperApp.parameter(context, "originalTransactionId")
        try StoreKeeperApp.validateText(original, field: "originalTransactionId")
        try await requireSubscriptionApp(original, caller: try context.caller())
        return try StoreKeeperApp.json([
            "extensions": try await support.extensions(of: original).map(StoreKeeperApp.ExtensionJSON.init)
        ])
    }

    /// A key limited to some apps reaches a subscription of its apps only (another app's, or one
    /// not recorded here, is as if it did not exist).
    func requireSubscriptionApp(_ original: String, caller: Caller) async throws {
        guard caller.limitedApps != nil else { return }
        let record = try await transactions.transaction(named: original)
        guard let record, caller.covers(app: record.appId) else {
            throw APIError.notFound("no subscription '\(original.prefix(64))' recorded here")
        }
    }

    func massExtend(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.support)
        try context.caller().requireEveryApp("a mass extension")
        let body = try await decode(StoreKeeperApp.MassExtendBody.self, request)
        let note = try StoreKeeperApp.validateExtension(days: body.days, reason: body.reason, note: body.note)
        guard grants.catalog.product(body.productId)?.type == .autoRenewable else {
            throw APIError(
                .notFound, "unknown_product", "no auto-renewable product '\(body.productId.prefix(100))' in the catalog"
            )
        }
        let row = try await support.requestMassExtension(
            productId: body.productId, days: body.days, reason: body.reason, note: note,
            actor: try context.caller().auditActor, now: Date())
        return try StoreKeeperApp.json(["requestId": row.requestId, "status": row.status], status: .accepted)
    }

    func getExtension(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.read)
        try context.caller().requireEveryApp("a mass extension's request")
        let id = try StoreKeeperApp.parameter(context, "requestId")
        guard let row = try await support.extensionRequest(id) else {
            throw APIError.notFound("no extension request '\(id.prefix(64))'")
        }
        return try StoreKeeperApp.json(StoreKeeperApp.ExtensionJSON(row))
    }

    func createGrant(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.support)
        let account = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(account)
        let body = try await decode(StoreKeeperApp.GrantBody.self, request)
        let grant = try await grants.grant(
            account: account, entitlement: body.entitlement, expiresAt: try body.until(now: Date()), note: body.note,
            actor: try context.caller().auditActor)
        return try StoreKeeperApp.json(
            StoreKeeperApp.GrantJSON(
                grantId: grant.grantId, accountId: account, entitlement: grant.entitlementId,
                expiresAt: grant.forGood ? nil : StoreKeeperApp.iso(grant.expiresAt), forGood: grant.forGood,
                createdAt: StoreKeeperApp.iso(grant.createdAt)), status: .created)
    }

    func endGrant(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.support)
        let account = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(account)
        let grantId = try StoreKeeperApp.parameter(context, "grantId")
        try StoreKeeperApp.validateText(grantId, field: "grantId")
        guard
            try await support.endGrant(
                account: account, grantId: grantId, actor: try context.caller().auditActor, now: Date())
        else {
            throw APIError.notFound("account '\(account.prefix(64))' has no running grant '\(grantId.prefix(64))'")
        }
        return try StoreKeeperApp.json(["grantId": grantId, "status": "ended"])
    }

    func addAccountNote(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        try caller.requireScope(.support)
        let accountId = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(accountId)
        let body = try await decode(StoreKeeperApp.NoteBody.self, request)
        let note = try await accounts.addNote(
            accountId: accountId, text: body.text, ticket: body.ticket, author: caller.auditActor, now: Date())
        return try StoreKeeperApp.json(StoreKeeperApp.NoteJSON(note), status: .created)
    }

    func listAccountNotes(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.read)
        let accountId = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(accountId)
        struct Notes: Encodable { var notes: [StoreKeeperApp.NoteJSON] }
        return try StoreKeeperApp.json(
            Notes(notes: try await accounts.notes(of: accountId).map(StoreKeeperApp.NoteJSON.init)))
    }
}

/// Operators' grants: the support store they are written to and the catalog that says which
/// entitlements exist.
struct Grants: Sendable {
    let support: SupportStore
    let catalog: Catalog

    /// An operator's grant, the one path of the API, the dashboard and the MCP desk: an
    /// entitlement the catalog defines, until a future date within 100 years or (nil) for good,
    /// audited with its note.
    func grant(account: String, entitlement: String, expiresAt until: Date?, note: String?, actor: String)
        async throws -> SupportStore.GrantRow
    {
        let entitlements = Set(catalog.products.compactMap(\.grants.entitlement))
        guard entitlements.contains(entitlement) else {
            throw APIError(
                .badRequest, "unknown_entitlement",
                "no product of the catalog grants '\(entitlement.prefix(64))'; entitlements: \(entitlements.sorted().joined(separator: ", "))"
            )
        }
        let now = Date()
        let expiresAt = until ?? SupportStore.grantForGood
        if until != nil {
            guard expiresAt > now else { throw APIError.badRequest("field 'expiresAt' must be in the future") }
            guard expiresAt < now.addingTimeInterval(100 * 365 * 86_400) else {
                throw APIError.badRequest("field 'expiresAt' must be within 100 years")
            }
        }
        let note = try StoreKeeperApp.validateNote(note)
        return try await support.createGrant(
            account: account, entitlement: entitlement, expiresAt: expiresAt, note: note, actor: actor, now: now)
    }
}

extension StoreKeeperApp {
    var grants: Grants { Grants(support: store.support, catalog: catalog) }
}

extension StoreKeeperApp {
    /// `storekeeper extend`: records the extension (validated as the API does), runs the job
    /// queue until Apple has answered or `wait` has passed, and returns the extension.
    public func extendAndWait(
        product: String?, subscription: String?, days: Int, reason: String, note: String, wait: Duration
    ) async throws -> (status: String, json: String) {
        let note = try Self.validateExtension(days: days, reason: reason, note: note)
        let row: SupportStore.ExtensionRow
        if let product {
            guard catalog.product(product)?.type == .autoRenewable else {
                throw APIError(.notFound, "unknown_product", "no auto-renewable product '\(product)' in the catalog")
            }
            row = try await store.support.requestMassExtension(
                productId: product, days: days, reason: reason, note: note, actor: "cli", now: Date())
        } else {
            let original = subscription ?? ""
            do {
                row = try await store.support.requestExtension(
                    originalTransactionId: original, days: days, reason: reason, note: note, actor: "cli", now: Date())
            } catch is SupportStore.UnknownSubscription {
                throw APIError.notFound("no subscription '\(original)'")
            } catch is SupportStore.ExtensionLimit {
                throw APIError(.conflict, "extension_limit", "two extensions within 365 days already")
            }
        }
        let runner = JobRunner(app: self)
        let deadline = ContinuousClock.now + wait
        var current = row
        while true {
            _ = await runner.runDueCounting(now: Date())
            current = try await store.support.extensionRequest(row.requestId) ?? current
            if current.status == "succeeded" || current.status == "failed" || ContinuousClock.now >= deadline { break }
            try await Task.sleep(for: .seconds(1))
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (current.status, String(decoding: try encoder.encode(ExtensionJSON(current)), as: UTF8.self))
    }
}

extension StoreKeeperApp {
    /// Get App Transaction Info (`anyTransactionId`): the Apple Account's app transaction,
    /// verified like any signed object — for support and migration without the device.
    func appTransaction(_ anyTransactionId: String) async throws -> Response {
        try Self.json(try await appTransactionFacts(anyTransactionId))
    }

    struct AppTransactionAnswer: Encodable {
        var appTransactionId: String?
        var bundleId: String?
        var environment: String?
        var originalApplicationVersion: String?
        var originalPurchaseDate: String?
        var originalPlatform: String?
        var applicationVersion: String?
        var preorderDate: String?
        var accountIds: [String]
        var signedAppTransactionInfo: String
    }

    func appTransactionFacts(_ anyTransactionId: String) async throws -> AppTransactionAnswer {
        guard let source = transactionSource else {
            throw APIError(
                .serviceUnavailable, "apple_unavailable", "no App Store Server API key is configured", retryable: false)
        }
        let signed: String
        do {
            signed = try await withDeadline(.seconds(10)) { try await source.signedAppTransaction(anyTransactionId) }
        } catch let error as AppStoreAPIError where !error.isRetryable {
            throw APIError(.notFound, "not_found", "Apple knows no app transaction for \(anyTransactionId): \(error)")
        } catch {
            throw APIError(
                .serviceUnavailable, "apple_unavailable", "Apple did not answer: \(error)", retryable: true)
        }
        let app: AppTransaction
        do {
            app = try await verifier.verifyAppTransaction(signed)
        } catch let failure as VerificationFailure {
            throw APIError.verification(failure, status: .badGateway)
        }
        func date(_ ms: Int64?) -> String? { ms.map { Self.iso(Date(timeIntervalSince1970: Double($0) / 1000)) } }
        let accounts = try await store.accounts.accounts(ofAppTransaction: app.appTransactionId ?? "")
        return AppTransactionAnswer(
            appTransactionId: app.appTransactionId, bundleId: app.bundleId, environment: app.receiptType?.rawValue,
            originalApplicationVersion: app.originalApplicationVersion,
            originalPurchaseDate: date(app.originalPurchaseDate), originalPlatform: app.originalPlatform?.rawValue,
            applicationVersion: app.applicationVersion, preorderDate: date(app.preorderDate), accountIds: accounts,
            signedAppTransactionInfo: signed)
    }
}
