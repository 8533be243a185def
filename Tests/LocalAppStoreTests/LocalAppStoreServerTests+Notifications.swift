import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import AsyncHTTPClient
import Crypto
import Foundation
import Hummingbird
import HummingbirdTesting
import JWTKit
import NIOCore
import NIOHTTP1
import StoreKeeperCatalog
import Synchronization
import Testing

@testable import LocalAppStore

/// Notification ordering, sandbox sends, and the control API.
extension LocalAppStoreServerTests {
    @Test func reorderedNotificationsArriveNewestFirst() async throws {
        let received = Mutex<[String]>([])
        let receiver = Router()
        receiver.post("hook") { request, context -> Response in
            let body = try await request.decode(as: ResponseBodyV2.self, context: context)
            let type = try await Self.verifier.verifyNotification(body.signedPayload ?? "").payload.notificationType
            received.withLock { $0.append(type?.rawValue ?? "") }
            return Response(status: .ok)
        }
        let hook = Application(router: receiver, configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await hook.test(.live) { hookClient in
            let store = Self.makeStore(notificationURL: "http://127.0.0.1:\(hookClient.port!)/hook")
            var faults = Faults()
            faults.reorderNotifications = true
            await store.setFaults(faults)
            let id = try await store.buy("ray", items: [.init(productId: "coins_60")]).transactions[0].transactionId!
            try await store.refund(id)
            await NotificationSender(store: store, timeout: .seconds(60)).deliverDue()
            #expect(received.withLock { $0 } == ["REFUND", "ONE_TIME_CHARGE"])
        }
    }

    @Test func sandboxSendsOnceUnlessAskedToRetry() async throws {
        let store = Self.makeStore(environment: .sandbox, notificationURL: "http://127.0.0.1:9/closed")
        _ = try await store.buy("eve", items: [.init(productId: "coins_60")])
        let sender = NotificationSender(store: store, timeout: .milliseconds(200))
        await sender.deliverDue()
        #expect(await store.notifications[0].attempts.count == 1)
        #expect(await store.notifications[0].nextAttempt == nil)
    }

    @Test func controlAPIDrivesTheStore() async throws {
        let store = Self.makeStore()
        try await Self.withServer(store) { port in
            func call(_ method: HTTPMethod, _ path: String, _ body: String? = nil) async throws -> (Int, [String: Any])
            {
                var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/control/\(path)")
                request.method = method
                if let body {
                    request.headers.add(name: "Content-Type", value: "application/json")
                    request.body = .bytes(ByteBuffer(string: body))
                }
                let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
                let bytes = try await response.body.collect(upTo: 10 * 1024 * 1024)
                let json = (try? JSONSerialization.jsonObject(with: Data(buffer: bytes))) as? [String: Any] ?? [:]
                return (Int(response.status.code), json)
            }
            let (status, bought) = try await call(
                .POST, "purchases",
                #"{"appleId":"fin","productId":"pro_monthly","appAccountToken":"7e3fb20b-4cdb-47cc-936d-99d65f608138"}"#
            )
            #expect(status == 200)
            let signed = try #require((bought["signedTransactions"] as? [String])?.first)
            let transaction = try await Self.verifier.verifyTransaction(signed)
            #expect(transaction.appAccountToken == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
            #expect(try await call(.POST, "clock/advance", #"{"seconds":2764800}"#).0 == 200)  // 32 days: renewed
            #expect(await store.history(of: "fin").count == 2)
            #expect(try await call(.POST, "subscriptions/\(transaction.originalTransactionId!)/cancel").0 == 200)
            #expect(
                try await call(.POST, "transactions/\(transaction.transactionId!)/refund", #"{"percentage":50000}"#).0
                    == 200)
            #expect(try await call(.POST, "customers/fin/billing", #"{"fails":true}"#).0 == 204)
            #expect(try await call(.GET, "customers/fin/receipt").1["receipt"] is String)
            #expect(try await call(.PUT, "faults", #"{"endpoints":{"history":{"status":500}}}"#).0 == 200)
            #expect(try await call(.DELETE, "faults").0 == 204)
            #expect(try await call(.GET, "clock").1["now"] is Int)
            let asked = try await call(
                .POST, "purchases", #"{"appleId":"kid","productId":"remove_ads","askToBuy":true}"#
            ).1
            let pendingId = try #require(asked["pendingId"] as? String)
            #expect(try await call(.POST, "pending/\(pendingId)/approve").0 == 200)

            // Bad input is a 4xx with a code, never a crash.
            #expect(try await call(.POST, "purchases", #"{"appleId":"x","productId":"nope"}"#).1["error"] != nil)
            #expect(try await call(.POST, "purchases", #"{"appleId":"x","productId":"nope"}"#).0 == 404)
            #expect(try await call(.POST, "purchases", "{not json").0 == 400)
            #expect(try await call(.POST, "transactions/123/refund").0 == 404)
            #expect(try await call(.POST, "transactions/123/explode").0 == 404)
            #expect(try await call(.POST, "clock/advance", #"{"seconds":-5}"#).0 == 400)
            #expect(try await call(.POST, "pending/nope/approve").0 == 404)
        }
    }
}
