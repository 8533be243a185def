import AppStoreModels
import AsyncHTTPClient
import Foundation
import NIOCore
import ServiceLifecycle

/// Delivers the local App Store's notifications as Apple does: POST `{"signedPayload": …}`
/// to the configured URL; 200–206 is success; anything else is retried on Apple's schedule
/// (+1, 12, 24, 48, 72 h of store time) and every attempt lands in the notification history.
public struct NotificationSender: Service {
    public let store: LocalAppStore
    let httpClient: HTTPClient
    /// Real-time pause between polls of the queue.
    let pollInterval: Duration
    let timeout: Duration

    public init(
        store: LocalAppStore, httpClient: HTTPClient = .shared, pollInterval: Duration = .milliseconds(50),
        timeout: Duration = .seconds(5)
    ) {
        self.store = store
        self.httpClient = httpClient
        self.pollInterval = pollInterval
        self.timeout = timeout
    }

    public func run() async throws {
        // Stops at graceful shutdown (or cancellation) between two polls.
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                if store.clock.scale > 0 { await store.processDueEvents() }
                await deliverDue()
                try await Task.sleep(for: pollInterval)
            }
        }
    }

    /// Sends every notification whose attempt is due, once each.
    public func deliverDue() async {
        guard let url = store.configuration.notificationURL else { return }
        var due = await store.dueNotifications()
        if await store.faults.reorderNotifications { due.reverse() }
        for index in due {
            let notification = await store.notification(at: index)
            if await store.takeNotificationDrop() {
                await store.recordAttempt(at: index, result: .noResponse)
                continue
            }
            let result = await post(notification.signedPayload, to: url)
            if await store.faults.duplicateNotifications { _ = await post(notification.signedPayload, to: url) }
            await store.recordAttempt(at: index, result: result)
        }
    }

    private func post(_ signedPayload: String, to url: String) async -> SendAttemptResult {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "App Store Server Notifications (StoreKeeper local)")
        let body = (try? JSONEncoder().encode(ResponseBodyV2(signedPayload: signedPayload))) ?? Data()
        request.body = .bytes(ByteBuffer(bytes: body))
        do {
            let response = try await httpClient.execute(
                request,
                timeout: .milliseconds(
                    timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000))
            _ = try? await response.body.collect(upTo: 1024 * 1024)
            return (200...206).contains(Int(response.status.code)) ? .success : .unsuccessfulHTTPResponseCode
        } catch let error as HTTPClientError where error == .deadlineExceeded || error == .readTimeout {
            return .timedOut
        } catch {
            return .noResponse
        }
    }
}
