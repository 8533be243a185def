import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// A faithful fake of the App Store: customers buy, subscriptions renew on a controllable
/// clock, refunds happen, and every event is signed with the local App Store's own
/// Apple-shaped certificate authority and queued as a Server Notification V2.
///
/// The state lives in memory; the keys live in the data directory (`PKIStore`). The HTTP
/// face (`LocalAppStoreServer`) serves Apple's paths on top of this actor.
public actor LocalAppStore {
    public struct Configuration: Sendable {
        public var bundleId: String
        public var appAppleId: Int64
        /// The environment stamped on everything this store signs.
        public var environment: AppStoreEnvironment
        public var catalog: Catalog
        /// Billing Grace Period, or nil when the app has it off.
        public var gracePeriod: TimeInterval?
        /// How long the App Store retries billing before `EXPIRED` / `BILLING_RETRY`.
        public var billingRetryPeriod: TimeInterval
        /// Where notifications go; nil keeps them in the history only.
        public var notificationURL: String?
        /// Apple retries failed notifications only in Production; this applies the schedule in
        /// Sandbox too, so a test can watch it.
        public var retryNotificationsInSandbox: Bool
        /// The App Store Connect key (PEM public key, key id, issuer) whose tokens the Server API accepts.
        public var serverAPIKey: ServerAPIKey?
        /// The app's shared secret for verifyReceipt; nil accepts any password.
        public var sharedSecret: String?

        public init(
            bundleId: String = "com.example.app", appAppleId: Int64 = 1_234_567_890,
            environment: AppStoreEnvironment = .production, catalog: Catalog,
            gracePeriod: TimeInterval? = 16 * 86_400, billingRetryPeriod: TimeInterval = 60 * 86_400,
            notificationURL: String? = nil, retryNotificationsInSandbox: Bool = false,
            serverAPIKey: ServerAPIKey? = nil,
            sharedSecret: String? = nil
        ) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environment = environment
            self.catalog = catalog
            self.gracePeriod = gracePeriod
            self.billingRetryPeriod = billingRetryPeriod
            self.notificationURL = notificationURL
            self.retryNotificationsInSandbox = retryNotificationsInSandbox
            self.serverAPIKey = serverAPIKey
            self.sharedSecret = sharedSecret
        }
    }

    /// The public half of an App Store Connect In-App Purchase key.
    public struct ServerAPIKey: Sendable {
        public var issuerId: String
        public var keyId: String
        public var publicKeyPEM: String

        public init(issuerId: String, keyId: String, publicKeyPEM: String) {
            self.issuerId = issuerId
            self.keyId = keyId
            self.publicKeyPEM = publicKeyPEM
        }
    }

    /// A simulated Apple Account on a device in a storefront.
    public struct Customer: Sendable, Hashable {
        public var appleId: String
        public var storefront: String
        public var deviceId: UUID
        public var appTransactionId: String
        /// Renewals fail while set (an expired card).
        public var billingFails = false
        /// Transactions in purchase order, as the device's receipt lists them.
        public var transactionIds: [String] = []
        /// Consumables the app has finished: they drop out of the receipt.
        public var finished: Set<String> = []
    }

    public struct StoredTransaction: Sendable, Hashable {
        public var payload: JWSTransactionDecodedPayload
        public var appleId: String
        /// When Apple last changed it (history v2 sorts by this).
        public var modified: Date
        public var consumptionRequested = false
    }

    public struct Subscription: Sendable, Hashable {
        public var originalTransactionId: String
        public var appleId: String
        public var group: String
        public var productId: String
        public var autoRenewProductId: String
        public var autoRenew: Bool
        public var expires: Date
        public var status: SubscriptionStatus
        public var gracePeriodExpires: Date?
        public var billingRetrySince: Date?
        public var expirationIntent: ExpirationIntent?
        public var lastTransactionId: String
        public var appAccountToken: String?
        public var extensions: [Date] = []
    }

    /// A notification and what happened to it.
    public struct SentNotification: Sendable, Hashable {
        public var payload: ResponseBodyV2DecodedPayload
        public var signedPayload: String
        public var attempts: [SendAttemptItem] = []
        /// Store time of the next attempt; nil when delivered or out of retries.
        public var nextAttempt: Date?
        public var delivered: Bool { attempts.last?.sendAttemptResult == .success }
    }

    public struct PendingPurchase: Sendable, Hashable {
        public var id: String
        public var appleId: String
        public var items: [PurchaseItem]
        public var appAccountToken: UUID?
    }

    public struct PurchaseItem: Sendable, Hashable, Codable {
        public var productId: String
        public var quantity: Int32
        public init(productId: String, quantity: Int32 = 1) {
            self.productId = productId
            self.quantity = quantity
        }
    }

    /// What a purchase returns to the simulated device.
    public struct PurchaseResult: Sendable {
        /// Signed transactions, one per item (merged payments: several).
        public var signedTransactions: [String]
        public var transactions: [JWSTransactionDecodedPayload]
        /// The device's app receipt after the purchase (PKCS#7, DER).
        public var receipt: [UInt8]
        /// Set for Ask to Buy: nothing was charged yet.
        public var pendingId: String?
    }

    public enum StoreError: Error, Hashable, Sendable, CustomStringConvertible {
        case unknownProduct(String)
        case unknownTransaction(String)
        case unknownSubscription(String)
        case unknownPending(String)
        case invalid(String)

        public var description: String {
            switch self {
            case .unknownProduct(let id): "unknown product '\(id)'"
            case .unknownTransaction(let id): "unknown transaction '\(id)'"
            case .unknownSubscription(let id): "unknown subscription '\(id)'"
            case .unknownPending(let id): "unknown pending purchase '\(id)'"
            case .invalid(let reason): reason
            }
        }
    }

    nonisolated public let configuration: Configuration
    nonisolated public let pki: ApplePKI
    nonisolated public let clock: StoreClock
    nonisolated let signer: JWSSigner

    private(set) var customers: [String: Customer] = [:]
    private(set) var transactions: [String: StoredTransaction] = [:]
    private(set) var subscriptions: [String: Subscription] = [:]
    private(set) var pending: [String: PendingPurchase] = [:]
    public private(set) var notifications: [SentNotification] = []
    /// Faults injected through the control API.
    public var faults = Faults()
    private var modificationCounter = 0

    public init(configuration: Configuration, pki: ApplePKI, clock: StoreClock = StoreClock()) {
        self.configuration = configuration
        self.pki = pki
        self.clock = clock
        self.signer = pki.jwsSigner
    }

    // MARK: Customers

    @discardableResult
    public func customer(_ appleId: String, storefront: String = "USA") -> Customer {
        if let existing = customers[appleId] { return existing }
        let customer = Customer(
            appleId: appleId, storefront: storefront, deviceId: UUID(), appTransactionId: TransactionIds.next())
        customers[appleId] = customer
        return customer
    }

    public func setBillingFails(_ appleId: String, _ fails: Bool) {
        customer(appleId)
        customers[appleId]?.billingFails = fails
    }

    // MARK: Purchases

    /// A customer buys `items` in one payment (several items: a merged payment, one receipt
    /// holding them all). With `askToBuy` nothing is charged until `approve`.
    public func buy(
        _ appleId: String, items: [PurchaseItem], appAccountToken: UUID? = nil, askToBuy: Bool = false
    ) throws -> PurchaseResult {
        guard !items.isEmpty else { throw StoreError.invalid("a purchase needs at least one product") }
        for item in items {
            guard let product = configuration.catalog.product(item.productId) else {
                throw StoreError.unknownProduct(item.productId)
            }
            guard (1...10).contains(item.quantity) else { throw StoreError.invalid("quantity must be 1…10") }
            if product.type != .consumable && item.quantity != 1 {
                throw StoreError.invalid("only consumables can be bought in quantity")
            }
        }
        customer(appleId)
        if askToBuy {
            let id = UUID().uuidString.lowercased()
            pending[id] = PendingPurchase(id: id, appleId: appleId, items: items, appAccountToken: appAccountToken)
            return PurchaseResult(
                signedTransactions: [], transactions: [], receipt: try receipt(for: appleId), pendingId: id)
        }
        return try charge(appleId, items: items, appAccountToken: appAccountToken)
    }

    /// A parent approves an Ask to Buy request: now the purchase happens.
    public func approve(_ pendingId: String) throws -> PurchaseResult {
        guard let request = pending.removeValue(forKey: pendingId) else { throw StoreError.unknownPending(pendingId) }
        return try charge(request.appleId, items: request.items, appAccountToken: request.appAccountToken)
    }

    /// A parent declines: nothing is ever charged.
    public func decline(_ pendingId: String) throws {
        guard pending.removeValue(forKey: pendingId) != nil else { throw StoreError.unknownPending(pendingId) }
    }

    private func charge(_ appleId: String, items: [PurchaseItem], appAccountToken: UUID?) throws -> PurchaseResult {
        let now = clock.now()
        var payloads: [JWSTransactionDecodedPayload] = []
        for item in items {
            let product = configuration.catalog.product(item.productId)!
            var payload = issue(product, quantity: item.quantity, appleId: appleId, token: appAccountToken, at: now)
            if product.type == .autoRenewable {
                payload = try subscribe(product, payload: payload, appleId: appleId, at: now)
            } else {
                store(payload, appleId: appleId, at: now)
                notify(.oneTimeCharge, subtype: nil, transaction: payload, at: now)
            }
            payloads.append(payload)
        }
        return PurchaseResult(
            signedTransactions: try payloads.map { try signer.sign(signed($0, at: now)) }, transactions: payloads,
            receipt: try receipt(for: appleId), pendingId: nil)
    }

    private func issue(
        _ product: Product, quantity: Int32, appleId: String, token: UUID?, at now: Date,
        original: String? = nil, originalPurchase: Date? = nil, reason: TransactionReason = .purchase
    ) -> JWSTransactionDecodedPayload {
        let storefront = customers[appleId]?.storefront ?? "USA"
        let price = product.price(in: storefront)
        let purchase = TransactionIssuer.Purchase(
            bundleId: configuration.bundleId, productId: product.id, type: product.type.appleType, quantity: quantity,
            appAccountToken: token, environment: configuration.environment, storefront: storefront,
            currency: price.currency, unitPrice: price.milliunits, subscriptionGroupIdentifier: product.group)
        var payload = TransactionIssuer().transaction(for: purchase, at: now, id: TransactionIds.next())
        if let original { payload.originalTransactionId = original }
        if let originalPurchase { payload.originalPurchaseDate = originalPurchase.milliseconds }
        payload.transactionReason = reason
        payload.appTransactionId = customers[appleId]?.appTransactionId
        if product.type == .autoRenewable {
            payload.expiresDate = (product.period ?? ISODuration(months: 1)).added(to: now).milliseconds
        }
        return payload
    }

    private func store(_ payload: JWSTransactionDecodedPayload, appleId: String, at now: Date) {
        let id = payload.transactionId!
        transactions[id] = StoredTransaction(payload: payload, appleId: appleId, modified: now)
        customers[appleId]?.transactionIds.append(id)
    }

    /// The app finished a transaction: consumables leave the device's receipt.
    public func finish(_ transactionId: String) throws {
        guard let stored = transactions[transactionId] else { throw StoreError.unknownTransaction(transactionId) }
        customers[stored.appleId]?.finished.insert(transactionId)
    }

    // MARK: Subscriptions

    private func subscribe(
        _ product: Product, payload: JWSTransactionDecodedPayload, appleId: String, at now: Date
    ) throws -> JWSTransactionDecodedPayload {
        let group = product.group ?? ""
        var payload = payload
        // One subscription per group and customer: buying again in the group is a resubscribe.
        if var existing = subscriptions.values.first(where: { $0.appleId == appleId && $0.group == group }) {
            guard existing.status == .expired || existing.status == .revoked else {
                throw StoreError.invalid("already subscribed in group '\(group)'; change the product instead")
            }
            payload.originalTransactionId = existing.originalTransactionId
            if let first = transactions[existing.originalTransactionId]?.payload.originalPurchaseDate {
                payload.originalPurchaseDate = first
            }
            store(payload, appleId: appleId, at: now)
            existing.productId = product.id
            existing.autoRenewProductId = product.id
            existing.autoRenew = true
            existing.expires = Date(milliseconds: payload.expiresDate!)
            existing.status = .active
            existing.gracePeriodExpires = nil
            existing.billingRetrySince = nil
            existing.expirationIntent = nil
            existing.lastTransactionId = payload.transactionId!
            existing.appAccountToken = payload.appAccountToken ?? existing.appAccountToken
            subscriptions[existing.originalTransactionId] = existing
            notify(.subscribed, subtype: .resubscribe, subscription: existing, at: now)
            return payload
        }
        store(payload, appleId: appleId, at: now)
        let subscription = Subscription(
            originalTransactionId: payload.originalTransactionId!, appleId: appleId, group: group,
            productId: product.id,
            autoRenewProductId: product.id, autoRenew: true, expires: Date(milliseconds: payload.expiresDate!),
            status: .active, lastTransactionId: payload.transactionId!, appAccountToken: payload.appAccountToken)
        subscriptions[subscription.originalTransactionId] = subscription
        notify(.subscribed, subtype: .initialBuy, subscription: subscription, at: now)
        return payload
    }

    /// The customer turns auto-renew off (or back on).
    public func setAutoRenew(_ originalTransactionId: String, _ on: Bool) throws {
        guard var subscription = subscriptions[originalTransactionId] else {
            throw StoreError.unknownSubscription(originalTransactionId)
        }
        guard subscription.autoRenew != on else { return }
        subscription.autoRenew = on
        subscriptions[originalTransactionId] = subscription
        notify(
            .didChangeRenewalStatus, subtype: on ? .autoRenewEnabled : .autoRenewDisabled, subscription: subscription,
            at: clock.now())
    }

    /// Upgrade (immediate), downgrade or crossgrade to another duration (next renewal) within
    /// the group; `productId` equal to the current product cancels a pending downgrade.
    public func changeProduct(_ originalTransactionId: String, to productId: String) throws {
        guard var subscription = subscriptions[originalTransactionId] else {
            throw StoreError.unknownSubscription(originalTransactionId)
        }
        guard let target = configuration.catalog.product(productId), target.group == subscription.group else {
            throw StoreError.invalid("'\(productId)' is not in subscription group '\(subscription.group)'")
        }
        let now = clock.now()
        let ranks = configuration.catalog.group(subscription.group).map(\.id)
        let currentRank = ranks.firstIndex(of: subscription.productId) ?? 0
        let targetRank = ranks.firstIndex(of: productId) ?? 0
        let current = configuration.catalog.product(subscription.productId)
        if productId == subscription.productId {
            subscription.autoRenewProductId = productId
            subscriptions[originalTransactionId] = subscription
            notify(.didChangeRenewalPref, subtype: nil, subscription: subscription, at: now)
            return
        }
        // Catalog order ranks a group: earlier is a higher level. Same period counts as an
        // upgrade (crossgrade, immediate), like App Store Connect's rule.
        let samePeriod = (current?.period ?? ISODuration(months: 1)) == (target.period ?? ISODuration(months: 1))
        if targetRank < currentRank || samePeriod {
            if var old = transactions[subscription.lastTransactionId] {
                old.payload.isUpgraded = true
                old.modified = now
                transactions[subscription.lastTransactionId] = old
            }
            var payload = issue(
                target, quantity: 1, appleId: subscription.appleId,
                token: subscription.appAccountToken.flatMap(UUID.init(uuidString:)), at: now,
                original: originalTransactionId,
                originalPurchase: transactions[originalTransactionId].map {
                    Date(milliseconds: $0.payload.originalPurchaseDate ?? 0)
                })
            payload.transactionReason = .purchase
            store(payload, appleId: subscription.appleId, at: now)
            subscription.productId = productId
            subscription.autoRenewProductId = productId
            subscription.expires = Date(milliseconds: payload.expiresDate!)
            subscription.lastTransactionId = payload.transactionId!
            subscriptions[originalTransactionId] = subscription
            notify(.didChangeRenewalPref, subtype: .upgrade, subscription: subscription, at: now)
        } else {
            subscription.autoRenewProductId = productId
            subscriptions[originalTransactionId] = subscription
            notify(.didChangeRenewalPref, subtype: .downgrade, subscription: subscription, at: now)
        }
    }

    /// Moves store time forward and lets everything due happen: renewals, billing failures,
    /// grace and retry expiry, notification retries.
    public func advance(by interval: TimeInterval) {
        clock.advance(by: interval)
        processDueEvents()
    }

    /// Applies every subscription event due by now (also called on a timer when the clock runs).
    public func processDueEvents() {
        let now = clock.now()
        for id in subscriptions.keys.sorted() {
            // Bounded: at most one renewal per period that passed, and a sane cap.
            for _ in 0..<1000 {
                guard let subscription = subscriptions[id], step(subscription, now: now) else { break }
            }
        }
    }

    /// One lifecycle step of a subscription if one is due; false when nothing is.
    private func step(_ subscription: Subscription, now: Date) -> Bool {
        var subscription = subscription
        switch subscription.status {
        case .active where subscription.expires <= now:
            let at = subscription.expires
            guard subscription.autoRenew else {
                subscription.status = .expired
                subscription.expirationIntent = .customerCancelled
                subscriptions[subscription.originalTransactionId] = subscription
                notify(.expired, subtype: .voluntary, subscription: subscription, at: at)
                return true
            }
            if customers[subscription.appleId]?.billingFails == true {
                subscription.billingRetrySince = at
                if let grace = configuration.gracePeriod {
                    subscription.status = .billingGracePeriod
                    subscription.gracePeriodExpires = at.addingTimeInterval(grace)
                    subscriptions[subscription.originalTransactionId] = subscription
                    notify(.didFailToRenew, subtype: .gracePeriod, subscription: subscription, at: at)
                } else {
                    subscription.status = .billingRetry
                    subscriptions[subscription.originalTransactionId] = subscription
                    notify(.didFailToRenew, subtype: nil, subscription: subscription, at: at)
                }
                return true
            }
            renew(&subscription, at: at, subtype: nil)
            return true
        case .billingGracePeriod, .billingRetry:
            let since = subscription.billingRetrySince ?? subscription.expires
            if customers[subscription.appleId]?.billingFails == false {
                // Billing recovered: renew now, from the recovery date.
                renew(&subscription, at: max(now, since), subtype: .billingRecovery)
                return true
            }
            if subscription.status == .billingGracePeriod, let graceEnd = subscription.gracePeriodExpires,
                graceEnd <= now
            {
                subscription.status = .billingRetry
                subscriptions[subscription.originalTransactionId] = subscription
                notify(.gracePeriodExpired, subtype: nil, subscription: subscription, at: graceEnd)
                return true
            }
            let retryEnd = since.addingTimeInterval(configuration.billingRetryPeriod)
            if retryEnd <= now {
                subscription.status = .expired
                subscription.expirationIntent = .billingError
                subscription.gracePeriodExpires = nil
                subscriptions[subscription.originalTransactionId] = subscription
                notify(.expired, subtype: .billingRetry, subscription: subscription, at: retryEnd)
                return true
            }
            return false
        default:
            return false
        }
    }

    private func renew(_ subscription: inout Subscription, at date: Date, subtype: NotificationSubtype?) {
        guard let product = configuration.catalog.product(subscription.autoRenewProductId) else { return }
        let first = transactions[subscription.originalTransactionId]?.payload.originalPurchaseDate
        var payload = issue(
            product, quantity: 1, appleId: subscription.appleId,
            token: subscription.appAccountToken.flatMap(UUID.init(uuidString:)), at: date,
            original: subscription.originalTransactionId, originalPurchase: first.map(Date.init(milliseconds:)),
            reason: .renewal)
        if subtype == nil {
            // An on-time renewal continues the previous period.
            payload.purchaseDate = subscription.expires.milliseconds
            payload.expiresDate =
                (product.period ?? ISODuration(months: 1)).added(to: subscription.expires).milliseconds
        }
        store(payload, appleId: subscription.appleId, at: date)
        subscription.productId = product.id
        subscription.expires = Date(milliseconds: payload.expiresDate!)
        subscription.status = .active
        subscription.gracePeriodExpires = nil
        subscription.billingRetrySince = nil
        subscription.lastTransactionId = payload.transactionId!
        subscriptions[subscription.originalTransactionId] = subscription
        notify(.didRenew, subtype: subtype, subscription: subscription, at: date)
    }

    /// Extend a Subscription Renewal Date (Server API): at most 90 days, two per 365 days, active only.
    public func extendRenewalDate(
        _ originalTransactionId: String, days: Int32, requestIdentifier: String
    ) throws -> ExtendRenewalDateResponse {
        guard var subscription = subscriptions[originalTransactionId] else {
            throw StoreError.unknownSubscription(originalTransactionId)
        }
        let now = clock.now()
        guard (1...90).contains(days) else { throw StoreError.invalid("extendByDays must be 1…90") }
        guard subscription.status == .active else { throw StoreError.invalid("subscription is not active") }
        let recent = subscription.extensions.filter { now.timeIntervalSince($0) < 365 * 86_400 }
        guard recent.count < 2 else { throw StoreError.invalid("two extensions in 365 days already") }
        subscription.extensions = recent + [now]
        subscription.expires = subscription.expires.addingTimeInterval(Double(days) * 86_400)
        if var last = transactions[subscription.lastTransactionId] {
            last.payload.expiresDate = subscription.expires.milliseconds
            last.modified = now
            transactions[subscription.lastTransactionId] = last
        }
        subscriptions[originalTransactionId] = subscription
        notify(.renewalExtended, subtype: nil, subscription: subscription, at: now)
        return ExtendRenewalDateResponse(
            originalTransactionId: originalTransactionId,
            webOrderLineItemId: transactions[subscription.lastTransactionId]?.payload.webOrderLineItemId, success: true,
            effectiveDate: subscription.expires.milliseconds)
    }

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

    // MARK: Reads

    public func transaction(_ id: String) -> StoredTransaction? { transactions[id] }

    public func subscription(_ originalTransactionId: String) -> Subscription? { subscriptions[originalTransactionId] }

    public func pendingPurchase(_ id: String) -> PendingPurchase? { pending[id] }

    /// The customer owning any transaction id, original transaction id or app transaction id.
    public func owner(of anyTransactionId: String) -> String? {
        if let stored = transactions[anyTransactionId] { return stored.appleId }
        return customers.values.first { $0.appTransactionId == anyTransactionId }?.appleId
    }

    /// Every transaction of a customer, oldest change first (history v2 order).
    public func history(of appleId: String) -> [StoredTransaction] {
        (customers[appleId]?.transactionIds ?? []).compactMap { transactions[$0] }
            .sorted { ($0.modified, $0.payload.transactionId ?? "") < ($1.modified, $1.payload.transactionId ?? "") }
    }

    public func subscriptions(of appleId: String) -> [Subscription] {
        subscriptions.values.filter { $0.appleId == appleId }.sorted {
            $0.originalTransactionId < $1.originalTransactionId
        }
    }

    /// The payload as Apple would sign it now (fresh `signedDate`, faults applied).
    nonisolated func signed(_ payload: JWSTransactionDecodedPayload, at now: Date, dropToken: Bool = false)
        -> JWSTransactionDecodedPayload
    {
        var payload = payload
        payload.signedDate = now.milliseconds
        if dropToken { payload.appAccountToken = nil }
        return payload
    }

    public func signTransaction(_ id: String) throws -> String {
        guard let stored = transactions[id] else { throw StoreError.unknownTransaction(id) }
        return try signer.sign(signed(stored.payload, at: clock.now(), dropToken: faults.dropAppAccountToken))
    }

    public func signRenewalInfo(_ originalTransactionId: String) throws -> String {
        guard let subscription = subscriptions[originalTransactionId] else {
            throw StoreError.unknownSubscription(originalTransactionId)
        }
        return try signer.sign(renewalInfo(subscription, at: clock.now()))
    }

    func renewalInfo(_ subscription: Subscription, at now: Date) -> JWSRenewalInfoDecodedPayload {
        let product = configuration.catalog.product(subscription.autoRenewProductId)
        let price = product?.price(in: customers[subscription.appleId]?.storefront ?? "USA")
        return JWSRenewalInfoDecodedPayload(
            originalTransactionId: subscription.originalTransactionId, productId: subscription.productId,
            autoRenewProductId: subscription.autoRenewProductId, autoRenewStatus: subscription.autoRenew ? .on : .off,
            expirationIntent: subscription.status == .expired ? subscription.expirationIntent : nil,
            isInBillingRetryPeriod: subscription.status == .billingRetry || subscription.status == .billingGracePeriod
                ? true : nil,
            gracePeriodExpiresDate: subscription.gracePeriodExpires?.milliseconds, signedDate: now.milliseconds,
            environment: configuration.environment,
            recentSubscriptionStartDate: transactions[subscription.originalTransactionId]?.payload.purchaseDate,
            renewalDate: subscription.expires.milliseconds, renewalPrice: price?.milliunits, currency: price?.currency,
            appAccountToken: subscription.appAccountToken,
            appTransactionId: customers[subscription.appleId]?.appTransactionId)
    }

    // MARK: Receipts

    /// The customer's app receipt as the device holds it: every purchase except finished
    /// consumables, signed by the receipt chain.
    public func receipt(for appleId: String) throws -> [UInt8] {
        guard let signer = pki.receiptSigner else { throw StoreError.invalid("this PKI has no receipt chain") }
        return try signer.sign(appReceipt(for: appleId))
    }

    func appReceipt(for appleId: String) -> AppReceipt {
        let customer = customers[appleId]
        let now = clock.now()
        var receipt = AppReceipt(
            inAppPurchases: (customer?.transactionIds ?? []).compactMap { id -> AppReceiptInAppPurchase? in
                guard let stored = transactions[id] else { return nil }
                if stored.payload.type == .consumable && customer?.finished.contains(id) == true { return nil }
                let payload = stored.payload
                return AppReceiptInAppPurchase(
                    quantity: Int64(payload.quantity ?? 1), productId: payload.productId,
                    transactionId: payload.transactionId,
                    purchaseDate: payload.purchaseDate.map(Date.init(milliseconds:)),
                    originalTransactionId: payload.originalTransactionId,
                    originalPurchaseDate: payload.originalPurchaseDate.map(Date.init(milliseconds:)),
                    productType: Self.receiptProductType(payload.type),
                    subscriptionExpirationDate: payload.expiresDate.map(Date.init(milliseconds:)),
                    webOrderLineItemId: payload.webOrderLineItemId.flatMap { Int64($0) }.map(String.init),
                    cancellationDate: payload.revocationDate.map(Date.init(milliseconds:)), isTrialPeriod: false,
                    isInIntroOfferPeriod: false)
            })
        receipt.receiptType = configuration.environment == .sandbox ? "ProductionSandbox" : "Production"
        receipt.appItemId = configuration.environment == .sandbox ? 0 : configuration.appAppleId
        receipt.bundleId = configuration.bundleId
        receipt.applicationVersion = "1"
        receipt.originalApplicationVersion = "1.0"
        // The device hash exactly as a device checks it (receipts.md §4.7):
        // SHA-1(identifierForVendor bytes ‖ opaque value ‖ bundle id attribute bytes).
        let opaque = (0..<16).map { _ in UInt8.random(in: 0...255) }
        let bundleBytes = Self.utf8StringTLV(configuration.bundleId)
        let deviceBytes = customer.map { withUnsafeBytes(of: $0.deviceId.uuid) { Array($0) } } ?? []
        receipt.opaqueValue = opaque
        receipt.bundleIdValueBytes = bundleBytes
        receipt.sha1Hash = Array(Insecure.SHA1.hash(data: deviceBytes + opaque + bundleBytes))
        receipt.creationDate = now
        receipt.requestDate = now
        receipt.originalPurchaseDate = now
        receipt.downloadId = customer.flatMap { Int64($0.appTransactionId) }
        return receipt
    }

    /// A DER UTF8String: tag, length, bytes.
    static func utf8StringTLV(_ text: String) -> [UInt8] {
        let bytes = Array(text.utf8)
        var length: [UInt8]
        if bytes.count < 0x80 {
            length = [UInt8(bytes.count)]
        } else {
            var value = bytes.count
            length = []
            while value > 0 {
                length.insert(UInt8(value & 0xFF), at: 0)
                value >>= 8
            }
            length.insert(0x80 | UInt8(length.count), at: 0)
        }
        return [0x0C] + length + bytes
    }

    private static func receiptProductType(_ type: ProductType?) -> Int64? {
        switch type {
        case .nonConsumable?: 0
        case .consumable?: 1
        case .nonRenewing?: 2
        case .autoRenewable?: 3
        default: nil
        }
    }

    // MARK: Notifications

    private func notify(
        _ type: NotificationType, subtype: NotificationSubtype?, subscription: Subscription, at date: Date
    ) {
        guard let transaction = transactions[subscription.lastTransactionId]?.payload else { return }
        enqueue(
            type, subtype: subtype, transaction: transaction, renewal: renewalInfo(subscription, at: date),
            status: subscription.status, at: date, consumptionReason: nil)
    }

    private func notify(
        _ type: NotificationType, subtype: NotificationSubtype?, transaction: JWSTransactionDecodedPayload,
        at date: Date,
        consumptionReason: ConsumptionRequestReason? = nil
    ) {
        enqueue(
            type, subtype: subtype, transaction: transaction, renewal: nil, status: nil, at: date,
            consumptionReason: consumptionReason)
    }

    private func enqueue(
        _ type: NotificationType, subtype: NotificationSubtype?, transaction: JWSTransactionDecodedPayload,
        renewal: JWSRenewalInfoDecodedPayload?, status: SubscriptionStatus?, at date: Date,
        consumptionReason: ConsumptionRequestReason?
    ) {
        do {
            let signedTransaction = try signer.sign(
                signed(transaction, at: date, dropToken: faults.dropAppAccountToken))
            let payload = ResponseBodyV2DecodedPayload(
                notificationType: type, subtype: subtype, notificationUUID: UUID().uuidString.lowercased(),
                version: "2.0",
                signedDate: date.milliseconds,
                data: NotificationData(
                    appAppleId: configuration.appAppleId, bundleId: configuration.bundleId, bundleVersion: "1",
                    environment: configuration.environment, signedTransactionInfo: signedTransaction,
                    signedRenewalInfo: try renewal.map { try signer.sign($0) }, status: status,
                    consumptionRequestReason: consumptionReason))
            try append(payload)
        } catch {
            // Signing in-memory payloads cannot fail short of a broken key; nothing to deliver then.
            assertionFailure("cannot sign notification: \(error)")
        }
    }

    private func append(_ payload: ResponseBodyV2DecodedPayload) throws {
        let signedPayload = try signer.sign(payload)
        notifications.append(SentNotification(payload: payload, signedPayload: signedPayload, nextAttempt: clock.now()))
    }

    /// Request a Test Notification (Server API): returns its token (the notification UUID).
    public func sendTestNotification() throws -> String {
        let payload = ResponseBodyV2DecodedPayload(
            notificationType: .test, notificationUUID: UUID().uuidString.lowercased(), version: "2.0",
            signedDate: clock.now().milliseconds,
            data: NotificationData(
                appAppleId: configuration.appAppleId, bundleId: configuration.bundleId,
                environment: configuration.environment))
        try append(payload)
        return payload.notificationUUID!
    }

    /// Notifications whose next attempt is due, oldest first.
    func dueNotifications() -> [Int] {
        let now = clock.now()
        return notifications.indices.filter { notifications[$0].nextAttempt.map { $0 <= now } ?? false }
    }

    func notification(at index: Int) -> SentNotification { notifications[index] }

    /// Records a send attempt and schedules the next per Apple's retry schedule.
    func recordAttempt(at index: Int, result: SendAttemptResult) {
        let now = clock.now()
        var notification = notifications[index]
        notification.attempts.append(SendAttemptItem(attemptDate: now.milliseconds, sendAttemptResult: result))
        let retries = configuration.environment == .production || configuration.retryNotificationsInSandbox
        let retryIndex = notification.attempts.count - 1
        if result == .success || !retries || retryIndex >= Self.retrySchedule.count {
            notification.nextAttempt = nil
        } else {
            notification.nextAttempt = now.addingTimeInterval(Self.retrySchedule[retryIndex])
        }
        notifications[index] = notification
    }

    /// Apple's V2 retry schedule after a failed attempt: +1, 12, 24, 48, 72 hours.
    public static let retrySchedule: [TimeInterval] = [3600, 12 * 3600, 24 * 3600, 48 * 3600, 72 * 3600]
}

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
    func takeFault(_ endpoint: String) -> Faults.Endpoint? {
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
