import AppStoreModels
import Foundation
import StoreKeeperCatalog

/// A verified App Store Server Notification as it is kept and applied: the decoded fields
/// and the signed objects inside it, already verified when it was accepted.
public struct NotificationRecord: Codable, Sendable, Hashable {
    public var notificationUUID: String
    public var type: String
    public var subtype: String?
    /// The payload's `signedDate` (epoch ms): the order events of one subscription apply in.
    public var signedDate: Int64
    public var environment: String?
    /// `data.status` (Apple's subscription status as of `signedDate`), when sent.
    public var appleStatus: Int?
    public var consumptionRequestReason: String?
    public var transaction: JWSTransactionDecodedPayload?
    public var renewalInfo: JWSRenewalInfoDecodedPayload?

    public init(
        notificationUUID: String, type: String, subtype: String?, signedDate: Int64, environment: String?,
        appleStatus: Int? = nil, consumptionRequestReason: String? = nil,
        transaction: JWSTransactionDecodedPayload? = nil, renewalInfo: JWSRenewalInfoDecodedPayload? = nil
    ) {
        self.notificationUUID = notificationUUID
        self.type = type
        self.subtype = subtype
        self.signedDate = signedDate
        self.environment = environment
        self.appleStatus = appleStatus
        self.consumptionRequestReason = consumptionRequestReason
        self.transaction = transaction
        self.renewalInfo = renewalInfo
    }

    /// The record of a verified payload (and the signed objects in it); nil without the
    /// fields every notification has.
    public init?(
        payload: ResponseBodyV2DecodedPayload, transaction: JWSTransactionDecodedPayload?,
        renewalInfo: JWSRenewalInfoDecodedPayload?
    ) {
        guard let uuid = payload.notificationUUID, !uuid.isEmpty, let type = payload.notificationType?.rawValue,
            let signedDate = payload.signedDate
        else { return nil }
        self.init(
            notificationUUID: uuid, type: type, subtype: payload.subtype?.rawValue, signedDate: signedDate,
            environment: payload.data?.environment?.rawValue ?? payload.summary?.environment?.rawValue,
            appleStatus: payload.data?.status.map { Int($0.rawValue) },
            consumptionRequestReason: payload.data?.consumptionRequestReason?.rawValue, transaction: transaction,
            renewalInfo: renewalInfo)
    }

    /// The subscription (or one-time purchase) the notification is about: events of one
    /// subject apply one at a time, in `signedDate` order. Nil when it has no transaction.
    public var subject: String? {
        transaction.flatMap { $0.originalTransactionId ?? $0.transactionId }
    }

    public var notificationType: NotificationType { NotificationType(rawValue: type) }
    public var notificationSubtype: NotificationSubtype? { subtype.map(NotificationSubtype.init(rawValue:)) }

    /// The subscription machine's event for this notification.
    public var subscriptionEvent: SubscriptionEvent {
        SubscriptionEvent(
            .notification(notificationType, notificationSubtype),
            signedDate: Date(timeIntervalSince1970: Double(signedDate) / 1000), transaction: transaction,
            renewalInfo: renewalInfo)
    }
}

/// What each notification type does (shared/spec/notifications.md §3): a pure routing
/// decision, one place, so every type and subtype is either applied or deliberately ignored.
public enum NotificationPlanner {
    public enum Action: Sendable, Hashable {
        /// A purchase or a subscription event: the signed transaction goes through delivery
        /// (exactly once, to the bound account), and an auto-renewable's state through
        /// SubscriptionMachine.
        case deliver
        /// REFUND, REVOKE: reverse what the transaction delivered.
        case refund
        /// REFUND_REVERSED: reinstate exactly what the refund reversed.
        case refundReversed
        /// CONSUMPTION_REQUEST: answered through the job queue when configured.
        case consumptionRequest
        /// Recorded, nothing to apply: the reason is kept with the notification.
        case ignored(String)
    }

