import Foundation
import Testing

@testable import StoreKeeperServer
@testable import StoreKeeperStorage

/// Support's look-up (`GET /v1/transactions/{id}` and the dashboard's search): any id a player or
/// a store quotes finds the transaction, its account, order, refunds and anomalies.
@Suite struct TransactionLookupTests {
    typealias API = ServerAPITests
    typealias Play = GooglePlayServerTests

    @Test(arguments: API.databases)
    func everyKindOfGoogleIdFindsThePurchase(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("quoted", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            #expect(try await play.submit("quoted", "coins_60", token, orderId: order.id).status == .ok)
            let googleOrder = try #require(await play.store.purchase(token)?.orders.first)
            #expect(googleOrder.hasPrefix("GPA."))
            // As Google's receipt e-mail prints it, with the prefix this server stores, by token.
            // Also as a player types it: in lower case, or the digits without `GPA.`.
            for id in [
                googleOrder, "gp:" + googleOrder, token, googleOrder.lowercased(), String(googleOrder.dropFirst(4)),
            ] {
                let found = try await API.call(
                    play.client, .get,
                    "/v1/transactions/\(id.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)")
                #expect(found.status == .ok, "\(id): \(found.json)")
                let transaction = found.json["transaction"] as? [String: Any] ?? [:]
                #expect(transaction["transactionId"] as? String == "gp:" + googleOrder)
                #expect(transaction["store"] as? String == "google_play")
                #expect(transaction["status"] as? String == "delivered")
                #expect(found.json["accountId"] as? String == "quoted")
                #expect(found.json["orderId"] as? String == order.id)
                #expect((found.json["refunds"] as? [Any])?.isEmpty == true)
            }
            // The dashboard's search finds the account by the order id as printed.
            let hits = try await play.app.store.reports.search(googleOrder)
            #expect(hits.contains { $0.kind == .transaction && $0.accountId == "quoted" })
        }
    }

    @Test(arguments: API.databases)
    func aGooglePurchaseRefundedBeforeItsClaimIsFoundWithItsRefund(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: nil)
            try await play.store.refund(token)
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            let googleOrder = try #require(await play.store.purchase(token)?.orders.first)
            let found = try await API.call(play.client, .get, "/v1/transactions/\(googleOrder)")
            #expect(found.status == .ok, "\(found.json)")
            let transaction = found.json["transaction"] as? [String: Any] ?? [:]
            #expect(transaction["status"] as? String == "refunded_before_delivery")
            #expect(transaction["store"] as? String == "google_play")
            let refunds = found.json["refunds"] as? [[String: Any]] ?? []
            #expect(refunds.count == 1 && refunds.first?["share"] as? Double == 1)
            #expect(found.json["accountId"] == nil || found.json["accountId"] is NSNull)
        }
    }

    @Test(arguments: API.databases)
    func appStoreAndWebIdsFindTheirPurchasesAndAnythingElseIsNotFound(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let created = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"apple1","productId":"pro_monthly"}"#)
            let token = try #require(UUID(uuidString: created.json["appAccountToken"] as? String ?? ""))
            let bought = try await app.localAppStore!.buy(
                "player", items: [.init(productId: "pro_monthly")], appAccountToken: token)
            #expect(
                try await API.submit(client, account: "apple1", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            let original = try #require(bought.transactions.first?.originalTransactionId)
            for quoted in [id, original] {
                let found = try await API.call(client, .get, "/v1/transactions/\(quoted)")
                #expect(found.status == .ok, "\(found.json)")
                #expect((found.json["transaction"] as? [String: Any])?["transactionId"] as? String == id)
                #expect((found.json["transaction"] as? [String: Any])?["store"] as? String == "app_store")
                #expect(found.json["accountId"] as? String == "apple1")
            }
            let web = try await API.call(
                client, .post, "/v1/purchases",
                body:
                    #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"pi_quoted","price":"1.19","currency":"EUR"}"#
            )
            #expect(web.status == .ok, "\(web.json)")
            let byPayment = try await API.call(client, .get, "/v1/transactions/pi_quoted")
            #expect((byPayment.json["transaction"] as? [String: Any])?["store"] as? String == "web")
            #expect(byPayment.json["accountId"] as? String == "webber")

            let unknown = try await API.call(client, .get, "/v1/transactions/GPA.0000-0000-0000-00000")
            #expect(unknown.status == .notFound && unknown.errorCode == "not_found")
            // A player's client token may not look transactions up.
            let player = try await API.call(
                client, .get, "/v1/transactions/\(id)", token: try await API.clientToken("apple1"))
            #expect(player.status == .forbidden)
        }
    }
}

