/// The money rules every store meets, decided once in the core (the delivery, refund and
/// subscription planners): the table the conformance suite runs against every store through its
/// local fake. A scenario a store cannot have is declared here, beside its economics
/// (`Proceeds`), with why — the suite lists it instead of running it.
public enum MoneyScenario: String, Sendable, Hashable, CaseIterable {
    /// Paid, claimed: delivered once.
    case buy
    /// The claim (or the store's notification) arrives twice, newest first: applied once.
    case duplicateAndReorder = "duplicate_and_reorder"
    /// Refunded at the store before anyone claimed it: never delivered.
    case refundBeforeDelivery = "refund_before_delivery"
    /// Two partial refunds after the delivery: what they refund together is taken back, once.
    case partialRefunds = "partial_refunds"
    /// A partial refund before the claim: the delivery gives only what was not refunded.
    case partialRefundBeforeDelivery = "partial_refund_before_delivery"
    /// A chargeback lost after the delivery: revoked.
    case chargebackLost = "chargeback_lost"
    /// A payment of an environment the deployment does not accept: refused.
    case wrongEnvironment = "wrong_environment"
    /// A payment for something the catalog does not sell: an `unknown_product` anomaly.
    case unknownProduct = "unknown_product"
    /// A subscription renewed twice, the store's word of the renewals arriving newest first and
    /// again: an older period never shortens a newer one.
    case olderRenewalLate = "older_renewal_late"
}

extension Store {
    /// The scenarios this store cannot have, and why.
    public var cannotHave: [MoneyScenario: String] {
        switch self {
        case .appStore:
            return [
                .chargebackLost:
                    "Apple settles chargebacks itself: a developer sees only Apple's REFUND (refund scenarios)"
            ]
        case .googlePlay:
            return [
                .chargebackLost:
                    "Google reports a chargeback as a voided purchase (voidedReason 7): the refund scenarios"
            ]
        case .web:
            return [
                .refundBeforeDelivery:
                    "the back end reports a web payment once it is paid; a refund is reported against it",
                .partialRefundBeforeDelivery:
                    "the back end reports a web payment once it is paid; a refund is reported against it",
                .chargebackLost: "the back end's payment provider: reported as a refund",
                .wrongEnvironment: "reported by the back end with its secret key: no store environment to check",
            ]
        case .stripe:
            return [:]
        }
    }
}
