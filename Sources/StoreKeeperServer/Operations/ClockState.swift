import Foundation
import Synchronization

/// This clock against Apple's, measured on Apple's 401 answers.
struct ClockCheck: Sendable, Encodable {
    /// Positive: this server is ahead of Apple.
    var skewSeconds: Double
    var measuredAt: Date
}

final class ClockState: Sendable {
    private let state = Mutex<ClockCheck?>(nil)
    func withLock<T>(_ body: (inout ClockCheck?) -> T) -> T { state.withLock { body(&$0) } }
}
