import Foundation
import HTTPTypes
import Hummingbird
import Logging
import MCP
import NIOCore

/// The desk over MCP's streamable HTTP transport (JSON answers, no server-sent stream: every tool
/// answers once): `POST /mcp`, each request carrying its own operator key as
/// `Authorization: Bearer`, so one listener serves every agent with its own scope and its own
/// label in the audit log.
extension SupportDesk {
    /// The listener's application (the MCP server behind it started): `allowedHosts` are the
    /// `Host` values it answers (DNS-rebinding protection; nil: 127.0.0.1, localhost and [::1] on
    /// any port).
    public func httpApplication(host: String, port: Int, allowedHosts: [String]? = nil) async throws
        -> some ApplicationProtocol
    {
        let origin =
            allowedHosts.map { hosts in
                OriginValidator(
                    allowedHosts: hosts, allowedOrigins: hosts.flatMap { ["https://\($0)", "http://\($0)"] })
            } ?? .localhost()
        let transport = StatelessHTTPServerTransport(
            validationPipeline: StandardValidationPipeline(validators: [
                origin, AcceptHeaderValidator(mode: .jsonOnly), ContentTypeValidator(), ProtocolVersionValidator(),
            ]),
            logger: logger)
        let server = await makeServer(key: nil)
        try await server.start(transport: transport)
        let router = Router()
        for method in [HTTPRequest.Method.post, .get, .delete] {
            router.on("mcp", method: method) { [self] request, _ in
                try await answer(request, transport: transport)
            }
        }
        router.get("healthz") { _, _ in Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ok\n"))) }
        return Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: "storekeeper-mcp"),
            logger: logger)
    }

    /// One HTTP request: its key checked with the StoreKeeper server first (none or refused: 401
    /// with `WWW-Authenticate`; the server not answering: 503 with Retry-After), then MCP's.
    func answer(_ request: Request, transport: StatelessHTTPServerTransport) async throws -> Response {
        do {
            _ = try await identity(of: try Self.bearer(request.headers[.authorization]))
        } catch DeskError.serverUnreachable(let why) {
            logger.warning("mcp: the StoreKeeper server did not answer", metadata: ["error": "\(why)"])
            return Self.jsonRPCError(
                status: .serviceUnavailable, DeskError.serverUnreachable(why).description, retry: 5)
        } catch {
            let message = (error as? DeskError)?.description ?? DeskError.noKey.description
            return Self.jsonRPCError(status: .unauthorized, message, retry: nil)
        }
        let body = try await request.body.collect(upTo: 1 << 20)
        var headers: [String: String] = [:]
        for field in request.headers { headers[field.name.canonicalName] = field.value }
        let answer = await transport.handleRequest(
            MCP.HTTPRequest(
                method: request.method.rawValue, headers: headers, body: Data(buffer: body), path: request.uri.path))
        var fields = HTTPFields()
        for (name, value) in answer.headers {
            if let name = HTTPField.Name(name) { fields[name] = value }
        }
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

    static func jsonRPCError(status: HTTPResponse.Status, _ message: String, retry: Int?) -> Response {
        let body: [String: Any] = [
            "jsonrpc": "2.0", "id": NSNull(), "error": ["code": -32001, "message": message] as [String: Any],
        ]
        var fields: HTTPFields = [.contentType: "application/json"]
        if status == .unauthorized { fields[.wwwAuthenticate] = #"Bearer realm="storekeeper""# }
        if let retry { fields[.retryAfter] = String(retry) }
        let data = (try? JSONSerialization.data(withJSONObject: body)) ?? Data()
        return Response(status: status, headers: fields, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}
