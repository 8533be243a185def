import HTTPTypes
import Hummingbird
import NIOCore
import NIOHTTPTypes
import Synchronization

/// Requests in flight across every connection, from a request's head to its answer's end.
public final class InFlightRequests: Sendable {
    let count = Atomic<Int>(0)
    let limit: Int
    let metrics: ServerMetrics?

    public init(limit: Int, metrics: ServerMetrics? = nil) {
        self.limit = limit
        self.metrics = metrics
    }
}

/// Load shedding on the event loop, in each connection's pipeline right after HTTP decoding:
/// above `limits.maxInFlightRequests` a request is answered 503 `overloaded` with
/// `Retry-After` by this handler itself — no task, no cooperative thread, no body read (its
/// bytes are dropped as they come). Shedding in a responder instead (as `DeadlineResponder`
/// does for the router alone) runs on the same two cooperative threads as the admitted
/// requests, so the flood's 503s queued in front of them: at 4,096 connections the admitted
/// requests' p99 was 6.9 s that way (BENCHMARKS.md).
///
/// A request that arrives pipelined behind one of its own connection's (not yet answered) is
/// never shed: answering it first would put the answers out of order.
final class LoadShedder: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let inFlight: InFlightRequests
    /// This connection's admitted requests not answered yet.
    private var outstanding = 0
    /// Dropping the rest of a shed request (its body and end).
    private var shedding = false

    init(_ inFlight: InFlightRequests) {
        self.inFlight = inFlight
    }

    static let overloadedBody = ByteBuffer(
        string:
            #"{"error":{"code":"overloaded","message":"too many requests in flight; retry shortly","retryable":true}}"#)

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        switch part {
        case .head:
            let admitted = inFlight.count.add(1, ordering: .relaxed).newValue
            if admitted > inFlight.limit, outstanding == 0 {
                inFlight.count.subtract(1, ordering: .relaxed)
                inFlight.metrics?.shed.increment()
                shedding = true
                var head = HTTPResponse(status: .serviceUnavailable)
                head.headerFields = [
                    .contentType: "application/json", .retryAfter: "1",
                    .contentLength: String(Self.overloadedBody.readableBytes),
                ]
                context.write(wrapOutboundOut(.head(head)), promise: nil)
                context.write(wrapOutboundOut(.body(Self.overloadedBody)), promise: nil)
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
                return
            }
            shedding = false
            outstanding += 1
            context.fireChannelRead(data)
        case .body, .end:
            if shedding {
                if case .end = part { shedding = false }
                return
            }
            context.fireChannelRead(data)
        }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data), outstanding > 0 {
            outstanding -= 1
            inFlight.count.subtract(1, ordering: .relaxed)
        }
        context.write(data, promise: promise)
    }

    func channelInactive(context: ChannelHandlerContext) {
        release()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        release()
    }

    /// A connection gone with requests unanswered no longer holds their places.
    private func release() {
        if outstanding > 0 {
            inFlight.count.subtract(outstanding, ordering: .relaxed)
            outstanding = 0
        }
    }
}
