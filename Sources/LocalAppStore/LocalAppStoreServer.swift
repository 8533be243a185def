import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Crypto
import Foundation
import Hummingbird
import JWTKit
import NIOCore

/// The local App Store over HTTP: Apple's App Store Server API paths (`/inApps/…`) with
/// Apple's bearer-token rules, `verifyReceipt` at `/verifyReceipt` (production) and
/// `/sandbox/verifyReceipt`, and a control API under `/control` (docs/local-app-store.md).
public struct LocalAppStoreServer: Sendable {
    public let store: LocalAppStore
    let keys: JWTKeyCollection?

    public init(store: LocalAppStore) async throws {
        self.store = store
        if let key = store.configuration.serverAPIKey {
            self.keys = await JWTKeyCollection().add(
                ecdsa: try ES256PublicKey(pem: key.publicKeyPEM), kid: JWKIdentifier(string: key.keyId))
        } else {
            self.keys = nil
        }
    }

    /// A server for a store without a Server API key: any bearer token is accepted (the
    /// in-process local App Store of the StoreKeeper server's zero-config mode).
    public init(unauthenticatedStore store: LocalAppStore) {
        self.store = store
        self.keys = nil
    }

    /// The router, for embedding in another Hummingbird application or for tests.
    public func router() -> Router<BasicRequestContext> {
        let router = Router()
        addRoutes(to: router)
        return router
    }

    /// Adds every route (Server API, verifyReceipt, control) under `router`, e.g. a group
    /// `/local-app-store` of the StoreKeeper server in zero-config mode.
    public func addRoutes<Context: RequestContext>(to router: some RouterMethods<Context>) {
        addServerAPI(to: router)
        addRetentionMessaging(to: router)
        addAppleRules2026(to: router)
        addVerifyReceipt(to: router)
        addControl(to: router)
    }

    /// An application listening on `host:port` (0 picks a free port), delivering notifications.
    public func application(
        host: String = "127.0.0.1", port: Int = 0, onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    )
        -> some ApplicationProtocol
    {
        Application(
            router: router(), configuration: .init(address: .hostname(host, port: port), serverName: "LocalAppStore"),
            services: [NotificationSender(store: store)],
            onServerRunning: { channel in await onServerRunning(channel.localAddress?.port ?? port) })
    }

    // MARK: Server API

