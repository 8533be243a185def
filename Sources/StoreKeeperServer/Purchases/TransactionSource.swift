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
}

public struct ServerAPITransactionSource: TransactionSource {
    let lookup: EnvironmentFallback

    public init(production: AppStoreServerAPIClient, sandbox: AppStoreServerAPIClient?) {
        lookup = EnvironmentFallback(production: production, sandbox: sandbox)
    }

    public func signedTransaction(_ transactionId: String) async throws -> String {
        guard let signed = try await lookup.getTransactionInfo(transactionId).signedTransactionInfo else {
            throw AppStoreAPIError(
                kind: .malformedResponse, message: "Apple answered without signedTransactionInfo", isRetryable: true)
        }
        return signed
    }

    public func sendConsumption(_ transactionId: String, environment: String?, _ request: ConsumptionRequest)
        async throws
    {
        let client =
            environment == AppStoreEnvironment.sandbox.rawValue
            ? lookup.sandbox ?? lookup.production : lookup.production
        try await client.sendConsumptionInformation(transactionId, request)
    }
}

struct LocalTransactionSource: TransactionSource {
    let store: LocalAppStore

    func sendConsumption(_ transactionId: String, environment: String?, _ request: ConsumptionRequest) async throws {
        do {
            try await store.receiveConsumption(transactionId, request)
        } catch {
            throw AppStoreAPIError(
                kind: .apple, httpStatus: error.status, errorCode: error.code,
                message: "Send Consumption Information refused", isRetryable: false)
        }
    }

    func signedTransaction(_ transactionId: String) async throws -> String {
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
