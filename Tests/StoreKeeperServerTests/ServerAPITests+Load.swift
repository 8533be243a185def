import AppStoreModels
import AppStoreSigning
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import JWTKit
import LocalAppStore
import NIOCore
import StoreKeeperCatalog
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// Concurrency, metrics, request ids and the client-token rate limit over HTTP.
extension ServerAPITests {
    @Test(arguments: databases)
    func sixtyFourConcurrentHTTPSubmissionsDeliverOnce(kind: String) async throws {
        try await Self.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("burst", items: [.init(productId: "coins_60")])
            let body = #"{"accountId":"c64","signedTransaction":"\#(bought.signedTransactions[0])"}"#
            let statuses = try await withThrowingTaskGroup(of: String?.self) { group in
                for _ in 0..<64 {
                    group.addTask {
                        try await Self.call(client, .post, "/v1/purchases", body: body).json["status"] as? String
                    }
                }
                return try await group.reduce(into: [String?]()) { $0.append($1) }
            }
            #expect(statuses.filter { $0 == "delivered" }.count == 1)
            #expect(statuses.filter { $0 == "already_delivered" }.count == 63)
            #expect(
                (try await Self.call(client, .get, "/v1/accounts/c64").json["balances"] as? [String: Int])?["coins"]
                    == 60)
        }
    }

    @Test func metricsAndRequestIds() async throws {
        try await Self.withServer("sqlite") { app, client in
            let bought = try await app.localAppStore!.buy("m", items: [.init(productId: "coins_60")])
            let body = #"{"accountId":"m1","signedTransaction":"\#(bought.signedTransactions[0])"}"#
            _ = try await Self.call(client, .post, "/v1/purchases", body: body)
            _ = try await Self.call(client, .post, "/v1/purchases", body: body)
            _ = try await Self.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"m1","signedTransaction":"x.y.z"}"#)
            let text = try await client.execute(
                uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(Self.secret)"]
            ) { String(buffer: $0.body) }
            #expect(text.contains("storekeeper_deliveries_total 1"))
            #expect(text.contains("storekeeper_duplicates_suppressed_total 1"))
            #expect(text.contains(#"storekeeper_proofs_rejected_total{code="invalid_signature"} 1"#))
            // The purchase carried no appAccountToken (bought without an order): the claim queues
            // Set App Account Token for the account (docs/external-purchases.md).
            #expect(text.contains("storekeeper_jobs_pending 1"))
            #expect(text.contains("storekeeper_anomalies_open 0"))
            #expect(text.contains("storekeeper_http_request_duration_seconds"))
            let tagged = try await client.execute(
                uri: "/healthz", method: .get, headers: [HTTPField.Name("X-Request-Id")!: "trace-123"]
            ) { $0.headers[HTTPField.Name("X-Request-Id")!] }
            #expect(tagged == "trace-123")
            let failed = try await Self.call(client, .get, "/v1/accounts/x", token: "nope")
            #expect(failed.headers[HTTPField.Name("X-Request-Id")!]?.isEmpty == false)
        }
    }

    @Test func clientTokensAreRateLimited() async throws {
        // Time stands still for the limiter: exactly the burst is admitted, whatever the machine's speed.
        let frozen = ContinuousClock.now
        try await Self.withServer("sqlite", clientRate: 5, rateLimitClock: { frozen }) { _, client in
            let token = try await Self.clientToken("busy")
            var statuses: [HTTPResponse.Status] = []
            for _ in 0..<8 {
                statuses.append(try await Self.call(client, .get, "/v1/accounts/busy", token: token).status)
            }
            #expect(statuses == Array(repeating: .ok, count: 5) + Array(repeating: .tooManyRequests, count: 3))
            let limited = try await Self.call(client, .get, "/v1/accounts/busy", token: token)
            #expect(limited.errorCode == "rate_limited")
            #expect(limited.headers[.retryAfter] == "1")
            #expect((limited.json["error"] as? [String: Any])?["retryable"] as? Bool == true)
            // Another account has its own bucket; secret keys are not limited unless configured.
            #expect(
                try await Self.call(client, .get, "/v1/accounts/calm", token: try await Self.clientToken("calm")).status
                    == .ok)
            for _ in 0..<20 { #expect(try await Self.call(client, .get, "/v1/accounts/busy").status == .ok) }
        }
    }
}
