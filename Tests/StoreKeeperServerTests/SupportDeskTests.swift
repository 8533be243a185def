import Foundation
import Testing

@testable import StoreKeeperServer

/// Issue 46's first support actions: credit (idempotent, audited with its reason), currencies
/// and entitlements checked against the catalog.
@Suite struct SupportDeskTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func creditIsIdempotentAuditedAndChecked(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            func credit(_ account: String, _ currency: String, _ body: String, token: String = API.secret)
                async throws -> API.Reply
            {
                try await API.call(
                    client, .post, "/v1/accounts/\(account)/balances/\(currency)/credit", token: token, body: body)
            }
            let first = try await credit(
                "desk", "coins", #"{"amount":120,"idempotencyKey":"ticket-42","reason":"ticket 42: lost coins"}"#)
            #expect(first.status == .ok, "\(first.json)")
            #expect(first.json["balance"] as? Int == 120)
            // The same request again: the same answer, no second credit.
            let again = try await credit(
                "desk", "coins", #"{"amount":120,"idempotencyKey":"ticket-42","reason":"ticket 42: lost coins"}"#)
            #expect(again.json["balance"] as? Int == 120)
            let changed = try await credit(
                "desk", "coins", #"{"amount":999,"idempotencyKey":"ticket-42","reason":"ticket 42"}"#)
            #expect(changed.status == .conflict && changed.errorCode == "idempotency_conflict")
            // A debit then spends it; the account reads the credited balance.
            let spent = try await API.call(
                client, .post, "/v1/accounts/desk/balances/coins/debit",
                body: #"{"amount":20,"idempotencyKey":"spend-1","reason":"ticket 43: credited twice"}"#)
            #expect(spent.json["balance"] as? Int == 100)
            let debited = try await app.store.anomalies.audit().filter { $0.action == "balance_debited" }
            #expect(debited.first?.detail.contains("ticket 43: credited twice") == true)
            let view = try await API.call(client, .get, "/v1/accounts/desk")
            #expect((view.json["balances"] as? [String: Any])?["coins"] as? Int == 100)
            // Audited with its reason.
            let audit = try await app.store.anomalies.audit().filter { $0.action == "balance_credited" }
            #expect(audit.count == 1)
            #expect(audit.first?.detail.contains("ticket 42: lost coins") == true)
            // A typo in the currency, a missing reason, a client token: refused, nothing written.
            let typo = try await credit("desk", "coin", #"{"amount":1,"idempotencyKey":"k2","reason":"r"}"#)
            #expect(typo.status == .badRequest && typo.errorCode == "unknown_currency")
            #expect((typo.json["error"] as? [String: Any])?["message"] as? String ?? "" != "")
            let noReason = try await credit("desk", "coins", #"{"amount":1,"idempotencyKey":"k3"}"#)
            #expect(noReason.status == .badRequest)
            let player = try await credit(
                "desk", "coins", #"{"amount":1,"idempotencyKey":"k4","reason":"r"}"#,
                token: try await API.clientToken("desk"))
            #expect(player.status == .forbidden)
            let debitTypo = try await API.call(
                client, .post, "/v1/accounts/desk/balances/coin/debit", body: #"{"amount":1,"idempotencyKey":"k5"}"#)
            #expect(debitTypo.errorCode == "unknown_currency")
            let final = try await API.call(client, .get, "/v1/accounts/desk")
            #expect((final.json["balances"] as? [String: Any])?["coins"] as? Int == 100)
        }
    }

    @Test func aGrantOfAnEntitlementTheCatalogDoesNotDefineIsRefusedNamingTheValidOnes() async throws {
        try await API.withServer("sqlite") { _, client in
            let expires = StoreKeeperApp.iso(Date().addingTimeInterval(86_400))
            let typo = try await API.call(
                client, .post, "/v1/accounts/desk/grants", body: #"{"entitlement":"pr0","expiresAt":"\#(expires)"}"#)
            #expect(typo.status == .badRequest && typo.errorCode == "unknown_entitlement")
            let message = (typo.json["error"] as? [String: Any])?["message"] as? String ?? ""
            #expect(message.contains("pro"), "\(message)")
            let granted = try await API.call(
                client, .post, "/v1/accounts/desk/grants", body: #"{"entitlement":"pro","expiresAt":"\#(expires)"}"#)
            #expect(granted.status == .created, "\(granted.json)")
        }
    }

    /// A grant for some days, until a date, or for good — exactly one; a grant for good never
    /// ends by itself (the account shows no end) and ends when support ends it.
    @Test(arguments: API.databases)
    func aGrantRunsForSomeDaysUntilADateOrForGood(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let forGood = try await API.call(
                client, .post, "/v1/accounts/vip/grants", body: #"{"entitlement":"pro","forever":true,"note":"VIP"}"#)
            #expect(forGood.status == .created, "\(forGood.json)")
            #expect(forGood.json["forGood"] as? Bool == true && forGood.json["expiresAt"] is NSNull)
            let account = try await API.call(client, .get, "/v1/accounts/vip")
            let pro = (account.json["entitlements"] as? [[String: Any]])?.first { $0["id"] as? String == "pro" }
            #expect(pro?["active"] as? Bool == true && pro?["expiresAt"] == nil, "\(account.json)")
            #expect(
                try await app.store.anomalies.audit().contains {
                    $0.action == "grant" && $0.detail.contains("for good")
                })

            let days = try await API.call(
                client, .post, "/v1/accounts/vip/grants", body: #"{"entitlement":"no_ads","days":3}"#)
            #expect(days.status == .created && days.json["forGood"] as? Bool == false)
            let until = try #require(StoreKeeperApp.parseDate(days.json["expiresAt"] as? String ?? ""))
            #expect(abs(until.timeIntervalSinceNow - 3 * 86_400) < 600)
            for body in [
                #"{"entitlement":"pro"}"#, #"{"entitlement":"pro","days":3,"forever":true}"#,
                #"{"entitlement":"pro","days":0}"#, #"{"entitlement":"pro","forever":false}"#,
                #"{"entitlement":"pro","days":3,"expiresAt":"2099-01-01T00:00:00Z"}"#,
            ] {
                let refused = try await API.call(client, .post, "/v1/accounts/vip/grants", body: body)
                #expect(refused.status == .badRequest, "\(body): \(refused.json)")
            }

            let grantId = try #require(forGood.json["grantId"] as? String)
            #expect(try await API.call(client, .delete, "/v1/accounts/vip/grants/\(grantId)").status == .ok)
            let after = try await API.call(client, .get, "/v1/accounts/vip")
            #expect(
                !((after.json["entitlements"] as? [[String: Any]]) ?? []).contains {
                    $0["id"] as? String == "pro" && $0["active"] as? Bool == true
                })
        }
    }
}
