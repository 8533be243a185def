import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Foundation
import LocalAppStore

/// Where `transactionId` submissions are looked up: the App Store Server API (production,
/// then sandbox on `4040010`), or the in-process local App Store in zero-config mode. The
/// answer is always verified like any other JWS.
public protocol TransactionSource: Sendable {
    func signedTransaction(_ transactionId: String) async throws -> String
    /// Send Consumption Information (v2) for a transaction of `environment`.
    func sendConsumption(_ transactionId: String, environment: String?, _ request: ConsumptionRequest) async throws
    /// Extend a Subscription Renewal Date for a subscription of `environment`.
    func extendRenewalDate(
        _ originalTransactionId: String, environment: String?, _ request: ExtendRenewalDateRequest
    ) async throws -> ExtendRenewalDateResponse
    /// Extend Subscription Renewal Dates for All Active Subscribers, and its status.
    func massExtend(_ request: MassExtendRenewalDateRequest) async throws -> MassExtendRenewalDateResponse
    func massExtendStatus(productId: String, requestIdentifier: String) async throws
        -> MassExtendRenewalDateStatusResponse
    /// Set App Account Token on an original transaction of `environment`.
    func setAppAccountToken(_ originalTransactionId: String, environment: String?, token: UUID) async throws
    /// Get App Transaction Info (`anyTransactionId`): the signed app transaction, verified by the caller.
    func signedAppTransaction(_ anyTransactionId: String) async throws -> String
    /// Finish Transaction (server side) for a transaction of `environment`.
    func finishTransaction(_ transactionId: String, environment: String?) async throws
    /// Send External Purchase Report.
    func sendExternalReport(_ report: ExternalPurchaseReport, sandbox: Bool) async throws
    /// Look Up Order ID: the signed transactions an Order ID (the customer's receipt e-mail)
    /// paid; empty when Apple knows no such order.
    func lookUpOrderId(_ orderId: String) async throws -> [String]
}

public struct ServerAPITransactionSource: TransactionSource {
    let lookup: EnvironmentFallback

    public init(production: AppStoreServerAPIClient, sandbox: AppStoreServerAPIClient?) {
        lookup = EnvironmentFallback(production: production, sandbox: sandbox)
    }

    /// Every App Store app of the deployment: calls about a transaction go to the app that
    /// knows it (Apple answers "not found" to the others).
    public init(_ lookup: EnvironmentFallback) {
        self.lookup = lookup
    }

    public func signedTransaction(_ transactionId: String) async throws -> String {
        guard let signed = try await lookup.getTransactionInfo(transactionId).signedTransactionInfo else {
            throw AppStoreAPIError(
                kind: .malformedResponse, message: "Apple answered without signedTransactionInfo", isRetryable: true)
        }
        return signed
    }

    /// `body` with the client of `environment` of each app in turn, until one knows the id.
    func each<T: Sendable>(_ environment: String?, _ body: (AppStoreServerAPIClient) async throws -> T)
        async throws -> T
    {
        try await EnvironmentFallback.first(lookup.clients(environment), body)
    }

    public func sendConsumption(_ transactionId: String, environment: String?, _ request: ConsumptionRequest)
        async throws
    {
        try await each(environment) { try await $0.sendConsumptionInformation(transactionId, request) }
    }

    public func extendRenewalDate(
        _ originalTransactionId: String, environment: String?, _ request: ExtendRenewalDateRequest
    ) async throws -> ExtendRenewalDateResponse {
        try await each(environment) { try await $0.extendSubscriptionRenewalDate(originalTransactionId, request) }
    }

    /// Product ids are unique across a developer's apps: the app whose product it is takes the
    /// request; Apple refuses it (4xx) for the others.
    public func massExtend(_ request: MassExtendRenewalDateRequest) async throws -> MassExtendRenewalDateResponse {
        try await eachRefusing { try await $0.extendRenewalDatesForAllActiveSubscribers(request) }
    }

