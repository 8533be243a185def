import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import AsyncHTTPClient
import Crypto
import Foundation
import JWTKit
import Synchronization
import Testing

@testable import AppStoreClient

/// The App Store Server API client against an in-process server playing Apple.
@Suite struct ServerAPIClientTests {
    static let key = P256.Signing.PrivateKey()
    static let credentials = ServerAPICredentials(
        issuerId: "57246542-96fe-1a63-e053-0824d011072a", keyId: "2X9R4HXF34", privateKeyPEM: key.pemRepresentation,
        bundleId: "com.example.app")
    static let fastRetry = RetryPolicy(
        maxAttempts: 3, baseDelay: .milliseconds(5), maxDelay: .milliseconds(20), maxRetryAfterWait: .seconds(2))

    /// A generous deadline by default: the tests count attempts, and in a full test run on two
    /// cores an answer can wait its turn long enough for a short deadline to retry it.
    /// A client of `server`. Its deadline is long: the tests count attempts, and on a machine
    /// running every suite at once an answer once took over 120 s to arrive, a transport timeout the
    /// client rightly retried (a 401 was counted twice).
    static func client(_ server: ScriptedAppleServer, retry: RetryPolicy = fastRetry, timeout: Duration = .seconds(900))
        async throws -> AppStoreServerAPIClient
    {
        try await AppStoreServerAPIClient(
            configuration: .init(
                credentials: credentials, environment: .sandbox, baseURL: server.baseURL, timeout: timeout,
                retryPolicy: retry))
    }

    static func withServer(
        _ handler: @escaping ScriptedAppleServer.Handler, _ body: (ScriptedAppleServer) async throws -> Void
    ) async throws {
        let server = try await ScriptedAppleServer(handler: handler)
        do {
            try await body(server)
        } catch {
            try await server.shutdown()
            throw error
        }
        try await server.shutdown()
    }

    static func expectAPIError(
        _ check: (AppStoreAPIError) -> Bool, sourceLocation: SourceLocation = #_sourceLocation,
        _ body: () async throws -> Void
    ) async {
        do {
            try await body()
            Issue.record("expected an AppStoreAPIError", sourceLocation: sourceLocation)
        } catch let error as AppStoreAPIError {
            #expect(check(error), "\(error)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("unexpected \(error)", sourceLocation: sourceLocation)
        }
    }