    public static func action(for record: NotificationRecord) -> Action {
        let type = record.notificationType
        switch type {
        case .subscribed, .didRenew, .didFailToRenew, .gracePeriodExpired, .expired, .didChangeRenewalStatus,
            .didChangeRenewalPref, .offerRedeemed, .priceIncrease, .renewalExtended, .oneTimeCharge:
            guard record.transaction != nil else { return .ignored("\(type.rawValue) without a signed transaction") }
            return .deliver
        case .refund, .revoke:
            guard record.transaction != nil else { return .ignored("\(type.rawValue) without a signed transaction") }
            return .refund
        case .refundReversed:
            guard record.transaction != nil else { return .ignored("\(type.rawValue) without a signed transaction") }
            return .refundReversed
        case .consumptionRequest:
            guard record.transaction != nil else { return .ignored("\(type.rawValue) without a signed transaction") }
            return .consumptionRequest
        case .refundDeclined:
            return .ignored("REFUND_DECLINED: Apple declined the refund; nothing was reversed, nothing changes")
        case .renewalExtension:
            return .ignored(
                "RENEWAL_EXTENSION \(record.subtype ?? ""): a mass extension's summary or failure; each extended subscription gets its own RENEWAL_EXTENDED"
            )
        case .test:
            return .ignored("TEST: a test notification, acknowledged")
        case .externalPurchaseToken:
            return .ignored("EXTERNAL_PURCHASE_TOKEN: external purchases are not sold through this server")
        case .rescindConsent:
            return .ignored("RESCIND_CONSENT: recorded for the app's parental-consent policy; purchases are unchanged")
        case .metadataUpdate, .migration, .priceChange:
            return .ignored("\(type.rawValue): Advanced Commerce API only")
        default:
            return .ignored("\(type.rawValue): a type this server does not know yet, stored and ignored")
        }
    }
}

/// What a refund (or a Family Sharing revocation) takes back, and what its reversal gives
/// back — pure: storage reads the delivery and the account's balance, commits the plan.
public enum RefundPlanner {
    /// What storage knows about the refunded transaction.
    public struct Context: Sendable, Hashable {
        /// The delivery recorded for the transaction (nil: it was never delivered here).
        public var delivery: DeliveryPlanner.Delivery?
        /// Whether the delivery is refunded now (a repeated REFUND changes nothing).
        public var refunded: Bool
        /// The currency the delivery credited, and how much (its ledger entry), if any.
        public var credited: Credit?
        /// The account's balance of that currency now.
        public var balance: Int64
        /// The entitlement the product grants, if any.
        public var entitlement: String?
        public var productType: Product.Kind?

        public init(
            delivery: DeliveryPlanner.Delivery?, refunded: Bool, credited: Credit?,
            balance: Int64, entitlement: String?, productType: Product.Kind?
        ) {
            self.delivery = delivery
            self.refunded = refunded
            self.credited = credited
            self.balance = balance
            self.entitlement = entitlement
            self.productType = productType
        }
    }

    /// What a delivery credited: its ledger entry.
    public struct Credit: Sendable, Hashable {
        public var currency: String
        public var amount: Int64

        public init(currency: String, amount: Int64) {
            self.currency = currency
            self.amount = amount
        }
    }

    public struct Plan: Sendable, Hashable {
        /// Nothing to do, and why (never delivered, already refunded, not refunded).
        public var skipped: String?
        public var accountId: String?
        public var ledger: [LedgerEntry] = []
        /// Remove (refund) or reinstate (reversal) the entitlement of the transaction.
        public var removeEntitlement: String?
        public var reinstateEntitlement: String?
        /// The delivery's new refund state, and its order's status.
        public var refunded: Bool?
        public var orderStatus: Order.Status?
        public var anomalies: [AnomalyDraft] = []
        /// Refunded before it was ever delivered here: record it as delivered with nothing
        /// (quantity 0) and refunded, so a late notification or submission of it never
        /// delivers it.
        public var recordUndelivered = false
    }

