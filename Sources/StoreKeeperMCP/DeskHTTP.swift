import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import MCP
import NIOCore
import ServiceLifecycle

/// The desk over MCP's streamable HTTP transport, as the specification defines it: `initialize`
/// (with the operator key as `Authorization: Bearer`) opens a session, answered with its
/// `Mcp-Session-Id`; each session has an MCP server of its own bound to the key it was opened
/// with, so a request reaches only its own session's key, answers and waits, whatever JSON-RPC
/// ids other clients choose. Any number of sessions at once; `DELETE /mcp` ends one; a session
/// idle longer than `sessionIdleTimeout` ends by itself. Answers are JSON (no server-sent
/// stream: every tool answers once).
extension SupportDesk {
    /// The listener's application: `allowedHosts` are the `Host` values it answers
    /// (DNS-rebinding protection; nil: 127.0.0.1, localhost and [::1] on any port).
    public func httpApplication(
        host: String, port: Int, allowedHosts: [String]? = nil, sessionIdleTimeout: Duration = .seconds(30 * 60),
        maxSessions: Int = 1000, idleConnectionTimeout: Duration = .seconds(60),
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) async throws -> some ApplicationProtocol {
        let origin =
            allowedHosts.map { hosts in
                OriginValidator(
                    allowedHosts: hosts, allowedOrigins: hosts.flatMap { ["https://\($0)", "http://\($0)"] })
            } ?? .localhost()
        let sessions = DeskSessions(
            desk: self, origin: origin, idleTimeout: sessionIdleTimeout, limit: maxSessions, logger: logger,
            clock: clock)
        let router = Router()
        for method in [HTTPRequest.Method.post, .get, .delete] {
            router.on("mcp", method: method) { request, _ in
                try await sessions.answer(request)
            }
        }
        router.get("healthz") { _, _ in Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ok\n"))) }
        return Application(
            router: router,
            server: .http1(configuration: .init(idleTimeout: .nanoseconds(Int64(idleConnectionTimeout.nanoseconds)))),
            configuration: .init(address: .hostname(host, port: port), serverName: "storekeeper-mcp"),
            services: [sessions],
            logger: logger)
    }

    static func jsonRPCError(
        status: HTTPResponse.Status, _ message: String, code: Int = -32001, retry: Int? = nil
    ) -> Response {
        let body: [String: Any] = [
            "jsonrpc": "2.0", "id": NSNull(), "error": ["code": code, "message": message] as [String: Any],
        ]
        var fields: HTTPFields = [.contentType: "application/json"]
        if status == .unauthorized { fields[.wwwAuthenticate] = #"Bearer realm="storekeeper""# }
        if let retry { fields[.retryAfter] = String(retry) }
        let data = (try? JSONSerialization.data(withJSONObject: body)) ?? Data()
        return Response(status: status, headers: fields, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}

extension Duration {
    var nanoseconds: Double {
        Double(components.seconds) * 1e9 + Double(components.attoseconds) / 1e9
    }
}

/// The open sessions of the HTTP listener: each one an MCP server bound to the key its
/// `initialize` came with (a SHA-256 of it, never the key in the clear beyond the server's own
/// closure), the JSON-RPC ids it has in flight, when it was last used.
actor DeskSessions: Service {
    struct Session {
        let server: Server
        let transport: StatelessHTTPServerTransport
        let key: SHA256.Digest
        let label: String
        var lastUsed: ContinuousClock.Instant
        var inFlight: Set<String> = []
    }

    let desk: SupportDesk
    let origin: OriginValidator
    let idleTimeout: Duration
    let limit: Int
    let logger: Logger
    /// Idle time is measured on it (a test moves it; the listener's is the monotonic clock).
    let clock: @Sendable () -> ContinuousClock.Instant
    private var sessions: [String: Session] = [:]

    init(
        desk: SupportDesk, origin: OriginValidator, idleTimeout: Duration, limit: Int, logger: Logger,
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.desk = desk
        self.origin = origin
        self.idleTimeout = idleTimeout
        self.limit = max(1, limit)
        self.logger = logger
        self.clock = clock
    }

    var count: Int { sessions.count }

    /// Ends idle sessions every few seconds until the listener stops; then ends them all.
    func run() async throws {
        let tick = min(Duration.seconds(5), idleTimeout)
        try? await cancelWhenGracefulShutdown { [self] in
            while !Task.isCancelled {
                do { try await Task.sleep(for: tick) } catch { break }
                await expireIdle()
            }
        }
        for id in Array(sessions.keys) { await end(id) }
    }

    func expireIdle() async {
        let now = clock()
        for (id, session) in sessions where session.inFlight.isEmpty && now - session.lastUsed > idleTimeout {
            logger.info("mcp: session expired", metadata: ["key": "\(session.label)"])
            await end(id)
        }
    }

    private func end(_ id: String) async {
        guard let session = sessions.removeValue(forKey: id) else { return }
        await session.server.stop()
        await session.transport.disconnect()
    }

    /// One HTTP request: `Host` and `Origin` checked, the key checked with the StoreKeeper server
    /// (none or refused: 401 with `WWW-Authenticate`; the server not answering: 503 with
    /// Retry-After), then routed to its session (or, for `initialize`, to a new one).
    func answer(_ request: Request) async throws -> Response {
        var headers: [String: String] = [:]
        for field in request.headers { headers[field.name.canonicalName] = field.value }
        // HTTP/1.1's Host is the request's authority in HTTPTypes, not one of its fields.
        // (Field names are compared without case: one Host, never two that disagree.)
        if !headers.keys.contains(where: { $0.lowercased() == "host" }), let authority = request.head.authority {
            headers[HTTPHeaderName.host] = authority
        }
        let method = request.method.rawValue
        let probe = MCP.HTTPRequest(method: method, headers: headers, body: nil, path: request.uri.path)
        if let refused = origin.validate(
            probe,
            context: HTTPValidationContext(
                httpMethod: method, sessionID: nil, isInitializationRequest: false,
                supportedProtocolVersions: Version.supported))
        {
            return Self.response(refused)
        }
        let key: String
        do {
            key = try SupportDesk.bearer(request.headers[.authorization])
            _ = try await desk.identity(of: key)
        } catch DeskError.serverUnreachable(let why) {
            logger.warning("mcp: the StoreKeeper server did not answer", metadata: ["error": "\(why)"])
            return SupportDesk.jsonRPCError(
                status: .serviceUnavailable, DeskError.serverUnreachable(why).description, retry: 5)
        } catch {
            let message = (error as? DeskError)?.description ?? DeskError.noKey.description
            return SupportDesk.jsonRPCError(status: .unauthorized, message)
        }
        let digest = SHA256.hash(data: Data(key.utf8))
        let sessionID = request.headers[HTTPField.Name(HTTPHeaderName.sessionID)!]

        switch request.method {
        case .get:
            // No server-initiated messages: the desk never opens a stream (the specification's 405).
            var response = SupportDesk.jsonRPCError(
                status: .methodNotAllowed, "this server sends no stream: POST requests to /mcp", code: -32000)
            response.headers[.allow] = "POST, DELETE"
            return response
        case .delete:
            guard let sessionID, let session = sessions[sessionID], session.key == digest else {
                return SupportDesk.jsonRPCError(status: .notFound, "no such session", code: -32001)
            }
            logger.info("mcp: session ended by the client", metadata: ["key": "\(session.label)"])
            await end(sessionID)
            return Response(status: .ok)
        default: break
        }

        let body = try await request.body.collect(upTo: 1 << 20)
        let data = Data(buffer: body)
        guard let message = try? JSONSerialization.jsonObject(with: data), message is [String: Any] || message is [Any]
        else {
            return SupportDesk.jsonRPCError(status: .badRequest, "Parse error: the body is not JSON", code: -32700)
        }
        let ids = Self.requestIDs(message)
        let opening = Self.isInitialize(message)
        let httpRequest = MCP.HTTPRequest(method: method, headers: headers, body: data, path: request.uri.path)

        if opening {
            guard sessionID == nil else {
                return SupportDesk.jsonRPCError(
                    status: .badRequest, "initialize opens a session: send it without Mcp-Session-Id", code: -32600)
            }
            return await open(httpRequest, key: key, digest: digest)
        }
        guard let sessionID else {
            return SupportDesk.jsonRPCError(
                status: .badRequest, "Mcp-Session-Id is required: send initialize first to open a session",
                code: -32600)
        }
        // Idle past its timeout: ended now, on this request (the sweep frees the others' memory).
        if let idle = sessions[sessionID], idle.inFlight.isEmpty, clock() - idle.lastUsed > idleTimeout {
            logger.info("mcp: session expired", metadata: ["key": "\(idle.label)"])
            await end(sessionID)
        }
        guard var session = sessions[sessionID], session.key == digest else {
            // The specification's answer to an unknown or expired session: the client starts a new one.
            return SupportDesk.jsonRPCError(status: .notFound, "no such session (expired or ended)", code: -32001)
        }
        if let busy = ids.first(where: { session.inFlight.contains($0) }) {
            return SupportDesk.jsonRPCError(
                status: .conflict, "request id \(busy.prefix(64)) is already in flight in this session",
                code: -32600)
        }
        session.inFlight.formUnion(ids)
        session.lastUsed = clock()
        sessions[sessionID] = session
        let answer = await session.transport.handleRequest(httpRequest)
        if var after = sessions[sessionID] {
            after.inFlight.subtract(ids)
            after.lastUsed = clock()
            sessions[sessionID] = after
        }
        return Self.response(answer, sessionID: sessionID)
    }

    /// `initialize`: a new session with an MCP server of its own whose every call uses `key`.
    private func open(_ request: MCP.HTTPRequest, key: String, digest: SHA256.Digest) async -> Response {
        await expireIdle()
        if sessions.count >= limit,
            let oldest = sessions.filter({ $0.value.inFlight.isEmpty })
                .min(by: { $0.value.lastUsed < $1.value.lastUsed })?.key
        {
            logger.notice("mcp: session limit reached; the least recently used session ended")
            await end(oldest)
        }
        guard sessions.count < limit else {
            return SupportDesk.jsonRPCError(
                status: .serviceUnavailable, "too many sessions at once; try again", code: -32000, retry: 5)
        }
        let identity = try? await desk.identity(of: key)
        let transport = StatelessHTTPServerTransport(
            validationPipeline: StandardValidationPipeline(validators: [
                AcceptHeaderValidator(mode: .jsonOnly), ContentTypeValidator(), ProtocolVersionValidator(),
            ]),
            logger: logger)
        let server = await desk.makeServer(key: key)
        do {
            try await server.start(transport: transport)
        } catch {
            await transport.disconnect()
            return SupportDesk.jsonRPCError(status: .internalServerError, "the session could not start", code: -32603)
        }
        let id = Self.newSessionID()
        sessions[id] = Session(
            server: server, transport: transport, key: digest, label: identity?.label ?? "?", lastUsed: clock())
        let answer = await transport.handleRequest(request)
        guard answer.statusCode == 200 else {
            await end(id)
            return Self.response(answer)
        }
        logger.info(
            "mcp: session opened", metadata: ["key": "\(identity?.label ?? "?")", "sessions": "\(sessions.count)"])
        return Self.response(answer, sessionID: id)
    }

    /// 128 random bits, hex: visible ASCII as the specification requires.
    static func newSessionID() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<4).map { _ in String(format: "%08x", UInt32.random(in: .min ... .max, using: &generator)) }
            .joined()
    }

    static func isInitialize(_ message: Any) -> Bool {
        if let object = message as? [String: Any] { return object["method"] as? String == "initialize" }
        if let batch = message as? [Any] { return batch.contains { isInitialize($0) } }
        return false
    }

    /// The ids of the requests in a message (a notification or an answer has none).
    static func requestIDs(_ message: Any) -> Set<String> {
        if let batch = message as? [Any] { return batch.reduce(into: []) { $0.formUnion(requestIDs($1)) } }
        guard let object = message as? [String: Any], object["method"] is String, let id = object["id"],
            !(id is NSNull)
        else { return [] }
        if let text = id as? String { return ["s:" + text] }
        return ["n:\(id)"]
    }

    static func response(_ answer: MCP.HTTPResponse, sessionID: String? = nil) -> Response {
        var fields = HTTPFields()
        for (name, value) in answer.headers {
            if let name = HTTPField.Name(name) { fields[name] = value }
        }
        if let sessionID { fields[HTTPField.Name(HTTPHeaderName.sessionID)!] = sessionID }
        let status = HTTPResponse.Status(code: answer.statusCode)
        if case .stream(let stream, _) = answer {
            return Response(
                status: status, headers: fields,
                body: ResponseBody { writer in
                    for try await chunk in stream { try await writer.write(ByteBuffer(bytes: chunk)) }
                    try await writer.finish(nil)
                })
        }
        return Response(
            status: status, headers: fields, body: .init(byteBuffer: ByteBuffer(bytes: answer.bodyData ?? Data())))
    }
}
