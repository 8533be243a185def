import Foundation
import LocalAppStore

/// The story's subscription scenes, on the subscription scenes' own local App Store (`past`),
/// whose clock starts 65 days back: bought, renewed a month later, billing failing and
/// recovering, upgraded, refunded — each reaching the server as Apple's signed notification.
extension DemoStory {
    func subscribe() async throws -> String {
        // Bought 65 days ago (this store's clock), by the app signed in as sam.
        _ = await past.customer("apple-sam")
        let payment = try await past.buy("apple-sam", items: [.init(productId: "pro_monthly")])
        original = payment.transactions[0].originalTransactionId ?? payment.transactions[0].transactionId ?? ""
        let reply = try await call(
            .POST, "/v1/purchases",
            ["accountId": "sam", "appId": appStoreAppId, "signedTransaction": payment.signedTransactions[0]])
        guard reply.status == 200 else { throw DemoFailure("the subscription answered \(reply.status)") }
        let first = try await subscription("sam")?["expiresAt"] as? String
        await pastAdvance(days: 32)
        try await eventually("DID_RENEW applied") {
            let now = try await self.subscription("sam")
            return now?["status"] as? String == "active" && now?["expiresAt"] as? String != first
        }
        let expires = try await subscription("sam")?["expiresAt"] as? String ?? "?"
        return "active; a month later DID_RENEW → active until \(expires)"
    }

    func billingFails() async throws -> String {
        await past.setBillingFails("apple-sam", true)
        await pastAdvance(days: 31)
        try await eventually("DID_FAIL_TO_RENEW applied") {
            try await self.subscription("sam")?["status"] as? String == "grace_period"
        }
        let entitled = (try await account("sam")["entitlements"] as? [[String: Any]] ?? []).count
        guard entitled == 1 else { throw DemoFailure("grace period without the entitlement") }
        return "DID_FAIL_TO_RENEW → grace_period, still entitled"
    }

    func billingRecovers() async throws -> String {
        await past.setBillingFails("apple-sam", false)
        await pastAdvance(days: 1)
        try await eventually("the recovery's DID_RENEW applied") {
            try await self.subscription("sam")?["status"] as? String == "active"
        }
        return "the card works again: DID_RENEW → active"
    }

    func upgrade() async throws -> String {
        try await past.changeProduct(original, to: "pro_yearly")
        await pastSender.deliverDue()
        try await eventually("the upgrade applied") {
            try await self.subscription("sam")?["productId"] as? String == "pro_yearly"
        }
        let entitlements = try await account("sam")["entitlements"] as? [[String: Any]] ?? []
        guard entitlements.count == 1 else { throw DemoFailure("\(entitlements.count) entitlements after the upgrade") }
        return "pro_monthly → pro_yearly at once, one entitlement"
    }

    func refund() async throws -> String {
        guard let latest = await past.subscription(original)?.lastTransactionId else {
            throw DemoFailure("no subscription at the App Store")
        }
        try await past.refund(latest)
        await pastSender.deliverDue()
        try await eventually("REFUND applied") { try await self.subscription("sam")?["status"] as? String == "revoked" }
        let entitlements = try await account("sam")["entitlements"] as? [[String: Any]] ?? []
        guard entitlements.isEmpty else { throw DemoFailure("still entitled after the refund") }
        return "REFUND → revoked, entitlement removed"
    }
}
