import Synchronization

/// Token buckets per caller: client tokens per account, secret keys only if configured.
final class RateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    let clientPerSecond: Int
    let secretPerSecond: Int?
    let clock: @Sendable () -> ContinuousClock.Instant
    private struct Buckets {
        var byCaller: [Caller: Bucket] = [:]
        var lastSweep: ContinuousClock.Instant?
    }
    private let buckets = Mutex(Buckets())

    init(
        clientPerSecond: Int, secretPerSecond: Int?,
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }
    ) {
        self.clientPerSecond = clientPerSecond
        self.secretPerSecond = secretPerSecond
        self.clock = clock
    }

    static let evictionThreshold = 10_000

    /// Callers currently remembered.
    var trackedCallers: Int { buckets.withLock { $0.byCaller.count } }

    /// nil when admitted; otherwise seconds to wait.
    func admit(_ caller: Caller, now: ContinuousClock.Instant? = nil) -> Int? {
        let now = now ?? clock()
        let rate: Int
        switch caller {
        case .secretKey, .key:
            guard let secretPerSecond else { return nil }
            rate = secretPerSecond
        case .account:
            rate = clientPerSecond
        }
        guard rate > 0 else { return nil }
        return buckets.withLock { state in
            // A bucket untouched for a second is full again: forgetting it changes nothing, and
            // the map stays bounded however many accounts pass by (swept at most once a second).
            if state.byCaller.count >= Self.evictionThreshold,
                state.lastSweep.map({ now - $0 >= .seconds(1) }) ?? true
            {
                state.byCaller = state.byCaller.filter { now - $0.value.updated < .seconds(1) }
                state.lastSweep = now
            }
            var bucket = state.byCaller[caller] ?? Bucket(tokens: Double(rate), updated: now)
            let elapsed = now - bucket.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(Double(rate), bucket.tokens + seconds * Double(rate))
            bucket.updated = now
            defer { state.byCaller[caller] = bucket }
            guard bucket.tokens >= 1 else { return 1 }
            bucket.tokens -= 1
            return nil
        }
    }

    /// Charges `count` more requests to an admitted caller (a batch's further entries): the
    /// bucket may go below zero, and the caller waits for it to refill before its next request.
    func charge(_ caller: Caller, count: Int, now: ContinuousClock.Instant? = nil) {
        guard count > 0 else { return }
        let now = now ?? clock()
        let rate: Int
        switch caller {
        case .secretKey, .key:
            guard let secretPerSecond else { return }
            rate = secretPerSecond
        case .account:
            rate = clientPerSecond
        }
        guard rate > 0 else { return }
        buckets.withLock { state in
            var bucket = state.byCaller[caller] ?? Bucket(tokens: Double(rate), updated: now)
            let elapsed = now - bucket.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(Double(rate), bucket.tokens + seconds * Double(rate)) - Double(count)
            bucket.updated = now
            state.byCaller[caller] = bucket
        }
    }
}
