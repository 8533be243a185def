import AppStoreModels
import AppStoreSigning
import Foundation
import Hummingbird
import StoreKeeperCatalog

/// What Apple added in 2025–2026, as Apple does it (Apple's 2025–26 App Store documentation): app
/// transactions (Get App Transaction Info), RESCIND_CONSENT, external purchase tokens and the
/// External Purchase Server API.
extension LocalAppStore {
    /// The customer's app transaction, as Get App Transaction Info returns it (no device fields).
    public func appTransaction(for appleId: String) -> AppTransaction? {
        guard let customer = customers[appleId] else { return nil }
        let first = customer.transactionIds.compactMap { transactions[$0]?.payload.purchaseDate }.min()
        return AppTransaction(
            appAppleId: configuration.appAppleId, appTransactionId: customer.appTransactionId,
            bundleId: configuration.bundleId, applicationVersion: "1", originalApplicationVersion: "1",
            originalPlatform: PurchasePlatform(rawValue: "iOS"),
            originalPurchaseDate: first ?? clock.now().milliseconds, receiptCreationDate: clock.now().milliseconds,
            receiptType: configuration.environment)
    }

    public func signAppTransaction(for appleId: String) throws -> String? {
        try appTransaction(for: appleId).map { try signer.sign($0) }
    }

    /// A parent withdraws consent for the customer's use of the app (Settings → Developer →
    /// Sandbox Apple Account → Revoke App Consent): RESCIND_CONSENT with `appData`, no subtype.
    public func rescindConsent(_ appleId: String) throws {
        guard let signed = try signAppTransaction(for: appleId) else {
            throw StoreError.invalid("unknown customer '\(appleId)'")
        }
        let payload = ResponseBodyV2DecodedPayload(
            notificationType: .rescindConsent, subtype: nil, notificationUUID: UUID().uuidString.lowercased(),
            version: "2.0", signedDate: clock.now().milliseconds,
            appData: NotificationAppData(
                appAppleId: configuration.appAppleId, bundleId: configuration.bundleId,
                environment: configuration.environment, signedAppTransactionInfo: signed))
        try append(payload)
    }

    // MARK: External purchases

    /// StoreKit issues an external purchase token (ExternalPurchase notice sheet or a custom
    /// link): its id, `SANDBOX…` outside Production.
    public func issueExternalPurchaseToken(tokenType: String? = nil) -> String {
        let id = (configuration.environment == .production ? "" : "SANDBOX") + UUID().uuidString.lowercased()
        externalTokens[id] = ExternalToken(id: id, created: clock.now(), tokenType: tokenType)
        return id
    }

    /// Sends EXTERNAL_PURCHASE_TOKEN for a token (`UNREPORTED`, `CREATED`, `ACTIVE_TOKEN_REMINDER`).
    public func notifyExternalPurchaseToken(_ id: String, subtype: NotificationSubtype) throws {
        guard let token = externalTokens[id] else {
            throw StoreError.invalid("unknown external purchase token '\(id)'")
        }
        let payload = ResponseBodyV2DecodedPayload(
            notificationType: .externalPurchaseToken, subtype: subtype,
            notificationUUID: UUID().uuidString.lowercased(), version: "2.0", signedDate: clock.now().milliseconds,
            externalPurchaseToken: ExternalPurchaseToken(
                externalPurchaseId: id, tokenCreationDate: token.created.milliseconds,
                appAppleId: configuration.appAppleId, bundleId: configuration.bundleId, tokenType: token.tokenType,
                tokenExpirationDate: token.tokenType == nil
                    ? nil : token.created.addingTimeInterval(30 * 86_400).milliseconds))
        try append(payload)
    }

    /// Tokens issued ~10 days ago and never reported get Apple's UNREPORTED reminder, once (run
    /// with the other due events whenever the clock moves).
    func remindUnreportedTokens() {
        let now = clock.now()
        for (id, token) in externalTokens.sorted(by: { $0.key < $1.key })
        where token.reports.isEmpty && now.timeIntervalSince(token.created) >= 10 * 86_400 && !token.reminded {
            externalTokens[id]?.reminded = true
            try? notifyExternalPurchaseToken(id, subtype: .unreported)
        }
    }

    /// Apple's refusal of a report.
    public struct ReportRefusal: Error, Hashable {
        public var code: Int64
        public var message: String
    }