    @Test func tokenCarriesApplesClaimsAndVerifies() async throws {
        try await Self.withServer({ _ in .json(#"{"signedTransactionInfo":"x.y.z"}"#) }) { server in
            let asked = Date()
            _ = try await Self.client(server).getTransactionInfo("1")
            let answered = Date()
            let authorization = try #require(server.requests.first?.header("Authorization"))
            #expect(authorization.hasPrefix("Bearer "))
            let token = String(authorization.dropFirst("Bearer ".count))
            let keys = await JWTKeyCollection().add(
                ecdsa: try ES256PublicKey(pem: Self.key.publicKey.pemRepresentation))
            let claims = try await keys.verify(token, as: ServerAPIClaims.self)
            #expect(claims.iss.value == Self.credentials.issuerId)
            #expect(claims.bid == "com.example.app")
            #expect(claims.aud.value == ["appstoreconnect-v1"])
            #expect(claims.exp.value.timeIntervalSince(claims.iat.value) <= 3600)
            // Issued for this call: between asking and the answer (seconds, so ±1 s).
            #expect(
                claims.iat.value >= asked.addingTimeInterval(-1) && claims.iat.value <= answered.addingTimeInterval(1))
            let header =
                try JSONSerialization.jsonObject(
                    with: Data(base64Encoded: base64(token.split(separator: ".")[0]))!) as! [String: Any]
            #expect(header["alg"] as? String == "ES256")
            #expect(header["kid"] as? String == "2X9R4HXF34")
            #expect(header["typ"] as? String == "JWT")
            // A token signed by another key does not verify.
            let otherKeys = await JWTKeyCollection().add(
                ecdsa: try ES256PublicKey(pem: P256.Signing.PrivateKey().publicKey.pemRepresentation))
            await #expect(throws: (any Error).self) { _ = try await otherKeys.verify(token, as: ServerAPIClaims.self) }
        }
    }

    @Test func transactionInfoReturnsVerifiableJWS() async throws {
        let pki = try ApplePKI.generate(includeReceiptChain: false)
        let jws = try pki.jwsSigner.sign(
            JWSTransactionDecodedPayload(
                transactionId: "42", bundleId: "com.example.app", signedDate: 1_767_225_605_000, environment: .sandbox))
        try await Self.withServer({ request in
            request.path == "/inApps/v1/transactions/42"
                ? .encoded(TransactionInfoResponse(signedTransactionInfo: jws)) : .json("{}", status: 404)
        }) { server in
            let response = try await Self.client(server).getTransactionInfo("42")
            let verifier = try SignedDataVerifier(
                .init(trustedRoots: [pki.root.derBytes], bundleId: "com.example.app", environments: [.sandbox]))
            #expect(try await verifier.verifyTransaction(response.signedTransactionInfo!).transactionId == "42")
            #expect(server.requests.first?.method == "GET")
            #expect(server.requests.first?.header("Accept") == "application/json")
        }
    }

    @Test func historyFollowsRevisionsWithTheSameFilters() async throws {
        try await Self.withServer({ request in
            let revision = request.query.first { $0.0 == "revision" }?.1
            switch revision {
            case nil: return .encoded(HistoryResponse(revision: "r1", hasMore: true, signedTransactions: ["a", "b"]))
            case "r1": return .encoded(HistoryResponse(revision: "r2", hasMore: true, signedTransactions: ["c"]))
            default: return .encoded(HistoryResponse(revision: "r3", hasMore: false, signedTransactions: ["d"]))
            }
        }) { server in
            let filter = TransactionHistoryFilter(
                startDate: 1, productTypes: [.consumable, .autoRenewable], sort: .descending, revoked: false)
            let all = try await Self.client(server).getAllTransactionHistory("7", filter: filter)
            #expect(all == ["a", "b", "c", "d"])
            #expect(server.requests.count == 3)
            for request in server.requests {
                #expect(request.path == "/inApps/v2/history/7")
                let query = request.query.filter { $0.0 != "revision" }.map { "\($0.0)=\($0.1)" }
                #expect(
                    query == [
                        "startDate=1", "productType=CONSUMABLE", "productType=AUTO_RENEWABLE", "sort=DESCENDING",
                        "revoked=false",
                    ])
            }
            #expect(server.requests.map { $0.query.first { $0.0 == "revision" }?.1 } == [nil, "r1", "r2"])
        }
    }

    @Test func historyThatNeverEndsIsBounded() async throws {
        let counter = Mutex(0)
        try await Self.withServer({ _ in
            let next = counter.withLock {
                $0 += 1
                return $0
            }
            return .encoded(HistoryResponse(revision: "r\(next)", hasMore: true, signedTransactions: []))
        }) { server in
            await Self.expectAPIError({ $0.kind == .malformedResponse }) {
                _ = try await Self.client(server, retry: .none).getAllTransactionHistory("7", maxPages: 5)
            }
            #expect(server.requests.count == 5)
        }
    }

