import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// App Store Server Notifications V2: queued, signed, sent and retried on Apple's schedule.
extension LocalAppStore {
    // MARK: Notifications

    func notify(
        _ type: NotificationType, subtype: NotificationSubtype?, subscription: Subscription, at date: Date
    ) {
        guard let transaction = transactions[subscription.lastTransactionId]?.payload else { return }
        enqueue(
            type, subtype: subtype, transaction: transaction, renewal: renewalInfo(subscription, at: date),
            status: subscription.status, at: date, consumptionReason: nil)
    }

    func notify(
        _ type: NotificationType, subtype: NotificationSubtype?, transaction: JWSTransactionDecodedPayload,
        at date: Date,
        consumptionReason: ConsumptionRequestReason? = nil
    ) {
        enqueue(
            type, subtype: subtype, transaction: transaction, renewal: nil, status: nil, at: date,
            consumptionReason: consumptionReason)
    }

    func enqueue(
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

    func append(_ payload: ResponseBodyV2DecodedPayload) throws {
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
