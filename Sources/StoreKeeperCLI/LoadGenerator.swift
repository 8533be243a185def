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

    /// Sends `bodies` as `POST path` over `concurrency` connections; every answer must be 200
    /// and contain `expect`. Returns each request's latency in seconds.
    static func run(
        host: String, port: Int, path: String, authorization: String, bodies: [String], concurrency: Int,
        expect: String
    ) async throws -> [Double] {
        let group = MultiThreadedEventLoopGroup.singleton
        var futures: [EventLoopFuture<[Double]>] = []
        for worker in 0..<min(concurrency, bodies.count) {
            let requests = stride(from: worker, to: bodies.count, by: concurrency).map { index in
                var request = ByteBuffer()
                request.writeString(
                    "POST \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nAuthorization: \(authorization)\r\n"
                        + "Content-Type: application/json\r\nContent-Length: \(bodies[index].utf8.count)\r\n\r\n")
                request.writeString(bodies[index])
                return request
            }
            let eventLoop = group.next()
            let done = eventLoop.makePromise(of: [Double].self)
            let connected = ClientBootstrap(group: eventLoop)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            ClientHandler(requests: requests, expect: Array(expect.utf8), done: done))
                    }
                }
                .connect(host: host, port: port)
            connected.whenFailure { done.fail($0) }
            futures.append(
                done.futureResult.flatMap { latencies in
                    connected.flatMap { $0.close() }.map { latencies }.recover { _ in latencies }
                })
        }
        var latencies: [Double] = []
        for future in futures { latencies += try await future.get() }
        return latencies
    }

    /// Writes a request, reads its answer (status line, headers, Content-Length body), records
    /// the time between the two, and writes the next.
    private final class ClientHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        let requests: [ByteBuffer]
        let expect: [UInt8]
        let done: EventLoopPromise<[Double]>
        var next = 0
        var sentAt = NIODeadline.now()
        var latencies: [Double] = []
        var received = ByteBuffer()
        var finished = false

        init(requests: [ByteBuffer], expect: [UInt8], done: EventLoopPromise<[Double]>) {
            self.requests = requests
            self.expect = expect
            self.done = done
            latencies.reserveCapacity(requests.count)
        }

        func channelActive(context: ChannelHandlerContext) {
            send(context: context)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var incoming = unwrapInboundIn(data)
            received.writeBuffer(&incoming)
            do {
                while let body = try takeResponse() {
                    latencies.append(Double((NIODeadline.now() - sentAt).nanoseconds) / 1e9)
                    guard body.readableBytesView.firstRange(of: expect) != nil else {
                        throw Failure(description: "unexpected answer: \(String(buffer: body).prefix(300))")
                    }
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
                done.succeed(latencies)
                return
            }
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

        /// One complete answer's body, if `received` holds one; throws unless it is a 200 with
        /// a Content-Length body (what the server sends for these requests).
        private func takeResponse() throws -> ByteBuffer? {
            let view = received.readableBytesView
            guard let headerEnd = view.firstRange(of: Array("\r\n\r\n".utf8)) else { return nil }
            let head = String(decoding: view[view.startIndex..<headerEnd.lowerBound], as: UTF8.self)
            let lines = head.split(separator: "\r\n")
            guard let status = lines.first, status.hasPrefix("HTTP/1.1 200") else {
                throw Failure(description: "unexpected answer: \(head.prefix(300))")
            }
            guard
                let length = lines.dropFirst().lazy.compactMap({ line -> Int? in
                    let parts = line.split(separator: ":", maxSplits: 1)
                    guard parts.count == 2, parts[0].lowercased() == "content-length" else { return nil }
                    return Int(parts[1].trimmingCharacters(in: .whitespaces))
                }).first
            else { throw Failure(description: "answer without Content-Length: \(head.prefix(300))") }
            let headerBytes = headerEnd.upperBound - view.startIndex
            guard received.readableBytes >= headerBytes + length else { return nil }
            received.moveReaderIndex(forwardBy: headerBytes)
            let body = received.readSlice(length: length)
            received.discardReadBytes()
            return body
        }
    }
}