    /// `body` on each app's Production client until one accepts; Apple's last refusal otherwise.
    func eachRefusing<T: Sendable>(
        sandbox: Bool = false, _ body: (AppStoreServerAPIClient) async throws -> T
    ) async throws -> T {
        var lastError: (any Error)?
        for client in lookup.clients(sandbox ? AppStoreEnvironment.sandbox.rawValue : nil) {
            do {
                return try await body(client)
            } catch let error as AppStoreAPIError where !error.isRetryable && lookup.otherApps.count > 0 {
                lastError = error
            }
        }
        throw lastError
            ?? AppStoreAPIError(kind: .malformedResponse, message: "no App Store client", isRetryable: false)
    }

    public func setAppAccountToken(_ originalTransactionId: String, environment: String?, token: UUID) async throws {
        try await each(environment) { try await $0.setAppAccountToken(originalTransactionId, appAccountToken: token) }
    }

    /// Production only (Apple's Look Up Order ID has no Sandbox): each app in turn until one
    /// knows the order.
    public func lookUpOrderId(_ orderId: String) async throws -> [String] {
        for client in lookup.clients(AppStoreEnvironment.production.rawValue) {
            let answer = try await client.lookUpOrderId(orderId)
            if answer.status == .valid, let signed = answer.signedTransactions, !signed.isEmpty { return signed }
        }
        return []
    }

    public func signedAppTransaction(_ anyTransactionId: String) async throws -> String {
        guard let signed = try await lookup.getAppTransactionInfo(anyTransactionId).signedAppTransactionInfo else {
            throw AppStoreAPIError(
                kind: .malformedResponse, message: "Apple answered without signedAppTransactionInfo", isRetryable: true)
        }
        return signed
    }

    public func finishTransaction(_ transactionId: String, environment: String?) async throws {
        try await each(environment) { try await $0.finishTransaction(transactionId) }
    }

    /// The report's tokens belong to one app: Apple refuses them from the others.
    public func sendExternalReport(_ report: ExternalPurchaseReport, sandbox: Bool) async throws {
        try await eachRefusing(sandbox: sandbox) { try await $0.sendExternalPurchaseReport(report) }
    }

    public func massExtendStatus(productId: String, requestIdentifier: String) async throws
        -> MassExtendRenewalDateStatusResponse
    {
        try await eachRefusing {
            try await $0.getStatusOfSubscriptionRenewalDateExtensions(
                productId: productId, requestIdentifier: requestIdentifier)
        }
    }
}

struct LocalTransactionSource: TransactionSource {
    let store: LocalAppStore

    /// A fault set on the local App Store's control API for `endpoint`, as Apple's answer.
    func injectedFault(_ endpoint: String) async throws {
        guard let fault = await store.takeFault(endpoint), let status = fault.status else { return }
        throw AppStoreAPIError(
            kind: status == 429 ? .rateLimited : .httpStatus, httpStatus: status,
            message: "local App Store fault: HTTP \(status)", isRetryable: status >= 500 || status == 429)
    }