    /// Send External Purchase Report, checked as Apple does: a requestIdentifier already
    /// accepted is a duplicate; line items only with LINE_ITEM; a refund points to a buy of an
    /// earlier (or the same) report and is at most its amount.
    public func receiveExternalReport(_ report: ExternalPurchaseReport) throws(ReportRefusal) -> String {
        guard let requestId = report.requestIdentifier, UUID(uuidString: requestId) != nil else {
            throw ReportRefusal(code: 4_000_001, message: "requestIdentifier must be a UUID")
        }
        guard externalReports[requestId.lowercased()] == nil else {
            throw ReportRefusal(code: 4_000_002, message: "duplicate requestIdentifier")
        }
        guard let id = report.externalPurchaseId, !id.isEmpty else {
            throw ReportRefusal(code: 4_000_003, message: "externalPurchaseId is required")
        }
        if (configuration.environment == .production) == id.hasPrefix("SANDBOX") {
            throw ReportRefusal(code: 4_000_004, message: "token of the other environment")
        }
        let items = report.lineItems ?? []
        switch report.status {
        case ExternalPurchaseReport.lineItem:
            guard !items.isEmpty else { throw ReportRefusal(code: 4_000_005, message: "LINE_ITEM needs line items") }
        case ExternalPurchaseReport.noLineItem, ExternalPurchaseReport.unrecognizedToken:
            guard items.isEmpty else { throw ReportRefusal(code: 4_000_006, message: "line items only with LINE_ITEM") }
        case ExternalPurchaseReport.duplicateToken:
            guard externalTokens[id]?.tokenType != nil else {
                throw ReportRefusal(code: 4_000_007, message: "DUPLICATE_TOKEN only for custom-link tokens")
            }
        default:
            throw ReportRefusal(code: 4_000_008, message: "unknown status")
        }
        var buys = externalTokens[id]?.buys ?? [:]
        for item in items {
            guard let lineId = item.lineItemId, !lineId.isEmpty, lineId.count <= 128, item.creationDate != nil,
                let quantity = item.quantity, quantity > 0, item.productIdentifier?.isEmpty == false,
                item.pricingCurrency?.count == 3, item.reportingCurrency?.count == 3,
                let inclusive = item.amountTaxInclusive, let exclusive = item.amountTaxExclusive,
                let tax = item.taxAmount, inclusive == exclusive + tax, item.netAmountTaxExclusive != nil
            else { throw ReportRefusal(code: 4_000_010, message: "line item is malformed") }
            switch item.eventType {
            case "BUY" where item.productType == ExternalPurchaseLineItem.subscription:
                // SubscriptionBuyLineItem: its event, its paid period; after the start, the
                // first payment's line item referenced.
                guard let event = item.subscriptionEvent, ExternalPurchaseLineItem.subscriptionEvents.contains(event),
                    let start = item.subscriptionStartDate, let end = item.subscriptionEndDate, end > start,
                    (item.subscriptionDaysOfPaidService ?? 0) > 0
                else { throw ReportRefusal(code: 4_000_014, message: "subscription line item is malformed") }
                if event != "SUBSCRIPTION_START" {
                    guard let reference = item.referenceLineItemId, buys[reference] != nil else {
                        throw ReportRefusal(
                            code: 4_000_015, message: "a renewal must reference the subscription's reported first buy")
                    }
                }
                buys[lineId] = inclusive
            case "BUY":
                guard item.productType == ExternalPurchaseLineItem.oneTimeBuy, item.subscriptionEvent == nil else {
                    throw ReportRefusal(code: 4_000_016, message: "productType must be ONE_TIME_BUY or SUBSCRIPTION")
                }
                buys[lineId] = inclusive
            case "REFUND":
                guard let reference = item.referenceLineItemId, let bought = buys[reference] else {
                    throw ReportRefusal(code: 4_000_011, message: "a refund must reference a reported buy")
                }
                guard inclusive <= bought else {
                    throw ReportRefusal(code: 4_000_012, message: "refund exceeds the buy")
                }
            default:
                throw ReportRefusal(code: 4_000_013, message: "eventType must be BUY or REFUND")
            }
        }
        var token = externalTokens[id] ?? ExternalToken(id: id, created: clock.now(), tokenType: nil)
        token.buys = buys
        token.reports.append(requestId.lowercased())
        externalTokens[id] = token
        externalReports[requestId.lowercased()] = report
        return requestId
    }

    public func externalReport(_ requestIdentifier: String) -> ExternalPurchaseReport? {
        externalReports[requestIdentifier.lowercased()]
    }

    public func externalToken(_ id: String) -> ExternalToken? { externalTokens[id] }
}

extension LocalAppStore {
    /// An external purchase token as the local App Store keeps it.
    public struct ExternalToken: Sendable, Hashable {
        public var id: String
        public var created: Date
        public var tokenType: String?
        /// The reports accepted for it, in order.
        public var reports: [String] = []
        public var reminded = false
        /// Reported buys: line item id → amount (tax inclusive).
        public var buys: [String: Int64] = [:]
    }
}

extension LocalAppStoreServer {
    func addAppleRules2026<Context: RequestContext>(to router: some RouterMethods<Context>) {
        router.get("inApps/v1/transactions/appTransactions/:id") { request, context in
            try await self.serve(request, "appTransaction") {
                let id = context.parameters.get("id") ?? ""
                guard !id.isEmpty, id.allSatisfy(\.isNumber) else { return Self.appleError(400, 4_000_006) }
                guard let appleId = await self.store.owner(of: id),
                    let signed = try await self.store.signAppTransaction(for: appleId)
                else { return Self.appleError(404, 4_040_010) }
                return Self.json(AppTransactionInfoResponse(signedAppTransactionInfo: signed))
            }
        }
        router.put("externalPurchase/v1/reports") { request, context in
            try await self.serve(request, "externalReport") {
                guard let report = try? await request.decode(as: ExternalPurchaseReport.self, context: context) else {
                    return Self.appleError(400, 4_000_000)
                }
                do {
                    let id = try await self.store.receiveExternalReport(report)
                    return Self.json(SendExternalPurchaseReportResponse(requestIdentifier: id))
                } catch let refusal as LocalAppStore.ReportRefusal {
                    return Self.appleError(400, refusal.code)
                }
            }
        }
        router.get("externalPurchase/v1/reports/:id") { request, context in
            try await self.serve(request, "externalReport") {
                guard let report = await self.store.externalReport(context.parameters.get("id") ?? "") else {
                    return Self.appleError(400, 4_040_000)
                }
                return Self.json(report)
            }
        }
    }
}
