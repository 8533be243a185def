import Foundation
import NIOCore
import NIOPosix

/// A lean HTTP/1.1 load generator for `bench --purchases`: one keep-alive connection per
/// client, each request's bytes built before the clock starts, and the next request written
/// from the event loop the moment the previous answer is complete — so the load generator,
/// which shares the machine with the server, takes as little of it as it can.
enum LoadGenerator {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// One answer: how long it took, when it came, and what it was.
    struct Answer: Sendable {
        enum Outcome: Sendable {
            /// 200 (or 201) with `expect` in its body.
            case delivered
            /// 503 `overloaded`: shed before any work.
            case shed
            /// Any other 503 (`storage_unavailable`, `timeout`): a fault answered.
            case unavailable
        }
        var latency: Double
        var at: NIODeadline
        var outcome: Outcome
    }

    /// Sends `bodies` as `POST path` over `concurrency` connections; every answer must be 200
    /// containing `expect` (any 200 when it is empty), or a 503 (retryable, never retried
    /// here). Returns every answer.
    /// With `interval`, request k is not sent before `k × interval` from the start (a steady
    /// rate; latency is counted from when it is sent). With `paths`, request k goes to
    /// `paths[k]` instead of `path`.
    static func run(
        host: String, port: Int, path: String, authorization: String, bodies: [String], concurrency: Int,
        expect: String, interval: TimeAmount? = nil, method: String = "POST", paths: [String]? = nil,
        headers: [String]? = nil
    ) async throws -> [Answer] {
        let group = MultiThreadedEventLoopGroup.singleton
        let start = NIODeadline.now()
        var futures: [EventLoopFuture<[Answer]>] = []
        for worker in 0..<min(concurrency, bodies.count) {
            let requests = stride(from: worker, to: bodies.count, by: concurrency).map { index in
                let path = paths?[index] ?? path
                var request = ByteBuffer()
                if method == "GET" {
                    request.writeString(
                        "GET \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nAuthorization: \(authorization)\r\n\r\n")
                    return request
                }
                let extra = headers.map { "\($0[index])\r\n" } ?? ""
                request.writeString(
                    "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nAuthorization: \(authorization)\r\n"
                        + extra
                        + "Content-Type: application/json\r\nContent-Length: \(bodies[index].utf8.count)\r\n\r\n")
                request.writeString(bodies[index])
                return request
            }
            let eventLoop = group.next()
            let done = eventLoop.makePromise(of: [Answer].self)
            let connected = ClientBootstrap(group: eventLoop)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            ClientHandler(
                                requests: requests,
                                due: interval.map { interval in
                                    stride(from: worker, to: bodies.count, by: concurrency).map {
                                        start + .nanoseconds(interval.nanoseconds * Int64($0))
                                    }
                                }, expect: Array(expect.utf8), done: done))
                    }
                }
                .connect(host: host, port: port)
            connected.whenFailure { done.fail($0) }
            futures.append(
                done.futureResult.flatMap { latencies in
                    connected.flatMap { $0.close() }.map { latencies }.recover { _ in latencies }
                })
        }
        var answers: [Answer] = []
        for future in futures { answers += try await future.get() }
        return answers
    }

    /// Writes a request, reads its answer (status line, headers, Content-Length body), records
    /// the time between the two, and writes the next.
    private final class ClientHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        let requests: [ByteBuffer]
        /// When each request may go, if paced.
        let due: [NIODeadline]?
        let expect: [UInt8]
        let done: EventLoopPromise<[Answer]>
        var next = 0
        var sentAt = NIODeadline.now()
        var answers: [Answer] = []
        var received = ByteBuffer()
        var finished = false

        init(requests: [ByteBuffer], due: [NIODeadline]?, expect: [UInt8], done: EventLoopPromise<[Answer]>) {
            self.requests = requests
            self.due = due
            self.expect = expect
            self.done = done
            answers.reserveCapacity(requests.count)
        }

        func channelActive(context: ChannelHandlerContext) {
            send(context: context)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var incoming = unwrapInboundIn(data)
            received.writeBuffer(&incoming)
            do {
                while let (status, body) = try takeResponse() {
                    let now = NIODeadline.now()
                    let outcome: Answer.Outcome
                    if status == 200 || status == 201, expect.isEmpty || Self.contains(body, expect) {
                        outcome = .delivered
                    } else if status == 503 {
                        outcome =
                            Self.contains(body, Self.overloaded) ? .shed : .unavailable
                    } else {
                        throw Failure(description: "unexpected answer \(status): \(String(buffer: body).prefix(300))")
                    }
                    answers.append(Answer(latency: Double((now - sentAt).nanoseconds) / 1e9, at: now, outcome: outcome))
                    send(context: context)
                }
            } catch {
                fail(error, context: context)
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            fail(Failure(description: "the server closed the connection"), context: context)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            fail(error, context: context)
        }

        private func send(context: ChannelHandlerContext) {
            guard next < requests.count else {
                finished = true
                done.succeed(answers)
                return
            }
            if let due, due[next] > .now() {
                let context = NIOLoopBound(context, eventLoop: context.eventLoop)
                context.value.eventLoop.scheduleTask(deadline: due[next]) { self.write(context: context.value) }
                return
            }
            write(context: context)
        }

        private func write(context: ChannelHandlerContext) {
            guard !finished else { return }
            sentAt = .now()
            context.writeAndFlush(wrapOutboundOut(requests[next]), promise: nil)
            next += 1
        }

        private func fail(_ error: any Error, context: ChannelHandlerContext) {
            guard !finished else { return }
            finished = true
            done.fail(error)
            context.close(promise: nil)
        }

        /// One complete answer's status and body, if `received` holds one; throws unless it
        /// has a Content-Length body (what the server sends for these requests). Parsed over
        /// the raw bytes: the generator shares the machine with the server it measures.
        private func takeResponse() throws -> (Int, ByteBuffer)? {
            let parsed: (status: Int, headerBytes: Int, length: Int?)?? = received.withUnsafeReadableBytes { bytes in
                guard let headerEnd = Self.headerEnd(bytes) else { return .some(nil) }
                // "HTTP/1.1 200 …"
                guard headerEnd >= 12, bytes.starts(with: Self.statusPrefix),
                    let status = Self.decimal(bytes[9..<12])
                else { return nil }
                return (status, headerEnd + 4, Self.contentLength(bytes[..<headerEnd]))
            }
            guard let parsed else {
                throw Failure(description: "unexpected answer: \(String(buffer: received).prefix(300))")
            }
            guard let (status, headerBytes, length) = parsed else { return nil }
            guard let length else {
                throw Failure(description: "answer without Content-Length: \(String(buffer: received).prefix(300))")
            }
            guard received.readableBytes >= headerBytes + length else { return nil }
            received.moveReaderIndex(forwardBy: headerBytes)
            let body = received.readSlice(length: length)
            received.discardReadBytes()
            return body.map { (status, $0) }
        }

        private static let overloaded = Array(#""overloaded""#.utf8)

        /// Whether `needle` occurs in `body`.
        private static func contains(_ body: ByteBuffer, _ needle: [UInt8]) -> Bool {
            body.withUnsafeReadableBytes { bytes in
                guard let first = needle.first, bytes.count >= needle.count else { return needle.isEmpty }
                for start in 0...(bytes.count - needle.count) where bytes[start] == first {
                    var offset = 1
                    while offset < needle.count, bytes[start + offset] == needle[offset] { offset += 1 }
                    if offset == needle.count { return true }
                }
                return false
            }
        }

        private static let statusPrefix = Array("HTTP/1.1 ".utf8)
        private static let contentLengthName = Array("content-length:".utf8)

        /// Where "\r\n\r\n" starts, if it is there.
        private static func headerEnd(_ bytes: UnsafeRawBufferPointer) -> Int? {
            guard bytes.count >= 4 else { return nil }
            var index = 0
            while index + 3 < bytes.count {
                if bytes[index] == 13, bytes[index + 1] == 10, bytes[index + 2] == 13, bytes[index + 3] == 10 {
                    return index
                }
                index += 1
            }
            return nil
        }

        private static func decimal(_ digits: Slice<UnsafeRawBufferPointer>) -> Int? {
            var value = 0
            var seen = false
            for byte in digits {
                if byte == 32 || byte == 9 {
                    if seen { break } else { continue }
                }
                guard byte >= 48, byte <= 57, value < 1 << 40 else { return nil }
                value = value * 10 + Int(byte - 48)
                seen = true
            }
            return seen ? value : nil
        }

        /// The Content-Length header's value (name matched without regard to case).
        private static func contentLength(_ head: Slice<UnsafeRawBufferPointer>) -> Int? {
            var lineStart = head.startIndex
            while lineStart < head.endIndex {
                var lineEnd = lineStart
                while lineEnd < head.endIndex, head[lineEnd] != 13 { lineEnd += 1 }
                let name = contentLengthName
                if lineEnd - lineStart > name.count,
                    zip(head[lineStart..<lineStart + name.count], name).allSatisfy({ $0 | 0x20 == $1 | 0x20 })
                {
                    return decimal(head[(lineStart + name.count)..<lineEnd])
                }
                lineStart = lineEnd + 2
            }
            return nil
        }
    }
}
