import Foundation
import Synchronization

/// Apple's published rate for an App Store Server API endpoint, kept on our side: Set App Account
/// Token is 20 requests a second per app in production and 10 % of that in the sandbox (Apple
/// enforces it per hour and answers 429 past it). A token bucket per environment, `burst` calls
/// at once, refilled at `perSecond`. A claim over the rate waits, pending, until the bucket has
/// room: Set App Account Token only labels Apple's records for later notifications (the purchase
/// is delivered and bound already), so it never competes with deliveries for the machine.
public final class AppleCallRate: Sendable {
    public struct Limit: Sendable {
        public var perSecond: Double
        public var burst: Double

        public init(perSecond: Double, burst: Double) {
            self.perSecond = perSecond
            self.burst = burst
        }
    }

    let production: Limit
    let sandbox: Limit
    private let buckets = Mutex<[Bool: (tokens: Double, at: ContinuousClock.Instant)]>([:])

    /// Set App Account Token's rate (server-api: 20/s; sandbox 10 %).
    public static let setAppAccountToken = Limit(perSecond: 20, burst: 20)

    public init(production: Limit = setAppAccountToken, sandbox: Limit? = nil) {
        self.production = production
        self.sandbox =
            sandbox ?? Limit(perSecond: production.perSecond / 10, burst: max(1, production.burst / 2))
    }

    func limit(sandbox: Bool) -> Limit { sandbox ? self.sandbox : production }

    /// The bucket's room now: what it held, refilled for the time since, at most `burst`.
    private func room(
        _ bucket: (tokens: Double, at: ContinuousClock.Instant)?, _ limit: Limit, now: ContinuousClock.Instant
    )
        -> Double
    {
        guard let bucket else { return limit.burst }
        let elapsed = now - bucket.at
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        return min(limit.burst, bucket.tokens + seconds * limit.perSecond)
    }

    /// Takes up to `count` calls' room for the environment; how many it got.
    func take(_ count: Int, sandbox: Bool) -> Int {
        let limit = limit(sandbox: sandbox)
        let now = ContinuousClock.now
        return buckets.withLock { buckets in
            let room = room(buckets[sandbox], limit, now: now)
            let taken = min(count, Int(room.rounded(.down)))
            buckets[sandbox] = (room - Double(taken), now)
            return taken
        }
    }

    /// Whether every environment called so far is out of room now (then no claim is even
    /// read; one of an environment not called yet waits a moment for the next refill).
    var spent: Bool {
        let now = ContinuousClock.now
        return buckets.withLock { buckets in
            !buckets.isEmpty && buckets.allSatisfy { room($1, limit(sandbox: $0), now: now) < 1 }
        }
    }
}
