import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// The subscription renewal engine: subscribing, auto-renew, product changes, the clock
/// advancing renewals, billing retry and grace, renewal date extensions.
extension LocalAppStore {
    // MARK: Subscriptions

    func subscribe(
        _ product: Product, payload: JWSTransactionDecodedPayload, appleId: String, at now: Date
    ) throws -> JWSTransactionDecodedPayload {
        let group = product.group ?? ""
        var payload = payload
        // One subscription per group and customer: buying again in the group is a resubscribe.
        if var existing = subscriptions.values.first(where: { $0.appleId == appleId && $0.group == group }) {
            if payload.offerType == .promotionalOffer, existing.status != .expired, existing.status != .revoked,
                existing.productId == product.id
            {
                // A subscriber redeems a promotional offer: it takes effect at the next renewal
                // (Apple: one active offer at a time, replaced at the next billing event).
                existing.pendingOffer = PendingOffer(
                    type: payload.offerType, id: payload.offerIdentifier, discountType: payload.offerDiscountType,
                    period: payload.offerPeriod, price: payload.price)
                existing.autoRenew = true
                subscriptions[existing.originalTransactionId] = existing
                notify(.offerRedeemed, subtype: nil, subscription: existing, at: now)
                return transactions[existing.lastTransactionId]?.payload ?? payload
            }
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
        if var commitment = subscription.commitment {
            // Committed to 12 months: cancelling stops the next commitment; billing goes on.
            guard commitment.renews != on else { return }
            commitment.renews = on
            subscription.commitment = commitment
            subscriptions[originalTransactionId] = subscription
            notify(
                .didChangeRenewalStatus, subtype: on ? .autoRenewEnabled : .autoRenewDisabled,
                subscription: subscription, at: clock.now())
            return
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
        remindUnreportedTokens()
    }

    /// One lifecycle step of a subscription if one is due; false when nothing is.
    func step(_ subscription: Subscription, now: Date) -> Bool {
        var subscription = subscription
        switch subscription.status {
        case .active where subscription.expires <= now:
            let at = subscription.expires
            let commitmentEnds = subscription.commitment.map { $0.period >= $0.periods && !$0.renews } ?? false
            guard subscription.autoRenew, !commitmentEnds else {
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

    func renew(_ subscription: inout Subscription, at date: Date, subtype: NotificationSubtype?) {
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
        if var commitment = subscription.commitment {
            // The next month of the commitment, or the first of a new one.
            let start = subtype == nil ? subscription.expires : date
            if commitment.period >= commitment.periods {
                commitment.period = 1
                commitment.expires = ISODuration(years: 1).added(to: start)
            } else {
                commitment.period += 1
            }
            commit(&payload, commitment, at: start)
            subscription.commitment = commitment
        }
        if let offer = subscription.pendingOffer {
            // The promotional offer redeemed during the last period starts with this renewal.
            payload.offerType = offer.type
            payload.offerIdentifier = offer.id
            payload.offerDiscountType = offer.discountType
            payload.offerPeriod = offer.period
            if let price = offer.price { payload.price = price }
            subscription.pendingOffer = nil
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
        // The same request identifier resends the same request: answered, not applied twice.
        if let done = extensionAnswers["\(originalTransactionId)|\(requestIdentifier)"] { return done }
        let now = clock.now()
        guard (1...90).contains(days) else { throw StoreError.invalid("extendByDays must be 1…90") }
        guard subscription.status == .active else { throw ExtensionRefusal.ineligible }
        let recent = subscription.extensions.filter { now.timeIntervalSince($0) < 365 * 86_400 }
        guard recent.count < 2 else { throw ExtensionRefusal.maximum }
        subscription.extensions = recent + [now]
        subscription.expires = subscription.expires.addingTimeInterval(Double(days) * 86_400)
        if var last = transactions[subscription.lastTransactionId] {
            last.payload.expiresDate = subscription.expires.milliseconds
            last.modified = now
            transactions[subscription.lastTransactionId] = last
        }
        subscriptions[originalTransactionId] = subscription
        notify(.renewalExtended, subtype: nil, subscription: subscription, at: now)
        let answer = ExtendRenewalDateResponse(
            originalTransactionId: originalTransactionId,
            webOrderLineItemId: transactions[subscription.lastTransactionId]?.payload.webOrderLineItemId, success: true,
            effectiveDate: subscription.expires.milliseconds)
        extensionAnswers["\(originalTransactionId)|\(requestIdentifier)"] = answer
        return answer
    }

    /// Extend Subscription Renewal Dates for All Active Subscribers: every active subscription
    /// of the product (in the storefronts, when given) is extended or fails with
    /// RENEWAL_EXTENSION / FAILURE, then RENEWAL_EXTENSION / SUMMARY. It completes at once
    /// (Apple's can take days); a repeated request identifier changes nothing.
    public func massExtend(
        productId: String, days: Int32, requestIdentifier: String, storefronts: [String]?
    ) throws {
        guard massExtensions[requestIdentifier] == nil else { return }
        guard configuration.catalog.product(productId)?.type == .autoRenewable else {
            throw StoreError.unknownProduct(productId)
        }
        guard (1...90).contains(days) else { throw StoreError.invalid("extendByDays must be 1…90") }
        let now = clock.now()
        var succeeded: Int64 = 0
        var failed: Int64 = 0
        let targets = subscriptions.values.filter { subscription in
            subscription.productId == productId && subscription.status != .expired && subscription.status != .revoked
                && (storefronts.map { $0.contains(customers[subscription.appleId]?.storefront ?? "USA") } ?? true)
        }.sorted { $0.originalTransactionId < $1.originalTransactionId }
        for subscription in targets {
            do {
                _ = try extendRenewalDate(
                    subscription.originalTransactionId, days: days, requestIdentifier: requestIdentifier)
                succeeded += 1
            } catch {
                failed += 1
                notify(.renewalExtension, subtype: .failure, subscription: subscription, at: now)
            }
        }
        let summary = ResponseBodyV2DecodedPayload(
            notificationType: .renewalExtension, subtype: .summary, notificationUUID: UUID().uuidString.lowercased(),
            version: "2.0", signedDate: now.milliseconds,
            summary: NotificationSummary(
                environment: configuration.environment, appAppleId: configuration.appAppleId,
                bundleId: configuration.bundleId, productId: productId, requestIdentifier: requestIdentifier,
                storefrontCountryCodes: storefronts, succeededCount: succeeded, failedCount: failed))
        try append(summary)
        massExtensions[requestIdentifier] = MassExtendRenewalDateStatusResponse(
            requestIdentifier: requestIdentifier, complete: true, completeDate: now.milliseconds,
            succeededCount: succeeded, failedCount: failed)
    }

    public func massExtensionStatus(_ requestIdentifier: String) -> MassExtendRenewalDateStatusResponse? {
        massExtensions[requestIdentifier]
    }
}

extension LocalAppStore {
    /// Apple's refusals of Extend a Subscription Renewal Date.
    public enum ExtensionRefusal: Error, Sendable {
        /// `SubscriptionExtensionIneligibleError` (4030004): not active, or a free period.
        case ineligible
        /// `SubscriptionMaxExtensionError` (4030005): two extensions within 365 days.
        case maximum
    }
}
