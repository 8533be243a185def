import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

extension Product.Kind {
    var appleType: ProductType {
        switch self {
        case .consumable: .consumable
        case .nonConsumable: .nonConsumable
        case .autoRenewable: .autoRenewable
        case .nonRenewing: .nonRenewing
        }
    }
}

/// Failures on demand, per endpoint (see the control API).
public struct Faults: Sendable, Codable, Hashable {
    public struct Endpoint: Sendable, Codable, Hashable {
        /// Extra latency before answering, in milliseconds.
        public var latencyMilliseconds: Int?
        /// Answer with this HTTP status (5xx, 429) instead.
        public var status: Int?
        /// With 429: seconds until the `Retry-After` time.
        public var retryAfterSeconds: Int?
        /// verifyReceipt only: answer this `status` (e.g. 21005).
        public var receiptStatus: Int?
        /// How many requests the fault applies to; nil means until cleared.
        public var count: Int?

        public init(
            latencyMilliseconds: Int? = nil, status: Int? = nil, retryAfterSeconds: Int? = nil,
            receiptStatus: Int? = nil,
            count: Int? = nil
        ) {
            self.latencyMilliseconds = latencyMilliseconds
            self.status = status
            self.retryAfterSeconds = retryAfterSeconds
            self.receiptStatus = receiptStatus
            self.count = count
        }
    }

    /// Keyed by endpoint name: `transactionInfo`, `history`, `subscriptions`, `refundHistory`,
    /// `notificationHistory`, `consumption`, `extend`, `appAccountToken`, `testNotification`,
    /// `verifyReceipt`, or `*` for all.
    public var endpoints: [String: Endpoint] = [:]
    /// Notifications: drop the next N sends (the receiver sees nothing; the attempt fails).
    public var dropNotifications: Int = 0
    /// Send each notification twice.
    public var duplicateNotifications = false
    /// Deliver due notifications newest first.
    public var reorderNotifications = false
    /// Sign transactions without their appAccountToken (the nil-applicationUsername case).
    public var dropAppAccountToken = false

    public init() {}

    /// Every key optional in JSON, so a test sets just the fault it wants.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        endpoints = try container.decodeIfPresent([String: Endpoint].self, forKey: .endpoints) ?? [:]
        dropNotifications = try container.decodeIfPresent(Int.self, forKey: .dropNotifications) ?? 0
        duplicateNotifications = try container.decodeIfPresent(Bool.self, forKey: .duplicateNotifications) ?? false
        reorderNotifications = try container.decodeIfPresent(Bool.self, forKey: .reorderNotifications) ?? false
        dropAppAccountToken = try container.decodeIfPresent(Bool.self, forKey: .dropAppAccountToken) ?? false
    }
}

extension LocalAppStore {
    public func setFaults(_ faults: Faults) { self.faults = faults }

    /// The fault to apply to one request of `endpoint`, consuming one use of a counted fault.
    public func takeFault(_ endpoint: String) -> Faults.Endpoint? {
        for key in [endpoint, "*"] {
            guard var fault = faults.endpoints[key] else { continue }
            if let count = fault.count {
                guard count > 0 else {
                    faults.endpoints[key] = nil
                    continue
                }
                fault.count = count - 1
                faults.endpoints[key] = fault.count == 0 ? nil : fault
            }
            return fault
        }
        return nil
    }

    func takeNotificationDrop() -> Bool {
        guard faults.dropNotifications > 0 else { return false }
        faults.dropNotifications -= 1
        return true
    }
}
