import Foundation
import GooglePlay
import Hummingbird
import Logging
import StoreKeeperCore
import StoreKeeperStorage

/// `POST /v1/notifications/google`: Real-time developer notifications by Pub/Sub push. The
/// push's OIDC token must verify (401 otherwise, nothing recorded); the message is recorded
/// durably, once per `messageId`, before the 204; applying it is a job that re-reads the
/// purchase from the Play Developer API — a notification is only a hint (invariant 6).
extension StoreKeeperApp {
    /// The job payload: which app and token to read again.
    struct GoogleSyncJob: Codable {
        var appId: String
        var token: String
        var messageId: String?
        /// A voided purchase (applied from the voided purchases list, which has its quantity).
        var voided: Bool?
        /// A pending refund review: the order and Google's token for the answer.
        var orderId: String?
        var reviewToken: String?
        var productId: String?
        /// `subscription` or `one_time`: the notification's own kind, never guessed from a
        /// product id a subscription notification need not carry.
        var kind: String?
    }
}

/// Owns what the push needs: the Google Play apps (their push identities), the database the
/// notification is recorded in, the body limit, metrics and the log.
struct GoogleNotificationsController {
    let google: [String: GooglePlayApp]
    let database: Database
    let maxBodyBytes: Int
    let metrics: ServerMetrics
    let logger: Logger

    /// Outside `/v1`'s authentication: the push carries Google's OIDC token instead.
    func addRoutes(to router: some RouterMethods<StoreKeeperContext>) {
        router.post("v1/notifications/google") { request, context in
            try await receiveGoogleNotification(request, context)
        }
    }

    func receiveGoogleNotification(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        guard !google.isEmpty else {
            throw APIError(.notFound, "not_found", "no Google Play app is configured on this server")
        }
        // 1. The OIDC bearer, against every Google app's push settings (one usually).
        let authorization = request.headers[.authorization]
        // Which apps' push identities (audience, service account) the token proves: a push is
        // applied only to an app whose identity it carries.
        var verifiedApps: Set<String> = []
        var reasons: [String] = []
        for app in google.values {
            guard let push = app.verifier else { continue }
            do {
                _ = try await push.verify(authorization: authorization)
                verifiedApps.insert(app.configuration.id)
            } catch {
                reasons.append(error.message)
            }
        }
        guard !verifiedApps.isEmpty else {
            metrics.notificationRejected.increment()
            logger.warning(
                "security: Google push rejected", metadata: ["reason": "\(reasons.first ?? "no push settings")"])
            throw APIError(.unauthorized, "unauthenticated", "the push's OIDC token does not verify")
        }
        // 2. The body: Pub/Sub's wrapped message with the notification in `data`.
        let bytes = try await request.body.collect(upTo: maxBodyBytes)
        guard let push = try? JSONDecoder().decode(PubSubPush.self, from: Data(buffer: bytes)),
            let messageId = push.message?.messageId, !messageId.isEmpty, messageId.unicodeScalars.count <= 128
        else {
            throw APIError.badRequest("not a Pub/Sub push: message.messageId is required")
        }
        try StoreKeeperApp.validateText(messageId, field: "messageId")
        let store = GooglePlayStore(database: database)
        guard let data = push.message?.data.flatMap({ Data(base64Encoded: $0) }),
            let notification = try? JSONDecoder().decode(DeveloperNotification.self, from: data)
        else {
            // Unreadable but authentic: kept aside and acknowledged (never nacked forever).
            _ = try await store.recordNotification(
                messageId: messageId, appId: nil, type: "UNREADABLE", purchaseToken: nil,
                body: String(decoding: bytes.readableBytesView.prefix(65_536), as: UTF8.self), sync: nil, now: Date())
            return Response(status: .noContent)
        }
        let named = google.values.first { $0.configuration.packageName == notification.packageName }
        // A push verified for one app that names another app's package is recorded, never applied.
        let app = named.flatMap { verifiedApps.contains($0.configuration.id) ? $0 : nil }
        if let named, app == nil {
            logger.warning(
                "security: Google push for a package its token does not vouch for: recorded, not applied",
                metadata: [
                    "packageName": "\(named.configuration.packageName)",
                    "verifiedFor": "\(verifiedApps.sorted().joined(separator: ","))",
                ])
        }
        let token = notification.purchaseToken
        var job: StoreKeeperApp.GoogleSyncJob?
        if let app, let token, token.utf8.count <= 4096 {
            job = StoreKeeperApp.GoogleSyncJob(
                appId: app.configuration.id, token: token, messageId: messageId,
                voided: notification.voidedPurchaseNotification != nil ? true : nil,
                productId: notification.oneTimeProductNotification?.sku
                    ?? notification.subscriptionNotification?.subscriptionId,
                kind: notification.subscriptionNotification != nil
                    ? "subscription"
                    : notification.oneTimeProductNotification != nil
                        ? "one_time"
                        : notification.voidedPurchaseNotification?.productType.map {
                            $0 == 1 ? "subscription" : "one_time"
                        })
        } else if let app, let review = notification.pendingRefundReviewNotification,
            let reviewToken = review.pendingRefundToken, let orderId = review.orderId
        {
            job = StoreKeeperApp.GoogleSyncJob(
                appId: app.configuration.id, token: "", messageId: messageId, orderId: orderId,
                reviewToken: reviewToken)
        }
        let recorded = try await store.recordNotification(
            messageId: messageId, appId: app?.configuration.id, type: notification.typeName,
            purchaseToken: notification.purchaseToken.map { GoogleReading.digest($0) },
            body: String(decoding: data.prefix(65_536), as: UTF8.self),
            sync: try job.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }, now: Date())
        if recorded == .new { metrics.notificationAccepted.increment() }
        if named == nil {
            logger.warning(
                "Google push for a package this server does not serve: recorded, not applied",
                metadata: ["packageName": "\(notification.packageName?.prefix(100) ?? "-")"])
        }
        return Response(status: .noContent)
    }
}