/// Support's refunds (`POST /v1/transactions/{id}/refund`): Google Play through Google's own
/// refund, web payments through theirs, the App Store refused as Apple's to grant.
@Suite struct SupportRefundTests {
    typealias API = ServerAPITests
    typealias Play = GooglePlayServerTests

    @Test(arguments: API.databases)
    func supportRefundsAGoogleOrderOnceThroughTheOneRefundPath(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("refundee", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            #expect(try await play.submit("refundee", "coins_60", token, orderId: order.id).status == .ok)
            #expect(try await play.balance("refundee") == 60)
            let googleOrder = try #require(await play.store.purchase(token)?.orders.first)
            let refunded = try await API.call(
                play.client, .post, "/v1/transactions/\(googleOrder)/refund",
                body: #"{"reason":"ticket 9: charged twice","note":"agent Kim"}"#)
            #expect(refunded.status == .ok, "\(refunded.json)")
            #expect(refunded.json["status"] as? String == "refunded", "\(refunded.json)")
            #expect(try await play.balance("refundee") == 0)
            // Google voided it and says so; its notification takes nothing more.
            #expect(await play.store.purchase(token)?.voided == true)
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            #expect(try await play.balance("refundee") == 0)
            let again = try await API.call(
                play.client, .post, "/v1/transactions/\(googleOrder)/refund", body: #"{"reason":"again"}"#)
            #expect(again.json["status"] as? String == "already_refunded", "\(again.json)")
            let looked = try await API.call(play.client, .get, "/v1/transactions/\(googleOrder)")
            #expect((looked.json["transaction"] as? [String: Any])?["status"] as? String == "refunded")
            let audit = try await play.app.store.anomalies.audit().filter { $0.action == "support_refund" }
            #expect(audit.count == 1 && audit.first?.detail.contains("ticket 9: charged twice") == true)
        }
    }

    /// A Google subscription is refunded by `purchases.subscriptionsv2.revoke`: in full (the
    /// purchase voided) or prorated (what is left of the period), access ending now either way,
    /// Google's notifications taking nothing more.
    @Test(arguments: API.databases)
    func supportRevokesAGoogleSubscriptionInFullOrProrated(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            func subscribe(_ account: String, daysAgo: Double) async throws -> (token: String, order: String) {
                let order = try await play.order(account, "pro_monthly")
                let token = try await play.store.buy(
                    "pro_monthly", obfuscatedAccountId: order.token,
                    purchasedAt: Date().addingTimeInterval(-daysAgo * 86_400))
                #expect(try await play.submit(account, "pro_monthly", token, orderId: order.id).status == .ok)
                #expect(try await play.entitlements(account) == ["pro"])
                return (token, try #require(await play.store.purchase(token)?.orders.last))
            }
            // Bad refund types: named, nothing asked of Google.
            let coins = try await play.order("coins", "coins_60")
            let coinToken = try await play.store.buy("coins_60", obfuscatedAccountId: coins.token)
            #expect(try await play.submit("coins", "coins_60", coinToken, orderId: coins.id).status == .ok)
            let coinOrder = try #require(await play.store.purchase(coinToken)?.orders.first)
            let half = try await API.call(
                play.client, .post, "/v1/transactions/\(coinOrder)/refund", body: #"{"reason":"r","refundType":"half"}"#
            )
            #expect(half.status == .badRequest && half.errorCode == "invalid_refund_type", "\(half.json)")
            let proratedCoins = try await API.call(
                play.client, .post, "/v1/transactions/\(coinOrder)/refund",
                body: #"{"reason":"r","refundType":"prorated"}"#)
            #expect(proratedCoins.status == .unprocessableContent && proratedCoins.errorCode == "invalid_refund_type")
            #expect(await play.store.purchase(coinToken)?.voided == false)

            // Prorated, half-way through the month: about half refunded, access ends now.
            let prorated = try await subscribe("prorated", daysAgo: 15)
            let revoked = try await API.call(
                play.client, .post, "/v1/transactions/\(prorated.order)/refund",
                body: #"{"reason":"ticket 31: left the game","refundType":"prorated"}"#)
            #expect(revoked.status == .ok && revoked.json["status"] as? String == "refunded", "\(revoked.json)")
            #expect(try await play.entitlements("prorated").isEmpty)
            let google = await play.store.subscriptionPurchaseV2(prorated.token)
            #expect(google?.subscriptionState == "SUBSCRIPTION_STATE_EXPIRED")
            #expect(await play.store.purchase(prorated.token)?.voided == false)
            func refunds(_ order: String) async throws -> [[String: Any]] {
                try await API.call(play.client, .get, "/v1/transactions/\(order)").json["refunds"] as? [[String: Any]]
                    ?? []
            }
            let share = try #require(try await refunds(prorated.order).first?["share"] as? Double)
            #expect(share > 0.4 && share < 0.6, "\(share)")
            #expect(try await refunds(prorated.order).first?["type"] as? String == "REFUND_PRORATED")
            // Google's SUBSCRIPTION_REVOKED arrives: access stays off, the share stays.
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            #expect(try await play.entitlements("prorated").isEmpty)
            #expect(try await refunds(prorated.order).first?["share"] as? Double == share)
            // Revoked already: Google refuses a second revocation.
            let again = try await API.call(
                play.client, .post, "/v1/transactions/\(prorated.order)/refund", body: #"{"reason":"again"}"#)
            #expect(again.status == .unprocessableContent && again.errorCode == "store_refused", "\(again.json)")

            // In full (the default): the purchase voided, the whole period refunded.
            let full = try await subscribe("full", daysAgo: 3)
            let whole = try await API.call(
                play.client, .post, "/v1/transactions/\(full.order)/refund", body: #"{"reason":"ticket 32"}"#)
            #expect(whole.status == .ok && whole.json["status"] as? String == "refunded", "\(whole.json)")
            #expect(try await play.entitlements("full").isEmpty)
            #expect(await play.store.purchase(full.token)?.voided == true)
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            #expect(try await refunds(full.order).count == 1)
            #expect(try await refunds(full.order).first?["share"] as? Double == 1)
            let audit = try await play.app.store.anomalies.audit().filter { $0.action == "support_refund" }
            #expect(audit.count == 2 && audit.allSatisfy { $0.detail.contains("revoked the subscription") })
        }
    }

    @Test(arguments: API.databases)
    func aRefundGoogleCannotAnswerNowIs202AndAppliedWhenItDoes(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("patient", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            #expect(try await play.submit("patient", "coins_60", token, orderId: order.id).status == .ok)
            let googleOrder = try #require(await play.store.purchase(token)?.orders.first)
            // Google down: 202, nothing taken yet, and asking again is the same pending request.
            play.store.setOutage(true)
            let body = #"{"reason":"ticket 12","idempotencyKey":"t-12"}"#
            let pending = try await API.call(
                play.client, .post, "/v1/transactions/\(googleOrder)/refund", body: body)
            #expect(pending.status == .accepted, "\(pending.json)")
            #expect(pending.json["status"] as? String == "pending")
            #expect(try await play.balance("patient") == 60)
            let again = try await API.call(play.client, .post, "/v1/transactions/\(googleOrder)/refund", body: body)
            #expect(
                again.status == .accepted && again.json["requestId"] as? String == pending.json["requestId"] as? String)
            // Still down when its job runs: still pending.
            await play.runJobs(now: Date().addingTimeInterval(60))
            #expect(try await play.balance("patient") == 60)
            // Google back: the job refunds once; the answer is then the refund's.
            play.store.setOutage(false)
            await play.runJobs(now: Date().addingTimeInterval(3600))
            #expect(try await play.balance("patient") == 0)
            #expect(await play.store.purchase(token)?.voided == true)
            let done = try await API.call(play.client, .post, "/v1/transactions/\(googleOrder)/refund", body: body)
            #expect(done.status == .ok && done.json["status"] as? String == "already_refunded", "\(done.json)")
            let actions = try await play.app.store.anomalies.audit().map(\.action)
            #expect(actions.filter { $0 == "support_refund_pending" }.count == 1)
            #expect(actions.filter { $0 == "support_refund" }.count == 1)
        }
    }

    @Test(arguments: API.databases)
    func appStoreRefundsAreApplesAndWebPaymentsAreRefundedHere(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "ios", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            let apple = try await API.call(client, .post, "/v1/transactions/\(id)/refund", body: #"{"reason":"r"}"#)
            #expect(apple.status == .unprocessableContent && apple.errorCode == "refunded_by_apple_only")
            let noReason = try await API.call(client, .post, "/v1/transactions/\(id)/refund", body: #"{"reason":" "}"#)
            #expect(noReason.status == .badRequest)
            let web = try await API.call(
                client, .post, "/v1/purchases",
                body:
                    #"{"store":"web","accountId":"webber","productId":"coins_60","paymentId":"pi_refund","price":"1.19","currency":"EUR"}"#
            )
            #expect(web.status == .ok)
            let refunded = try await API.call(
                client, .post, "/v1/transactions/pi_refund/refund", body: #"{"reason":"chargeback threat"}"#)
            #expect(refunded.status == .ok, "\(refunded.json)")
            let balance = try await API.call(client, .get, "/v1/accounts/webber")
            #expect((balance.json["balances"] as? [String: Int])?["coins"] ?? 0 == 0)
            let unknown = try await API.call(client, .post, "/v1/transactions/nope/refund", body: #"{"reason":"r"}"#)
            #expect(unknown.status == .notFound)
        }
    }
}

/// Exports take `until` (exclusive) beside `since`, CSV is an attachment, and a query parameter a
/// route does not read is 400 `unknown_parameter` naming it.
@Suite struct QueryParameterTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func exportsStopAtUntilAndUnknownParametersAreNamed(kind: String) async throws {
        try await API.withServer(kind, configure: { _ in }, prepare: { $0.exportSettleSeconds = 0 }) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "x1", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let past = "2000-01-01T00:00:00Z"
            let future = StoreKeeperApp.iso(Date().addingTimeInterval(86_400))
            let before = try await API.call(client, .get, "/v1/export/transactions?format=ndjson&until=\(past)")
            #expect(before.status == .ok)
            let all = try await client.execute(
                uri: "/v1/export/transactions?until=\(future)", method: .get,
                headers: [.authorization: "Bearer \(API.secret)"]
            ) { ($0.status, $0.headers[.contentDisposition], String(buffer: $0.body)) }
            #expect(all.0 == .ok)
            #expect(all.1 == #"attachment; filename="storekeeper-transactions.csv""#)
            #expect(all.2.contains(bought.transactions[0].transactionId!))
            let empty = try await client.execute(
                uri: "/v1/export/transactions?format=ndjson&until=\(past)", method: .get,
                headers: [.authorization: "Bearer \(API.secret)"]
            ) { String(buffer: $0.body) }
            #expect(!empty.contains(bought.transactions[0].transactionId!))
            let backwards = try await API.call(client, .get, "/v1/export/transactions?since=\(future)&until=\(past)")
            #expect(backwards.status == .badRequest)
            for path in [
                "/v1/export/transactions?to=\(past)", "/v1/accounts/x1?verbose=1", "/v1/anomalies?status=open&x=1",
                "/v1/analytics/mrr?form=2026-01-01",
            ] {
                let reply = try await API.call(client, .get, path)
                #expect(reply.status == .badRequest && reply.errorCode == "unknown_parameter", "\(path): \(reply.json)")
            }
            let named = try await API.call(client, .get, "/v1/export/transactions?to=\(past)")
            let message = (named.json["error"] as? [String: Any])?["message"] as? String ?? ""
            #expect(message.contains("'to'") && message.contains("until"), "\(message)")
            #expect(try await API.call(client, .get, "/v1/anomalies?status=all").status == .ok)
        }
    }
}

/// Support's transfers: "I bought it on my old account".
@Suite struct SupportTransferTests {
    typealias API = ServerAPITests

    @Test(arguments: API.databases)
    func aPurchaseMovesWithItsEntitlementAndAConsumableDoesNot(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "remove_ads")])
            #expect(
                try await API.submit(client, account: "old", signedTransaction: bought.signedTransactions[0]).status
                    == .ok)
            let id = try #require(bought.transactions.first?.transactionId)
            let moved = try await API.call(
                client, .post, "/v1/transactions/\(id)/transfer", body: #"{"toAccountId":"new","note":"ticket 12"}"#)
            #expect(moved.status == .ok, "\(moved.json)")
            #expect(moved.json["status"] as? String == "transferred" && moved.json["fromAccountId"] as? String == "old")
            func entitlements(_ account: String) async throws -> [String] {
                (try await API.call(client, .get, "/v1/accounts/\(account)").json["entitlements"] as? [[String: Any]]
                    ?? [])
                    .compactMap { $0["id"] as? String }
            }
            #expect(try await entitlements("new") == ["no_ads"])
            #expect(try await entitlements("old").isEmpty)
            let again = try await API.call(
                client, .post, "/v1/transactions/\(id)/transfer", body: #"{"toAccountId":"new"}"#)
            #expect(again.json["status"] as? String == "already_held")
            // The old account submitting it now is refused: the purchase is new's (first binder).
            let old = try await API.submit(client, account: "old", signedTransaction: bought.signedTransactions[0])
            #expect(old.errorCode == "owned_by_other_account", "\(old.json)")
            let audit = try await app.store.anomalies.audit().filter { $0.action == "ownership_transfer" }
            #expect(audit.first?.detail.contains("ticket 12") == true)

            let coins = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
            #expect(
                try await API.submit(client, account: "old", signedTransaction: coins.signedTransactions[0]).status
                    == .ok)
            let consumable = try await API.call(
                client, .post, "/v1/transactions/\(coins.transactions[0].transactionId!)/transfer",
                body: #"{"toAccountId":"new"}"#)
            #expect(consumable.status == .unprocessableContent && consumable.errorCode == "not_transferable")
            let player = try await API.call(
                client, .post, "/v1/transactions/\(id)/transfer", token: try await API.clientToken("new"),
                body: #"{"toAccountId":"old"}"#)
            #expect(player.status == .forbidden)
        }
    }
}

/// The extend route on Google Play: `purchases.subscriptionsv2.defer` (read first for its etag),
/// the account's access moved at once, audited; what cannot be deferred is refused.
@Suite struct GoogleDeferTests {
    typealias API = ServerAPITests
    typealias Play = GooglePlayServerTests

    @Test(arguments: API.databases)
    func extendingAGoogleSubscriptionDefersItAtGoogleAndMovesAccessNow(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("late", "pro_monthly")
            let token = try await play.store.buy("pro_monthly", obfuscatedAccountId: order.token)
            let submitted = try await play.submit("late", "pro_monthly", token, orderId: order.id)
            let original = try #require(
                (submitted.json["transactions"] as? [[String: Any]])?.first?["originalTransactionId"] as? String)
            let before = try #require(try await play.subscriptions("late").first?["expiresAt"] as? String)
            let googleBefore = try #require(await play.store.purchase(token)?.expiry)
            let extended = try await API.call(
                play.client, .post, "/v1/subscriptions/\(original)/extend",
                body: #"{"days":7,"reason":"service_issue","note":"ticket 44"}"#)
            #expect(extended.status == .ok, "\(extended.json)")
            #expect(
                extended.json["status"] as? String == "extended" && extended.json["store"] as? String == "google_play")
            // Google moved it by 7 days, and so did the account's view, now.
            let googleAfter = try #require(await play.store.purchase(token)?.expiry)
            #expect(googleAfter.timeIntervalSince(googleBefore) == 7 * 86_400)
            let after = try #require(try await play.subscriptions("late").first?["expiresAt"] as? String)
            #expect(after > before && after == extended.json["expiresAt"] as? String, "\(before) → \(after)")
            #expect(try await play.entitlements("late") == ["pro"])
            // Google's SUBSCRIPTION_DEFERRED changes nothing more.
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            #expect(try await play.subscriptions("late").first?["expiresAt"] as? String == after)
            let audit = try await play.app.store.anomalies.audit().filter { $0.action == "subscription_deferred" }
            #expect(audit.count == 1 && audit.first?.detail.contains("ticket 44") == true)
            // A read key may not; an unknown subscription is 422; an expired one Google refuses.
            let unknown = try await API.call(
                play.client, .post, "/v1/subscriptions/gp:nope/extend", body: #"{"days":7,"reason":"service_issue"}"#)
            #expect(unknown.status == .unprocessableContent && unknown.errorCode == "not_extendable")
            try await play.store.cancel(token)
            await play.store.advance(by: 60 * 86_400)
            let expired = try await API.call(
                play.client, .post, "/v1/subscriptions/\(original)/extend",
                body: #"{"days":7,"reason":"service_issue"}"#)
            #expect(expired.status == .unprocessableContent && expired.errorCode == "not_extendable", "\(expired.json)")
        }
    }
}

@Suite struct QuotedGoogleOrderIdTests {
    @Test func aGoogleOrderIdIsReadAsPlayersQuoteIt() {
        #expect(TransactionStore.googleOrderId(quoted: "3302-0002-1234-00002") == "GPA.3302-0002-1234-00002")
        #expect(
            TransactionStore.googleOrderId(quoted: "gpa.3302-0002-1234-00002..1") == "GPA.3302-0002-1234-00002..1")
        #expect(TransactionStore.googleOrderId(quoted: "GPA.3302-0002-1234-00002") == "GPA.3302-0002-1234-00002")
        for other in [
            "3302", "3302-", "-3302", "3302-00a2", "3302-0002..", "2924347423441280", "pi_3302-0002", "",
            "3302-0\u{0301}002", "٣٣٠٢-٠٠٠٢", "gpa.",
        ] {
            #expect(TransactionStore.googleOrderId(quoted: other) == nil, "\(other)")
        }
    }
}
