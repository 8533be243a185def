import AsyncHTTPClient
import Crypto
import CryptoExtras
import EventLoopPinning
import Foundation
import GooglePlay
import Hummingbird
import HummingbirdCore
import JWTKit
import KeyFiles
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import StoreKeeperSupport
import Synchronization

/// The local Google Play over HTTP, at Google's paths and with Google's rules:
/// - `POST /token`: OAuth's JWT-bearer grant; the assertion must verify against the service
///   account this fake issued (RS256), `iss` its e-mail, `aud` this endpoint, at most an hour;
/// - `GET /oauth2/v3/certs`: the JWKS that verifies its Pub/Sub pushes;
/// - `/androidpublisher/v3/applications/{packageName}/…`: purchases (productsv2,
///   subscriptionsv2), acknowledge and consume, voided purchases, reviewrefund — each needing
///   an access token it issued;
/// - pushes: `PushSender` POSTs each notification wrapped as Pub/Sub does, with an OIDC
///   bearer, retrying with Pub/Sub's backoff until acknowledged (102, 200, 201, 202, 204).
public final class LocalGooglePlayServer: Sendable {
    public let store: LocalGooglePlay
    /// The service account this fake trusts (its key file is what the server is given).
    public let serviceAccountEmail: String
    let serviceAccountKeyId: String
    let serviceAccountPrivateKeyPEM: String
    let assertionKeys: JWTKeyCollection
    let pushKeys: JWTKeyCollection
    let pushKeyId: String
    let pushJWKS: String
    let accessTokens = AccessTokens()

    /// The access tokens issued, checked on every API call without a hop to an actor.
    final class AccessTokens: Sendable {
        private let issued = Mutex<[String: Date]>([:])
        func issue(now: Date) -> String {
            let token = "ya29.local-" + UUID().uuidString.lowercased()
            issued.withLock { issued in
                issued = issued.filter { $0.value > now }
                issued[token] = now.addingTimeInterval(3600)
            }
            return token
        }
        func valid(_ token: String, now: Date) -> Bool { issued.withLock { ($0[token] ?? .distantPast) > now } }
    }

    public init(store: LocalGooglePlay, serviceAccountEmail: String = "storekeeper@local-play.iam.gserviceaccount.com")
        async throws
    {
        self.store = store
        self.serviceAccountEmail = serviceAccountEmail
        let account = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        serviceAccountKeyId = Self.keyId(account.publicKey.derRepresentation)
        serviceAccountPrivateKeyPEM = account.pkcs8PEMRepresentation
        assertionKeys = await JWTKeyCollection().add(
            rsa: try Insecure.RSA.PublicKey(backing: account.publicKey), digestAlgorithm: .sha256)
        let push = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        pushKeyId = Self.keyId(push.publicKey.derRepresentation)
        let jwtPush = try Insecure.RSA.PrivateKey(backing: push)
        pushKeys = await JWTKeyCollection().add(
            rsa: jwtPush, digestAlgorithm: .sha256, kid: JWKIdentifier(string: pushKeyId))
        let (modulus, exponent) = try jwtPush.publicKey.getKeyPrimitives()
        let jwk: [String: String] = [
            "kty": "RSA", "alg": "RS256", "use": "sig", "kid": pushKeyId, "n": modulus.base64URLEncodedString(),
            "e": exponent.base64URLEncodedString(),
        ]
        pushJWKS = String(
            decoding: try JSONSerialization.data(withJSONObject: ["keys": [jwk]], options: [.sortedKeys]), as: UTF8.self
        )
    }

    static func keyId(_ der: Data) -> String {
        SHA256.hash(data: der).prefix(20).lowercaseHex
    }

    /// The service account's JSON key, as Google's Cloud Console downloads it, whose
    /// `token_uri` is this server's `/token` at `baseURL`.
    public func serviceAccountKey(baseURL: String) -> ServiceAccountKey {
        ServiceAccountKey(
            projectId: "local-play", privateKeyId: serviceAccountKeyId, privateKey: serviceAccountPrivateKeyPEM,
            clientEmail: serviceAccountEmail, tokenURI: baseURL + "/token")
    }

    public func writeServiceAccountKey(baseURL: String, to path: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        try KeyFiles.writePrivate(try encoder.encode(serviceAccountKey(baseURL: baseURL)), to: path)
    }

