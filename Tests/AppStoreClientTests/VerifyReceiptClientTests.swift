import AppStoreModels
import Foundation
import Synchronization
import Testing

@testable import AppStoreClient

/// The legacy verifyReceipt client against scripted production and sandbox endpoints.
@Suite struct VerifyReceiptClientTests {
    static let fastRetry = RetryPolicy(maxAttempts: 3, baseDelay: .milliseconds(5), maxDelay: .milliseconds(20))

    /// One server playing both hosts: `/production/verifyReceipt` and `/sandbox/verifyReceipt`.
    static func withApple(
        production: @escaping @Sendable (Int) -> ScriptedAppleServer.Response,
        sandbox: @escaping @Sendable (Int) -> ScriptedAppleServer.Response = { _ in .json(#"{"status":21008}"#) },
        retry: RetryPolicy = fastRetry, timeout: Duration = .seconds(30),
        _ body: (VerifyReceiptClient, ScriptedAppleServer) async throws -> Void
    ) async throws {
        let counts = Mutex((production: 0, sandbox: 0))
        let server = try await ScriptedAppleServer { request in
            if request.path.hasPrefix("/production") {
                return production(
                    counts.withLock {
                        $0.production += 1
                        return $0.production
                    })
            }
            return sandbox(
                counts.withLock {
                    $0.sandbox += 1
                    return $0.sandbox
                })
        }
        let client = VerifyReceiptClient(
            configuration: .init(
                productionURL: server.baseURL + "/production/verifyReceipt",
                sandboxURL: server.baseURL + "/sandbox/verifyReceipt", sharedSecret: "cafe01",
                excludeOldTransactions: true, timeout: timeout, retryPolicy: retry))
        do {
            try await body(client, server)
        } catch {
            try await server.shutdown()
            throw error
        }
        try await server.shutdown()
    }

    static func hits(_ server: ScriptedAppleServer) -> [String] {
        server.requests.map { $0.path.hasPrefix("/production") ? "production" : "sandbox" }
    }

    static let valid = #"{"status":0,"environment":"Production","receipt":{"bundle_id":"com.example.app","in_app":[]}}"#

    @Test func productionReceiptAnswersFromProduction() async throws {
        try await Self.withApple(production: { _ in .json(Self.valid) }) { client, server in
            let result = try await client.verify(receiptData: "MIIabc")
            #expect(result.environment == .production)
            #expect(result.response.receipt?.bundleId == "com.example.app")
            #expect(Self.hits(server) == ["production"])
            let body = try JSONSerialization.jsonObject(with: Data(server.requests[0].body)) as! [String: Any]
            #expect(body["receipt-data"] as? String == "MIIabc")
            #expect(body["password"] as? String == "cafe01")
            #expect(body["exclude-old-transactions"] as? Bool == true)
            #expect(server.requests[0].method == "POST")
            #expect(server.requests[0].header("Content-Type") == "application/json")
        }
    }

    @Test func sandboxReceiptAtProductionIsResentToSandbox() async throws {
        try await Self.withApple(
            production: { _ in .json(#"{"status":21007}"#) },
            sandbox: { _ in .json(#"{"status":0,"environment":"Sandbox"}"#) }
        ) { client, server in
            let result = try await client.verify(receiptData: "MIIsandbox")
            #expect(result.environment == .sandbox)
            #expect(Self.hits(server) == ["production", "sandbox"])
            #expect(server.requests[0].body == server.requests[1].body)
        }
    }

    @Test func productionReceiptAtSandboxIsResentToProduction() async throws {
        try await Self.withApple(production: { _ in .json(Self.valid) }) { client, server in
            let result = try await client.verify(receiptData: "MII", startingAt: .sandbox)
            #expect(result.environment == .production)
            #expect(Self.hits(server) == ["sandbox", "production"])
        }
    }

    @Test func environmentsNeverPingPong() async throws {
        try await Self.withApple(
            production: { _ in .json(#"{"status":21007}"#) }, sandbox: { _ in .json(#"{"status":21008}"#) }
        ) { client, server in
            await ServerAPIClientTests.expectAPIError({ $0.errorCode == 21008 && !$0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
            #expect(Self.hits(server) == ["production", "sandbox"])
        }
    }

    @Test(arguments: [
        (Int64(21000), false), (21001, false), (21003, false), (21004, false), (21010, false), (21099, false),
    ])
    func permanentStatusesAreNotRetried(status: Int64, retryable: Bool) async throws {
        try await Self.withApple(production: { _ in .json(#"{"status":\#(status)}"#) }) { client, server in
            await ServerAPIClientTests.expectAPIError({ $0.errorCode == status && $0.isRetryable == retryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
            #expect(server.requests.count == 1)
        }
    }

    @Test(arguments: [Int64(21002), 21005, 21009])
    func transientStatusesAreRetriedThenReported(status: Int64) async throws {
        try await Self.withApple(production: { _ in .json(#"{"status":\#(status)}"#) }) { client, server in
            await ServerAPIClientTests.expectAPIError({ $0.errorCode == status && $0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
            #expect(server.requests.count == 3)
        }
        // ...and a retry that succeeds is a success.
        try await Self.withApple(production: { call in call == 1 ? .json(#"{"status":\#(status)}"#) : .json(Self.valid)
        }) {
            client, server in
            let result = try await client.verify(receiptData: "MII")
            #expect(result.response.status == 0)
            #expect(server.requests.count == 2)
        }
    }

    @Test func internalErrorsFollowIsRetryable() async throws {
        try await Self.withApple(production: { _ in .json(#"{"status":21100,"is_retryable":true}"#) }) { client, _ in
            await ServerAPIClientTests.expectAPIError({ $0.errorCode == 21100 && $0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
        }
        try await Self.withApple(production: { _ in .json(#"{"status":21199,"is-retryable":false}"#) }) {
            client, server in
            await ServerAPIClientTests.expectAPIError({ $0.errorCode == 21199 && !$0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
            #expect(server.requests.count == 1)
        }
    }

    @Test func expiredIOS6SubscriptionReceiptIsStillDecoded() async throws {
        try await Self.withApple(production: { _ in .json(#"{"status":21006,"receipt":{"bundle_id":"b"}}"#) }) {
            client, _ in
            let result = try await client.verify(receiptData: "MII")
            #expect(result.response.receipt?.bundleId == "b")
        }
    }

    @Test func transportFailuresAreRetryable() async throws {
        try await Self.withApple(production: { _ in .init(status: 503, body: []) }, retry: .none) { client, _ in
            await ServerAPIClientTests.expectAPIError({ $0.httpStatus == 503 && $0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
        }
        try await Self.withApple(production: { _ in .json("<html>maintenance</html>") }, retry: .none) { client, _ in
            await ServerAPIClientTests.expectAPIError({ $0.kind == .malformedResponse && $0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
        }
        try await Self.withApple(production: { _ in .json(#"{"receipt":{}}"#) }, retry: .none) { client, _ in
            await ServerAPIClientTests.expectAPIError({ $0.kind == .malformedResponse }) {
                _ = try await client.verify(receiptData: "MII")
            }
        }
        try await Self.withApple(
            production: { _ in .init(status: 200, body: Array(Self.valid.utf8), delay: .seconds(1)) }, retry: .none,
            timeout: .milliseconds(200)
        ) { client, _ in
            await ServerAPIClientTests.expectAPIError({ $0.kind == .timeout && $0.isRetryable }) {
                _ = try await client.verify(receiptData: "MII")
            }
        }
    }

    @Test func defaultURLsAreApples() {
        let configuration = VerifyReceiptClient.Configuration()
        #expect(configuration.productionURL == "https://buy.itunes.apple.com/verifyReceipt")
        #expect(configuration.sandboxURL == "https://sandbox.itunes.apple.com/verifyReceipt")
    }
}
