import Crypto
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import SwiftASN1
import Synchronization
import Testing
import X509

@testable import GooglePlay

/// The Developer API's hand-written HTTP/1.1 client against a real NIO server on loopback:
/// kept-alive connections, the per-origin limit and its queue, deadlines (waiting, answering),
/// bounded bodies, chunked answers, `Connection: close`, a kept-alive connection the other
/// side dropped, TLS with a trusted and an untrusted certificate.
@Suite struct HTTP1ConnectionsTests {
    /// The test servers' and the clients' event loops, their own: the whole suite's servers keep
    /// the shared loops busy, and a call expected to succeed must not meet a deadline for that
    /// (those calls have two minutes; the deadline tests use short ones on calls that never end).
    static let serverLoops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    static let clientLoops = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// A small HTTP/1.1 server whose answer depends on the path.
    final class TestServer: Sendable {
        let channel: any Channel
        let accepted = Atomic<Int>(0)
        let inFlight = Atomic<Int>(0)
        let maxInFlight = Atomic<Int>(0)
        let requests = Atomic<Int>(0)

        var port: Int { channel.localAddress!.port! }

        /// `hangUp`: every connection is closed as soon as it is accepted.
        static func start(tls: NIOSSLContext? = nil, hangUp: Bool = false) async throws -> TestServer {
            let box = Mutex<TestServer?>(nil)
            let channel = try await ServerBootstrap(group: HTTP1ConnectionsTests.serverLoops)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let server = box.withLock { $0! }
                        server.accepted.add(1, ordering: .relaxed)
                        if hangUp {
                            try channel.pipeline.syncOperations.addHandler(HangUp())
                            return
                        }
                        if let tls { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                        try channel.pipeline.syncOperations.addHandler(Handler(server: server))
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            let server = TestServer(channel: channel)
            box.withLock { $0 = server }
            return server
        }

        init(channel: any Channel) { self.channel = channel }

        func stop() async { try? await channel.close() }

        func origin(_ scheme: String = "http", host: String = "127.0.0.1") -> HTTP1Connections.Origin {
            HTTP1Connections.Origin(url: "\(scheme)://\(host):\(port)")!
        }
    }

    final class HangUp: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        func channelActive(context: ChannelHandlerContext) { context.close(promise: nil) }
    }

    final class Handler: ChannelInboundHandler {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let server: TestServer
        var head: HTTPRequestHead?
        var body: [UInt8] = []
        /// Requests answered on this connection.
        var answered = 0

