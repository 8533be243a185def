import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// Refunds, family-sharing revocations, refund requests and reversals.
extension LocalAppStore {
    // MARK: Refunds

    /// Apple grants a refund: the transaction is revoked; a refunded subscription ends now.
    public func refund(
        _ transactionId: String, percentage: Int32? = nil, reason: RevocationReason = .refundedForOtherReason
    )
        throws
    {
        guard var stored = transactions[transactionId] else { throw StoreError.unknownTransaction(transactionId) }
        let now = clock.now()
        stored.payload.revocationDate = now.milliseconds
        stored.payload.revocationReason = reason
        stored.payload.revocationType = percentage == nil ? .refundFull : .refundProrated
        stored.payload.revocationPercentage = percentage
        stored.modified = now
        transactions[transactionId] = stored
        if var subscription = subscriptions[stored.payload.originalTransactionId ?? ""],
            subscription.lastTransactionId == transactionId
        {
            subscription.status = .revoked
            subscriptions[subscription.originalTransactionId] = subscription
            notify(.refund, subtype: nil, subscription: subscription, at: now)
        } else {
            notify(.refund, subtype: nil, transaction: stored.payload, at: now)
        }
    }

    /// Family Sharing ends for a shared purchase (non-consumable or subscription): the family
    /// member loses access; Apple sends REVOKE.
    public func revokeFamilySharing(_ transactionId: String) throws {
        guard var stored = transactions[transactionId] else { throw StoreError.unknownTransaction(transactionId) }
        guard stored.payload.type == .nonConsumable || stored.payload.type == .autoRenewable else {
            throw StoreError.invalid("only non-consumables and subscriptions are shared with a family")
        }
        let now = clock.now()
        stored.payload.inAppOwnershipType = .familyShared
        stored.payload.revocationDate = now.milliseconds
        stored.payload.revocationReason = .refundedForOtherReason
        stored.payload.revocationType = .familyRevoke
        stored.modified = now
        transactions[transactionId] = stored
        if var subscription = subscriptions[stored.payload.originalTransactionId ?? ""] {
            subscription.status = .revoked
            subscriptions[subscription.originalTransactionId] = subscription
            notify(.revoke, subtype: nil, subscription: subscription, at: now)
        } else {
            notify(.revoke, subtype: nil, transaction: stored.payload, at: now)
        }
    }

    /// The customer asks for a refund: Apple asks the developer for consumption data.
    public func requestRefund(_ transactionId: String, reason: ConsumptionRequestReason = .unintendedPurchase) throws {
        guard var stored = transactions[transactionId] else { throw StoreError.unknownTransaction(transactionId) }
        stored.consumptionRequested = true
        transactions[transactionId] = stored
        notify(
            .consumptionRequest, subtype: nil, transaction: stored.payload, at: clock.now(), consumptionReason: reason)
    }

    /// Send Consumption Information (v2), checked as Apple does: Apple's error code when refused.
    public func receiveConsumption(_ transactionId: String, _ request: ConsumptionRequest) throws(ConsumptionRefusal) {
        guard request.customerConsented == true else { throw ConsumptionRefusal(code: 4_000_035) }
        guard request.sampleContentProvided != nil else { throw ConsumptionRefusal(code: 4_000_041) }
        guard var stored = transactions[transactionId] else { throw ConsumptionRefusal(code: 4_040_010) }
        if stored.payload.type == .autoRenewable, request.consumptionPercentage != nil {
            throw ConsumptionRefusal(code: 4_000_209)
        }
        stored.consumptionReceived.append(request)
        transactions[transactionId] = stored
    }

    /// Apple's refusal of a Send Consumption Information request.
    public struct ConsumptionRefusal: Error, Hashable {
        public var code: Int64
        public var status: Int { code == 4_040_010 ? 404 : 400 }
    }

    public func declineRefund(_ transactionId: String) throws {
        guard let stored = transactions[transactionId] else { throw StoreError.unknownTransaction(transactionId) }
        notify(.refundDeclined, subtype: nil, transaction: stored.payload, at: clock.now())
    }

    /// Apple reverses a refund: the transaction is valid again.
    public func reverseRefund(_ transactionId: String) throws {
        guard var stored = transactions[transactionId], stored.payload.revocationDate != nil else {
            throw StoreError.invalid("transaction '\(transactionId)' is not refunded")
        }
        let now = clock.now()
        stored.payload.revocationDate = nil
        stored.payload.revocationReason = nil
        stored.payload.revocationType = nil
        stored.payload.revocationPercentage = nil
        stored.modified = now
        transactions[transactionId] = stored
        if var subscription = subscriptions[stored.payload.originalTransactionId ?? ""], subscription.status == .revoked
        {
            subscription.status = subscription.expires > now ? .active : .expired
            subscriptions[subscription.originalTransactionId] = subscription
            notify(.refundReversed, subtype: nil, subscription: subscription, at: now)
        } else {
            notify(.refundReversed, subtype: nil, transaction: stored.payload, at: now)
        }
    }

    /// Sets (or replaces) the appAccountToken of an original transaction (Server API).
    public func setAppAccountToken(_ originalTransactionId: String, token: UUID) throws {
        guard transactions[originalTransactionId] != nil else {
            throw StoreError.unknownTransaction(originalTransactionId)
        }
        let value = token.uuidString.lowercased()
        transactions[originalTransactionId]?.payload.appAccountToken = value
        if subscriptions[originalTransactionId] != nil { subscriptions[originalTransactionId]?.appAccountToken = value }
    }
}
