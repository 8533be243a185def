import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// An in-process HTTP server on 127.0.0.1 that plays Apple from a script: each request is
/// recorded and answered by the handler, which can delay, fail or return anything.
final class ScriptedAppleServer: Sendable {
    struct Request: Sendable {
        var method: String
        var uri: String
        var headers: [(String, String)]
        var body: [UInt8]

        func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
        var path: String { String(uri.split(separator: "?", maxSplits: 1).first ?? "") }
        var query: [(String, String)] {
            guard let query = uri.split(separator: "?", maxSplits: 1).dropFirst().first else { return [] }
            return query.split(separator: "&").map { pair in
                let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
                return (parts[0], (parts.count > 1 ? parts[1] : "").removingPercentEncoding ?? "")
            }
        }
    }

    struct Response: Sendable {
        var status: Int = 200
        var headers: [(String, String)] = [("Content-Type", "application/json")]
        var body: [UInt8] = []
        var delay: Duration = .zero

        static func json(_ text: String, status: Int = 200) -> Response {
            Response(status: status, body: Array(text.utf8))
        }
        static func encoded<T: Encodable>(_ value: T, status: Int = 200) -> Response {
            Response(status: status, body: Array(try! JSONEncoder().encode(value)))
        }
    }

    typealias Handler = @Sendable (Request) async -> Response

    private let channel: any Channel
    private let recorded = Mutex<[Request]>([])
    let port: Int

    var baseURL: String { "http://127.0.0.1:\(port)" }
    var requests: [Request] { recorded.withLock { $0 } }

    init(handler: @escaping Handler) async throws {
        // The process-wide group: it outlives every server, so a late answer never meets a
        // shut-down loop.
        let group = MultiThreadedEventLoopGroup.singleton
        let box = HandlerBox(handler: handler)
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.pipeline.configureHTTPServerPipeline().flatMap {
                    channel.pipeline.addHandler(RequestHandler(box: box))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        self.channel = channel
        self.port = channel.localAddress?.port ?? 0
        box.server = self
    }

    fileprivate func record(_ request: Request) { recorded.withLock { $0.append(request) } }

    func shutdown() async throws {
        try await channel.close()
    }

    fileprivate final class HandlerBox: @unchecked Sendable {
        let handler: Handler
        weak var server: ScriptedAppleServer?
        init(handler: @escaping Handler) { self.handler = handler }
    }

    private final class RequestHandler: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let box: HandlerBox
        var head: HTTPRequestHead?
        var body: [UInt8] = []

        init(box: HandlerBox) { self.box = box }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                self.head = head
                body = []
            case .body(var buffer):
                body += buffer.readBytes(length: buffer.readableBytes) ?? []
            case .end:
                guard let head else { return }
                let request = Request(
                    method: head.method.rawValue, uri: head.uri, headers: head.headers.map { ($0.name, $0.value) },
                    body: body)
                box.server?.record(request)
                let handler = box.handler
                let channel = context.channel
                let loop = context.eventLoop
                Task {
                    let response = await handler(request)
                    if response.delay > .zero { try? await Task.sleep(for: response.delay) }
                    loop.execute {
                        var headers = HTTPHeaders(response.headers)
                        headers.replaceOrAdd(name: "Content-Length", value: String(response.body.count))
                        let responseHead = HTTPResponseHead(
                            version: .http1_1, status: HTTPResponseStatus(statusCode: response.status), headers: headers
                        )
                        channel.write(HTTPServerResponsePart.head(responseHead), promise: nil)
                        channel.write(
                            HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(bytes: response.body))), promise: nil)
                        channel.writeAndFlush(HTTPServerResponsePart.end(nil), promise: nil)
                    }
                }
            }
        }
    }
}
