import AppStoreModels
import AppStoreSigning
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// `POST /v1/retention/apple` (Apple's Get Retention Message) on the real server: the
/// catalog's rules with their holdout, one answer per request identifier, refusals of what
/// Apple did not sign for this app; the report; and the local App Store's cancel flow and
/// performance test against it over real sockets.
@Suite struct RetentionTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static func ask(_ relay: Relay, _ signedPayload: String) async throws -> API.Reply {
        try await API.call(
            relay.client, .post, "/v1/retention/apple", token: nil, body: #"{"signedPayload":"\#(signedPayload)"}"#)
    }

    static func request(
        _ relay: Relay, original: String, product: String = "pro_monthly", appAppleId: Int64 = 1_234_567_890,
        environment: AppStoreEnvironment = .production, signer: JWSSigner? = nil, id: String = UUID().uuidString
    ) async throws -> String {
        try (signer ?? relay.store.signer).sign(
            DecodedRealtimeRequestBody(
                originalTransactionId: original, appAppleId: appAppleId, productId: product, userLocale: "en-US",
                requestIdentifier: id, signedDate: Date().milliseconds, environment: environment))
    }

    @Test(arguments: API.databases)
    func rulesHoldoutRepeatsAndTheReport(kind: String) async throws {
        try await OfferTests.withRelay(kind) { relay in
            let (_, monthly) = try await relay.buy("ret", "pro_monthly")
            let original = try #require(monthly.originalTransactionId)
            let (_, yearly) = try await relay.buy("yan", "pro_yearly")
            try await relay.deliver()

            // pro_monthly: the `stay` offer (V2, transactionId = the original) to about half,
            // the rule's holdout `{}` to the rest.
            var answered = 0
            var held = 0
            for _ in 0..<40 {
                let reply = try await Self.ask(relay, try await Self.request(relay, original: original))
                #expect(reply.status == .ok, "\(reply.json)")
                if let offer = reply.json["promotionalOffer"] as? [String: Any] {
                    answered += 1
                    #expect(offer["messageIdentifier"] as? String == "22222222-2222-2222-2222-222222222222")
                    let jws = try #require(offer["promotionalOfferSignatureV2"] as? String)
                    let claims = try #require(relay.store.offerChecker.verifyV2(jws))
                    #expect(claims.transactionId == original && claims.offerIdentifier == "stay")
                    #expect(reply.json.count == 1)
                } else {
                    #expect(reply.json.isEmpty, "\(reply.json)")
                    held += 1
                }
            }
            #expect(answered > 5 && held > 5, "answered \(answered), holdout \(held)")
            // pro_yearly: switch plan to monthly.
            let switchPlan = try await Self.ask(
                relay,
                try await Self.request(
                    relay, original: try #require(yearly.originalTransactionId), product: "pro_yearly"))
            #expect((switchPlan.json["alternateProduct"] as? [String: Any])?["productId"] as? String == "pro_monthly")
            // Unknown subscription: no account, so no offer; the catch-all message.
            let stranger = try await Self.ask(relay, try await Self.request(relay, original: "424242"))
            #expect(
                (stranger.json["message"] as? [String: Any])?["messageIdentifier"] as? String
                    == "33333333-3333-3333-3333-333333333333")
            // An account with a second subscription in the group (another Apple ID): its whole
            // offer history is read; still eligible for the active-subscriber offer.
            let (_, second) = try await relay.buy("ret", "pro_yearly", appleId: "apple-ret-2")
            try await relay.deliver()
            var secondAnswered = false
            var extra = 0
            for _ in 0..<20 where !secondAnswered {
                extra += 1
                let reply = try await Self.ask(relay, try await Self.request(relay, original: original))
                #expect(reply.status == .ok)
                secondAnswered = reply.json["promotionalOffer"] != nil
            }
            #expect(secondAnswered)
            #expect(second.originalTransactionId != original)

            // The same request identifier again: the same answer, recorded once.
            let id = UUID().uuidString
            let once = try await Self.ask(relay, try await Self.request(relay, original: original, id: id))
            let again = try await Self.ask(relay, try await Self.request(relay, original: original, id: id))
            #expect(NSDictionary(dictionary: once.json) == NSDictionary(dictionary: again.json))

            // The customer then turns auto-renew off: every pro_monthly request counts as cancelled.
            try await relay.store.setAutoRenew(original, false)
            try await relay.deliver()
            let report = try await API.call(relay.client, .get, "/v1/retention/report")
            #expect(report.status == .ok)
            let rules = try #require(report.json["rules"] as? [[String: Any]])
            #expect(rules.map { $0["rule"] as? String } == ["yearly-switch", "monthly-offer", "rule-3"])
            let offerRule = rules[1]
            let shown = try #require(offerRule["answered"] as? [String: Any])
            let holdout = try #require(offerRule["holdout"] as? [String: Any])
            #expect((shown["requests"] as? Int ?? 0) + (holdout["requests"] as? Int ?? 0) == 41 + extra)
            #expect((shown["cancelled"] as? Int ?? 0) + (holdout["cancelled"] as? Int ?? 0) == 41 + extra)
            #expect(shown["saved"] as? Int == 0)
            #expect((rules[0]["answered"] as? [String: Any])?["requests"] as? Int == 1)
            #expect((rules[2]["answered"] as? [String: Any])?["requests"] as? Int == 1)
            #expect(try await API.call(relay.client, .get, "/v1/retention/report?since=soon").status == .badRequest)
        }
    }

    // Store-side or HTTP-level checks with no SQL of their own: SQLite is enough (keeps
    // the PostgreSQL suite's load within its deadlines on 2 cores).
    @Test(arguments: ["sqlite"])
    func anOfferRedeemedAfterTheAnswerCountsAsSaved(kind: String) async throws {
        try await OfferTests.withRelay(kind) { relay in
            let (_, bought) = try await relay.buy("keep", "pro_monthly")
            let original = try #require(bought.originalTransactionId)
            try await relay.deliver()
            var answered = false
            for _ in 0..<30 where !answered {
                let reply = try await Self.ask(relay, try await Self.request(relay, original: original))
                answered = reply.json["promotionalOffer"] != nil
            }
            #expect(answered)
            // The subscriber takes the offer (signed for their order): OFFER_REDEEMED, and the
            // next renewal carries it.
            let order = try await OfferTests.order(relay, "keep", offer: "stay")
            #expect(order.status == .created, "\(order.json)")
            _ = try await OfferTests.pay(relay, appleId: "apple-keep", reply: order, v2: true).get()
            #expect(try await relay.deliver() == ["OFFER_REDEEMED"])
            await relay.store.advance(by: 32 * 86_400)
            #expect(try await relay.deliver() == ["DID_RENEW"])
            let renewal = await relay.store.transactions.values.map(\.payload).filter {
                $0.originalTransactionId == original && $0.transactionReason == .renewal
            }
            #expect(renewal.first?.offerType == .promotionalOffer && renewal.first?.offerIdentifier == "stay")
            let rules = try await API.call(relay.client, .get, "/v1/retention/report").json["rules"] as? [[String: Any]]
            let shown = try #require(rules?[1]["answered"] as? [String: Any])
            #expect(shown["requests"] as? Int ?? 0 >= 1)
            #expect(shown["saved"] as? Int == shown["requests"] as? Int)
            #expect(shown["offerRedeemed"] as? Int == shown["requests"] as? Int)
            #expect(shown["cancelled"] as? Int == 0)
        }
    }

    // Store-side or HTTP-level checks with no SQL of their own: SQLite is enough (keeps
    // the PostgreSQL suite's load within its deadlines on 2 cores).
    @Test(arguments: ["sqlite"])
    func forgedOtherAppOtherEnvironmentAndBrokenRequestsAre400(kind: String) async throws {
        try await OfferTests.withRelay(kind, configure: { $0.environments = [.production] }) { relay in
            let (_, bought) = try await relay.buy("safe", "pro_monthly")
            let original = try #require(bought.originalTransactionId)
            let forger = try ApplePKI.generate(name: "Forged")
            let cases: [(String, String)] = [
                (try await Self.request(relay, original: original, signer: forger.jwsSigner), "forged chain"),
                (try await Self.request(relay, original: original, appAppleId: 99), "another app"),
                (
                    try await Self.request(relay, original: original, appAppleId: 99, environment: .sandbox),
                    "another app in Sandbox"
                ),
                (try await Self.request(relay, original: original, environment: .sandbox), "another environment"),
                (String(try await Self.request(relay, original: original).dropLast(20)), "truncated"),
                ("not.a.jws", "garbage"),
            ]
            for (payload, name) in cases {
                let reply = try await Self.ask(relay, payload)
                #expect(reply.status == .badRequest, "\(name): \(reply.json)")
                #expect(reply.errorCode != nil, "\(name)")
            }
            let empty = try await API.call(relay.client, .post, "/v1/retention/apple", token: nil, body: "{}")
            #expect(empty.status == .badRequest)
            let huge = try await API.call(
                relay.client, .post, "/v1/retention/apple", token: nil,
                body: #"{"signedPayload":"\#(String(repeating: "a", count: 2_000_000))"}"#)
            #expect(huge.status == .contentTooLarge)
            // Nothing was recorded for any of them.
            let report = try await API.call(relay.client, .get, "/v1/retention/report").json
            let rules = report["rules"] as? [[String: Any]] ?? []
            #expect(rules.allSatisfy { ($0["answered"] as? [String: Any])?["requests"] as? Int == 0 })
            #expect((report["unmatched"] as? [String: Any])?["requests"] as? Int == 0)
        }
    }

    static func performanceResult(_ client: any TestClientProtocol, _ requestId: String) async throws
        -> [String: Any]
    {
        var result: [String: Any] = [:]
        for _ in 0..<600 {
            result = try await API.call(
                client, .get, "/local-app-store/inApps/v1/messaging/performanceTest/result/\(requestId)"
            ).json
            if result["result"] as? String != "PENDING" { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        return result
    }

    /// The local App Store calls the server's endpoint over a socket, as Apple does.
    @Test func cancelFlowWithinBudgetDefaultFallbackAndPerformanceTest() async throws {
        try await API.withServer("sqlite", configure: { $0.catalog = OfferTests.catalog }) { app, _ in
            try await app.application().test(.live) { client in
                let relay = Relay(app, client)
                let store = relay.store
                let port = try #require(client.port)
                let (_, bought) = try await relay.buy("flow", "pro_monthly")
                let original = try #require(bought.originalTransactionId)
                for (id, header) in [
                    ("22222222-2222-2222-2222-222222222222", "Stay for less"),
                    ("33333333-3333-3333-3333-333333333333", "We'd miss you"),
                    ("44444444-4444-4444-4444-444444444444", "Default"),
                ] {
                    try await store.uploadMessage(id, header: header, body: "body")
                }
                try await store.setDefaultMessage(
                    productId: "pro_monthly", locale: "en-US", messageId: "44444444-4444-4444-4444-444444444444")
                func cancelFlow() async throws -> [String: Any] {
                    let reply = try await API.call(
                        client, .post, "/local-app-store/control/subscriptions/\(original)/cancel-flow", body: "{}")
                    #expect(reply.status == .ok, "\(reply.json)")
                    return reply.json
                }
                // No realtime URL yet: Apple's default message.
                var seen = try await cancelFlow()
                #expect(seen["shown"] as? String == "defaultMessage")
                #expect(seen["fallbackReason"] as? String == "NO_REALTIME_URL")
                // Configured through Apple's API path (bearer token; the secret key in this mode).
                let configured = try await API.call(
                    client, .put, "/local-app-store/inApps/v1/messaging/realtime/url",
                    body: #"{"realtimeURL":"http://127.0.0.1:\#(port)/v1/retention/apple"}"#)
                #expect(configured.status == .ok)
                // What the subscriber sees: the answer, or — when it misses Apple's 700 ms (a
                // loaded test machine) — the default message; never a wait past the budget.
                var kinds = Set<String>()
                for _ in 0..<12 {
                    seen = try await cancelFlow()
                    kinds.insert(seen["shown"] as? String ?? "")
                    if seen["shown"] as? String == "promotionalOffer" {
                        #expect(seen["header"] as? String == "Stay for less")
                        #expect(seen["offerIdentifier"] as? String == "stay")
                        #expect((seen["elapsedMilliseconds"] as? Int ?? 9_999) <= 700)
                    } else {
                        // The rule's holdout answered {}, or the answer came too late.
                        #expect(seen["shown"] as? String == "defaultMessage")
                        #expect(["EMPTY_RESPONSE", "TIMED_OUT"].contains(seen["fallbackReason"] as? String ?? ""))
                    }
                }
                #expect(kinds.isSubset(of: ["promotionalOffer", "defaultMessage"]))

                // Apple's performance test, run locally against the endpoint (a small run: the
                // suite shares two cores; Apple's 100 × 10 is `bench`-sized). Over HTTP: a bad
                // request and an unknown run are Apple's errors.
                let refused = try await API.call(
                    client, .post, "/local-app-store/inApps/v1/messaging/performanceTest",
                    body: #"{"originalTransactionId":"424242"}"#)
                #expect(refused.status == .badRequest)
                #expect(refused.json["errorCode"] as? Int == 4_000_006)
                let unknown = try await API.call(
                    client, .get, "/local-app-store/inApps/v1/messaging/performanceTest/result/\(UUID())")
                #expect(unknown.status == .notFound)
                let lenient = try await RetentionCaller(store: store).startPerformanceTest(
                    original,
                    config: .init(
                        maxConcurrentRequests: 2, totalRequests: 20, totalDuration: 60_000,
                        responseTimeThreshold: 10_000,
                        successRateThreshold: 95))
                let passed = try await Self.performanceResult(client, try #require(lenient.requestId))
                #expect(passed["result"] as? String == "PASS", "\(passed)")

                // A slow endpoint: the flow does not wait for it past Apple's budget.
                let slow = Router()
                slow.post("slow") { _, _ -> String in
                    try await Task.sleep(for: .seconds(10))
                    return "{}"
                }
                try await Application(router: slow).test(.live) { slowClient in
                    await store.setRealtimeURL("http://127.0.0.1:\(slowClient.port!)/slow")
                    let clock = ContinuousClock.now
                    let flow = try await RetentionCaller(store: store).cancelFlow(original)
                    // Far under the endpoint's 10 s, whatever else loads the machine.
                    #expect(ContinuousClock.now - clock < .seconds(10))
                    #expect(flow.shown == "defaultMessage")
                    #expect(flow.fallbackReason == "TIMED_OUT")
                }

                // The endpoint down: the default message, within budget.
                _ = try await API.call(
                    client, .put, "/local-app-store/inApps/v1/messaging/realtime/url",
                    body: #"{"realtimeURL":"http://127.0.0.1:1/v1/retention/apple"}"#)
                seen = try await cancelFlow()
                #expect(seen["shown"] as? String == "defaultMessage")
                #expect(seen["fallbackReason"] as? String == "NO_RESPONSE")
            }
        }
    }
}