        init(server: TestServer) { self.server = server }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                self.head = head
                body = []
            case .body(var part):
                body += part.readBytes(length: part.readableBytes) ?? []
            case .end:
                guard let head else { return }
                server.requests.add(1, ordering: .relaxed)
                let now = server.inFlight.add(1, ordering: .relaxed).newValue
                var seen = server.maxInFlight.load(ordering: .relaxed)
                while now > seen {
                    let (exchanged, original) = server.maxInFlight.compareExchange(
                        expected: seen, desired: now, ordering: .relaxed)
                    if exchanged { break }
                    seen = original
                }
                answer(context: context, head: head)
            }
        }

        func respond(
            context: ChannelHandlerContext, _ text: String, status: HTTPResponseStatus = .ok, close: Bool = false
        ) {
            var headers = HTTPHeaders([("Content-Length", String(text.utf8.count))])
            if close { headers.add(name: "Connection", value: "close") }
            context.write(
                wrapOutboundOut(.head(.init(version: .http1_1, status: status, headers: headers))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: text)))), promise: nil)
            let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
            answered += 1
            server.inFlight.subtract(1, ordering: .relaxed)
            if close { done.assumeIsolated().whenComplete { _ in context.close(promise: nil) } }
        }

        func answer(context: ChannelHandlerContext, head: HTTPRequestHead) {
            let path = String(head.uri.prefix { $0 != "?" })
            switch path {
            case "/echo":
                let host = head.headers.first(name: "Host") ?? "-"
                let length = head.headers.first(name: "Content-Length") ?? "-"
                respond(
                    context: context,
                    "\(head.method.rawValue) \(head.uri) host=\(host) length=\(length) body=\(String(decoding: body, as: UTF8.self))"
                )
            case "/slow":
                context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(50)) {
                    self.respond(context: context, "slow")
                }
            case "/hang":
                server.inFlight.subtract(1, ordering: .relaxed)
            case "/big":
                respond(context: context, String(repeating: "x", count: 10_000))
            case "/chunked":
                context.write(
                    wrapOutboundOut(
                        .head(.init(version: .http1_1, status: .ok, headers: ["Transfer-Encoding": "chunked"]))),
                    promise: nil)
                for part in ["one,", "two,", "three"] {
                    context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: part)))), promise: nil)
                }
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
                answered += 1
                server.inFlight.subtract(1, ordering: .relaxed)
            case "/close":
                respond(context: context, "closing", close: true)
            case "/once":
                // Answers a connection's first request, then drops it at the second without a
                // word: a kept-alive connection the server closed as the client reused it.
                if answered == 0 {
                    respond(context: context, "first")
                } else {
                    server.inFlight.subtract(1, ordering: .relaxed)
                    context.close(promise: nil)
                }
            case "/status":
                respond(context: context, "{\"error\":{}}", status: .notFound)
            default:
                respond(context: context, "ok")
            }
        }
    }

    static func text(_ answer: HTTP1Connections.Answer) -> String { String(decoding: answer.body, as: UTF8.self) }

    static func get(
        _ connections: HTTP1Connections, _ origin: HTTP1Connections.Origin, _ target: String,
        timeout: TimeAmount = .seconds(120), maxBody: Int = 1 << 20
    ) async throws -> HTTP1Connections.Answer {
        try await connections.exchange(
            .GET, origin: origin, target: target, headers: [("Accept", "application/json")], body: nil,
            deadline: .now() + timeout, maxBody: maxBody)
    }

    @Test func originsAreParsedFromURLs() throws {
        let google = try #require(HTTP1Connections.Origin(url: "https://androidpublisher.googleapis.com"))
        #expect(google.tls && google.host == "androidpublisher.googleapis.com" && google.port == 443)
        #expect(google.hostHeader == "androidpublisher.googleapis.com")
        let local = try #require(HTTP1Connections.Origin(url: "http://127.0.0.1:8081/base/path?x"))
        #expect(!local.tls && local.host == "127.0.0.1" && local.port == 8081 && local.hostHeader == "127.0.0.1:8081")
        let six = try #require(HTTP1Connections.Origin(url: "http://[::1]:9000/"))
        #expect(six.host == "::1" && six.port == 9000 && six.hostHeader == "[::1]:9000")
        for bad in [
            "ftp://example.com", "example.com", "http://", "http://host:99999", "http://host:x", "http://user@host",
            "http://[::1", "http://[::1]x",
        ] {
            #expect(HTTP1Connections.Origin(url: bad) == nil, "\(bad)")
        }
    }

    @Test func callsReuseOneKeptAliveConnectionAndSendWhatTheyAreGiven() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops)
        let origin = server.origin()
        for index in 0..<20 {
            let answer = try await Self.get(connections, origin, "/echo?n=\(index)")
            #expect(answer.status == 200)
            #expect(Self.text(answer) == "GET /echo?n=\(index) host=127.0.0.1:\(server.port) length=- body=")
        }
        let posted = try await connections.exchange(
            .POST, origin: origin, target: "/echo", headers: [("Content-Type", "application/json")],
            body: Array(#"{"a":1}"#.utf8), deadline: .now() + .seconds(120), maxBody: 1024)
        #expect(Self.text(posted) == #"POST /echo host=127.0.0.1:\#(server.port) length=7 body={"a":1}"#)
        let empty = try await connections.exchange(
            .POST, origin: origin, target: "/echo", headers: [], body: nil, deadline: .now() + .seconds(120),
            maxBody: 1024)
        #expect(Self.text(empty).contains("length=0"))
        #expect(server.accepted.load(ordering: .relaxed) == 1)
        #expect(connections.openConnections(to: origin) == 1)
        let missing = try await Self.get(connections, origin, "/status")
        #expect(missing.status == 404 && Self.text(missing) == #"{"error":{}}"#)
        await server.stop()
    }

    @Test func anIdleConnectionIsClosedAfterTheIdleTimeout() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops, idleTimeout: .milliseconds(100))
        let origin = server.origin()
        #expect(Self.text(try await Self.get(connections, origin, "/")) == "ok")
        for _ in 0..<1000 where connections.openConnections(to: origin) != 0 {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(connections.openConnections(to: origin) == 0)
        #expect(Self.text(try await Self.get(connections, origin, "/")) == "ok")
        #expect(server.accepted.load(ordering: .relaxed) == 2)
        await server.stop()
    }

    @Test func concurrentCallsStayWithinTheLimitAndQueue() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops, maxConnectionsPerOrigin: 3)
        let origin = server.origin()
        try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<30 {
                group.addTask { Self.text(try await Self.get(connections, origin, "/slow")) }
            }
            for try await text in group { #expect(text == "slow") }
        }
        #expect(server.requests.load(ordering: .relaxed) == 30)
        #expect(server.accepted.load(ordering: .relaxed) <= 3)
        #expect(server.maxInFlight.load(ordering: .relaxed) <= 3)
        #expect(connections.openConnections(to: origin) <= 3)
        await server.stop()
    }

    @Test func aDeadlineEndsAWaitForTheAnswerAndTheConnectionIsNotReused() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops)
        let origin = server.origin()
        await #expect(throws: HTTP1Connections.Failure.deadlineExceeded) {
            try await Self.get(connections, origin, "/hang", timeout: .milliseconds(200))
        }
        // The hung connection is closed; the next call opens another and is answered.
        #expect(Self.text(try await Self.get(connections, origin, "/")) == "ok")
        #expect(server.accepted.load(ordering: .relaxed) == 2)
        await server.stop()
    }

    @Test func aDeadlineEndsAWaitForAFreeConnection() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops, maxConnectionsPerOrigin: 1)
        let origin = server.origin()
        let hung = Task { try await Self.get(connections, origin, "/hang", timeout: .seconds(2)) }
        // Wait until the one connection is taken by the hung call.
        while server.requests.load(ordering: .relaxed) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        await #expect(throws: HTTP1Connections.Failure.deadlineExceeded) {
            try await Self.get(connections, origin, "/", timeout: .milliseconds(200))
        }
        await #expect(throws: HTTP1Connections.Failure.deadlineExceeded) { try await hung.value }
        // The slot came back when the hung call's deadline closed its connection.
        #expect(Self.text(try await Self.get(connections, origin, "/")) == "ok")
        await server.stop()
    }

    @Test func anAnswerLargerThanTheLimitFailsAndChunkedAnswersAreJoined() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops)
        let origin = server.origin()
        await #expect(throws: HTTP1Connections.Failure.bodyTooLarge(1000)) {
            try await Self.get(connections, origin, "/big", maxBody: 1000)
        }
        #expect(try await Self.get(connections, origin, "/big", maxBody: 10_000).body.count == 10_000)
        #expect(Self.text(try await Self.get(connections, origin, "/chunked")) == "one,two,three")
        #expect(Self.text(try await Self.get(connections, origin, "/chunked")) == "one,two,three")
        await server.stop()
    }

    @Test func connectionCloseAndADroppedKeptAliveConnection() async throws {
        let server = try await TestServer.start()
        let connections = HTTP1Connections(group: Self.clientLoops, maxConnectionsPerOrigin: 1)
        let origin = server.origin()
        #expect(Self.text(try await Self.get(connections, origin, "/close")) == "closing")
        #expect(Self.text(try await Self.get(connections, origin, "/")) == "ok")
        #expect(server.accepted.load(ordering: .relaxed) == 2)
        // A GET that meets a kept-alive connection dropped without an answer is sent again, once,
        // on a new connection.
        // (The second connection answered "/" before: its "/once" is dropped.)
        #expect(Self.text(try await Self.get(connections, origin, "/once")) == "first")
        #expect(server.accepted.load(ordering: .relaxed) == 3)
        #expect(Self.text(try await Self.get(connections, origin, "/once")) == "first")
        #expect(server.accepted.load(ordering: .relaxed) == 4)
        // A POST is not sent twice: the caller learns the connection ended.
        let before = server.requests.load(ordering: .relaxed)
        await #expect(throws: HTTP1Connections.Failure.self) {
            try await connections.exchange(
                .POST, origin: origin, target: "/once", headers: [], body: nil, deadline: .now() + .seconds(120),
                maxBody: 1024)
        }
        #expect(server.requests.load(ordering: .relaxed) == before + 1)
        await server.stop()
        // Nothing listens any more: a clear failure, not a hang.
        await #expect(throws: HTTP1Connections.Failure.self) {
            try await Self.get(connections, origin, "/", timeout: .seconds(5))
        }
    }

    @Test func aConnectionClosedAsItOpensFailsTheCallAtOnce() async throws {
        let server = try await TestServer.start(hangUp: true)
        let connections = HTTP1Connections(group: Self.clientLoops)
        for _ in 0..<20 {
            // The request meets the connection open (and the close before an answer) or already
            // closed (the write fails): either way a connection failure, never the deadline.
            let failure = await #expect(throws: HTTP1Connections.Failure.self) {
                try await Self.get(connections, server.origin(), "/", timeout: .seconds(120))
            }
            #expect(failure != nil && failure != .deadlineExceeded)
        }
        // Each closed connection gave its slot back (its close is seen on its loop).
        for _ in 0..<1000 where connections.openConnections(to: server.origin()) != 0 {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(connections.openConnections(to: server.origin()) == 0)
        await server.stop()
    }

    @Test func tlsToATrustedCertificateAndNotToAnUntrustedOne() async throws {
        let key = P256.Signing.PrivateKey()
        let name = try DistinguishedName { CommonName("localhost") }
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: Date().addingTimeInterval(-3600), notValidAfter: Date().addingTimeInterval(3600),
            issuer: name, subject: name, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                SubjectAlternativeNames([.dnsName("localhost")])
            }, issuerPrivateKey: .init(key))
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        let trusted = try NIOSSLCertificate(bytes: serializer.serializedBytes, format: .der)
        let server = try await TestServer.start(
            tls: try NIOSSLContext(
                configuration: .makeServerConfiguration(
                    certificateChain: [.certificate(trusted)],
                    privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(key.derRepresentation), format: .der)))))
        var trusting = TLSConfiguration.makeClientConfiguration()
        trusting.trustRoots = .certificates([trusted])
        let connections = HTTP1Connections(group: Self.clientLoops, tlsConfiguration: trusting)
        let origin = server.origin("https", host: "localhost")
        for _ in 0..<3 {
            #expect(Self.text(try await Self.get(connections, origin, "/echo")).hasPrefix("GET /echo host=localhost:"))
        }
        #expect(server.accepted.load(ordering: .relaxed) == 1)
        // The system's roots do not trust it; plain HTTP to a TLS port gets no answer.
        await #expect(throws: HTTP1Connections.Failure.self) {
            try await Self.get(HTTP1Connections(group: Self.clientLoops), origin, "/echo", timeout: .seconds(5))
        }
        await #expect(throws: HTTP1Connections.Failure.self) {
            try await Self.get(connections, server.origin("http", host: "localhost"), "/echo", timeout: .seconds(2))
        }
        await server.stop()
    }
}
