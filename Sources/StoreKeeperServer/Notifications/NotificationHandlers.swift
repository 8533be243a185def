import AppStoreAdapter
import AppStoreModels
import AppStoreVerification
import Foundation
import Hummingbird
import Logging
import StoreKeeperCore
import StoreKeeperStorage

/// `POST /v1/notifications/apple`: App Store Server Notifications V2. On the request path only
/// what the 200 promises: the payload and everything signed inside it verified, and one
/// durable insert (group committed). Applying is the job queue's (NotificationStore).
extension StoreKeeperApp {
    struct NotificationBody: RequestBody, FastDecodable {
        var signedPayload: String?

        init(fast f: FastJSON.Fields) throws {
            signedPayload = try f.string("signedPayload")
        }

        func validate() throws {
            guard let signedPayload, !signedPayload.isEmpty else {
                throw APIError.badRequest("field 'signedPayload' is required")
            }
        }
    }

    /// A notification and everything signed in it, verified (a refusal is a security event),
    /// as it is recorded: the endpoint's check, and reconciliation's for Notification History.
    func verifiedNotification(_ signedPayload: String) async throws -> NotificationRecord {
        try await Self.verifiedNotification(signedPayload, verifier: verifier, metrics: metrics, logger: logger)
    }

    static func verifiedNotification(
        _ signedPayload: String, verifier: SignedDataVerifier, metrics: ServerMetrics, logger: Logger
    ) async throws -> NotificationRecord {
        let verified: VerifiedNotification
        do {
            verified = try await verifier.verifyNotification(signedPayload)
        } catch let failure as VerificationFailure {
            // Anyone can POST here: a payload that does not verify is a security event, and
            // Apple (if it was Apple) retries it.
            metrics.verificationFailure(failure.code)
            metrics.notificationRejected.increment()
            logger.warning(
                "security: notification rejected",
                metadata: [
                    "code": "\(failure.code)", "reason": "\(failure.reason)",
                    "bytes": "\(signedPayload.utf8.count)",
                ])
            throw APIError.verification(failure, status: .badRequest)
        }
        guard
            let record = NotificationRecord(
                payload: verified.payload, transaction: verified.transaction, renewalInfo: verified.renewalInfo,
                appTransaction: verified.appTransaction),
            record.notificationUUID.unicodeScalars.count <= 128
        else {
            throw APIError.badRequest("the notification has no notificationUUID, notificationType or signedDate")
        }
        try Self.validateText(record.notificationUUID, field: "notificationUUID")
        return record
    }

    /// How the applier reads back a notification this server recorded (verified when it was
    /// accepted): decoded from the stored `signedPayload`, not verified again.
    static func storedNotification(_ signedPayload: String) throws -> NotificationRecord {
        let decoded = try SignedDataVerifier.decodeVerifiedEarlier(notification: signedPayload)
        guard
            let record = NotificationRecord(
                payload: decoded.payload, transaction: decoded.transaction, renewalInfo: decoded.renewalInfo,
                appTransaction: decoded.appTransaction)
        else { throw APIError.badRequest("stored notification without notificationUUID, type or signedDate") }
        return record
    }
}

/// `POST /v1/notifications/apple`: verify, record durably, answer 200.
struct NotificationsController: RequestHandling {
    let verifier: SignedDataVerifier
    let notifications: NotificationStore
    let metrics: ServerMetrics
    let logger: Logger
    let maxBodyBytes: Int

    /// Outside `/v1`'s authentication: Apple signs the body, it sends no credentials.
    func addRoutes(to router: some RouterMethods<StoreKeeperContext>) {
        router.post("v1/notifications/apple") { request, context in try await receiveNotification(request, context) }
    }

    func receiveNotification(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let body = try await decode(StoreKeeperApp.NotificationBody.self, request)
        guard let signedPayload = body.signedPayload else {
            throw APIError.badRequest("field 'signedPayload' is required")
        }
        let record = try await StoreKeeperApp.verifiedNotification(
            signedPayload, verifier: verifier, metrics: metrics, logger: logger)
        try await notifications.accept(record, signedPayload: signedPayload, now: Date())
        metrics.notificationAccepted.increment()
        return Response(status: .ok)
    }
}

extension StoreKeeperApp {
    /// How notifications and refunds are applied here (catalog, ownership policy, consumption,
    /// shared Apple ID limit, apps): one definition for every store's path.
    func notificationSettings() -> NotificationStore.Settings {
        var settings = NotificationStore.Settings(
            catalog: catalog, policy: configuration.ownershipPolicy,
            consumptionEnabled: configuration.consumptionEnabled, read: StoreKeeperApp.storedNotification)
        settings.sharedAppleIdLimit = configuration.sharedAppleIdAccounts
        settings.apps = store.apps
        return settings
    }
}
