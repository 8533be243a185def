import CP256Verify
import Crypto
import Foundation
import Synchronization

/// ES256 verification against one public key with a precomputed table of its multiples.
///
/// An ECDSA verification computes u1·G + u2·Q. BoringSSL has a table for the generator G,
/// but builds Q's multiples again on every call and spends most of the verification on
/// 256 point doublings for them. Every JWS an app's server sees is signed by the same few
/// Apple leaf keys, so for a key that keeps coming back a table of d · 2^(8w) · Q (32 windows
/// × 255 values, 765 KiB) turns u2·Q into at most 32 additions. Built with BoringSSL's own
/// P-256 assembly (the copy swift-crypto links in), in `CP256Verify`; where that does not
/// exist (not x86-64) there is no table and swift-crypto verifies.
///
/// Differentially tested against swift-crypto (P256TableTests): random keys and messages,
/// every kind of corrupted signature, high-s, out-of-range r and s, and signatures built on
/// purpose to hit a doubling and the point at infinity.
final class P256Table: @unchecked Sendable {
    // Read-only after `init`.
    private let storage: UnsafeMutableRawPointer
    /// The table, for `sk_p256_verify` (tests); valid while `self` lives.
    var pointer: UnsafeRawPointer { UnsafeRawPointer(storage) }

    /// Whether this machine has the fast path at all.
    static let available: Bool = sk_p256_available() != 0 && sk_p256_base_table() != nil

    /// How many tables may exist at once (765 KiB each).
    final class Budget: Sendable {
        /// A server sees one or two Apple leaf keys at a time; past the limit, keys are
        /// verified by swift-crypto.
        static let shared = Budget(limit: 8)

        let limit: Int
        private let live = Atomic<Int>(0)

        init(limit: Int) { self.limit = limit }

        var count: Int { live.load(ordering: .relaxed) }

        fileprivate func take() -> Bool {
            guard live.add(1, ordering: .relaxed).newValue <= limit else {
                live.subtract(1, ordering: .relaxed)
                return false
            }
            return true
        }

        fileprivate func give() { live.subtract(1, ordering: .relaxed) }
    }

    private let budget: Budget

    /// The table of `key`; nil where the fast path does not exist or `budget` is spent.
    init?(_ key: P256.Signing.PublicKey, budget: Budget = .shared) {
        guard Self.available else { return nil }
        let point = [UInt8](key.rawRepresentation)  // x ‖ y, 32 bytes each
        guard point.count == 64, budget.take() else { return nil }
        self.budget = budget
        let storage = UnsafeMutableRawPointer.allocate(byteCount: sk_p256_table_size(), alignment: 64)
        let built = point.withUnsafeBufferPointer { point in
            sk_p256_table_init(storage, point.baseAddress, point.baseAddress! + 32)
        }
        guard built == 1 else {
            storage.deallocate()
            budget.give()
            return nil
        }
        self.storage = storage
    }

    deinit {
        storage.deallocate()
        budget.give()
    }

    /// Whether `signature` (r ‖ s, 64 bytes) signs `data` with SHA-256 under this key.
    func isValidSignature(_ signature: [UInt8], for data: some DataProtocol) -> Bool {
        guard signature.count == 64 else { return false }
        let digest = SHA256.hash(data: data)
        return digest.withUnsafeBytes { digest in
            signature.withUnsafeBufferPointer { signature in
                sk_p256_verify(
                    storage, digest.bindMemory(to: UInt8.self).baseAddress, signature.baseAddress) == 1
            }
        }
    }
}

/// A verified leaf certificate's key: verified by swift-crypto until it has signed
/// `tableAfter` JWS, then through its `P256Table`, built once by the call that crosses it.
final class LeafKey: Sendable {
    static let tableAfter = 32

    let key: P256.Signing.PublicKey
    private let uses = Atomic<Int>(0)
    private let table = Mutex<P256Table?>(nil)

    init(_ key: P256.Signing.PublicKey) {
        self.key = key
    }

    /// Whether a table has been built (tests, diagnostics).
    var hasTable: Bool { table.withLock { $0 != nil } }

    /// Whether `signature` (r ‖ s, 64 bytes) is this key's ES256 signature of `data`.
    func isValidSignature(_ signature: [UInt8], for data: ArraySlice<UInt8>) -> Bool {
        if let table = table.withLock({ $0 }) { return table.isValidSignature(signature, for: data) }
        if P256Table.available, uses.add(1, ordering: .relaxed).newValue == Self.tableAfter,
            let built = P256Table(key)
        {
            table.withLock { $0 = built }
            return built.isValidSignature(signature, for: data)
        }
        guard let parsed = try? P256.Signing.ECDSASignature(rawRepresentation: signature) else { return false }
        return key.isValidSignature(parsed, for: data)
    }
}