    /// An OIDC token as Pub/Sub signs it for a push.
    public func pushToken(audience: String, serviceAccount: String, issuedAt: Date = Date()) async throws -> String {
        try await pushKeys.sign(
            PushTokenClaims(audience: audience, email: serviceAccount, issuedAt: issuedAt),
            kid: JWKIdentifier(string: pushKeyId))
    }

    /// The service account the local Google Play's pushes are signed for.
    public static let pushServiceAccount = "local-pubsub@local-play.iam.gserviceaccount.com"

    /// The JWKS of the push tokens.
    public var certificates: String { pushJWKS }

    // MARK: Routes

    public func router() -> Router<BasicRequestContext> {
        let router = Router()
        addRoutes(to: router)
        return router
    }

    public func addRoutes<Context: RequestContext>(to router: some RouterMethods<Context>) {
        addGoogleRoutes(to: router)
        addControl(to: router.group("control"))
    }

    /// Google's own routes (token endpoint, push certificates, the Developer API), which check
    /// Google's credentials themselves.
    public func addGoogleRoutes<Context: RequestContext>(to router: some RouterMethods<Context>) {
        router.post("token") { request, context in try await self.token(request, context) }
        router.get("oauth2/v3/certs") { _, _ in
            var response = Self.json(Data(self.pushJWKS.utf8))
            response.headers[.cacheControl] = "public, max-age=3600"
            return response
        }
        let app = router.group("androidpublisher/v3/applications/:packageName")
        addExternalTransactionRoutes(to: app)
        app.get("purchases/productsv2/tokens/:token") { request, context in
            try await self.authorized(request, context) {
                let token = context.parameters.get("token") ?? ""
                guard let resource = await self.store.productPurchaseV2(token) else {
                    return Self.googleError(404, "purchaseTokenNotFound", "The purchase token was not found.")
                }
                return Self.json(resource.json)
            }
        }
        app.get("purchases/subscriptionsv2/tokens/:token") { request, context in
            try await self.authorized(request, context) {
                let token = context.parameters.get("token") ?? ""
                guard let resource = await self.store.subscriptionPurchaseV2(token) else {
                    return Self.googleError(404, "purchaseTokenNotFound", "The purchase token was not found.")
                }
                return Self.json(resource)
            }
        }
        // `subscriptionsv2.defer` (the GET above shares the segment's one parameter name).
        app.post("purchases/subscriptionsv2/tokens/:token") { request, context in
            try await self.authorized(request, context) {
                let (token, action) = Self.split(context.parameters.get("token") ?? "")
                if action == "revoke" {
                    // Exactly one of fullRefund, proratedRefund (itemBasedRefund is for add-ons,
                    // which this store does not sell).
                    guard let body = try? await request.decode(as: RevokeRequest.self, context: context),
                        let revocation = body.revocationContext,
                        (revocation.fullRefund != nil) != (revocation.proratedRefund != nil)
                    else {
                        return Self.googleError(
                            400, "invalidValue",
                            "revocationContext must hold exactly one of fullRefund, proratedRefund.")
                    }
                    do {
                        try await self.store.revokeSubscription(token, prorated: revocation.proratedRefund != nil)
                        return Self.json(Data("{}".utf8))
                    } catch {
                        return Self.refusal(error)
                    }
                }
                guard action == "defer" else { return Self.googleError(404, "notFound", "Unknown method.") }
                guard let body = try? await request.decode(as: DeferRequest.self, context: context),
                    let duration = body.deferralContext?.deferDuration, duration.hasSuffix("s"),
                    let seconds = Double(duration.dropLast())
                else {
                    return Self.googleError(
                        400, "invalidValue", "deferralContext.deferDuration is required (\"86400s\").")
                }
                do {
                    let productId = await self.store.purchase(token)?.productId ?? ""
                    if body.deferralContext?.validateOnly == true {
                        return Self.json(DeferResponse(itemExpiryTimeDetails: []))
                    }
                    let expiry = try await self.store.deferSubscription(
                        token, seconds: seconds, etag: body.deferralContext?.etag)
                    return Self.json(
                        DeferResponse(itemExpiryTimeDetails: [
                            .init(productId: productId, expiryTime: GoogleTime.format(expiry))
                        ]))
                } catch {
                    return Self.refusal(error)
                }
            }
        }
        app.post("purchases/products/:productId/tokens/:tokenAction") { request, context in
            try await self.authorized(request, context) {
                let productId = context.parameters.get("productId") ?? ""
                let (token, action) = Self.split(context.parameters.get("tokenAction") ?? "")
                if self.store.injectedAcknowledgeFailure() {
                    return Self.googleError(503, "backendError", "The service is currently unavailable.")
                }
                do {
                    switch action {
                    case "acknowledge": try await self.store.acknowledge(productId: productId, token: token)
                    case "consume": try await self.store.consume(productId: productId, token: token)
                    default: return Self.googleError(404, "notFound", "Unknown method.")
                    }
                } catch {
                    return Self.refusal(error)
                }
                return Self.json(Data("{}".utf8))
            }
        }
        app.post("purchases/subscriptions/:productId/tokens/:tokenAction") { request, context in
            try await self.authorized(request, context) {
                let productId = context.parameters.get("productId") ?? ""
                let (token, action) = Self.split(context.parameters.get("tokenAction") ?? "")
                guard action == "acknowledge" else { return Self.googleError(404, "notFound", "Unknown method.") }
                if self.store.injectedAcknowledgeFailure() {
                    return Self.googleError(503, "backendError", "The service is currently unavailable.")
                }
                do {
                    try await self.store.acknowledge(productId: productId, token: token)
                } catch {
                    return Self.refusal(error)
                }
                return Self.json(Data("{}".utf8))
            }
        }
        app.get("purchases/voidedpurchases") { request, context in
            try await self.authorized(request, context) {
                let query = request.uri.queryParameters
                let start = query["startTime"].flatMap { Int64(String($0)) }.map {
                    Date(timeIntervalSince1970: Double($0) / 1000)
                }
                let max = query["maxResults"].flatMap { Int(String($0)) } ?? 1000
                let page = (query["token"] ?? query["pageSelection.token"]).map(String.init)
                do {
                    return Self.json(
                        try await self.store.voidedPurchases(startTime: start, pageToken: page, maxResults: max))
                } catch {
                    return Self.refusal(error)
                }
            }
        }
        app.get("orders:batchGet") { request, context in
            try await self.authorized(request, context) {
                do {
                    let ids = request.uri.queryParameters.getAll("orderIds").map { $0.removingPercentEncoding ?? $0 }
                    return Self.json(OrdersBatch(orders: try await self.store.orders(ids)))
                } catch {
                    guard case .notFound = error as? LocalGooglePlay.Refusal else { return Self.refusal(error) }
                    return Self.googleError(404, "notFound", "The order was not found.")
                }
            }
        }
        // (One parameter name for both methods: the router keeps one node for the segment.)
        app.get("orders/:orderAction") { request, context in
            try await self.authorized(request, context) {
                do {
                    return Self.json(try await self.store.order(context.parameters.get("orderAction") ?? ""))
                } catch {
                    guard case .notFound = error as? LocalGooglePlay.Refusal else { return Self.refusal(error) }
                    return Self.googleError(404, "notFound", "The order was not found.")
                }
            }
        }
        app.post("orders/:orderAction") { request, context in
            try await self.authorized(request, context) {
                let (orderId, action) = Self.split(context.parameters.get("orderAction") ?? "")
                if action == "refund" {
                    // `orders.refund?revoke=true|false`: an empty answer once refunded.
                    let revoke = request.uri.queryParameters.get("revoke") == "true"
                    do {
                        try await self.store.refund(orderId: orderId, revoke: revoke)
                    } catch {
                        guard case .notFound = error as? LocalGooglePlay.Refusal else { return Self.refusal(error) }
                        return Self.googleError(404, "notFound", "The order was not found.")
                    }
                    return Self.json(Data("{}".utf8))
                }
                guard action == "reviewrefund" else { return Self.googleError(404, "notFound", "Unknown method.") }
                guard let body = try? await request.decode(as: ReviewRefundRequest.self, context: context) else {
                    return Self.googleError(400, "invalidValue", "Invalid JSON payload received.")
                }
                do {
                    try await self.store.reviewRefund(orderId: orderId, body)
                } catch {
                    return Self.refusal(error)
                }
                return Self.json(Data("{}".utf8))
            }
        }
    }

