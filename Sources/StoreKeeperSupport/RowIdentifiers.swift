import Synchronization

/// Random (version 4) UUIDs for identifiers that must be unique but need not be secret: request
/// ids, job, audit, anomaly, support and rejected-proof row ids, the random half of the
/// outbox's UUIDv7.
///
/// Foundation's `UUID()` opens and reads `/dev/urandom` on every call on Linux, and one
/// `getrandom` per byte is no better: either was several per cent of a cheap request's time.
/// Here the system's generator seeds a SplitMix64 sequence once per process; each identifier
/// takes the next two outputs. SplitMix64's output is a bijection of its counter, so a process
/// never draws the same word twice (for 2^63 identifiers); with the version and variant bits
/// set, two identifiers are equal only as rarely as two random UUIDs are.
///
/// **Predictable**: SplitMix64 can be run backwards, so whoever sees one identifier (request
/// ids are echoed in `X-Request-Id`) can compute the process's others. Never use it for an
/// identifier that grants anything by being known: orders' `appAccountToken`, offer nonces and
/// dashboard sessions keep using the system's generator.
public enum RowIdentifiers {
    private static let state = Mutex<UInt64>(
        {
            var system = SystemRandomNumberGenerator()
            return system.next()
        }())
    private static let golden: UInt64 = 0x9E37_79B9_7F4A_7C15

    /// SplitMix64's finalizer: a bijection of 64-bit words.
    @inline(__always) static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Two fresh 64-bit words of the process's sequence.
    public static func nextWords() -> (UInt64, UInt64) {
        let counter = state.withLock { value -> UInt64 in
            value &+= 2 &* golden
            return value
        }
        return (mix(counter), mix(counter &+ golden))
    }

    /// A fresh version 4 UUID's 16 bytes.
    public static func uuidBytes() -> [UInt8] {
        let (high, low) = nextWords()
        return uuidBytes(high, low)
    }

    /// A version 4 UUID's 16 bytes from two 64-bit words (their version and variant bits set).
    static func uuidBytes(_ high: UInt64, _ low: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)
        for index in 0..<8 {
            bytes[index] = UInt8(truncatingIfNeeded: high >> (56 - 8 * UInt64(index)))
            bytes[8 + index] = UInt8(truncatingIfNeeded: low >> (56 - 8 * UInt64(index)))
        }
        bytes[6] = 0x40 | (bytes[6] & 0x0F)  // version 4
        bytes[8] = 0x80 | (bytes[8] & 0x3F)  // variant 10
        return bytes
    }

    /// A fresh version 4 UUID in lower-case text, as `UUID().uuidString.lowercased()` writes it.
    public static func uuidString() -> String {
        uuidBytes().uuidText
    }

    /// A version 4 UUID from the system's cryptographic generator (`getrandom`), in lower-case
    /// text: for what must not be guessable from other ids (an account's appAccountToken), unlike
    /// `uuidString`. `UUID().uuidString.lowercased()` gives the same, but formats each with
    /// `snprintf` — on the SQLite writer's thread, for every purchase a batch claims.
    public static func randomUUIDString() -> String {
        var system = SystemRandomNumberGenerator()
        return uuidBytes(system.next(), system.next()).uuidText
    }
}
