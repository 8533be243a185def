import Foundation

extension LocalStripe {
    /// A refund that succeeded and then failed (a closed card, `pm_card_refundFail`): the money
    /// is back with the merchant — `status: failed`, the charge's `amount_refunded` lowered,
    /// `refund.failed` and `charge.refund.updated`.
    @discardableResult
    public func failRefund(_ id: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard var refund = refunds[id] else { throw Failure.missing(id) }
        guard refund["status"] as? String == "succeeded" else {
            throw Failure.invalid("Only a succeeded refund can fail.", param: "refund")
        }
        refund["status"] = "failed"
        refund["failure_reason"] = "expired_or_canceled_card"
        refunds[id] = refund
        if let chargeId = refund["charge"] as? String, var charge = charges[chargeId] {
            let refunded = (charge["amount_refunded"] as? Int64 ?? 0) - (refund["amount"] as? Int64 ?? 0)
            charge["amount_refunded"] = max(0, refunded)
            charge["refunded"] = false
            charges[chargeId] = charge
        }
        emit("refund.failed", refund)
        emit("charge.refund.updated", refund)
        return refund
    }
}