    /// `externaltransactions`: create, get, refund (Google's US programs).
    func addExternalTransactionRoutes<Context: RequestContext>(to app: some RouterMethods<Context>) {
        app.post("externalTransactions") { request, context in
            try await self.authorized(request, context) {
                guard let id = request.uri.queryParameters.get("externalTransactionId") else {
                    return Self.googleError(400, "required", "externalTransactionId is required.")
                }
                guard let body = try? await request.decode(as: ExternalTransaction.self, context: context) else {
                    return Self.googleError(400, "invalidValue", "Invalid JSON payload received.")
                }
                do {
                    return Self.json(try await self.store.createExternalTransaction(id: id, body))
                } catch {
                    return Self.externalRefusal(error)
                }
            }
        }
        app.get("externalTransactions/:idAction") { request, context in
            try await self.authorized(request, context) {
                guard let found = await self.store.externalTransaction(context.parameters.get("idAction") ?? "")
                else { return Self.googleError(404, "notFound", "The external transaction was not found.") }
                return Self.json(found)
            }
        }
        app.post("externalTransactions/:idAction") { request, context in
            try await self.authorized(request, context) {
                let (id, action) = Self.split(context.parameters.get("idAction") ?? "")
                guard action == "refund" else { return Self.googleError(404, "notFound", "Unknown method.") }
                guard let body = try? await request.decode(as: ExternalTransactionRefund.self, context: context)
                else { return Self.googleError(400, "invalidValue", "Invalid JSON payload received.") }
                do {
                    return Self.json(try await self.store.refundExternalTransaction(id: id, body))
                } catch {
                    return Self.externalRefusal(error)
                }
            }
        }
    }

