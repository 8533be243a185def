import Foundation
import StoreKeeperCatalog
import Stripe

/// Subscriptions on the test clock: billed through invoices (draft → paid, or open and
/// retried), renewed when the clock passes a period's end, dunned (three retries, three days
/// apart, then canceled with `payment_failed`), canceled at period end or at once, changed.
extension LocalStripe {
    static let retryInterval: Int64 = 3 * 86_400
    static let maxAttempts = 4

    func periodEnd(start: Int64, price: Object) -> Int64 {
        let recurring = price["recurring"] as? Object
        let interval = recurring?["interval"] as? String ?? "month"
        let count = recurring?["interval_count"] as? Int ?? 1
        var components = DateComponents()
        switch interval {
        case "day": components.day = count
        case "week": components.day = 7 * count
        case "year": components.year = count
        default: components.month = count
        }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let date = calendar.date(byAdding: components, to: Date(timeIntervalSince1970: Double(start)))!
        return Int64(date.timeIntervalSince1970)
    }

    func startSubscription(session: Object, customer: String, noPayment: Bool) throws -> (
        subscription: String, invoice: String
    ) {
        guard let priceId = session["line_price"] as? String, let price = prices[priceId] else {
            throw Failure.invalid("no recurring price", param: "line_items")
        }
        let id = newId("sub")
        let end = periodEnd(start: now, price: price)
        subscriptions[id] = [
            "id": id, "object": "subscription", "status": noPayment ? "trialing" : "incomplete", "customer": customer,
            "items_data": [
                [
                    "id": newId("si"), "object": "subscription_item", "price": priceId, "quantity": 1,
                    "current_period_start": now, "current_period_end": end,
                ] as Object
            ],
            "cancel_at_period_end": false, "cancel_at": NSNull(), "canceled_at": NSNull(), "ended_at": NSNull(),
            "trial_end": noPayment ? end : NSNull(), "start_date": now, "created": now,
            "metadata": session["subscription_data_metadata"] ?? [String: String](),
            "livemode": configuration.livemode, "pause_collection": NSNull(), "currency": price["currency"] ?? "usd",
            "cancellation_details": ["reason": NSNull(), "feedback": NSNull(), "comment": NSNull()] as Object,
        ]
        emit("customer.subscription.created", subscriptionObject(id))
        let invoice = bill(
            subscription: id, reason: "subscription_create", periodStart: now, periodEnd: end,
            amount: noPayment ? 0 : (price["unit_amount"] as? Int64 ?? 0), fail: false)
        setStatus(id, noPayment ? "trialing" : "active", previous: ["status": "incomplete"])
        return (id, invoice)
    }

    func setStatus(_ id: String, _ status: String, previous: Object? = nil) {
        guard var subscription = subscriptions[id] else { return }
        let old = subscription["status"] as? String
        subscription["status"] = status
        subscriptions[id] = subscription
        if old != status || previous != nil {
            emit(
                "customer.subscription.updated", subscriptionObject(id),
                previous: previous ?? ["status": old ?? NSNull()])
        }
    }

