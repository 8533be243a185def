import HTTPTypes
import NIOCore
import NIOEmbedded
import NIOHTTPTypes
import Testing

@testable import StoreKeeperServer

/// The event-loop load shedder: above the limit a request is answered 503 `overloaded` with
/// Retry-After by the handler itself, its body dropped; admitted requests hold their place
/// until their answer ends or their connection goes.
@Suite struct LoadShedderTests {
    static func connection(_ inFlight: InFlightRequests) throws -> EmbeddedChannel {
        try EmbeddedChannel(handler: LoadShedder(inFlight))
    }

    static func head() -> HTTPRequestPart {
        .head(HTTPRequest(method: .post, scheme: nil, authority: nil, path: "/v1/purchases"))
    }

    /// Everything written back to the client: the response heads' statuses.
    static func answers(_ channel: EmbeddedChannel) throws -> [HTTPResponse.Status] {
        var statuses: [HTTPResponse.Status] = []
        while let part = try channel.readOutbound(as: HTTPResponsePart.self) {
            if case .head(let head) = part {
                statuses.append(head.status)
                #expect(head.headerFields[.retryAfter] == "1")
            }
        }
        return statuses
    }

    @Test func aboveTheLimitIsAnsweredHereAndItsBodyDropped() throws {
        let inFlight = InFlightRequests(limit: 1)
        let first = try Self.connection(inFlight)
        let second = try Self.connection(inFlight)
        // The first request is admitted and passed on, body and all.
        try first.writeInbound(Self.head())
        try first.writeInbound(HTTPRequestPart.body(ByteBuffer(string: "{}")))
        try first.writeInbound(HTTPRequestPart.end(nil))
        #expect(try first.readInbound(as: HTTPRequestPart.self) != nil)
        #expect(inFlight.count.load(ordering: .relaxed) == 1)
        // The second, on another connection, is shed: nothing of it goes further.
        try second.writeInbound(Self.head())
        try second.writeInbound(HTTPRequestPart.body(ByteBuffer(string: #"{"big":"body"}"#)))
        try second.writeInbound(HTTPRequestPart.end(nil))
        #expect(try second.readInbound(as: HTTPRequestPart.self) == nil)
        #expect(try Self.answers(second) == [.serviceUnavailable])
        #expect(inFlight.count.load(ordering: .relaxed) == 1)
        // The first answer ends: there is room again.
        try first.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
        try first.writeOutbound(HTTPResponsePart.end(nil))
        #expect(inFlight.count.load(ordering: .relaxed) == 0)
        try second.writeInbound(Self.head())
        #expect(try second.readInbound(as: HTTPRequestPart.self) != nil)
        #expect(inFlight.count.load(ordering: .relaxed) == 1)
        // A connection that goes away unanswered gives its place back.
        _ = try second.finish()
        #expect(inFlight.count.load(ordering: .relaxed) == 0)
    }

    /// A request pipelined behind its own connection's unanswered one is never shed: its 503
    /// would overtake the earlier answer.
    @Test func aPipelinedRequestIsNeverAnsweredOutOfOrder() throws {
        let inFlight = InFlightRequests(limit: 1)
        let channel = try Self.connection(inFlight)
        try channel.writeInbound(Self.head())
        try channel.writeInbound(HTTPRequestPart.end(nil))
        try channel.writeInbound(Self.head())
        try channel.writeInbound(HTTPRequestPart.end(nil))
        #expect(try Self.answers(channel).isEmpty)
        #expect(inFlight.count.load(ordering: .relaxed) == 2)
        _ = try channel.finish()
        #expect(inFlight.count.load(ordering: .relaxed) == 0)
    }
}