    static func externalRefusal(_ error: any Error) -> Response {
        guard let error = error as? LocalGooglePlay.ExternalRefusal else {
            return googleError(500, "backendError", "Backend Error")
        }
        return googleError(error.status, error.reason, error.message)
    }

    struct DeferRequest: Decodable {
        struct Context: Decodable {
            var deferDuration: String?
            var etag: String?
            var validateOnly: Bool?
        }
        var deferralContext: Context?
    }

    struct DeferResponse: Encodable {
        struct Item: Encodable {
            var productId: String
            var expiryTime: String
        }
        var itemExpiryTimeDetails: [Item]
    }

    struct OrdersBatch: Encodable {
        var orders: [GoogleOrder]
    }

    /// `TOKEN:verb` → (TOKEN, verb).
    static func split(_ segment: String) -> (String, String) {
        guard let colon = segment.lastIndex(of: ":") else { return (segment, "") }
        return (String(segment[..<colon]), String(segment[segment.index(after: colon)...]))
    }

    func authorized<Context: RequestContext>(
        _ request: Request, _ context: Context, _ body: () async throws -> Response
    ) async throws -> Response {
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer "),
            accessTokens.valid(String(header.dropFirst(7)), now: Date())
        else {
            return Self.googleError(
                401, "authError", "Request had invalid authentication credentials.", status: "UNAUTHENTICATED")
        }
        guard context.parameters.get("packageName") == store.configuration.packageName else {
            return Self.googleError(404, "notFound", "No application was found for the given package name.")
        }
        if store.injectedFailure() {
            return Self.googleError(503, "backendError", "The service is currently unavailable.", status: "UNAVAILABLE")
        }
        return try await body()
    }

    /// OAuth 2.0's JWT-bearer grant, checked as Google checks it.
    func token<Context: RequestContext>(_ request: Request, _ context: Context) async throws -> Response {
        let body = try await request.body.collect(upTo: 64 * 1024)
        let form = Self.form(String(buffer: body))
        func refuse(_ error: String, _ description: String) -> Response {
            var response = Self.json(["error": error, "error_description": description])
            response.status = .badRequest
            return response
        }
        guard form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer", let assertion = form["assertion"]
        else { return refuse("unsupported_grant_type", "Invalid grant_type.") }
        let claims: ServiceAccountAssertion
        do {
            claims = try await assertionKeys.verify(assertion, as: ServiceAccountAssertion.self)
        } catch {
            return refuse("invalid_grant", "Invalid JWT Signature.")
        }
        let now = Date()
        guard claims.iss.value == serviceAccountEmail else {
            return refuse("invalid_grant", "Invalid email or User ID")
        }
        guard claims.aud.value.contains(where: { $0.hasSuffix("/token") }) else {
            return refuse("invalid_grant", "Invalid JWT: Failed audience check.")
        }
        guard claims.exp.value.timeIntervalSince(claims.iat.value) <= 3600,
            claims.iat.value <= now.addingTimeInterval(300), claims.exp.value > now
        else {
            return refuse(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."
            )
        }
        guard claims.scope.split(separator: " ").contains(Substring(ServiceAccountAssertion.androidPublisherScope))
        else { return refuse("invalid_scope", "Invalid OAuth scope or ID token audience provided.") }
        let token = accessTokens.issue(now: now)
        return Self.json(
            ["access_token": token, "expires_in": "3599", "token_type": "Bearer"], numbers: ["expires_in"])
    }