    func sendConsumption(_ transactionId: String, environment: String?, _ request: ConsumptionRequest) async throws {
        do {
            try await store.receiveConsumption(transactionId, request)
        } catch {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: error.status, errorCode: error.code,
                message: "Send Consumption Information refused", isRetryable: false)
        }
    }

    func extendRenewalDate(
        _ originalTransactionId: String, environment: String?, _ request: ExtendRenewalDateRequest
    ) async throws -> ExtendRenewalDateResponse {
        try await injectedFault("extend")
        do {
            return try await store.extendRenewalDate(
                originalTransactionId, days: request.extendByDays ?? 0,
                requestIdentifier: request.requestIdentifier ?? "")
        } catch LocalAppStore.ExtensionRefusal.maximum {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 403, errorCode: 4_030_005,
                message: "Subscription has reached the maximum number of extensions.", isRetryable: false)
        } catch let error as LocalAppStore.StoreError {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 404, errorCode: 4_040_005, message: error.description, isRetryable: false)
        } catch {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 403, errorCode: 4_030_004, message: "Subscription extension ineligible.",
                isRetryable: false)
        }
    }

    func massExtend(_ request: MassExtendRenewalDateRequest) async throws -> MassExtendRenewalDateResponse {
        try await injectedFault("extend")
        do {
            try await store.massExtend(
                productId: request.productId ?? "", days: request.extendByDays ?? 0,
                requestIdentifier: request.requestIdentifier ?? "", storefronts: request.storefrontCountryCodes)
        } catch {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 400, errorCode: 4_000_023, message: "\(error)", isRetryable: false)
        }
        return MassExtendRenewalDateResponse(requestIdentifier: request.requestIdentifier)
    }

    func massExtendStatus(productId: String, requestIdentifier: String) async throws
        -> MassExtendRenewalDateStatusResponse
    {
        guard let status = await store.massExtensionStatus(requestIdentifier) else {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 404, errorCode: 4_040_009, message: "Mass extension request not found.",
                isRetryable: false)
        }
        return status
    }

    func setAppAccountToken(_ originalTransactionId: String, environment: String?, token: UUID) async throws {
        try await injectedFault("appAccountToken")
        guard let stored = await store.transaction(originalTransactionId) else {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 404, errorCode: 4_040_005, message: "Original transaction id not found.",
                isRetryable: false)
        }
        guard stored.payload.originalTransactionId == originalTransactionId else {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 400, errorCode: 4_000_187,
                message: "Transaction id is not an original transaction id.", isRetryable: false)
        }
        guard stored.payload.inAppOwnershipType != .familyShared else {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 400, errorCode: 4_000_185, message: "Family transactions are not supported.",
                isRetryable: false)
        }
        try await store.setAppAccountToken(originalTransactionId, token: token)
    }

    func lookUpOrderId(_ orderId: String) async throws -> [String] {
        try await injectedFault("lookUpOrderId")
        var signed: [String] = []
        for id in await store.transactions(ofOrder: orderId) ?? [] {
            signed.append(try await store.signTransaction(id))
        }
        return signed
    }

    func signedAppTransaction(_ anyTransactionId: String) async throws -> String {
        try await injectedFault("appTransaction")
        guard let owner = await store.owner(of: anyTransactionId),
            let signed = try await store.signAppTransaction(for: owner)
        else {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 404, errorCode: AppStoreAPIError.transactionIdNotFound,
                message: "Transaction id not found.", isRetryable: false)
        }
        return signed
    }

    func finishTransaction(_ transactionId: String, environment: String?) async throws {
        try await injectedFault("finish")
        guard await store.transaction(transactionId) != nil else {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 404, errorCode: AppStoreAPIError.transactionIdNotFound,
                message: "Transaction id not found.", isRetryable: false)
        }
        try await store.finish(transactionId)
    }

    func sendExternalReport(_ report: ExternalPurchaseReport, sandbox: Bool) async throws {
        try await injectedFault("externalReport")
        do {
            _ = try await store.receiveExternalReport(report)
        } catch {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 400, errorCode: error.code, message: error.message, isRetryable: false)
        }
    }

    func signedTransaction(_ transactionId: String) async throws -> String {
        // Faults set on the control API apply here as they do over HTTP (Apple down, 429…).
        try await injectedFault("transactionInfo")
        do {
            return try await store.signTransaction(transactionId)
        } catch {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: 404, errorCode: AppStoreAPIError.transactionIdNotFound,
                message: "Transaction id not found.", isRetryable: false)
        }
    }
}

/// Runs `body`, giving up after `deadline` (the caller then makes the work a durable job).
func withDeadline<T: Sendable>(_ deadline: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T
{
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: deadline)
            throw AppStoreAPIError(
                kind: .timeout, message: "Apple did not answer within \(deadline)", isRetryable: true)
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}
