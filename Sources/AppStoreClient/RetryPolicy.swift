import Foundation
import NIOCore

/// How a client retries retryable failures on its own before giving up to the caller.
///
/// Kept short by default: a server that must answer its own client quickly turns a failure
/// into a durable job instead of waiting here (docs/architecture.md invariant 5).
public struct RetryPolicy: Sendable, Hashable {
    /// Total attempts, including the first (1 = never retry).
    public var maxAttempts: Int
    public var baseDelay: Duration
    public var maxDelay: Duration
    /// A 429 whose `Retry-After` is further away than this is returned to the caller at once.
    public var maxRetryAfterWait: Duration

    public init(
        maxAttempts: Int = 3, baseDelay: Duration = .milliseconds(200), maxDelay: Duration = .seconds(2),
        maxRetryAfterWait: Duration = .seconds(2)
    ) {
        self.maxAttempts = max(1, maxAttempts)
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
        self.maxRetryAfterWait = maxRetryAfterWait
    }

    public static let none = RetryPolicy(maxAttempts: 1)

    /// Exponential backoff with full jitter for attempt `n` (1-based), or the wait `Retry-After`
    /// asks for; nil when the error should go back to the caller now.
    func delay(after error: AppStoreAPIError, attempt: Int, now: Date = Date()) -> Duration? {
        guard error.isRetryable, attempt < maxAttempts else { return nil }
        if let retryAfter = error.retryAfter {
            let wait = max(0, retryAfter.timeIntervalSince(now))
            guard
                wait <= Double(maxRetryAfterWait.components.seconds) + Double(maxRetryAfterWait.components.attoseconds)
                    / 1e18
            else { return nil }
            return .milliseconds(Int64(wait * 1000))
        }
        let base = Double(baseDelay.components.seconds) * 1000 + Double(baseDelay.components.attoseconds) / 1e15
        let cap = Double(maxDelay.components.seconds) * 1000 + Double(maxDelay.components.attoseconds) / 1e15
        let ceiling = min(cap, base * pow(2, Double(attempt - 1)))
        return .milliseconds(Int64(Double.random(in: 0...ceiling)))
    }
}

extension Duration {
    /// The same span as a NIO `TimeAmount`.
    var timeAmount: TimeAmount {
        .nanoseconds(components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000)
    }
}