    static func form(_ text: String) -> [String: String] {
        var fields: [String: String] = [:]
        // On bytes, as a form is defined (`&\u{301}` is one `Character` but two fields).
        for pair in text.utf8.split(separator: UInt8(ascii: "&")) {
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1).map { bytes in
                let text = String(decoding: bytes.map { $0 == UInt8(ascii: "+") ? 0x20 : $0 }, as: UTF8.self)
                return text.removingPercentEncoding ?? text
            }
            if parts.count == 2 { fields[parts[0]] = parts[1] }
        }
        return fields
    }

    // MARK: Answers

    static func json(_ data: Data) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/json; charset=UTF-8"],
            body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func json(_ bytes: [UInt8]) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/json; charset=UTF-8"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    static func json<T: Encodable>(_ value: T) -> Response {
        json((try? JSONEncoder().encode(value)) ?? Data("{}".utf8))
    }

    static func json(_ fields: [String: String], numbers: Set<String> = []) -> Response {
        var object: [String: Any] = fields
        for key in numbers { if let value = fields[key].flatMap(Int.init) { object[key] = value } }
        return json((try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data())
    }

    static func googleError(_ code: Int, _ reason: String, _ message: String, status: String? = nil) -> Response {
        var response = json(GoogleErrorBody(code: code, message: message, reason: reason, status: status))
        response.status = .init(code: code)
        return response
    }

    static func refusal(_ error: any Error) -> Response {
        switch error as? LocalGooglePlay.Refusal {
        case .notFound: googleError(404, "purchaseTokenNotFound", "The purchase token was not found.")
        case .invalidPurchaseState(let message): googleError(400, "invalidPurchaseState", message)
        case .invalid(let message): googleError(400, "invalidValue", message)
        case nil: googleError(500, "backendError", "Backend Error")
        }
    }

    // MARK: Pushes

    /// Delivers the store's notifications to `endpoint` as Pub/Sub pushes (OIDC bearer with
    /// `audience` and `serviceAccount`), retrying with Pub/Sub's backoff until acknowledged.
    public func pushSender(endpoint: String, audience: String, serviceAccount: String) -> PushSender {
        PushSender(server: self, endpoint: endpoint, audience: audience, serviceAccount: serviceAccount)
    }

    public struct PushSender: Service {
        let server: LocalGooglePlayServer
        let endpoint: String
        let audience: String
        let serviceAccount: String

        /// One pass: every due push sent once; returns how many were acknowledged.
        @discardableResult
        public func deliverDue() async -> Int {
            var acknowledged = 0
            for push in await server.store.takeDuePushes() {
                if await send(push) {
                    acknowledged += 1
                } else {
                    await server.store.retry(push)
                }
            }
            return acknowledged
        }

        func send(_ push: LocalGooglePlay.Push) async -> Bool {
            guard let data = try? JSONEncoder().encode(push.notification),
                let token = try? await server.pushToken(audience: audience, serviceAccount: serviceAccount)
            else { return false }
            let body = PubSubPush(
                message: .init(
                    data: data.base64EncodedString(), messageId: push.messageId,
                    publishTime: GoogleTime.format(push.publishTime)),
                subscription: "projects/local-play/subscriptions/storekeeper")
            var request = HTTPClientRequest(url: endpoint)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.headers.add(name: "Authorization", value: "Bearer \(token)")
            request.body = .bytes(ByteBuffer(bytes: (try? JSONEncoder().encode(body)) ?? Data()))
            do {
                let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
                _ = try? await response.body.collect(upTo: 1 << 16)
                return [102, 200, 201, 202, 204].contains(Int(response.status.code))
            } catch {
                return false
            }
        }

        public func run() async throws {
            try? await cancelWhenGracefulShutdown {
                while !Task.isCancelled {
                    await server.store.runDue()
                    await deliverDue()
                    try await Task.sleep(for: .milliseconds(250))
                }
            }
        }
    }
}