    func addServerAPI<Context: RequestContext>(to router: some RouterMethods<Context>) {
        let api = router.group("inApps")
        api.get("v1/transactions/:id") { request, context in
            try await self.serve(request, "transactionInfo") {
                let id = try Self.transactionId(context)
                guard await self.store.transaction(id) != nil else { return Self.appleError(404, 4_040_010) }
                return Self.json(
                    TransactionInfoResponse(signedTransactionInfo: try await self.store.signTransaction(id)))
            }
        }
        api.get("v2/history/:id") { request, context in
            try await self.serve(request, "history") {
                try await self.history(request, context, excludeFinished: false)
            }
        }
        api.get("v1/history/:id") { request, context in
            try await self.serve(request, "history") { try await self.history(request, context, excludeFinished: true) }
        }
        api.get("v1/subscriptions/:id") { request, context in
            try await self.serve(request, "subscriptions") { try await self.statuses(request, context) }
        }
        api.get("v1/lookup/:orderId") { request, context in
            try await self.serve(request, "lookUpOrderId") {
                let orderId = context.parameters.get("orderId") ?? ""
                guard let ids = await self.store.transactions(ofOrder: orderId), !ids.isEmpty else {
                    return Self.json(OrderLookupResponse(status: .invalid, signedTransactions: []))
                }
                var signed: [String] = []
                for id in ids { signed.append(try await self.store.signTransaction(id)) }
                return Self.json(OrderLookupResponse(status: .valid, signedTransactions: signed))
            }
        }
        api.get("v2/refund/lookup/:id") { request, context in
            try await self.serve(request, "refundHistory") { try await self.refunds(request, context) }
        }
        api.post("v1/notifications/history") { request, context in
            try await self.serve(request, "notificationHistory") {
                try await self.notificationHistory(request, context)
            }
        }
        api.put("v2/transactions/consumption/:id") { request, context in
            try await self.serve(request, "consumption") {
                let id = try Self.transactionId(context)
                guard let body = try? await request.decode(as: ConsumptionRequest.self, context: context) else {
                    return Self.appleError(400, 4_000_000)
                }
                do {
                    try await self.store.receiveConsumption(id, body)
                } catch let refusal as LocalAppStore.ConsumptionRefusal {
                    return Self.appleError(refusal.status, refusal.code)
                }
                return Response(status: .accepted)
            }
        }
        api.put("v1/subscriptions/extend/:id") { request, context in
            try await self.serve(request, "extend") {
                let id = try Self.transactionId(context, code: 4_000_008)
                guard let body = try? await request.decode(as: ExtendRenewalDateRequest.self, context: context) else {
                    return Self.appleError(400, 4_000_000)
                }
                guard let days = body.extendByDays, (1...90).contains(days) else {
                    return Self.appleError(400, 4_000_009)
                }
                guard body.extendReasonCode?.isKnown == true else { return Self.appleError(400, 4_000_010) }
                guard let requestIdentifier = body.requestIdentifier, !requestIdentifier.isEmpty,
                    requestIdentifier.count <= 128
                else { return Self.appleError(400, 4_000_011) }
                guard await self.store.subscription(id) != nil else { return Self.appleError(404, 4_040_005) }
                do {
                    return Self.json(
                        try await self.store.extendRenewalDate(id, days: days, requestIdentifier: requestIdentifier))
                } catch LocalAppStore.ExtensionRefusal.maximum {
                    return Self.appleError(403, 4_030_005)
                } catch {
                    return Self.appleError(403, 4_030_004)
                }
            }
        }
        api.post("v1/subscriptions/extend/mass") { request, context in
            try await self.serve(request, "extend") {
                guard let body = try? await request.decode(as: MassExtendRenewalDateRequest.self, context: context)
                else {
                    return Self.appleError(400, 4_000_000)
                }
                guard let days = body.extendByDays, (1...90).contains(days) else {
                    return Self.appleError(400, 4_000_009)
                }
                guard body.extendReasonCode?.isKnown == true else { return Self.appleError(400, 4_000_010) }
                guard let requestIdentifier = body.requestIdentifier, UUID(uuidString: requestIdentifier) != nil else {
                    return Self.appleError(400, 4_000_011)
                }
                guard let productId = body.productId, !productId.isEmpty else { return Self.appleError(400, 4_000_023) }
                do {
                    try await self.store.massExtend(
                        productId: productId, days: days, requestIdentifier: requestIdentifier,
                        storefronts: body.storefrontCountryCodes)
                } catch {
                    return Self.appleError(400, 4_000_023)
                }
                return Self.json(MassExtendRenewalDateResponse(requestIdentifier: requestIdentifier))
            }
        }
        api.get("v1/subscriptions/extend/mass/:productId/:requestId") { request, context in
            try await self.serve(request, "extend") {
                guard let status = await self.store.massExtensionStatus(context.parameters.get("requestId") ?? "")
                else { return Self.appleError(404, 4_040_009) }
                return Self.json(status)
            }
        }
        api.put("v1/transactions/:id/appAccountToken") { request, context in
            try await self.serve(request, "appAccountToken") {
                let id = try Self.transactionId(context)
                guard let body = try? await request.decode(as: UpdateAppAccountTokenRequest.self, context: context),
                    let token = body.appAccountToken.flatMap(UUID.init(uuidString:))
                else { return Self.appleError(400, 4_000_183) }
                guard let stored = await self.store.transaction(id) else { return Self.appleError(404, 4_040_005) }
                guard stored.payload.originalTransactionId == id else { return Self.appleError(400, 4_000_187) }
                try await self.store.setAppAccountToken(id, token: token)
                return Response(status: .ok)
            }
        }
        api.post("v1/transactions/:id/finish") { request, context in
            try await self.serve(request, "finish") {
                let id = try Self.transactionId(context)
                guard await self.store.transaction(id) != nil else { return Self.appleError(404, 4_040_010) }
                try await self.store.finish(id)
                return Response(status: .ok)
            }
        }
        api.post("v1/notifications/test") { request, _ in
            try await self.serve(request, "testNotification") {
                guard self.store.configuration.notificationURL != nil else { return Self.appleError(404, 4_040_007) }
                return Self.json(
                    SendTestNotificationResponse(testNotificationToken: try await self.store.sendTestNotification()))
            }
        }
        api.get("v1/notifications/test/:token") { request, context in
            try await self.serve(request, "testNotification") {
                let token = context.parameters.get("token") ?? ""
                guard let sent = await self.store.notifications.first(where: { $0.payload.notificationUUID == token })
                else {
                    return Self.appleError(404, 4_040_008)
                }
                return Self.json(
                    CheckTestNotificationResponse(
                        signedPayload: sent.signedPayload, sendAttempts: sent.attempts,
                        firstSendAttemptResult: sent.attempts.first?.sendAttemptResult))
            }
        }
    }