    @Test func everyEndpointUsesApplesMethodPathAndBody() async throws {
        try await Self.withServer({ request in
            switch (request.method, request.path) {
            case ("GET", "/inApps/v1/subscriptions/9"):
                return .encoded(StatusResponse(environment: .sandbox, data: [.init(subscriptionGroupIdentifier: "g")]))
            case ("GET", "/inApps/v2/refund/lookup/9"):
                return .encoded(RefundHistoryResponse(signedTransactions: [], hasMore: false))
            case ("POST", "/inApps/v1/notifications/history"):
                let token = request.query.first { $0.0 == "paginationToken" }?.1
                return .encoded(
                    NotificationHistoryResponse(
                        paginationToken: token == nil ? "p2" : "p3", hasMore: token == nil,
                        notificationHistory: [.init(signedPayload: token ?? "first")]))
            case ("PUT", "/inApps/v2/transactions/consumption/9"): return .init(status: 202, body: [])
            case ("PUT", "/inApps/v1/transactions/consumption/9"): return .init(status: 202, body: [])
            case ("PUT", "/inApps/v1/subscriptions/extend/9"):
                return .encoded(ExtendRenewalDateResponse(originalTransactionId: "9", success: true, effectiveDate: 5))
            case ("POST", "/inApps/v1/subscriptions/extend/mass"):
                return .encoded(MassExtendRenewalDateResponse(requestIdentifier: "m"))
            case ("GET", "/inApps/v1/subscriptions/extend/mass/pro/m"):
                return .encoded(MassExtendRenewalDateStatusResponse(requestIdentifier: "m", complete: true))
            case ("PUT", "/inApps/v1/transactions/9/appAccountToken"): return .init(status: 200, body: [])
            case ("POST", "/inApps/v1/notifications/test"):
                return .encoded(SendTestNotificationResponse(testNotificationToken: "t-1"))
            case ("GET", "/inApps/v1/notifications/test/t-1"):
                return .encoded(CheckTestNotificationResponse(signedPayload: "s"))
            case ("POST", "/inApps/v1/transactions/9/finish"): return .init(status: 200, body: [])
            case ("GET", "/inApps/v1/lookup/ORDER1"):
                return .encoded(OrderLookupResponse(status: .valid, signedTransactions: ["x"]))
            case ("GET", "/inApps/v1/transactions/appTransactions/9"):
                return .encoded(AppTransactionInfoResponse(signedAppTransactionInfo: "a"))
            default: return .json(#"{"errorCode":4000000,"errorMessage":"bad"}"#, status: 400)
            }
        }) { server in
            let client = try await Self.client(server)
            #expect(
                try await client.getAllSubscriptionStatuses("9", status: [.active, .billingGracePeriod]).data?.count
                    == 1)
            #expect(server.requests.last?.query.map { "\($0.0)=\($0.1)" } == ["status=1", "status=4"])
            #expect(try await client.getRefundHistory("9").hasMore == false)
            let history = NotificationHistoryRequest(startDate: 1, endDate: 2, onlyFailures: true)
            #expect(try await client.getAllNotificationHistory(history).map(\.signedPayload) == ["first", "p2"])
            let bodies = server.requests.filter { $0.path == "/inApps/v1/notifications/history" }.map(\.body)
            #expect(bodies.count == 2 && bodies[0] == bodies[1])
            #expect(try JSONDecoder().decode(NotificationHistoryRequest.self, from: Data(bodies[0])) == history)
            try await client.sendConsumptionInformation(
                "9",
                ConsumptionRequest(customerConsented: true, sampleContentProvided: false, deliveryStatus: .delivered))
            #expect(
                try JSONDecoder().decode(ConsumptionRequest.self, from: Data(server.requests.last!.body)).deliveryStatus
                    == .delivered)
            try await client.sendConsumptionInformationV1("9", ConsumptionRequestV1(customerConsented: true))
            let extended = try await client.extendSubscriptionRenewalDate(
                "9",
                ExtendRenewalDateRequest(
                    extendByDays: 7, extendReasonCode: .serviceIssueOrOutage, requestIdentifier: "r"))
            #expect(extended.effectiveDate == 5)
            #expect(
                try await client.extendRenewalDatesForAllActiveSubscribers(.init(productId: "pro")).requestIdentifier
                    == "m")
            #expect(
                try await client.getStatusOfSubscriptionRenewalDateExtensions(productId: "pro", requestIdentifier: "m")
                    .complete == true)
            let token = UUID()
            try await client.setAppAccountToken("9", appAccountToken: token)
            #expect(
                try JSONDecoder().decode(UpdateAppAccountTokenRequest.self, from: Data(server.requests.last!.body))
                    .appAccountToken == token.uuidString.lowercased())
            #expect(server.requests.last?.header("Content-Type") == "application/json")
            let test = try await client.requestTestNotification()
            #expect(try await client.getTestNotificationStatus(test.testNotificationToken!).signedPayload == "s")
            try await client.finishTransaction("9")
            #expect(try await client.lookUpOrderId("ORDER1").status == .valid)
            #expect(try await client.getAppTransactionInfo("9").signedAppTransactionInfo == "a")
            // Identifiers are path segments, never paths.
            await Self.expectAPIError({ !$0.isRetryable }) { _ = try await client.getTransactionInfo("") }
            _ = try? await client.getTransactionInfo("../../etc")
            #expect(server.requests.last?.path == "/inApps/v1/transactions/..%2F..%2Fetc")
        }
    }

    @Test func errorsAreClassifiedAsApplesSpecSays() async throws {
        let script: [String: ScriptedAppleServer.Response] = [
            "401": .init(status: 401, headers: [], body: []),
            "4040010": .json(#"{"errorCode":4040010,"errorMessage":"Transaction id not found."}"#, status: 404),
            "4000006": .json(#"{"errorCode":4000006,"errorMessage":"Invalid transaction id."}"#, status: 400),
            "4040006": .json(#"{"errorCode":4040006,"errorMessage":"retry"}"#, status: 404),
            "5000001": .json(#"{"errorCode":5000001,"errorMessage":"retry"}"#, status: 500),
            "503": .init(status: 503, headers: [], body: Array("<html>down</html>".utf8)),
            "malformed": .json("this is not json"),
            "wrongshape": .json(#"{"signedTransactionInfo":42}"#),
        ]
        try await Self.withServer({ request in
            script[String(request.path.split(separator: "/").last!)] ?? .json("{}", status: 418)
        }) { server in
            let client = try await Self.client(server)
            func attempts(_ id: String) -> Int { server.requests.filter { $0.path.hasSuffix("/\(id)") }.count }
            await Self.expectAPIError({ $0.kind == .unauthorized && !$0.isRetryable }) {
                _ = try await client.getTransactionInfo("401")
            }
            #expect(attempts("401") == 1)
            await Self.expectAPIError({ $0.errorCode == 4_040_010 && !$0.isRetryable && $0.httpStatus == 404 }) {
                _ = try await client.getTransactionInfo("4040010")
            }
            #expect(attempts("4040010") == 1)
            await Self.expectAPIError({ $0.errorCode == 4_000_006 && !$0.isRetryable }) {
                _ = try await client.getTransactionInfo("4000006")
            }
            await Self.expectAPIError({ $0.errorCode == 4_040_006 && $0.isRetryable }) {
                _ = try await client.getTransactionInfo("4040006")
            }
            #expect(attempts("4040006") == 3)
            await Self.expectAPIError({ $0.errorCode == 5_000_001 && $0.isRetryable }) {
                _ = try await client.getTransactionInfo("5000001")
            }
            await Self.expectAPIError({ $0.kind == .httpStatus && $0.httpStatus == 503 && $0.isRetryable }) {
                _ = try await client.getTransactionInfo("503")
            }
            #expect(attempts("503") == 3)
            await Self.expectAPIError({ $0.kind == .malformedResponse }) {
                _ = try await client.getTransactionInfo("malformed")
            }
            await Self.expectAPIError({ $0.kind == .malformedResponse }) {
                _ = try await client.getTransactionInfo("wrongshape")
            }
            await Self.expectAPIError({ $0.httpStatus == 418 && !$0.isRetryable }) {
                _ = try await client.getTransactionInfo("teapot")
            }
        }
    }

    @Test func rateLimitHonoursRetryAfter() async throws {
        let calls = Mutex(0)
        try await Self.withServer({ request in
            let call = calls.withLock {
                $0 += 1
                return $0
            }
            if request.path.hasSuffix("/far") {
                let later = Int64((Date().timeIntervalSince1970 + 3600) * 1000)
                return .init(
                    status: 429, headers: [("Retry-After", String(later)), ("Content-Type", "application/json")],
                    body: Array(#"{"errorCode":4290000,"errorMessage":"Rate limit exceeded."}"#.utf8))
            }
            if call == 1 {
                let soon = Int64((Date().timeIntervalSince1970 + 0.3) * 1000)
                return .init(
                    status: 429, headers: [("Retry-After", String(soon))],
                    body: Array(#"{"errorCode":4290000,"errorMessage":"Rate limit exceeded."}"#.utf8))
            }
            return .json(#"{"signedTransactionInfo":"a.b.c"}"#)
        }) { server in
            let client = try await Self.client(server)
            let started = ContinuousClock.now
            #expect(try await client.getTransactionInfo("soon").signedTransactionInfo == "a.b.c")
            // It waited for Retry-After rather than the 5 ms backoff.
            #expect(ContinuousClock.now - started >= .milliseconds(200))
            await Self.expectAPIError({
                $0.kind == .rateLimited && $0.isRetryable && $0.errorCode == 4_290_000
                    && ($0.retryAfter?.timeIntervalSinceNow ?? 0) > 3000
            }) { _ = try await client.getTransactionInfo("far") }
            #expect(server.requests.filter { $0.path.hasSuffix("/far") }.count == 1)
        }
    }

    @Test func timeoutsAndDeadNetworkAreRetryable() async throws {
        try await Self.withServer({ _ in .init(status: 200, body: Array("{}".utf8), delay: .seconds(1)) }) { server in
            let client = try await Self.client(server, retry: .none, timeout: .milliseconds(200))
            await Self.expectAPIError({ $0.kind == .timeout && $0.isRetryable }) {
                _ = try await client.getTransactionInfo("1")
            }
        }
        let closed = try await ScriptedAppleServer(handler: { _ in .json("{}") })
        let client = try await Self.client(closed, retry: .none, timeout: .milliseconds(300))
        try await closed.shutdown()
        // Refused connections: AHC reports the refusal, or its deadline if it was still retrying.
        await Self.expectAPIError({ ($0.kind == .network || $0.kind == .timeout) && $0.isRetryable }) {
            _ = try await client.getTransactionInfo("1")
        }
    }

    @Test func environmentFallbackFindsSandboxIds() async throws {
        try await Self.withServer({ _ in .json(#"{"errorCode":4040010,"errorMessage":"not found"}"#, status: 404) }) {
            production in
            try await Self.withServer({ _ in .json(#"{"signedTransactionInfo":"sandbox.jws.here"}"#) }) { sandbox in
                let fallback = EnvironmentFallback(
                    production: try await Self.client(production), sandbox: try await Self.client(sandbox))
                #expect(try await fallback.getTransactionInfo("77").signedTransactionInfo == "sandbox.jws.here")
                #expect(production.requests.count == 1 && sandbox.requests.count == 1)
                let productionOnly = EnvironmentFallback(production: try await Self.client(production), sandbox: nil)
                await Self.expectAPIError({ $0.errorCode == 4_040_010 }) {
                    _ = try await productionOnly.getTransactionInfo("77")
                }
            }
        }
    }

    @Test func defaultHostsAreApples() async throws {
        let production = try await AppStoreServerAPIClient(configuration: .init(credentials: Self.credentials))
        #expect(production.configuration.resolvedBaseURL == "https://api.storekit.apple.com")
        let sandbox = try await AppStoreServerAPIClient(
            configuration: .init(credentials: Self.credentials, environment: .sandbox))
        #expect(sandbox.configuration.resolvedBaseURL == "https://api.storekit-sandbox.apple.com")
        await #expect(throws: (any Error).self) {
            _ = try await AppStoreServerAPIClient(
                configuration: .init(
                    credentials: .init(issuerId: "i", keyId: "k", privateKeyPEM: "not a key", bundleId: "b")))
        }
    }
}

func base64<S: StringProtocol>(_ url: S) -> String {
    var text = url.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while text.count % 4 != 0 { text += "=" }
    return text
}
