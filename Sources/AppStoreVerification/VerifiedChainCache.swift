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
///
/// A second, smaller memo maps an exact JWS header to the DER it carries, so a header seen
/// before is not base64- and JSON-decoded again. It grants no trust: the DER it yields still
/// has to be found in (or enter) the chain cache.
final class VerifiedChainCache: Sendable {
    struct Key: Hashable, Sendable {
        let leaf: Bytes
        let intermediate: Bytes
    }

    struct Entry: Sendable {
        let leafKey: LeafKey
        /// Intersection of the three certificates' validity periods.
        let validFrom: Date
        let validUntil: Date
        let verifiedAt: Date
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        var insertionOrder: [Key] = []
        var headers: [Bytes: Key] = [:]
        var headerOrder: [Bytes] = []
        /// The header seen last: servers see one Apple header at a time, and comparing
        /// against it is cheaper than hashing it.
        var lastHeader: (header: Bytes, key: Key)?
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

    /// The certificates a header carried when it was last decoded.
    func certificates(forHeader header: ArraySlice<UInt8>) -> Key? {
        guard capacity > 0 else { return nil }
        return state.withLock { state in
            if let last = state.lastHeader, last.header.equals(header) { return last.key }
            let bytes = Bytes(header)
            guard let key = state.headers[bytes] else { return nil }
            state.lastHeader = (bytes, key)
            return key
        }
    }

    func remember(header: ArraySlice<UInt8>, certificates: Key) {
        guard capacity > 0 else { return }
        let header = Bytes(header)
        state.withLock { state in
            state.lastHeader = (header, certificates)
            if state.headers.updateValue(certificates, forKey: header) == nil {
                state.headerOrder.append(header)
            }
            while state.headerOrder.count > capacity {
                state.headers[state.headerOrder.removeFirst()] = nil
            }
        }
    }

    var count: Int { state.withLock { $0.entries.count } }

    /// How many cached leaf keys verify through a precomputed table (diagnostics, tests).
    var tableCount: Int { state.withLock { $0.entries.values.filter(\.leafKey.hasTable).count } }
}

/// Bytes as a dictionary key: hashed once, in one pass over the buffer (the default
/// `[UInt8]` hashing feeds the hasher byte by byte, on every lookup), compared with memcmp.
struct Bytes: Hashable, Sendable {
    let storage: [UInt8]
    private let digest: Int

    init<C: Collection>(_ bytes: C) where C.Element == UInt8 {
        storage = Array(bytes)
        var hasher = Hasher()
        storage.withUnsafeBytes { hasher.combine(bytes: $0) }
        digest = hasher.finalize()
    }

    func hash(into hasher: inout Hasher) { hasher.combine(digest) }

    static func == (lhs: Bytes, rhs: Bytes) -> Bool {
        lhs.digest == rhs.digest && lhs.equals(rhs.storage[...])
    }

    func equals(_ other: ArraySlice<UInt8>) -> Bool {
        guard storage.count == other.count else { return false }
        guard !storage.isEmpty else { return true }
        return storage.withUnsafeBytes { mine in
            other.withUnsafeBytes { theirs in memcmp(mine.baseAddress!, theirs.baseAddress!, mine.count) == 0 }
        }
    }
}
