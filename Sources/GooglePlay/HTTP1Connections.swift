import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// The HTTP/1.1 client of the Developer API's calls — the one network exchange of every Google
/// Play purchase: kept-alive connections per origin (up to `maxConnectionsPerOrigin`, then the
/// call queues until one is free or its deadline passes), TLS for `https`, one deadline per call
/// covering the wait, the connection, the request and the whole answer, and an answer's body
/// bounded.
///
/// Written by hand rather than through AsyncHTTPClient (which the rest of the server uses for
/// its rare calls): per call, AsyncHTTPClient parses the URL, spawns a task for its
/// cancellation actor, runs a pool state machine and a streamed body's back-pressure — more CPU
/// than the exchange itself on a loopback or a near Google front end. A call here takes a
/// connection on the event loop the caller runs on when there is one (the server's handlers
/// run on their connection's loop), writes one request and collects one answer on that loop.
/// README's "Dependencies" gives the measurement.
public final class HTTP1Connections: Sendable {
    /// Where a connection goes.
    public struct Origin: Hashable, Sendable, CustomStringConvertible {
        public var tls: Bool
        public var host: String
        public var port: Int

        /// `http(s)://host[:port]` of `url` (a path after it is ignored), or nil.
        public init?(url: String) {
            let tls: Bool
            let rest: Substring
            if url.hasPrefix("https://") {
                tls = true
                rest = url.dropFirst(8)
            } else if url.hasPrefix("http://") {
                tls = false
                rest = url.dropFirst(7)
            } else {
                return nil
            }
            let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            guard !authority.isEmpty, !authority.contains("@") else { return nil }
            var host = Substring(authority)
            var port = tls ? 443 : 80
            if host.hasPrefix("[") {
                // An IPv6 literal: [::1]:8080.
                guard let close = host.firstIndex(of: "]") else { return nil }
                let after = host[host.index(after: close)...]
                host = host[host.index(after: host.startIndex)..<close]
                if !after.isEmpty {
                    guard after.hasPrefix(":"), let given = Int(after.dropFirst()) else { return nil }
                    port = given
                }
            } else if let colon = host.lastIndex(of: ":") {
                guard let given = Int(host[host.index(after: colon)...]) else { return nil }
                port = given
                host = host[..<colon]
            }
            guard !host.isEmpty, (1...65535).contains(port) else { return nil }
            self.tls = tls
            self.host = String(host)
            self.port = port
        }

        /// The `Host` header's value.
        var hostHeader: String {
            let name = host.contains(":") ? "[\(host)]" : host
            return port == (tls ? 443 : 80) ? name : "\(name):\(port)"
        }

        public var description: String { "\(tls ? "https" : "http")://\(hostHeader)" }
    }

    /// One answer: its status and whole body.
    public struct Answer: Sendable {
        public var status: Int
        public var body: [UInt8]
    }

    /// Why a call failed.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// The deadline passed (waiting for a connection, connecting, or for the answer).
        case deadlineExceeded
        /// The answer's body is larger than the call allows.
        case bodyTooLarge(Int)
        /// The connection could not be made, or ended before the whole answer.
        case connection(String)

