import Foundation
import Logging
import MCP

/// A transport that knows which requests it still owes an answer. The MCP server answers each
/// request from a task of its own, and its receive loop ends as soon as the client closes its
/// side (stdin at EOF): a client that writes its requests and closes stdin at once would lose
/// every answer still being worked on when the process exits. `settle(within:)` waits for them.
actor AnsweringTransport: Transport {
    let inner: any Transport
    let logger: Logger
    /// Requests received (a batch with a request in it counts once: it is answered by one array).
    private(set) var owed = 0
    /// Answers sent (a response object, or a batch's array).
    private(set) var answered = 0

    init(_ inner: any Transport, logger: Logger) {
        self.inner = inner
        self.logger = logger
    }

    func connect() async throws { try await inner.connect() }

    func disconnect() async { await inner.disconnect() }

    func send(_ data: Data) async throws {
        try await inner.send(data)
        if Self.kind(of: data) == .answer { answered += 1 }
    }

    func receive() -> AsyncThrowingStream<Data, any Error> {
        let (stream, continuation) = AsyncThrowingStream<Data, any Error>.makeStream()
        let forwarding = Task {
            do {
                for try await data in await inner.receive() {
                    switch Self.kind(of: data) {
                    case .request: owed += 1
                    // A cancelled request is not answered (MCP): nothing is owed for it.
                    case .cancellation: owed = max(answered, owed - 1)
                    case .answer, .other: break
                    }
                    continuation.yield(data)
                }
                continuation.finish()
            } catch {
                continuation.finish(throwing: error)
            }
        }
        continuation.onTermination = { _ in forwarding.cancel() }
        return stream
    }

    /// Returns once every request received has been answered, or at `deadline`; how many were
    /// still owed then.
    func settle(within deadline: Duration) async -> Int {
        let end = ContinuousClock.now + deadline
        while answered < owed, ContinuousClock.now < end {
            try? await Task.sleep(for: .milliseconds(20))
        }
        return max(0, owed - answered)
    }

    enum Kind: Equatable {
        case request, answer, cancellation, other
    }

    /// What a JSON-RPC message is, read as loosely as the server reads it (anything unreadable is
    /// `other`: the server answers it with a parse error, which it owed nobody).
    static func kind(of data: Data) -> Kind {
        guard let object = try? JSONSerialization.jsonObject(with: data) else { return .other }
        if let batch = object as? [Any] {
            if batch.contains(where: { ($0 as? [String: Any]).map(isRequest) ?? false }) { return .request }
            return batch.contains(where: { ($0 as? [String: Any]).map(isAnswer) ?? false }) ? .answer : .other
        }
        guard let message = object as? [String: Any] else { return .other }
        if isRequest(message) { return .request }
        if isAnswer(message) { return .answer }
        if message["method"] as? String == "notifications/cancelled" { return .cancellation }
        return .other
    }

    private static func isRequest(_ message: [String: Any]) -> Bool {
        message["method"] is String && message["id"] != nil && !(message["id"] is NSNull)
    }

    private static func isAnswer(_ message: [String: Any]) -> Bool {
        message["method"] == nil && message["id"] != nil && (message["result"] != nil || message["error"] != nil)
    }
}
