import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// What answers with the account view (a purchase, a redemption): its `AccountBook`.
protocol CarriesAccountView {
    var accountBook: AccountBook { get }
}

extension CarriesAccountView {
    func account(_ accountId: String, state: PurchaseStore.AccountState? = nil) async throws -> AccountJSON {
        try await accountBook.account(accountId, state: state)
    }
}

/// Account reads and debits.
extension StoreKeeperApp: CarriesAccountView {
    /// The account views and support's credit, as every route and the dashboard use them.
    var accountBook: AccountBook {
        AccountBook(
            store: store, catalog: catalog, readClock: readClock,
            subscriptionApps: SubscriptionApps(
                appStoreAppId: configuration.hasAppStoreApp
                    ? configuration.appStoreAppId ?? configuration.bundleId : nil,
                googleAppIds: Array(google.keys), stripeAppIds: Array(stripe.keys), database: database))
    }

    /// The account as docs/api.md shows it; `state` when the caller already read it.

    static func shownStatus(_ status: String, expiresAt: Date?, now: Date) -> String {
        guard let known = SubscriptionStatus(rawValue: status) else { return status }
        return SubscriptionMachine.status(known, expiresAt: expiresAt, at: now).rawValue
    }

    struct DebitBody: RequestBody {
        var amount: Int64
        var idempotencyKey: String
        /// Why (support's words, shown on the ledger's audit): required for a credit.
        var reason: String?

        func validate() throws {
            if let reason {
                guard reason.unicodeScalars.count <= 500 else {
                    throw APIError.badRequest("field 'reason' must be at most 500 characters")
                }
                try StoreKeeperApp.validateText(reason, field: "reason", requireNFC: false)
            }
            guard amount > 0, amount <= 1_000_000_000_000 else {
                throw APIError.badRequest("field 'amount' must be a positive integer")
            }
            guard !idempotencyKey.isEmpty, idempotencyKey.unicodeScalars.count <= 200 else {
                throw APIError.badRequest("field 'idempotencyKey' must be 1…200 characters")
            }
            try StoreKeeperApp.validateText(idempotencyKey, field: "idempotencyKey")
        }
    }
}

/// The customer's consent
/// The customer's consent to share consumption data with Apple (docs/consent.md).
extension StoreKeeperApp {
    struct ConsentBody: RequestBody {
        var consumptionData: Bool

        func validate() throws {}
    }

    /// `consumptionData`, `source` and `changedAt` are null until the customer answered.
    struct ConsentJSON: Encodable {
        var accountId: String
        var consumptionData: Bool?
        var source: String?
        var changedAt: String?
        /// Set while a parent's RESCIND_CONSENT stands (the backend's consent ends it).
        var rescindedAt: String?

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(accountId, forKey: .accountId)
            try container.encode(consumptionData, forKey: .consumptionData)
            try container.encode(source, forKey: .source)
            try container.encode(changedAt, forKey: .changedAt)
            try container.encode(rescindedAt, forKey: .rescindedAt)
        }

        enum CodingKeys: String, CodingKey { case accountId, consumptionData, source, changedAt, rescindedAt }
    }

    static func consentJSON(_ consent: Consent) throws -> Response {
        try json(
            ConsentJSON(
                accountId: consent.accountId, consumptionData: consent.consumptionData, source: consent.source,
                changedAt: consent.changedAt.map(iso), rescindedAt: consent.rescindedAt.map(iso)))
    }
}

/// What an account is shown as and support's credit: its store, the catalog (what a product
/// grants, which currencies exist), the clock reads are dated by, and which app a subscription
/// came from.
struct AccountBook: Sendable {
    let store: PurchaseStore
    let catalog: Catalog
    let readClock: @Sendable () -> Date
    let subscriptionApps: SubscriptionApps