    /// A REFUND or REVOKE of `transactionId`. `key` makes the ledger entries unique (the
    /// notification's UUID): the notification itself is applied once.
    public static func refund(_ context: Context, transactionId: String, key: String, reason: String) -> Plan {
        guard let delivery = context.delivery else {
            var plan = Plan(
                skipped:
                    "transaction \(transactionId) was never delivered here: nothing to take back; recorded as refunded so it never is"
            )
            plan.recordUndelivered = true
            plan.orderStatus = .refunded
            return plan
        }
        guard !context.refunded else {
            return Plan(skipped: "transaction \(transactionId) is refunded already")
        }
        var plan = Plan(accountId: delivery.accountId, refunded: true, orderStatus: .refunded)
        if let credited = context.credited, credited.amount != 0 {
            plan.ledger.append(
                LedgerEntry(
                    key: "refund:\(transactionId):\(credited.currency):\(key)", accountId: delivery.accountId,
                    currency: credited.currency, amount: -credited.amount))
            let (after, overflow) = context.balance.subtractingReportingOverflow(credited.amount)
            if overflow || after < 0 {
                // The credit was spent (in part) before the money went back: the balance goes
                // negative and an operator decides.
                plan.anomalies.append(
                    AnomalyDraft(
                        kind: .refundedAfterDelivery, transactionId: transactionId, orderId: delivery.orderId,
                        accountId: delivery.accountId,
                        detail:
                            "\(reason): \(credited.amount) \(credited.currency) of transaction \(transactionId) taken back from account \(delivery.accountId), whose balance was \(context.balance) (now \(overflow ? "below the limit" : String(after))): the credit was already spent"
                    ))
            }
        }
        if context.productType != .autoRenewable, let entitlement = context.entitlement {
            // Subscriptions lose access through their own state (SubscriptionMachine).
            plan.removeEntitlement = entitlement
        }
        return plan
    }

    /// A REFUND_REVERSED of `transactionId`: gives back exactly what the refund took.
    public static func reversal(_ context: Context, transactionId: String, key: String) -> Plan {
        guard let delivery = context.delivery else {
            return Plan(skipped: "transaction \(transactionId) was never delivered here: nothing to reinstate")
        }
        guard context.refunded else {
            return Plan(skipped: "transaction \(transactionId) is not refunded: nothing to reinstate")
        }
        var plan = Plan(accountId: delivery.accountId, refunded: false, orderStatus: .delivered)
        if let credited = context.credited, credited.amount != 0 {
            plan.ledger.append(
                LedgerEntry(
                    key: "refund_reversed:\(transactionId):\(credited.currency):\(key)", accountId: delivery.accountId,
                    currency: credited.currency, amount: credited.amount))
        }
        if context.productType != .autoRenewable, let entitlement = context.entitlement {
            plan.reinstateEntitlement = entitlement
        }
        return plan
    }
}

/// The answer to Apple's CONSUMPTION_REQUEST (Send Consumption Information v2), built from our
/// own records only — pure.
public enum ConsumptionPlanner {
    /// What the records say about the transaction Apple asks about.
    public struct Facts: Sendable, Hashable {
        public var delivered: Bool
        public var productType: Product.Kind?
        /// For a consumable: what the delivery credited, and the account's balance now.
        public var credited: Int64?
        public var balance: Int64?

        public init(delivered: Bool, productType: Product.Kind?, credited: Int64?, balance: Int64?) {
            self.delivered = delivered
            self.productType = productType
            self.credited = credited
            self.balance = balance
        }
    }

    /// Delivery status; for a consumable the share of its credit spent since (in milliunits:
    /// the balance left over covers the unspent part); for a non-consumable or non-renewing
    /// purchase delivered means fully provided; never a percentage for an auto-renewable
    /// (Apple refuses it), and 0 for anything undelivered.
    public static func request(_ facts: Facts) -> ConsumptionRequest {
        var request = ConsumptionRequest(
            customerConsented: true, sampleContentProvided: false,
            deliveryStatus: facts.delivered ? .delivered : .undeliveredOther)
        switch facts.productType {
        case .autoRenewable:
            break
        case _ where !facts.delivered:
            request.consumptionPercentage = 0
        case .consumable:
            if let credited = facts.credited, credited > 0 {
                let unspent = min(max(facts.balance ?? 0, 0), credited)
                request.consumptionPercentage = Int32((credited - unspent) * 100_000 / credited)
            }
        default:
            request.consumptionPercentage = 100_000
        }
        return request
    }
}