extension LocalGooglePlayServer {
    /// The server listening on `host` (port 0: a free one) in the background; `stop()` ends it.
    public final class Running: Sendable {
        public let baseURL: String
        let group: ServiceGroup
        let task: Task<Void, any Error>
        let threads: MultiThreadedEventLoopGroup?

        init(baseURL: String, group: ServiceGroup, task: Task<Void, any Error>, threads: MultiThreadedEventLoopGroup?) {
            self.baseURL = baseURL
            self.group = group
            self.task = task
            self.threads = threads
        }

        public func stop() async {
            await group.triggerGracefulShutdown()
            _ = try? await task.value
            try? await threads?.shutdownGracefully()
        }
    }

    /// `threads`: event loops of its own, as a remote Google's would be, instead of NIO's shared
    /// ones — the in-process fake then never queues its answers behind the connections of the
    /// server it answers (`bench --purchases --store google_play`).
    public func start(host: String = "127.0.0.1", port: Int = 0, logger: Logger? = nil, threads: Int? = nil)
        async throws -> Running
    {
        let bound = Mutex(0)
        var log = logger ?? Logger(label: "local-google-play")
        if logger == nil { log.logLevel = .error }
        let loops = threads.map { MultiThreadedEventLoopGroup(numberOfThreads: max(1, $0)) }
        // Google's API answers from Google's machines: with loops of its own, each connection's
        // requests are handled on its loop, never crossing to Swift's shared pool and back — on one
        // host, the stand-in costs the server's cores as little as it can. On the shared loops
        // (demo mode, beside the server) handlers stay on the pool: a long control request (the
        // clock moved over every subscription) must not hold up the server's connections.
        let app = Application(
            router: router(),
            server: HTTPServerBuilder { responder in
                EventLoopPinned(inner: HTTP1Channel(responder: responder), pinned: loops != nil)
            },
            configuration: .init(address: .hostname(host, port: port), serverName: "LocalGooglePlay"),
            onServerRunning: { channel in bound.withLock { $0 = channel.localAddress?.port ?? port } },
            eventLoopGroupProvider: loops.map { .shared($0) } ?? .singleton, logger: log)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: log))
        let task = Task { try await group.run() }
        // A bound on a start that never comes, not a timing: on a loaded 2-core machine (CPU-bound
        // tests beside it) a listener has taken over a minute to come up.
        let deadline = ContinuousClock.now + .seconds(300)
        while bound.withLock({ $0 }) == 0 {
            guard ContinuousClock.now < deadline else {
                await group.triggerGracefulShutdown()
                try? await loops?.shutdownGracefully()
                throw LocalGooglePlay.Refusal.invalid("the local Google Play did not start listening")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        return Running(baseURL: "http://\(host):\(bound.withLock { $0 })", group: group, task: task, threads: loops)
    }

    /// A push as Pub/Sub sends it: the wrapped body and the OIDC bearer (for tests that post
    /// it themselves).
    public func pushRequest(_ push: LocalGooglePlay.Push, audience: String, serviceAccount: String) async throws
        -> (body: Data, authorization: String)
    {
        let data = try JSONEncoder().encode(push.notification)
        let body = PubSubPush(
            message: .init(
                data: data.base64EncodedString(), messageId: push.messageId,
                publishTime: GoogleTime.format(push.publishTime)),
            subscription: "projects/local-play/subscriptions/storekeeper")
        return (
            try JSONEncoder().encode(body),
            "Bearer " + (try await pushToken(audience: audience, serviceAccount: serviceAccount))
        )
    }
}

/// `purchases.subscriptionsv2.revoke`'s body.
struct RevokeRequest: Decodable {
    struct Context: Decodable {
        struct Empty: Decodable {}
        var fullRefund: Empty?
        var proratedRefund: Empty?
    }
    var revocationContext: Context?
}