    /// Authentication and faults around every Server API call.
    func serve(
        _ request: Request, _ endpoint: String, _ body: () async throws -> Response
    ) async throws -> Response {
        guard await authorized(request) else { return Response(status: .unauthorized) }
        if let fault = await store.takeFault(endpoint) {
            if let latency = fault.latencyMilliseconds { try await Task.sleep(for: .milliseconds(latency)) }
            if let status = fault.status {
                if status == 429 {
                    let retryAt = Date().addingTimeInterval(Double(fault.retryAfterSeconds ?? 1)).milliseconds
                    var response = Self.appleError(429, 4_290_000)
                    response.headers[.retryAfter] = String(retryAt)
                    return response
                }
                return Self.appleError(status, status >= 500 ? 5_000_000 : 4_000_000)
            }
        }
        return try await body()
    }

    /// Apple's rules for the bearer token (server-api.md §2); any failure is a bare 401.
    func authorized(_ request: Request) async -> Bool {
        guard let keys, let key = store.configuration.serverAPIKey else {
            // No key configured: any well-formed bearer token is accepted (documented).
            return request.headers[.authorization]?.hasPrefix("Bearer ") == true
        }
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer ") else { return false }
        let token = String(header.dropFirst("Bearer ".count))
        // The key id must be the configured one (JWTKit would fall back to its only key).
        guard Self.keyId(of: token) == key.keyId, let claims = try? await keys.verify(token, as: ServerAPIClaims.self)
        else {
            return false
        }
        let now = Date()
        return claims.iss.value == key.issuerId && claims.bid == store.configuration.bundleId
            && claims.iat.value <= now.addingTimeInterval(60)
    }

    func history(_ request: Request, _ context: some RequestContext, excludeFinished: Bool) async throws
        -> Response
    {
        let id = try Self.transactionId(context)
        guard let owner = await store.owner(of: id) else { return Self.appleError(404, 4_040_010) }
        let query = Self.query(request)
        var items = await store.history(of: owner)
        if excludeFinished {
            let finished = await store.finishedConsumables(of: owner)
            items.removeAll { finished.contains($0.payload.transactionId ?? "") }
        }
        if let start = query.first(where: { $0.0 == "startDate" })?.1 {
            guard let value = Int64(start) else { return Self.appleError(400, 4_000_015) }
            items.removeAll { ($0.payload.purchaseDate ?? 0) < value }
        }
        if let end = query.first(where: { $0.0 == "endDate" })?.1 {
            guard let value = Int64(end) else { return Self.appleError(400, 4_000_016) }
            items.removeAll { ($0.payload.purchaseDate ?? 0) >= value }
        }
        let productIds = query.filter { $0.0 == "productId" }.map(\.1)
        if !productIds.isEmpty { items.removeAll { !productIds.contains($0.payload.productId ?? "") } }
        let productTypes = query.filter { $0.0 == "productType" }.map(\.1)
        if !productTypes.isEmpty {
            let known = [
                "AUTO_RENEWABLE": ProductType.autoRenewable, "NON_RENEWABLE": .nonRenewing, "CONSUMABLE": .consumable,
                "NON_CONSUMABLE": .nonConsumable,
            ]
            guard productTypes.allSatisfy({ known[$0] != nil }) else { return Self.appleError(400, 4_000_022) }
            let wanted = Set(productTypes.compactMap { known[$0] })
            items.removeAll { !wanted.contains($0.payload.type ?? .consumable) }
        }
        let groups = query.filter { $0.0 == "subscriptionGroupIdentifier" }.map(\.1)
        if !groups.isEmpty { items.removeAll { !groups.contains($0.payload.subscriptionGroupIdentifier ?? "") } }
        if let revoked = query.first(where: { $0.0 == "revoked" })?.1 {
            guard revoked == "true" || revoked == "false" else { return Self.appleError(400, 4_000_030) }
            items.removeAll { ($0.payload.revocationDate != nil) != (revoked == "true") }
        }
        if let sort = query.first(where: { $0.0 == "sort" })?.1 {
            guard sort == "ASCENDING" || sort == "DESCENDING" else { return Self.appleError(400, 4_000_021) }
            if sort == "DESCENDING" { items.reverse() }
        }
        guard let offset = Self.offset(fromRevision: query.first { $0.0 == "revision" }?.1) else {
            return Self.appleError(400, 4_000_005)
        }
        let page = Array(items.dropFirst(offset).prefix(20))
        var signed: [String] = []
        for item in page { signed.append(try await store.signTransaction(item.payload.transactionId!)) }
        let next = offset + page.count
        return Self.json(
            HistoryResponse(
                revision: Self.revision(offset: next), hasMore: next < items.count,
                bundleId: store.configuration.bundleId,
                appAppleId: store.configuration.appAppleId, environment: store.configuration.environment,
                signedTransactions: signed))
    }

