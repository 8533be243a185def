import AppStoreModels
import AppStoreVerification
import Foundation
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage

/// `POST /v1/notifications/apple`: App Store Server Notifications V2. On the request path only
/// what the 200 promises: the payload and everything signed inside it verified, and one
/// durable insert (group committed). Applying is the job queue's (NotificationStore).
extension StoreKeeperApp {
    struct NotificationBody: Decodable {
        var signedPayload: String?
    }

    func receiveNotification(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        let body = try await decode(NotificationBody.self, request)
        guard let signedPayload = body.signedPayload, !signedPayload.isEmpty else {
            throw APIError.badRequest("field 'signedPayload' is required")
        }
        try await acceptNotification(signedPayload)
        metrics.notificationAccepted.increment()
        return Response(status: .ok)
    }

    /// Verifies a notification and records it durably (a known UUID changes nothing).
    func acceptNotification(_ signedPayload: String) async throws {
        let record = try await verifiedNotification(signedPayload)
        try await notifications.accept(record, signedPayload: signedPayload, now: Date())
    }

    /// A notification and everything signed in it, verified (a refusal is a security event),
    /// as it is recorded: the endpoint's check, and reconciliation's for Notification History.
    func verifiedNotification(_ signedPayload: String) async throws -> NotificationRecord {
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
        let payload = verified.payload
        guard let uuid = payload.notificationUUID, !uuid.isEmpty, uuid.count <= 128,
            let type = payload.notificationType?.rawValue, let signedDate = payload.signedDate
        else {
            throw APIError.badRequest("the notification has no notificationUUID, notificationType or signedDate")
        }
        try Self.validateText(uuid, field: "notificationUUID")
        return NotificationRecord(
            notificationUUID: uuid, type: type, subtype: payload.subtype?.rawValue, signedDate: signedDate,
            environment: payload.data?.environment?.rawValue ?? payload.summary?.environment?.rawValue,
            appleStatus: payload.data?.status.map { Int($0.rawValue) },
            consumptionRequestReason: payload.data?.consumptionRequestReason?.rawValue,
            transaction: verified.transaction, renewalInfo: verified.renewalInfo)
    }
}

struct NotificationsController {
    let app: StoreKeeperApp

    /// Outside `/v1`'s authentication: Apple signs the body, it sends no credentials.
    func addRoutes(to router: some RouterMethods<StoreKeeperContext>) {
        router.post("v1/notifications/apple") { request, context in try await app.receiveNotification(request, context)
        }
    }
}
