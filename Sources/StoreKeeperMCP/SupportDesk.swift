import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import MCP
import NIOCore
import NIOHTTP1
import SystemPackage

/// What an operator key is, as the server says (`GET /v1/keys/current`): its label in the audit
/// log, its scope, the apps it is limited to.
public struct KeyIdentity: Sendable, Equatable, Decodable {
    public var label: String
    public var scope: String
    public var apps: [String]?

    public init(label: String, scope: String, apps: [String]?) {
        self.label = label
        self.scope = scope
        self.apps = apps
    }

    var deskScope: DeskTool.Scope { DeskTool.Scope(rawValue: scope) ?? .read }
}

/// Why the desk cannot serve a key: answered to the client (401 over HTTP), never a crash.
public enum DeskError: Error, CustomStringConvertible, Equatable {
    case noKey
    case keyRefused(String)
    case serverUnreachable(String)

    public var description: String {
        switch self {
        case .noKey: "no key: give an operator key (Authorization: Bearer <key>, or STOREKEEPER_KEY for stdio)"
        case .keyRefused(let why): "the StoreKeeper server refused the key: \(why)"
        case .serverUnreachable(let why): "the StoreKeeper server did not answer: \(why)"
        }
    }
}

/// `storekeeper mcp`: the support desk's tools for an agent, over the Model Context Protocol. Each
/// tool is one call of the StoreKeeper server's HTTP API made with the caller's own key, so the
/// server's scopes, app limits, validation and audit log (under the key's label) hold as they do
/// for the dashboard and the API; a key is offered only the tools its scope includes (a `read` key
/// no write tool).
public actor SupportDesk {
    public let serverURL: URL
    let client: HTTPClient
    let logger: Logger
    let callTimeout: TimeAmount
    private var identities: [SHA256.Digest: (identity: KeyIdentity, until: Date)] = [:]

    public init(
        serverURL: URL, client: HTTPClient = .shared, logger: Logger = Logger(label: "storekeeper.mcp"),
        callTimeout: TimeAmount = .seconds(30)
    ) {
        var text = serverURL.absoluteString
        while text.hasSuffix("/") { text.removeLast() }
        self.serverURL = URL(string: text) ?? serverURL
        self.client = client
        self.logger = logger
        self.callTimeout = callTimeout
    }

    // MARK: The API

    /// One API call with `key`: the status and the body (at most 16 MiB), within the deadline.
    public func perform(_ call: APICall, key: String) async throws -> (status: Int, body: Data) {
        var url = serverURL.absoluteString + call.path
        if !call.query.isEmpty {
            url +=
                "?"
                + call.query.sorted { $0.key < $1.key }.map { "\(segment($0.key))=\(segment($0.value))" }
                .joined(separator: "&")
        }
        var request = HTTPClientRequest(url: url)
        request.method = HTTPMethod(rawValue: call.method)
        request.headers.add(name: "Authorization", value: "Bearer \(key)")
        request.headers.add(name: "User-Agent", value: "storekeeper-mcp")
        // The audit log names this desk as the origin of each write (the key decides the rest).
        request.headers.add(name: "StoreKeeper-Origin", value: "mcp")
        request.headers.add(name: "Accept", value: "application/json")
        if let body = call.body {
            let data = try JSONEncoder().encode(Value.object(body))
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: data))
        }
        do {
            let response = try await client.execute(request, timeout: callTimeout)
            let body = try await response.body.collect(upTo: 16 << 20)
            return (Int(response.status.code), Data(buffer: body))
        } catch {
            throw DeskError.serverUnreachable("\(call.method) \(call.path): \(error)")
        }
    }

    /// Who `key` is, asked of the server and remembered for 30 s (a revoked key is refused by the
    /// server on its next call regardless).
    public func identity(of key: String) async throws -> KeyIdentity {
        guard !key.isEmpty else { throw DeskError.noKey }
        let digest = SHA256.hash(data: Data(key.utf8))
        if let known = identities[digest], known.until > Date() { return known.identity }
        let (status, body) = try await perform(APICall(method: "GET", path: "/v1/keys/current"), key: key)
        guard status == 200, let identity = try? JSONDecoder().decode(KeyIdentity.self, from: body) else {
            if status == 401 || status == 403 { throw DeskError.keyRefused(Self.errorText(status, body)) }
            throw DeskError.serverUnreachable(Self.errorText(status, body))
        }
        if identities.count > 1000 { identities.removeAll() }
        identities[digest] = (identity, Date().addingTimeInterval(30))
        return identity
    }

    static func errorText(_ status: Int, _ body: Data) -> String {
        let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        let error = object?["error"] as? [String: Any]
        let code = error?["code"] as? String ?? "http_\(status)"
        let message = error?["message"] as? String ?? String(decoding: body.prefix(300), as: UTF8.self)
        return "HTTP \(status) \(code): \(message)"
    }

    // MARK: Tools

    /// The tools `identity` is offered.
    public static func tools(for identity: KeyIdentity) -> [Tool] {
        DeskTool.all.filter { $0.scope <= identity.deskScope }.map(\.tool)
    }

    /// One tool call with `key`: the API's answer as the tool's result (its JSON; an API error is
    /// the tool's error with the API's code and message).
    public func call(_ name: String, arguments: [String: Value]?, key: String) async -> CallTool.Result {
        do {
            let identity = try await identity(of: key)
            guard let tool = DeskTool.all.first(where: { $0.name == name }) else {
                return Self.failure("unknown tool '\(name.prefix(64))'")
            }
            guard tool.scope <= identity.deskScope else {
                logger.notice(
                    "mcp: refused",
                    metadata: ["tool": "\(name)", "key": "\(identity.label)", "scope": "\(identity.scope)"])
                return Self.failure(
                    "key '\(identity.label)' has the \(identity.scope) scope; \(name) needs \(tool.scope.rawValue)")
            }
            let request = tool.marked(try tool.call(try Arguments(arguments, of: tool)))
            let (status, body) = try await perform(request, key: key)
            logger.info(
                "mcp: tool called",
                metadata: ["tool": "\(name)", "key": "\(identity.label)", "status": "\(status)"])
            guard (200..<300).contains(status) else { return Self.failure(Self.errorText(status, body)) }
            let value = try? JSONDecoder().decode(Value.self, from: body)
            let text = String(decoding: body, as: UTF8.self)
            return CallTool.Result(
                content: [.text(text: text.isEmpty ? "{}" : text, annotations: nil, _meta: nil)],
                structuredContent: value?.objectValue.map(Value.object),
                isError: false)
        } catch let error as ToolArgumentError {
            return Self.failure(error.description)
        } catch {
            return Self.failure("\(error)")
        }
    }

    static func failure(_ message: String) -> CallTool.Result {
        CallTool.Result(content: [.text(text: message, annotations: nil, _meta: nil)], isError: true)
    }

    /// An MCP server whose calls use `key`, or (nil) the key of each HTTP request's
    /// `Authorization: Bearer`.
    public func makeServer(key fixed: String?) async -> Server {
        let server = Server(
            name: "storekeeper", version: "1",
            instructions:
                "StoreKeeper's support desk: find a purchase by any id a player quotes, read an account, "
                + "analytics; with a support key, credit, grant, refund Google Play and web purchases, transfer, "
                + "extend and note. Every write is audited under this key's label.",
            capabilities: .init(tools: .init(listChanged: false)))
        await server.withMethodHandler(ListTools.self) { [self] _ in
            let key = try fixed ?? Self.bearer(Server.currentHandlerContext?.httpContext?.header("Authorization"))
            do {
                return ListTools.Result(tools: Self.tools(for: try await identity(of: key)))
            } catch {
                throw MCPError.invalidRequest("\(error)")
            }
        }
        await server.withMethodHandler(CallTool.self) { [self] parameters in
            let key = try fixed ?? Self.bearer(Server.currentHandlerContext?.httpContext?.header("Authorization"))
            return await call(parameters.name, arguments: parameters.arguments, key: key)
        }
        return server
    }

    /// The key of `Authorization: Bearer <key>`.
    static func bearer(_ header: String?) throws -> String {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else {
            throw MCPError.invalidRequest(DeskError.noKey.description)
        }
        return String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)
    }

    /// Over stdin/stdout with `key` (checked with the server first: a refused key is an error
    /// before anything is served), until stdin closes — and then until every request read has
    /// been answered (each API call has its own 30 s deadline; `answerWithin` bounds the wait),
    /// so a client that writes its requests and closes stdin at once still gets every answer.
    public func serveStdio(
        key: String, input: SystemPackage.FileDescriptor = .standardInput,
        output: SystemPackage.FileDescriptor = .standardOutput, answerWithin: Duration = .seconds(40)
    ) async throws {
        let identity = try await identity(of: key)
        logger.notice(
            "mcp: serving over stdio", metadata: ["key": "\(identity.label)", "scope": "\(identity.scope)"])
        let server = await makeServer(key: key)
        let transport = AnsweringTransport(
            StdioTransport(input: input, output: output, logger: logger), logger: logger)
        try await server.start(transport: transport)
        await server.waitUntilCompleted()
        let unanswered = await transport.settle(within: answerWithin)
        if unanswered > 0 {
            logger.error("mcp: stdin closed; \(unanswered) requests still unanswered after \(answerWithin)")
        }
    }
}
