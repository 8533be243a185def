import Crypto
import Foundation
import Synchronization

/// Chains that already passed full verification, so steady-state JWS verification costs one
/// P-256 signature check instead of two P-384 ones.
///
/// Keyed by the exact DER of leaf and intermediate: a different byte is a different key and
/// goes through full verification. An entry is reused only for a validation time inside the
/// validity window of all three certificates (that is the only time-dependent part of the
/// path check), and, when online checks are on, only while its OCSP answer is fresh.
final class VerifiedChainCache: Sendable {
    struct Key: Hashable, Sendable {
        let leaf: [UInt8]
        let intermediate: [UInt8]
    }

    struct Entry: Sendable {
        let leafKey: P256.Signing.PublicKey
        /// Intersection of the three certificates' validity periods.
        let validFrom: Date
        let validUntil: Date
        let verifiedAt: Date
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        var insertionOrder: [Key] = []
    }

    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = max(0, capacity)
    }

    func lookup(_ key: Key, at validationTime: Date, freshAfter: Date?) -> Entry? {
        guard capacity > 0, let entry = state.withLock({ $0.entries[key] }) else { return nil }
        guard entry.validFrom <= validationTime, validationTime <= entry.validUntil else { return nil }
        if let freshAfter, entry.verifiedAt < freshAfter { return nil }
        return entry
    }

    func insert(_ entry: Entry, for key: Key) {
        guard capacity > 0 else { return }
        state.withLock { state in
            if state.entries.updateValue(entry, forKey: key) == nil {
                state.insertionOrder.append(key)
            }
            // Oldest first out: a genuine app sees one or two Apple leaves at a time, so a
            // small bound is plenty and keeps forged chains from growing memory.
            while state.insertionOrder.count > capacity {
                let evicted = state.insertionOrder.removeFirst()
                state.entries[evicted] = nil
            }
        }
    }

    var count: Int { state.withLock { $0.entries.count } }
}