    func statuses(_ request: Request, _ context: some RequestContext) async throws -> Response {
        let id = try Self.transactionId(context)
        guard let owner = await store.owner(of: id) else { return Self.appleError(404, 4_040_010) }
        let wanted = try Self.query(request).filter { $0.0 == "status" }.map { pair -> SubscriptionStatus in
            guard let value = Int32(pair.1), SubscriptionStatus(rawValue: value).isKnown else {
                throw HTTPError(.badRequest)
            }
            return SubscriptionStatus(rawValue: value)
        }
        var groups: [String: [LastTransactionsItem]] = [:]
        for subscription in await store.subscriptions(of: owner)
        where wanted.isEmpty || wanted.contains(subscription.status) {
            groups[subscription.group, default: []].append(
                LastTransactionsItem(
                    status: subscription.status, originalTransactionId: subscription.originalTransactionId,
                    signedTransactionInfo: try await store.signTransaction(subscription.lastTransactionId),
                    signedRenewalInfo: try await store.signRenewalInfo(subscription.originalTransactionId)))
        }
        return Self.json(
            StatusResponse(
                environment: store.configuration.environment, bundleId: store.configuration.bundleId,
                appAppleId: store.configuration.appAppleId,
                data: groups.keys.sorted().map {
                    SubscriptionGroupIdentifierItem(subscriptionGroupIdentifier: $0, lastTransactions: groups[$0])
                }))
    }

    func refunds(_ request: Request, _ context: some RequestContext) async throws -> Response {
        let id = try Self.transactionId(context)
        guard let owner = await store.owner(of: id) else { return Self.appleError(404, 4_040_010) }
        let refunded = await store.history(of: owner).filter { $0.payload.revocationDate != nil }
            .sorted { ($0.payload.revocationDate ?? 0) < ($1.payload.revocationDate ?? 0) }
        guard let offset = Self.offset(fromRevision: Self.query(request).first { $0.0 == "revision" }?.1) else {
            return Self.appleError(400, 4_000_005)
        }
        let page = Array(refunded.dropFirst(offset).prefix(20))
        var signed: [String] = []
        for item in page { signed.append(try await store.signTransaction(item.payload.transactionId!)) }
        let next = offset + page.count
        return Self.json(
            RefundHistoryResponse(
                signedTransactions: signed, revision: Self.revision(offset: next), hasMore: next < refunded.count))
    }

    func notificationHistory(_ request: Request, _ context: some RequestContext) async throws -> Response {
        guard let body = try? await request.decode(as: NotificationHistoryRequest.self, context: context) else {
            return Self.appleError(400, 4_000_000)
        }
        guard let start = body.startDate else { return Self.appleError(400, 4_000_015) }
        guard let end = body.endDate else { return Self.appleError(400, 4_000_016) }
        guard start < end else { return Self.appleError(400, 4_000_013) }
        guard body.transactionId == nil || body.notificationType == nil else { return Self.appleError(400, 4_000_019) }
        var items = await store.notifications.filter {
            let signed = $0.payload.signedDate ?? 0
            return signed >= start && signed < end
        }
        if let type = body.notificationType { items.removeAll { $0.payload.notificationType != type } }
        if let subtype = body.notificationSubtype { items.removeAll { $0.payload.subtype != subtype } }
        if body.onlyFailures == true { items.removeAll(where: \.delivered) }
        if let transactionId = body.transactionId {
            guard let owner = await store.owner(of: transactionId) else { return Self.appleError(404, 4_040_010) }
            let ids = Set(await store.history(of: owner).compactMap(\.payload.transactionId))
            items = items.filter { notification in
                guard let signed = notification.payload.data?.signedTransactionInfo,
                    let payload = try? Self.unverifiedTransaction(signed)
                else { return false }
                return ids.contains(payload.transactionId ?? "")
            }
        }
        guard let offset = Self.offset(fromRevision: Self.query(request).first { $0.0 == "paginationToken" }?.1) else {
            return Self.appleError(400, 4_000_014)
        }
        let page = Array(items.dropFirst(offset).prefix(20))
        let next = offset + page.count
        return Self.json(
            NotificationHistoryResponse(
                paginationToken: Self.revision(offset: next), hasMore: next < items.count,
                notificationHistory: page.map {
                    NotificationHistoryResponseItem(
                        signedPayload: $0.signedPayload, sendAttempts: Array($0.attempts.prefix(6)),
                        firstSendAttemptResult: $0.attempts.first?.sendAttemptResult)
                }))
    }
}
