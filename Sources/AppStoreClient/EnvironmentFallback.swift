import AppStoreModels

/// The App Store Server API of a deployment: for each of its App Store apps a Production
/// client and, when Sandbox data is accepted, a Sandbox one. Look-ups by transaction id try
/// Production first, then Sandbox (Apple's documented order), then the next app's: Apple
/// answers "not found" for an id of another environment or of another app.
public struct EnvironmentFallback: Sendable {
    public let production: AppStoreServerAPIClient
    public let sandbox: AppStoreServerAPIClient?
    /// The deployment's other App Store apps, in configuration order.
    public let otherApps: [EnvironmentFallback]

    public init(
        production: AppStoreServerAPIClient, sandbox: AppStoreServerAPIClient?, otherApps: [EnvironmentFallback] = []
    ) {
        self.production = production
        self.sandbox = sandbox
        self.otherApps = otherApps.flatMap {
            [EnvironmentFallback(production: $0.production, sandbox: $0.sandbox)] + $0.otherApps
        }
    }

    /// Every client, in the order look-ups try them: this app's Production, its Sandbox, then
    /// each other app's.
    public var allClients: [AppStoreServerAPIClient] {
        ([self] + otherApps).flatMap { [$0.production] + ($0.sandbox.map { [$0] } ?? []) }
    }

    /// The clients of `environment` (Production when nil or unknown; an app without Sandbox
    /// answers with its Production client), one per app.
    public func clients(_ environment: String?) -> [AppStoreServerAPIClient] {
        ([self] + otherApps).map {
            environment == AppStoreEnvironment.sandbox.rawValue ? $0.sandbox ?? $0.production : $0.production
        }
    }

    /// Whether `error` is Apple's "no such id here" — another environment's or another app's.
    public static func isNotFound(_ error: any Error) -> Bool {
        guard let error = error as? AppStoreAPIError, let code = error.errorCode else { return false }
        return code == AppStoreAPIError.transactionIdNotFound || code == AppStoreAPIError.originalTransactionIdNotFound
    }

    /// `body` on each of `clients` in turn until one knows the id; the last "not found" otherwise.
    public static func first<T: Sendable>(
        _ clients: [AppStoreServerAPIClient], _ body: (AppStoreServerAPIClient) async throws -> T
    ) async throws -> T {
        var lastError: (any Error)?
        for client in clients {
            do {
                return try await body(client)
            } catch  where isNotFound(error) {
                lastError = error
            }
        }
        throw lastError
            ?? AppStoreAPIError(kind: .malformedResponse, message: "no App Store client", isRetryable: false)
    }

    /// Get Transaction Info in whichever environment and app knows the id.
    public func getTransactionInfo(_ transactionId: String) async throws -> TransactionInfoResponse {
        try await Self.first(allClients) { try await $0.getTransactionInfo(transactionId) }
    }

    /// Get App Transaction Info in whichever environment and app knows the id.
    public func getAppTransactionInfo(_ anyTransactionId: String) async throws -> AppTransactionInfoResponse {
        try await Self.first(allClients) { try await $0.getAppTransactionInfo(anyTransactionId) }
    }
}
