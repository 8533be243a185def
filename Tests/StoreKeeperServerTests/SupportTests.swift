import AppStoreModels
import Foundation
import Hummingbird
import HummingbirdTesting
import StoreKeeperStorage
import Testing

@testable import LocalAppStore
@testable import StoreKeeperServer

/// Customer support (docs/api.md, secret key) on the real server: renewal-date extensions through
/// the job queue to the local App Store (Apple's rules, the same request identifier on every
/// retry), mass extensions with their status, and operator grants that end on time.
@Suite struct SupportTests {
    typealias API = ServerAPITests
    typealias Relay = NotificationTests.Relay

    static func extend(_ relay: Relay, _ original: String, days: Int = 10, reason: String = "service_issue")
        async throws -> API.Reply
    {
        try await API.call(
            relay.client, .post, "/v1/subscriptions/\(original)/extend",
            body: #"{"days":\#(days),"reason":"\#(reason)","note":"outage on 2026-11-20"}"#)
    }

    static func extensions(_ relay: Relay, _ original: String) async throws -> [[String: Any]] {
        try await API.call(relay.client, .get, "/v1/subscriptions/\(original)/extensions").json["extensions"]
            as? [[String: Any]] ?? []
    }

    static func expiry(_ relay: Relay, _ account: String) async throws -> Date? {
        (try await relay.subscription(account)?["expiresAt"] as? String).flatMap(StoreKeeperApp.parseDate)
    }

    @Test(arguments: API.databases)
    func extendTwiceThenTheLimitWithTheEngineApplyingIt(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let (_, first) = try await relay.buy("ext", "pro_monthly")
            let original = try #require(first.originalTransactionId)
            try await relay.deliver()
            let before = try #require(try await Self.expiry(relay, "ext"))

            let accepted = try await Self.extend(relay, original)
            #expect(accepted.status == .accepted, "\(accepted.json)")
            #expect(accepted.json["status"] as? String == "pending")
            let requestId = try #require(accepted.json["requestId"] as? String)
            await relay.apply()
            let done = try await API.call(relay.client, .get, "/v1/extensions/\(requestId)")
            #expect(done.json["status"] as? String == "succeeded", "\(done.json)")
            // Apple's answer moved the renewal date (read back signed), then RENEWAL_EXTENDED arrives.
            let after = try #require(try await Self.expiry(relay, "ext"))
            #expect(after.timeIntervalSince(before) == 10 * 86_400)
            #expect(try await relay.deliver() == ["RENEWAL_EXTENDED"])
            #expect(try await Self.expiry(relay, "ext") == after)
            // Compared as the API writes them (a parsed and re-formatted date can be 1 ms off).
            let subscriptionExpiry = try await relay.subscription("ext")?["expiresAt"] as? String
            #expect(try await relay.entitlements("ext").first?["expiresAt"] as? String == subscriptionExpiry)

            #expect(
                try await Self.extend(relay, original, days: 3, reason: "customer_satisfaction").status == .accepted)
            await relay.apply()
            let third = try await Self.extend(relay, original, days: 1)
            #expect(third.status == .conflict)
            #expect(third.errorCode == "extension_limit")
            let history = try await Self.extensions(relay, original)
            #expect(history.map { $0["status"] as? String } == ["succeeded", "succeeded"])
            let audit = try await API.call(relay.client, .get, "/v1/audit").json.description
            #expect(audit.contains("extension_requested") && audit.contains("extension_succeeded"))
        }
    }

    // Store-side or HTTP-level checks with no SQL of their own: SQLite is enough (keeps
    // the PostgreSQL suite's load within its deadlines on 2 cores).
    @Test(arguments: ["sqlite"])
    func appleFailingIsRetriedWithTheSameRequestIdentifierAndIneligibleFails(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let (_, first) = try await relay.buy("flaky", "pro_monthly")
            let original = try #require(first.originalTransactionId)
            try await relay.deliver()
            let before = try #require(try await Self.expiry(relay, "flaky"))
            var faults = Faults()
            faults.endpoints["extend"] = .init(status: 503, count: 2)
            await relay.store.setFaults(faults)
            let requestId = try #require(try await Self.extend(relay, original, days: 7).json["requestId"] as? String)
            let runner = JobRunner(app: relay.app)
            var now = Date()
            for _ in 0..<2 {
                _ = await runner.runDueCounting(now: now)
                let pending = try await API.call(relay.client, .get, "/v1/extensions/\(requestId)")
                #expect(pending.json["status"] as? String == "pending")
                now = now.addingTimeInterval(3600)
            }
            _ = await runner.runDueCounting(now: now)
            #expect(
                try await API.call(relay.client, .get, "/v1/extensions/\(requestId)").json["status"] as? String
                    == "succeeded")
            // Apple saw one request identifier, and applied it once.
            let answers = await relay.store.extensionAnswers.keys.filter { $0.hasPrefix(original) }
            #expect(answers == ["\(original)|\(requestId)"])
            #expect(try await Self.expiry(relay, "flaky")?.timeIntervalSince(before) == 7 * 86_400)

            // Ineligible at Apple (refunded, so revoked): a failed extension, on the subscription.
            try await relay.store.refund(try #require(first.transactionId), percentage: nil)
            try await relay.deliver()
            _ = try await Self.extend(relay, original, days: 2)
            await relay.apply()
            let failed = try await Self.extensions(relay, original).first
            #expect(failed?["status"] as? String == "failed")
            let error = failed?["error"] as? String ?? ""
            #expect(error.contains("4030004"), "\(String(describing: failed))")
        }
    }

    @Test(arguments: API.databases)
    func massExtensionThroughAppleWithItsStatusPolled(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            for account in ["m1", "m2"] { _ = try await relay.buy(account, "pro_monthly") }
            let (_, gone) = try await relay.buy("m3", "pro_monthly")
            try await relay.store.refund(try #require(gone.transactionId), percentage: nil)
            try await relay.deliver()
            let accepted = try await API.call(
                relay.client, .post, "/v1/extensions/mass",
                body: #"{"productId":"pro_monthly","days":5,"reason":"service_issue","note":"outage"}"#)
            #expect(accepted.status == .accepted, "\(accepted.json)")
            let id = try #require(accepted.json["requestId"] as? String)
            await relay.apply()
            let status = try await API.call(relay.client, .get, "/v1/extensions/\(id)")
            #expect(status.json["status"] as? String == "succeeded", "\(status.json)")
            #expect(status.json["succeededCount"] as? Int == 2)
            #expect(status.json["failedCount"] as? Int == 0)
            let types = try await relay.deliver()
            #expect(types.filter { $0 == "RENEWAL_EXTENDED" }.count == 2)
            #expect(types.last == "RENEWAL_EXTENSION")
            let counts = try await relay.statuses()
            #expect(counts["pending"] == nil, "\(counts)")
            // Bad input.
            let unknown = try await API.call(
                relay.client, .post, "/v1/extensions/mass", body: #"{"productId":"coins_60","days":5,"reason":"other"}"#
            )
            #expect(unknown.errorCode == "unknown_product")
            #expect(try await API.call(relay.client, .get, "/v1/extensions/nope").status == .notFound)
        }
    }

    // Store-side or HTTP-level checks with no SQL of their own: SQLite is enough (keeps
    // the PostgreSQL suite's load within its deadlines on 2 cores).
    @Test(arguments: ["sqlite"])
    func badExtensionInputAndClientTokens(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let (_, first) = try await relay.buy("bad", "pro_monthly")
            let original = try #require(first.originalTransactionId)
            for days in [0, 91, -1] {
                let reply = try await Self.extend(relay, original, days: days)
                #expect(reply.status == .badRequest)
                #expect(reply.errorCode == "bad_request")
            }
            #expect(try await Self.extend(relay, original, reason: "because").errorCode == "bad_request")
            #expect(try await Self.extend(relay, "999999999").status == .notFound)
            let malformed = try await API.call(
                relay.client, .post, "/v1/subscriptions/\(original)/extend", body: #"{"days":"ten"}"#)
            #expect(malformed.status == .badRequest)
            let token = try await API.clientToken("bad")
            for (method, path, body) in [
                (HTTPRequest.Method.post, "/v1/subscriptions/\(original)/extend", #"{"days":1,"reason":"other"}"#),
                (.post, "/v1/extensions/mass", #"{"productId":"pro_monthly","days":1,"reason":"other"}"#),
                (.post, "/v1/accounts/bad/grants", #"{"entitlement":"pro","expiresAt":"2099-01-01T00:00:00Z"}"#),
                (.get, "/v1/subscriptions/\(original)/extensions", nil),
                (.get, "/v1/retention/report", nil),
            ] {
                let reply = try await API.call(relay.client, method, path, token: token, body: body)
                #expect(reply.status == .forbidden, "\(path)")
            }
            #expect(try await Self.extensions(relay, original).isEmpty, "nothing half-written")
        }
    }

    @Test(arguments: API.databases)
    func grantsAreAuditedShowTheirSourceAndEndOnTime(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            func grant(_ body: String) async throws -> API.Reply {
                try await API.call(relay.client, .post, "/v1/accounts/gus/grants", body: body)
            }
            // Short, but long enough for a loaded machine to create and read it first.
            let ends = Date().addingTimeInterval(20)
            let soon = StoreKeeperApp.iso(ends)
            let short = try await grant(#"{"entitlement":"pro","expiresAt":"\#(soon)","note":"sorry for the outage"}"#)
            #expect(short.status == .created, "\(short.json)")
            #expect(short.json["entitlement"] as? String == "pro")
            let long = try await grant(#"{"entitlement":"season","expiresAt":"2099-01-01T00:00:00Z","note":"partner"}"#)
            let longId = try #require(long.json["grantId"] as? String)
            var entitlements = try await relay.entitlements("gus")
            #expect(entitlements.count == 2)
            #expect(entitlements.allSatisfy { $0["source"] as? String == "grant" })
            #expect(entitlements.first { $0["id"] as? String == "season" }?["active"] as? Bool == true)
            if Date() < ends.addingTimeInterval(-0.5) {
                // (Unless the machine was so loaded that its twenty seconds are over already.)
                #expect(entitlements.first { $0["id"] as? String == "pro" }?["active"] as? Bool == true)
            }
            // A purchase beside them says so.
            _ = try await relay.buy("gus", "remove_ads")
            entitlements = try await relay.entitlements("gus")
            #expect(entitlements.first { $0["id"] as? String == "no_ads" }?["source"] as? String == "purchase")
            // Ends on time, no job: derived when read.
            try await Task.sleep(for: .seconds(max(0, ends.timeIntervalSinceNow) + 0.5))
            entitlements = try await relay.entitlements("gus")
            #expect(entitlements.first { $0["id"] as? String == "pro" }?["active"] as? Bool == false)
            #expect(entitlements.first { $0["id"] as? String == "season" }?["active"] as? Bool == true)
            // Ended early by an operator; a second DELETE is 404.
            let ended = try await API.call(relay.client, .delete, "/v1/accounts/gus/grants/\(longId)")
            #expect(ended.status == .ok)
            #expect(try await relay.entitlements("gus").contains { $0["id"] as? String == "season" } == false)
            #expect(try await API.call(relay.client, .delete, "/v1/accounts/gus/grants/\(longId)").status == .notFound)
            #expect(
                try await API.call(relay.client, .delete, "/v1/accounts/other/grants/\(longId)").status == .notFound)
            let audit = try await API.call(relay.client, .get, "/v1/audit").json.description
            #expect(audit.contains("sorry for the outage") && audit.contains("grant_ended"))
            // Bad input: a past or malformed expiresAt, no entitlement, control characters.
            #expect(try await grant(#"{"entitlement":"pro","expiresAt":"2000-01-01T00:00:00Z"}"#).status == .badRequest)
            #expect(try await grant(#"{"entitlement":"pro","expiresAt":"tomorrow"}"#).status == .badRequest)
            #expect(try await grant(#"{"entitlement":"","expiresAt":"2099-01-01T00:00:00Z"}"#).status == .badRequest)
            #expect(try await grant(#"{"expiresAt":"2099-01-01T00:00:00Z"}"#).status == .badRequest)
            #expect(
                try await grant(#"{"entitlement":"a\u0000b","expiresAt":"2099-01-01T00:00:00Z"}"#).status == .badRequest
            )
        }
    }
}
