import AppStoreModels

/// Transaction lookups for ids of unknown environment: production first, then sandbox on
/// `TransactionIdNotFoundError` (server-api.md §1). App Review buys in sandbox against
/// production builds; this is how such an id is still found.
public struct EnvironmentFallback: Sendable {
    public let production: AppStoreServerAPIClient
    public let sandbox: AppStoreServerAPIClient?

    public init(production: AppStoreServerAPIClient, sandbox: AppStoreServerAPIClient?) {
        self.production = production
        self.sandbox = sandbox
    }

    /// Get Transaction Info in whichever environment knows the id.
    public func getTransactionInfo(_ transactionId: String) async throws -> TransactionInfoResponse {
        do {
            return try await production.getTransactionInfo(transactionId)
        } catch let error as AppStoreAPIError where error.errorCode == AppStoreAPIError.transactionIdNotFound {
            guard let sandbox else { throw error }
            return try await sandbox.getTransactionInfo(transactionId)
        }
    }

    /// Get App Transaction Info in whichever environment knows the id.
    public func getAppTransactionInfo(_ anyTransactionId: String) async throws -> AppTransactionInfoResponse {
        do {
            return try await production.getAppTransactionInfo(anyTransactionId)
        } catch let error as AppStoreAPIError where error.errorCode == AppStoreAPIError.transactionIdNotFound {
            guard let sandbox else { throw error }
            return try await sandbox.getAppTransactionInfo(anyTransactionId)
        }
    }
}