    /// An invoice for a period: paid (a charge, an InvoicePayment), or open with a failed
    /// attempt.
    @discardableResult
    func bill(subscription id: String, reason: String, periodStart: Int64, periodEnd: Int64, amount: Int64, fail: Bool)
        -> String
    {
        let subscription = subscriptions[id] ?? [:]
        let items = subscription["items_data"] as? [Object] ?? []
        let priceId = items.first?["price"] as? String ?? ""
        let currency = subscription["currency"] as? String ?? "usd"
        let invoiceId = newId("in")
        var invoice: Object = [
            "id": invoiceId, "object": "invoice", "status": "draft", "billing_reason": reason,
            "customer": subscription["customer"] ?? NSNull(), "currency": currency, "amount_due": amount,
            "amount_paid": Int64(0), "amount_remaining": amount, "total": amount, "subtotal": amount,
            "attempt_count": 0, "attempted": false, "next_payment_attempt": NSNull(), "created": now,
            "period_start": periodStart, "period_end": periodEnd, "livemode": configuration.livemode,
            "parent": [
                "type": "subscription_details",
                "subscription_details": ["subscription": id, "metadata": subscription["metadata"] ?? [:]] as Object,
            ] as Object,
            "lines_data": [
                [
                    "id": newId("il"), "object": "line_item", "amount": amount, "currency": currency, "quantity": 1,
                    "period": ["start": periodStart, "end": periodEnd],
                    "pricing": [
                        "type": "price_details",
                        "price_details": ["price": priceId, "product": prices[priceId]?["product"] ?? ""],
                    ] as Object,
                    "parent": [
                        "type": "subscription_item_details",
                        "subscription_item_details": [
                            "subscription": id, "subscription_item": items.first?["id"] ?? "", "proration": false,
                        ],
                    ] as Object,
                ] as Object
            ],
            "status_transitions": ["finalized_at": NSNull(), "paid_at": NSNull()] as Object,
        ]
        invoices[invoiceId] = invoice
        emit("invoice.created", invoiceObject(invoiceId, expand: []))
        invoice["status"] = "open"
        invoice["status_transitions"] = ["finalized_at": now, "paid_at": NSNull()] as Object
        invoices[invoiceId] = invoice
        emit("invoice.finalized", invoiceObject(invoiceId, expand: []))
        attempt(invoice: invoiceId, fail: fail)
        var updated = subscriptions[id] ?? [:]
        updated["latest_invoice"] = invoiceId
        subscriptions[id] = updated
        return invoiceId
    }

    /// One payment attempt of an open invoice.
    func attempt(invoice id: String, fail: Bool) {
        guard var invoice = invoices[id] else { return }
        let amount = invoice["amount_due"] as? Int64 ?? 0
        let attempts = (invoice["attempt_count"] as? Int ?? 0) + 1
        invoice["attempt_count"] = attempts
        invoice["attempted"] = true
        let pi = newId("pi")
        let customer = invoice["customer"] as? String
        let currency = invoice["currency"] as? String ?? "usd"
        var intent: Object = [
            "id": pi, "object": "payment_intent", "amount": amount, "currency": currency,
            "status": fail ? "requires_payment_method" : "succeeded", "metadata": [String: String](),
            "customer": customer ?? NSNull(), "created": now, "livemode": configuration.livemode,
            "amount_received": fail ? 0 : amount, "latest_charge": NSNull(),
        ]
        paymentIntents[pi] = intent
        var payments = invoice["payments_data"] as? [Object] ?? []
        if fail {
            payments.append([
                "id": newId("inpay"), "object": "invoice_payment", "status": "canceled", "amount_paid": NSNull(),
                "payment": ["type": "payment_intent", "payment_intent": pi] as Object,
            ])
            invoice["payments_data"] = payments
            invoice["next_payment_attempt"] = attempts < Self.maxAttempts ? now + Self.retryInterval : NSNull()
            invoices[id] = invoice
            emit("invoice.payment_failed", invoiceObject(id, expand: []))
            return
        }
        if amount > 0 {
            let charge = makeCharge(amount: amount, currency: currency, paymentIntent: pi, customer: customer)
            intent["latest_charge"] = charge
            paymentIntents[pi] = intent
            emit("charge.succeeded", chargeObject(charge))
        }
        payments.append([
            "id": newId("inpay"), "object": "invoice_payment", "status": "paid", "amount_paid": amount,
            "payment": ["type": "payment_intent", "payment_intent": pi] as Object,
        ])
        invoice["payments_data"] = payments
        invoice["payment_intent_id"] = pi
        invoice["status"] = "paid"
        invoice["amount_paid"] = amount
        invoice["amount_remaining"] = Int64(0)
        invoice["next_payment_attempt"] = NSNull()
        invoice["status_transitions"] =
            ["finalized_at": (invoice["status_transitions"] as? Object)?["finalized_at"] ?? now, "paid_at": now]
            as Object
        invoices[id] = invoice
        emit("invoice.paid", invoiceObject(id, expand: []))
        emit("invoice.payment_succeeded", invoiceObject(id, expand: []))
    }

