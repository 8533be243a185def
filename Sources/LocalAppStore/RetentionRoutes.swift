import AppStoreModels
import Foundation
import Hummingbird

/// The Retention Messaging API's paths (`/inApps/v1/messaging/…`, Apple's bearer token), as
/// sandbox serves them: messages are approved as soon as they are uploaded.
extension LocalAppStoreServer {
    var retentionCaller: RetentionCaller { RetentionCaller(store: store) }

    func addRetentionMessaging<Context: RequestContext>(to router: some RouterMethods<Context>) {
        let messaging = router.group("inApps/v1/messaging")
        messaging.put("realtime/url") { request, context in
            try await self.serve(request, "messaging") {
                guard let body = try? await request.decode(as: RealtimeUrl.self, context: context),
                    let url = body.realtimeURL, url.count <= 256, let parsed = URL(string: url),
                    ["http", "https"].contains(parsed.scheme?.lowercased() ?? ""), parsed.host != nil
                else { return Self.appleError(400, 4_000_215) }
                await self.store.setRealtimeURL(url)
                return Response(status: .ok)
            }
        }
        messaging.get("realtime/url") { request, _ in
            try await self.serve(request, "messaging") {
                guard let url = await self.store.getRealtimeURL() else { return Self.appleError(404, 4_040_021) }
                return Self.json(RealtimeUrl(realtimeURL: url))
            }
        }
        messaging.delete("realtime/url") { request, _ in
            try await self.serve(request, "messaging") {
                await self.store.setRealtimeURL(nil)
                return Response(status: .ok)
            }
        }
        messaging.put("message/:id") { request, context in
            try await self.serve(request, "messaging") {
                let id = (context.parameters.get("id") ?? "").lowercased()
                guard UUID(uuidString: id) != nil,
                    let body = try? await request.decode(as: UploadMessageRequestBody.self, context: context)
                else { return Self.appleError(400, 4_000_000) }
                return try await self.retention {
                    try await self.store.uploadMessage(id, header: body.header ?? "", body: body.body ?? "")
                    return Response(status: .ok)
                }
            }
        }
        messaging.delete("message/:id") { request, context in
            try await self.serve(request, "messaging") {
                try await self.retention {
                    try await self.store.deleteMessage((context.parameters.get("id") ?? "").lowercased())
                    return Response(status: .ok)
                }
            }
        }
        messaging.get("message/list") { request, _ in
            try await self.serve(request, "messaging") {
                Self.json(["messageIdentifiers": await self.store.messageList()])
            }
        }
        messaging.put("default/:productId/:locale") { request, context in
            try await self.serve(request, "messaging") {
                guard let body = try? await request.decode(as: DefaultMessage.self, context: context),
                    let id = body.messageIdentifier?.lowercased()
                else { return Self.appleError(400, 4_000_000) }
                return try await self.retention {
                    try await self.store.setDefaultMessage(
                        productId: context.parameters.get("productId") ?? "",
                        locale: context.parameters.get("locale") ?? "", messageId: id)
                    return Response(status: .ok)
                }
            }
        }
        messaging.get("default/:productId/:locale") { request, context in
            try await self.serve(request, "messaging") {
                guard
                    let id = await self.store.defaultMessage(
                        productId: context.parameters.get("productId") ?? "",
                        locale: context.parameters.get("locale") ?? "")
                else { return Self.appleError(404, 4_040_020) }
                return Self.json(DefaultMessage(messageIdentifier: id))
            }
        }
        messaging.delete("default/:productId/:locale") { request, context in
            try await self.serve(request, "messaging") {
                try await self.store.setDefaultMessage(
                    productId: context.parameters.get("productId") ?? "",
                    locale: context.parameters.get("locale") ?? "", messageId: nil)
                return Response(status: .ok)
            }
        }
        messaging.post("performanceTest") { request, context in
            try await self.serve(request, "messaging") {
                guard let body = try? await request.decode(as: PerformanceTestRequest.self, context: context),
                    let original = body.originalTransactionId
                else { return Self.appleError(400, 4_000_211) }
                return try await self.retention {
                    Self.json(try await self.retentionCaller.startPerformanceTest(original))
                }
            }
        }
        messaging.get("performanceTest/result/:requestId") { request, context in
            try await self.serve(request, "messaging") {
                let id = context.parameters.get("requestId") ?? ""
                guard UUID(uuidString: id) != nil else { return Self.appleError(400, 4_000_212) }
                guard let result = await self.store.performanceTestResult(id.lowercased()) else {
                    return Self.appleError(404, 4_040_018)
                }
                return Self.json(result)
            }
        }
    }

    func retention(_ body: () async throws -> Response) async throws -> Response {
        do {
            return try await body()
        } catch let refusal as LocalAppStore.RetentionRefusal {
            return Self.appleError(refusal.status, refusal.code)
        }
    }
}