        public var description: String {
            switch self {
            case .deadlineExceeded: "no answer before the deadline"
            case .bodyTooLarge(let limit): "the answer is larger than \(limit) bytes"
            case .connection(let why): why
            }
        }
    }

    /// The Developer API's connections: on the shared event loops, up to 64 at once to an origin
    /// (every Google purchase and acknowledgement waits on a call: at Google's ~100 ms a call,
    /// 8 connections would cap a server at about 80 purchases a second), idle ones closed after
    /// 60 s (below Google front ends' own idle limit).
    public static let shared = HTTP1Connections()

    let group: any EventLoopGroup
    let maxConnectionsPerOrigin: Int
    let idleTimeout: TimeAmount
    let tlsContext: NIOSSLContext?
    let tlsError: String?
    private let pools = Mutex<[Origin: Pool]>([:])

    public init(
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton, maxConnectionsPerOrigin: Int = 64,
        idleTimeout: TimeAmount = .seconds(60), tlsConfiguration: TLSConfiguration? = nil
    ) {
        self.group = group
        self.maxConnectionsPerOrigin = max(1, maxConnectionsPerOrigin)
        self.idleTimeout = idleTimeout
        var configuration = tlsConfiguration ?? .makeClientConfiguration()
        configuration.applicationProtocols = ["http/1.1"]
        do {
            tlsContext = try NIOSSLContext(configuration: configuration)
            tlsError = nil
        } catch {
            tlsContext = nil
            tlsError = "TLS cannot be set up: \(error)"
        }
    }

    /// The connections open to `origin` now (idle and busy).
    public func openConnections(to origin: Origin) -> Int {
        pools.withLock { $0[origin]?.open ?? 0 }
    }

    // MARK: A call

    /// Sends `method target` (a path with its query) to `origin` and returns the whole answer,
    /// all before `deadline`. A GET that finds its kept-alive connection closed by the other
    /// side before any answer is sent again once, on a new connection.
    public func exchange(
        _ method: HTTPMethod, origin: Origin, target: String, headers: [(String, String)], body: [UInt8]?,
        deadline: NIODeadline, maxBody: Int
    ) async throws -> Answer {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: target)
        head.headers.reserveCapacity(headers.count + 3)
        head.headers.add(name: "Host", value: origin.hostHeader)
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        if let body {
            head.headers.add(name: "Content-Length", value: String(body.count))
        } else if method == .POST || method == .PUT || method == .PATCH {
            head.headers.add(name: "Content-Length", value: "0")
        }
        let request = Request(head: head, body: body, maxBody: maxBody)
        var retried = false
        while true {
            let connection = try await checkOut(origin, deadline: deadline)
            do {
                let answer = try await connection.send(request, deadline: deadline)
                if answer.reusable {
                    checkIn(connection, origin: origin)
                } else {
                    connection.channel.close(promise: nil)
                }
                return Answer(status: answer.status, body: answer.body)
            } catch let failure as ExchangeFailure {
                connection.channel.close(promise: nil)
                if failure.closedBeforeAnswer, connection.reused, method == .GET, !retried {
                    retried = true
                    continue
                }
                throw failure.failure
            }
        }
    }

    // MARK: The pool

    struct Pool {
        var idle: [Connection] = []
        var open = 0
        var waiters: [Waiter] = []
    }

    struct Waiter {
        var id: UInt64
        var promise: EventLoopPromise<Connection?>
    }

    private let waiterIds = Atomic<UInt64>(0)

    /// A free connection to `origin`: an idle one (on the caller's event loop first), a new one
    /// while fewer than the limit are open, else the first freed (nil from the queue: a
    /// connection closed, so this call may open one).
    func checkOut(_ origin: Origin, deadline: NIODeadline) async throws -> Connection {
        let current = MultiThreadedEventLoopGroup.currentEventLoop
        while true {
            enum Next {
                case use(Connection)
                case open
                case wait(Waiter)
            }
            let loop = current ?? group.any()
            let next: Next = pools.withLock { pools in
                var pool = pools[origin] ?? Pool()
                defer { pools[origin] = pool }
                if !pool.idle.isEmpty {
                    let index =
                        current.flatMap { loop in pool.idle.lastIndex { $0.channel.eventLoop === loop } }
                        ?? pool.idle.count - 1
                    return .use(pool.idle.remove(at: index))
                }
                if pool.open < maxConnectionsPerOrigin {
                    pool.open += 1
                    return .open
                }
                let waiter = Waiter(
                    id: waiterIds.wrappingAdd(1, ordering: .relaxed).newValue,
                    promise: loop.makePromise(of: Connection?.self))
                pool.waiters.append(waiter)
                return .wait(waiter)
            }
            switch next {
            case .use(let connection):
                if connection.channel.isActive { return connection }
                // Closed while idle, before its close was seen: it is gone.
                closed(connection, origin: origin)
            case .open:
                do {
                    return try await connect(origin, on: loop, deadline: deadline)
                } catch {
                    pools.withLock { pools in pools[origin]?.open -= 1 }
                    wakeOne(origin)
                    throw error
                }
            case .wait(let waiter):
                let timer = waiter.promise.futureResult.eventLoop.scheduleTask(deadline: deadline) {
                    let removed = self.pools.withLock { pools in
                        guard let index = pools[origin]?.waiters.firstIndex(where: { $0.id == waiter.id }) else {
                            return false
                        }
                        pools[origin]?.waiters.remove(at: index)
                        return true
                    }
                    if removed { waiter.promise.fail(Failure.deadlineExceeded) }
                }
                let handed = try await waiter.promise.futureResult.get()
                timer.cancel()
                if let handed {
                    if handed.channel.isActive { return handed }
                    closed(handed, origin: origin)
                }
            // A slot was freed: try again.
            }
        }
    }

    /// Hands a connection that answered in full back: to the first waiting call, else idle.
    func checkIn(_ connection: Connection, origin: Origin) {
        enum Next {
            case hand(Waiter)
            case idle(generation: UInt64)
            case gone
        }
        let next: Next = pools.withLock { pools in
            guard var pool = pools[origin] else { return .gone }
            defer { pools[origin] = pool }
            if !pool.waiters.isEmpty { return .hand(pool.waiters.removeFirst()) }
            pool.idle.append(connection)
            return .idle(generation: connection.nextIdleGeneration())
        }
        switch next {
        case .hand(let waiter):
            waiter.promise.succeed(connection)
        case .idle(let generation):
            // Closed after `idleTimeout` if still idle since this check-in (taking it from the
            // idle list and this close exclude each other under the pool's lock).
            connection.channel.eventLoop.scheduleTask(in: idleTimeout) {
                let expired = self.pools.withLock { pools in
                    guard var pool = pools[origin], connection.idleGeneration == generation,
                        let index = pool.idle.firstIndex(where: { $0 === connection })
                    else { return false }
                    pool.idle.remove(at: index)
                    pools[origin] = pool
                    return true
                }
                if expired { connection.channel.close(promise: nil) }
            }
        case .gone:
            connection.channel.close(promise: nil)
        }
    }

    /// A connection closed (by either side): its slot is free.
    func closed(_ connection: Connection, origin: Origin) {
        guard connection.markClosed() else { return }
        pools.withLock { pools in
            guard var pool = pools[origin] else { return }
            pool.idle.removeAll { $0 === connection }
            pool.open -= 1
            pools[origin] = pool
        }
        wakeOne(origin)
    }

    /// Lets the first waiting call open a connection in a freed slot.
    private func wakeOne(_ origin: Origin) {
        let waiter: Waiter? = pools.withLock { pools in
            guard var pool = pools[origin], !pool.waiters.isEmpty, pool.open < maxConnectionsPerOrigin else {
                return nil
            }
            defer { pools[origin] = pool }
            return pool.waiters.removeFirst()
        }
        waiter?.promise.succeed(nil)
    }

    func connect(_ origin: Origin, on loop: any EventLoop, deadline: NIODeadline) async throws -> Connection {
        let remaining = deadline - .now()
        guard remaining > .zero else { throw Failure.deadlineExceeded }
        let tls: NIOSSLContext?
        if origin.tls {
            guard let context = tlsContext else { throw Failure.connection(tlsError ?? "TLS cannot be set up") }
            tls = context
        } else {
            tls = nil
        }
        let serverName = origin.host.isIPAddress ? nil : origin.host
        let channel: any Channel
        do {
            channel = try await ClientBootstrap(group: loop)
                .connectTimeout(min(remaining, .seconds(10)))
                .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let tls {
                            try channel.pipeline.syncOperations.addHandler(
                                try NIOSSLClientHandler(context: tls, serverHostname: serverName))
                        }
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(ExchangeHandler())
                    }
                }
                .connect(host: origin.host, port: origin.port).get()
        } catch ChannelError.connectTimeout {
            throw Failure.deadlineExceeded
        } catch {
            throw Failure.connection("cannot connect to \(origin): \(error)")
        }
        let connection = Connection(channel: channel)
        channel.closeFuture.whenComplete { _ in self.closed(connection, origin: origin) }
        return connection
    }

    // MARK: One connection

    struct Request: Sendable {
        var head: HTTPRequestHead
        var body: [UInt8]?
        var maxBody: Int
    }

    struct Response: Sendable {
        var status: Int
        var body: [UInt8]
        /// The answer was whole and the other side keeps the connection open.
        var reusable: Bool
    }

    struct ExchangeFailure: Error {
        var failure: Failure
        /// The connection ended before a byte of the answer (a kept-alive connection the other
        /// side had just closed).
        var closedBeforeAnswer = false
    }

    final class Connection: Sendable {
        let channel: any Channel
        private struct State {
            var idleGeneration: UInt64 = 0
            var exchanges: UInt64 = 0
            var closed = false
        }
        private let state = Mutex(State())

        init(channel: any Channel) { self.channel = channel }

        /// Has answered before (a first request can't meet a kept-alive connection gone stale).
        var reused: Bool { state.withLock { $0.exchanges > 1 } }

        func send(_ request: Request, deadline: NIODeadline) async throws -> Response {
            let id = state.withLock { state in
                state.exchanges += 1
                return state.exchanges
            }
            let promise = channel.eventLoop.makePromise(of: Response.self)
            // A promise completed twice keeps its first result: the handler's answer or failure
            // wins, and these are the backstops for a connection whose handler is already gone.
            let timer = channel.eventLoop.scheduleTask(deadline: deadline) { [channel] in
                channel.triggerUserOutboundEvent(DeadlinePassed(exchange: id), promise: nil)
                promise.fail(ExchangeFailure(failure: .deadlineExceeded))
            }
            defer { timer.cancel() }
            channel.writeAndFlush(Exchange(id: id, request: request, promise: promise)).whenFailure { error in
                promise.fail(
                    ExchangeFailure(
                        failure: .connection("the request could not be sent: \(error)"), closedBeforeAnswer: true))
            }
            return try await promise.futureResult.get()
        }

        /// Which check-in as idle this is (changed under the pool's lock only).
        var idleGeneration: UInt64 { state.withLock { $0.idleGeneration } }

        func nextIdleGeneration() -> UInt64 {
            state.withLock { state in
                state.idleGeneration &+= 1
                return state.idleGeneration
            }
        }

        /// True the first time only.
        func markClosed() -> Bool {
            state.withLock { state in
                defer { state.closed = true }
                return !state.closed
            }
        }
    }

    struct Exchange: Sendable {
        var id: UInt64
        var request: Request
        var promise: EventLoopPromise<Response>
    }

    /// The deadline of exchange `exchange` passed.
    struct DeadlinePassed: Sendable {
        var exchange: UInt64
    }

    /// Writes one request and collects its answer (one at a time: no pipelining). Every
    /// completion of a call's promise happens here, on the connection's loop.
    final class ExchangeHandler: ChannelDuplexHandler, RemovableChannelHandler {
        typealias InboundIn = HTTPClientResponsePart
        typealias OutboundIn = Exchange
        typealias OutboundOut = HTTPClientRequestPart

        private var promise: EventLoopPromise<Response>?
        private var exchange: UInt64 = 0
        private var maxBody = 0
        private var status: Int?
        private var keepAlive = false
        private var body: ByteBuffer?

        func write(context: ChannelHandlerContext, data: NIOAny, promise writePromise: EventLoopPromise<Void>?) {
            let next = unwrapOutboundIn(data)
            guard promise == nil, context.channel.isActive else {
                let failure = ExchangeFailure(
                    failure: .connection("the connection closed before the request"), closedBeforeAnswer: true)
                next.promise.fail(failure)
                writePromise?.fail(failure)
                return
            }
            promise = next.promise
            exchange = next.id
            maxBody = next.request.maxBody
            status = nil
            body = nil
            context.write(wrapOutboundOut(.head(next.request.head)), promise: nil)
            if let bytes = next.request.body, !bytes.isEmpty {
                context.write(
                    wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: bytes)))), promise: nil)
            }
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: writePromise)
        }

        func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
            guard let passed = event as? DeadlinePassed else {
                context.triggerUserOutboundEvent(event, promise: promise)
                return
            }
            promise?.succeed()
            guard self.promise != nil, passed.exchange == exchange else { return }
            // Whatever comes later is dropped with the connection.
            fail(ExchangeFailure(failure: .deadlineExceeded))
            context.close(promise: nil)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard let promise else { return }
            switch unwrapInboundIn(data) {
            case .head(let head):
                status = Int(head.status.code)
                keepAlive = head.isKeepAlive
            case .body(var part):
                let size = (body?.readableBytes ?? 0) + part.readableBytes
                guard size <= maxBody else {
                    fail(ExchangeFailure(failure: .bodyTooLarge(maxBody)))
                    context.close(promise: nil)
                    return
                }
                if body == nil { body = part } else { body!.writeBuffer(&part) }
            case .end:
                self.promise = nil
                let bytes = body.map { Array(buffer: $0) } ?? []
                body = nil
                promise.succeed(Response(status: status ?? 0, body: bytes, reusable: keepAlive))
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            fail(
                ExchangeFailure(
                    failure: .connection("the connection closed before the whole answer"),
                    closedBeforeAnswer: status == nil && body == nil))
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            fail(
                ExchangeFailure(
                    failure: .connection("the connection failed: \(error)"),
                    closedBeforeAnswer: status == nil && body == nil))
            context.close(promise: nil)
        }

        private func fail(_ failure: ExchangeFailure) {
            guard let promise else { return }
            self.promise = nil
            promise.fail(failure)
        }
    }
}

extension String {
    /// An IPv4 or IPv6 literal (no TLS server name for those).
    fileprivate var isIPAddress: Bool {
        (try? SocketAddress(ipAddress: self, port: 0)) != nil
    }
}