    /// The account as docs/api.md shows it; `state` when the caller already read it.
    func account(_ accountId: String, state: PurchaseStore.AccountState? = nil) async throws -> AccountJSON {
        let now = readClock()
        let state = if let state { state } else { try await store.accounts.account(accountId) }
        let entitlements = state.entitlements.map { row in
            let source =
                row.grantId != nil
                ? "grant"
                : catalog.product(row.productId ?? "")?.type == .autoRenewable ? "subscription" : "purchase"
            return AccountJSON.Entitlement(
                id: row.entitlementId, active: row.expiresAt.map { $0 > now } ?? true, productId: row.productId,
                expiresAt: row.expiresAt.map(StoreKeeperApp.iso), originalTransactionId: row.originalTransactionId,
                source: source,
                grantId: row.grantId)
        }
        var apps: [String: String] = [:]
        for subscription in state.subscriptions {
            // Recorded with it since several apps (migration 19); older rows: the app their store implies.
            var app = subscription.appId
            if app == nil {
                app = try await subscriptionApps.appId(
                    ofOriginal: subscription.originalTransactionId, store: subscription.store ?? .appStore)
            }
            apps[subscription.originalTransactionId] = app
        }
        return AccountJSON(
            accountId: accountId, entitlements: entitlements, balances: state.balances,
            subscriptions: state.subscriptions.map {
                AccountJSON.Subscription(
                    originalTransactionId: $0.originalTransactionId,
                    store: ($0.store ?? .appStore).rawValue, appId: apps[$0.originalTransactionId],
                    productId: $0.productId,
                    // A store silent past the paid period and its retry window: shown expired.
                    status: StoreKeeperApp.shownStatus($0.status, expiresAt: $0.expiresAt, now: now),
                    expiresAt: $0.expiresAt.map(StoreKeeperApp.iso), autoRenew: $0.autoRenew,
                    commitment: $0.commitment.map {
                        AccountJSON.Commitment(
                            billingPeriod: $0.period, totalBillingPeriods: $0.periods,
                            expiresAt: $0.expiresAt.map(StoreKeeperApp.iso),
                            renews: $0.renews)
                    })
            })
    }

    /// Support's credit, the one path of the API and the dashboard: a catalog currency, a reason
    /// (shown on the account's audit), idempotent by key.
    func supportCredit(
        accountId: String, currency: String, amount: Int64, idempotencyKey: String, reason: String?, actor: String
    ) async throws -> AccountStore.CreditResult {
        guard let reason, !reason.trimmingCharacters(in: .whitespaces).isEmpty else {
            throw APIError.badRequest("field 'reason' is required: it is shown on the account's audit")
        }
        try requireCatalogCurrency(currency)
        return try await store.accounts.credit(
            accountId: accountId, currency: currency, amount: amount, idempotencyKey: idempotencyKey, reason: reason,
            actor: actor, now: Date())
    }

    /// A currency some product of the catalog grants; else 400 `unknown_currency` naming them.
    func requireCatalogCurrency(_ currency: String) throws {
        let known = Set(catalog.products.compactMap(\.grants.currency))
        guard known.contains(currency) else {
            throw APIError(
                .badRequest, "unknown_currency",
                "no product of the catalog grants '\(currency.prefix(64))'; currencies: \(known.sorted().joined(separator: ", "))"
            )
        }
    }
}

/// The app a subscription recorded without one came from: the App Store app, the only
/// Google Play app, or the one Google's token was read for; nil for a web checkout.
struct SubscriptionApps: Sendable {
    let appStoreAppId: String?
    let googleAppIds: [String]
    let stripeAppIds: [String]
    let database: Database

    func appId(ofOriginal originalTransactionId: String, store: Store) async throws -> String? {
        switch store {
        case .appStore:
            return appStoreAppId
        case .googlePlay:
            if googleAppIds.count == 1 { return googleAppIds.first }
            return try await GooglePlayStore(database: database).appId(ofOriginal: originalTransactionId)
        case .web:
            return nil
        case .stripe:
            return stripeAppIds.count == 1 ? stripeAppIds.first : nil
        }
    }
}

