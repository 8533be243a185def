import AppStoreModels
import Foundation
import HTTPTypes
import LocalGooglePlay
import SQLKit
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// "One core for every store", finding 1: a purchase the store refunded before anyone claimed
/// it was delivered afterwards, in full, to whoever submitted it. The refund is now recorded by
/// transaction id through the one refund path, and the delivery path honours it: a whole refund
/// is never delivered, a partial one delivers only what was not refunded.
@Suite struct RefundBeforeClaimTests {
    typealias API = ServerAPITests
    typealias Play = GooglePlayServerTests

    @Test(arguments: API.databases)
    func aGooglePurchaseRefundedBeforeItsClaimIsNeverDelivered(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: nil)
            try await play.store.refund(token)
            // Google's notification of the voided purchase arrives and is applied first.
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            let claim = try await play.submit("finder", "coins_60", token)
            #expect(claim.errorCode == "revoked", "\(claim.json)")
            #expect(try await play.balance("finder") == 0)
            #expect(try await play.app.store.accounts.deliveries(of: "finder").isEmpty)
        }
    }

    @Test(arguments: API.databases)
    func googlesOwnThreeDayRefundOfAnUnclaimedPurchaseIsHonoured(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            let order = try await play.order("late", "coins_60")
            let token = try await play.store.buy("coins_60", obfuscatedAccountId: order.token)
            _ = await play.store.takeDuePushes()  // the purchase's own notification is lost
            // Never claimed, so never acknowledged: Google refunds it at 72 hours.
            await play.store.advance(by: 4 * 86_400)
            #expect(await play.store.purchase(token)?.voided == true)
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            let claim = try await play.submit("late", "coins_60", token, orderId: order.id)
            #expect(claim.status != .ok, "\(claim.json)")
            #expect(try await play.balance("late") == 0)
        }
    }

    @Test(arguments: API.databases)
    func aPartialRefundBeforeTheClaimDeliversOnlyWhatWasNotRefunded(kind: String) async throws {
        try await Play.withPlay(kind) { play in
            // Through Google's voided-purchase record (notification, then the voided list) …
            let notified = try await play.store.buy("coins_60", obfuscatedAccountId: nil, quantity: 5)
            try await play.store.refund(notified, quantity: 4)
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            #expect(try await play.submit("five", "coins_60", notified).status == .ok)
            #expect(try await play.balance("five") == 60)
            // … or read from the purchase itself before any notification is applied.
            let unread = try await play.store.buy("coins_60", obfuscatedAccountId: nil, quantity: 5)
            try await play.store.refund(unread, quantity: 3)
            #expect(try await play.submit("other", "coins_60", unread).status == .ok)
            #expect(try await play.balance("other") == 120)
            // The voided record applied afterwards takes nothing more; the last units' refund
            // takes back exactly what is left.
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            await play.app.runGoogleHousekeeping(now: Date().addingTimeInterval(3 * 3600))
            await play.runJobs()
            #expect(try await play.balance("other") == 120)
            try await play.store.refund(notified)
            #expect(try await play.push().allSatisfy { $0 == .noContent })
            await play.runJobs()
            #expect(try await play.balance("five") == 0)
            // Submitting again never delivers the refunded units.
            _ = try await play.submit("five", "coins_60", notified)
            _ = try await play.submit("other", "coins_60", unread)
            #expect(try await play.balance("five") == 0)
            #expect(try await play.balance("other") == 120)
        }
    }

    /// The same on the App Store: Apple's REFUND of a consumable nobody claimed (bought without
    /// an order, its app killed before submitting), then the device submits the JWS it kept —
    /// signed before the refund, so it does not say revoked.
    @Test(arguments: API.databases)
    func anAppleRefundOfAnUnclaimedPurchaseStopsTheOldJWS(kind: String) async throws {
        try await NotificationTests.withRelay(kind) { relay in
            let bought = try await relay.store.buy("apple-anon", items: [.init(productId: "coins_60")])
            try await relay.store.refund(bought.transactions[0].transactionId!)
            _ = try await relay.deliver()
            let reply = try await API.submit(
                relay.client, account: "anon", signedTransaction: bought.signedTransactions[0])
            #expect(reply.errorCode == "revoked", "\(reply.json)")
            #expect((try await relay.account("anon")["balances"] as? [String: Int])?["coins"] == nil)
        }
    }
}