    public func subscription(_ id: String, expand: Set<String>) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard subscriptions[id] != nil else { throw Failure.missing(id) }
        var out = subscriptionObject(id)
        if expand.contains("latest_invoice"), let invoice = out["latest_invoice"] as? String {
            out["latest_invoice"] = invoiceObject(invoice, expand: [])
        }
        return out
    }

    func subscriptionObject(_ id: String) -> Object {
        guard var out = subscriptions[id] else { return [:] }
        let items = (out["items_data"] as? [Object] ?? []).map { item -> Object in
            var item = item
            if let price = item["price"] as? String { item["price"] = prices[price] ?? price }
            item["subscription"] = id
            return item
        }
        out["items_data"] = nil
        out["items"] =
            ["object": "list", "has_more": false, "url": "/v1/subscription_items?subscription=\(id)", "data": items]
            as Object
        if out["latest_invoice"] == nil { out["latest_invoice"] = NSNull() }
        return out
    }

    public func invoice(_ id: String, expand: Set<String>) throws -> Object {
        lock.lock()
        defer { lock.unlock() }
        guard invoices[id] != nil else { throw Failure.missing(id) }
        return invoiceObject(id, expand: expand)
    }

    func invoiceObject(_ id: String, expand: Set<String>) -> Object {
        guard var out = invoices[id] else { return [:] }
        let lines = out["lines_data"] as? [Object] ?? []
        let payments = out["payments_data"] as? [Object] ?? []
        out["lines_data"] = nil
        out["payments_data"] = nil
        out["payment_intent_id"] = nil
        out["lines"] =
            ["object": "list", "has_more": false, "url": "/v1/invoices/\(id)/lines", "data": lines] as Object
        // `payments` is includable: only when expanded.
        if expand.contains("payments") {
            out["payments"] =
                [
                    "object": "list", "has_more": false,
                    "data": payments.map { payment -> Object in
                        var payment = payment
                        payment["invoice"] = id
                        return payment
                    },
                ] as Object
        }
        return out
    }

    /// Moves the test clock forward by `seconds`, producing in order what falls due: renewals
    /// (paid, or failed and retried), cancellations at period end, retries exhausted.
    public func advance(seconds: Int64) {
        lock.lock()
        defer { lock.unlock() }
        let target = now + max(0, seconds)
        while true {
            // The earliest due moment among every subscription.
            var next: (at: Int64, id: String)?
            for (id, subscription) in subscriptions {
                let status = subscription["status"] as? String ?? ""
                guard ["active", "trialing", "past_due"].contains(status) else { continue }
                let due: Int64?
                if status == "past_due", let invoice = subscription["latest_invoice"] as? String {
                    due = invoices[invoice]?["next_payment_attempt"] as? Int64
                } else {
                    due = (subscription["items_data"] as? [Object])?.first?["current_period_end"] as? Int64
                }
                if let due, due <= target, next.map({ due < $0.at || (due == $0.at && id < $0.id) }) ?? true {
                    next = (due, id)
                }
            }
            guard let (at, id) = next else { break }
            now = max(now, at)
            renew(id)
        }
        now = target
    }

    func renew(_ id: String) {
        guard var subscription = subscriptions[id] else { return }
        let status = subscription["status"] as? String ?? ""
        var items = subscription["items_data"] as? [Object] ?? []
        guard var item = items.first else { return }
        let fail = failingSubscriptions.contains(id)
        if status == "past_due", let invoiceId = subscription["latest_invoice"] as? String {
            attempt(invoice: invoiceId, fail: fail)
            let invoice = invoices[invoiceId] ?? [:]
            if (invoice["status"] as? String) == "paid" {
                setStatus(id, "active")
            } else if invoice["next_payment_attempt"] is NSNull {
                end(id, reason: "payment_failed")
            }
            return
        }
        if subscription["cancel_at_period_end"] as? Bool == true {
            end(id, reason: "cancellation_requested")
            return
        }
        let start = item["current_period_end"] as? Int64 ?? now
        let price = prices[item["price"] as? String ?? ""] ?? [:]
        let end = periodEnd(start: start, price: price)
        let previous: Object = ["items": ["data": items]]
        item["current_period_start"] = start
        item["current_period_end"] = end
        items[0] = item
        subscription["items_data"] = items
        if status == "trialing" { subscription["trial_end"] = NSNull() }
        subscriptions[id] = subscription
        let invoice = bill(
            subscription: id, reason: "subscription_cycle", periodStart: start, periodEnd: end,
            amount: price["unit_amount"] as? Int64 ?? 0, fail: fail)
        if (invoices[invoice]?["status"] as? String) == "paid" {
            setStatus(id, "active", previous: previous)
        } else {
            setStatus(id, "past_due", previous: previous)
        }
    }

    func end(_ id: String, reason: String) {
        guard var subscription = subscriptions[id] else { return }
        subscription["status"] = "canceled"
        subscription["ended_at"] = now
        if subscription["canceled_at"] is NSNull { subscription["canceled_at"] = now }
        subscription["cancellation_details"] = ["reason": reason, "feedback": NSNull(), "comment": NSNull()] as Object
        subscriptions[id] = subscription
        emit("customer.subscription.deleted", subscriptionObject(id))
    }

    /// The customer (in the portal) or the merchant cancels: at period end, or at once.
    public func cancel(subscription id: String, atPeriodEnd: Bool) throws {
        lock.lock()
        defer { lock.unlock() }
        guard var subscription = subscriptions[id] else { throw Failure.missing(id) }
        guard (subscription["status"] as? String) != "canceled" else {
            throw Failure.invalid("This subscription is already canceled.", param: "subscription")
        }
        if atPeriodEnd {
            subscription["cancel_at_period_end"] = true
            subscription["canceled_at"] = now
            subscription["cancel_at"] =
                (subscription["items_data"] as? [Object])?.first?["current_period_end"] ?? NSNull()
            subscriptions[id] = subscription
            emit("customer.subscription.updated", subscriptionObject(id), previous: ["cancel_at_period_end": false])
        } else {
            subscription["canceled_at"] = now
            subscriptions[id] = subscription
            end(id, reason: "cancellation_requested")
        }
    }

    /// "Renew" in the portal: a cancellation at period end undone.
    public func uncancel(subscription id: String) throws {
        lock.lock()
        defer { lock.unlock() }
        guard var subscription = subscriptions[id], (subscription["status"] as? String) != "canceled" else {
            throw Failure.missing(id)
        }
        subscription["cancel_at_period_end"] = false
        subscription["cancel_at"] = NSNull()
        subscription["canceled_at"] = NSNull()
        subscriptions[id] = subscription
        emit("customer.subscription.updated", subscriptionObject(id), previous: ["cancel_at_period_end": true])
    }

    /// A plan change at once (the portal's upgrade): the item's price replaced.
    public func changePlan(subscription id: String, price priceId: String) throws {
        lock.lock()
        defer { lock.unlock() }
        guard var subscription = subscriptions[id] else { throw Failure.missing(id) }
        guard prices[priceId] != nil else { throw Failure.missing(priceId) }
        var items = subscription["items_data"] as? [Object] ?? []
        guard !items.isEmpty else { throw Failure.missing(id) }
        let previous: Object = ["items": ["data": items]]
        items[0]["price"] = priceId
        subscription["items_data"] = items
        subscriptions[id] = subscription
        emit("customer.subscription.updated", subscriptionObject(id), previous: previous)
    }

    /// The customer's card declines from now on (true), or is replaced by one that works.
    public func setCardFails(subscription id: String, _ fails: Bool) throws {
        lock.lock()
        defer { lock.unlock() }
        guard subscriptions[id] != nil else { throw Failure.missing(id) }
        if fails { failingSubscriptions.insert(id) } else { failingSubscriptions.remove(id) }
    }

    /// The subscriptions of a customer (the portal's page).
    public func subscriptions(customer: String) -> [String] {
        lock.lock()
        defer { lock.unlock() }
        return subscriptions.filter { ($0.value["customer"] as? String) == customer }.map(\.key).sorted()
    }
}
