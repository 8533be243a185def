import Foundation

extension LocalStripe {
    // MARK: Disputes

    /// A chargeback (`needs_response`, funds and a 15.00 fee withdrawn) or an inquiry
    /// (`warning_needs_response`, no money moved).
    public func openDispute(charge id: String, inquiry: Bool, reason: String = "fraudulent") throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard var charge = charges[id] else { throw Failure.missing(id) }
        let disputeId = newId(inquiry ? "du" : "dp")
        let amount = charge["amount"] as? Int64 ?? 0
        var transactions: [String] = []
        if !inquiry {
            let txn = newId("txn")
            balanceTransactions[txn] = [
                "id": txn, "object": "balance_transaction", "amount": -amount, "fee": Int64(1500),
                "net": -amount - 1500, "currency": charge["currency"] ?? "usd", "status": "available",
                "type": "adjustment", "reporting_category": "dispute", "created": now,
            ]
            transactions.append(txn)
            charge["disputed"] = true
            charges[id] = charge
        }
        disputes[disputeId] = [
            "id": disputeId, "object": "dispute", "amount": amount, "charge": id,
            "payment_intent": charge["payment_intent"] ?? NSNull(), "currency": charge["currency"] ?? "usd",
            "status": inquiry ? "warning_needs_response" : "needs_response", "reason": reason, "created": now,
            "balance_transactions": transactions, "is_charge_refundable": inquiry,
        ]
        emit("charge.dispute.created", disputes[disputeId]!)
        if !inquiry { emit("charge.dispute.funds_withdrawn", disputes[disputeId]!) }
        return disputes[disputeId]!
    }

    /// Closes a dispute: `won` (funds reinstated), `lost`, or an inquiry's `warning_closed`.
    public func closeDispute(_ id: String, outcome: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard var dispute = disputes[id] else { throw Failure.missing(id) }
        let inquiry = (dispute["status"] as? String ?? "").hasPrefix("warning_")
        let status = inquiry ? "warning_closed" : outcome == "won" ? "won" : "lost"
        dispute["status"] = status
        if status == "won" {
            let txn = newId("txn")
            let amount = dispute["amount"] as? Int64 ?? 0
            balanceTransactions[txn] = [
                "id": txn, "object": "balance_transaction", "amount": amount, "fee": Int64(-1500), "net": amount + 1500,
                "currency": dispute["currency"] ?? "usd", "status": "available", "type": "adjustment",
                "reporting_category": "dispute_reversal", "created": now,
            ]
            dispute["balance_transactions"] = (dispute["balance_transactions"] as? [String] ?? []) + [txn]
        }
        disputes[id] = dispute
        emit("charge.dispute.closed", dispute)
        if status == "won" { emit("charge.dispute.funds_reinstated", dispute) }
        return dispute
    }

    /// `GET /v1/disputes`: a charge's or a payment intent's disputes, newest first.
    public func disputeList(charge: String?, paymentIntent: String?) -> Object {
        lock.lock()
        defer { lock.unlock() }
        let list = disputes.values.filter { dispute in
            (charge == nil || (dispute["charge"] as? String) == charge)
                && (paymentIntent == nil || (dispute["payment_intent"] as? String) == paymentIntent)
        }
        .sorted {
            ($0["created"] as? Int64 ?? 0, $0["id"] as? String ?? "") > (
                $1["created"] as? Int64 ?? 0, $1["id"] as? String ?? ""
            )
        }
        return ["object": "list", "has_more": false, "url": "/v1/disputes", "data": list]
    }

    public func dispute(_ id: String) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard let dispute = disputes[id] else { throw Failure.missing(id) }
        return dispute
    }
}