/// `/v1/accounts/…`: reads, debits and credits, consent; owns the account book, the store and
/// the body limit.
struct AccountsController: RequestHandling {
    let book: AccountBook
    let store: PurchaseStore
    let maxBodyBytes: Int

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("accounts/:accountId") { request, context in
            let caller = try context.caller()
            let accountId = try StoreKeeperApp.parameter(context, "accountId")
            try StoreKeeperApp.validateAccountId(accountId)
            try caller.require(accountId, scope: .read)
            return try StoreKeeperApp.json(try await book.account(accountId))
        }
        v1.post("accounts/:accountId/balances/:currency/debit") { request, context in
            try await debit(request, context)
        }
        v1.post("accounts/:accountId/balances/:currency/credit") { request, context in
            try await credit(request, context)
        }
        v1.get("accounts/:accountId/consent") { request, context in
            let caller = try context.caller()
            let accountId = try StoreKeeperApp.parameter(context, "accountId")
            try StoreKeeperApp.validateAccountId(accountId)
            try caller.require(accountId, scope: .read)
            return try StoreKeeperApp.consentJSON(try await store.accounts.consent(of: accountId))
        }
        v1.put("accounts/:accountId/consent") { request, context in
            try await setConsent(request, context)
        }
    }

    /// A balance request's account, currency and body: a secret key's only (a client token
    /// could pre-claim the backend's idempotency keys, or credit itself).
    func balanceRequest(_ request: Request, _ context: StoreKeeperContext, action: String) async throws
        -> (accountId: String, currency: String, body: StoreKeeperApp.DebitBody)
    {
        let caller = try context.caller()
        let accountId = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(accountId)
        let currency = try StoreKeeperApp.parameter(context, "currency")
        try StoreKeeperApp.validateText(currency, field: "currency")
        guard caller.isKey else {
            throw APIError.forbidden("\(action) need a secret key (the app's backend or support), not a client token")
        }
        try caller.requireScope(.support)
        return (accountId, currency, try await decode(StoreKeeperApp.DebitBody.self, request))
    }

    /// Who a debit is audited under: an operator key (`auth.keys`: support, through the API, the
    /// dashboard or the MCP desk) always, reason or not; a secret key (the app's back end
    /// spending a player's coins) when it gives a reason — support acting with it.
    static func debitActor(_ caller: Caller, reason: String?) -> String? {
        let reason = reason?.trimmingCharacters(in: .whitespaces) ?? ""
        switch caller {
        case .key: return caller.auditActor
        case .secretKey: return reason.isEmpty ? nil : caller.auditActor
        case .account: return nil
        }
    }

    func debit(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let (accountId, currency, body) = try await balanceRequest(request, context, action: "debits")
        switch try await store.accounts.debit(
            accountId: accountId, currency: currency, amount: body.amount, idempotencyKey: body.idempotencyKey,
            reason: body.reason.flatMap { $0.trimmingCharacters(in: .whitespaces).isEmpty ? nil : $0 },
            actor: Self.debitActor(try context.caller(), reason: body.reason), now: Date())
        {
        case .debited(let balance): return try StoreKeeperApp.json(["balance": balance])
        case .idempotencyConflict:
            throw APIError(
                .conflict, "idempotency_conflict",
                "this idempotencyKey already answered a debit of another account, currency or amount")
        case .insufficient(let balance):
            // Nothing to spend in a currency the catalog never grants: a typo, said as such.
            if balance == 0 { try book.requireCatalogCurrency(currency) }
            throw APIError(.conflict, "insufficient_balance", "balance \(balance) is less than \(body.amount)")
        }
    }

    /// `POST /v1/accounts/{accountId}/balances/{currency}/credit` (secret key): support
    /// compensates a player; idempotent by key, audited with its reason.
    func credit(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let (accountId, currency, body) = try await balanceRequest(request, context, action: "credits")
        switch try await book.supportCredit(
            accountId: accountId, currency: currency, amount: body.amount, idempotencyKey: body.idempotencyKey,
            reason: body.reason, actor: try context.caller().auditActor)
        {
        case .credited(let balance): return try StoreKeeperApp.json(["balance": balance])
        case .idempotencyConflict:
            throw APIError(
                .conflict, "idempotency_conflict",
                "this idempotencyKey already answered another credit or debit")
        }
    }

    func setConsent(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let caller = try context.caller()
        let accountId = try StoreKeeperApp.parameter(context, "accountId")
        try StoreKeeperApp.validateAccountId(accountId)
        try caller.require(accountId)
        let body = try await decode(StoreKeeperApp.ConsentBody.self, request)
        do {
            let consent = try await store.accounts.setConsent(
                accountId, consumptionData: body.consumptionData, source: caller.isKey ? "backend" : "app",
                now: Date())
            return try StoreKeeperApp.consentJSON(consent)
        } catch let rescinded as ConsentRescinded {
            throw APIError(
                .forbidden, "consent_rescinded",
                "a parent withdrew consent (RESCIND_CONSENT, \(StoreKeeperApp.iso(rescinded.at))): only the app's backend (a secret key) can restore it"
            )
        }
    }
}
