import Foundation
import Synchronization

/// The local App Store's time: real time scaled (a month in minutes) plus manual advances.
///
/// `now = start + (real time since creation) × scale + advanced`. Scale 0 freezes time, so
/// tests move it only by `advance(by:)` and nothing depends on the machine's speed.
public final class StoreClock: Sendable {
    private struct State {
        var advanced: TimeInterval = 0
    }

    public let start: Date
    public let scale: Double
    private let realStart = ContinuousClock.now
    private let state = Mutex(State())

    public init(start: Date = Date(), scale: Double = 1) {
        self.start = start
        self.scale = max(0, scale)
    }

    public func now() -> Date {
        let real = ContinuousClock.now - realStart
        let elapsed = Double(real.components.seconds) + Double(real.components.attoseconds) / 1e18
        return start.addingTimeInterval(elapsed * scale + state.withLock { $0.advanced })
    }

    /// Moves store time forward (never back).
    public func advance(by interval: TimeInterval) {
        guard interval > 0 else { return }
        state.withLock { $0.advanced += interval }
    }

    /// How long to wait in real time until store time reaches `date` (nil when frozen).
    public func realDelay(until date: Date) -> Duration? {
        guard scale > 0 else { return nil }
        let storeSeconds = max(0, date.timeIntervalSince(now()))
        return .milliseconds(Int64(storeSeconds / scale * 1000))
    }
}

extension Date {
    /// Epoch milliseconds, as Apple's payloads carry dates.
    var milliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }

    init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
