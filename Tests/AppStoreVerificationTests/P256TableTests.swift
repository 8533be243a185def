import AppStoreSigning
import CP256Verify
import Crypto
import Foundation
import Testing

@testable import AppStoreVerification

/// The precomputed-table ES256 verifier must say exactly what swift-crypto says, for every
/// signature: genuine, corrupted, out of range, and built on purpose to reach the corners of
/// the point arithmetic (a doubling, the point at infinity, a zero half).
@Suite(.enabled(if: P256Table.available)) struct P256TableTests {
    /// A digest of our choosing, for swift-crypto's `isValidSignature(_:for: Digest)`.
    struct RawDigest: Digest {
        static var byteCount: Int { 32 }
        var bytes: [UInt8]
        func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
            try bytes.withUnsafeBytes(body)
        }
        func makeIterator() -> IndexingIterator<[UInt8]> { bytes.makeIterator() }
        var description: String { bytes.map { String(format: "%02x", $0) }.joined() }
    }

    static let order: [UInt8] = Array(
        hex: "ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551")

    /// The table's verdict and swift-crypto's, on a digest.
    static func verdicts(_ table: P256Table, _ key: P256.Signing.PublicKey, digest: [UInt8], signature: [UInt8])
        -> (fast: Bool, reference: Bool)
    {
        let fast = digest.withUnsafeBufferPointer { digest in
            signature.withUnsafeBufferPointer { signature in
                withExtendedLifetime(table) {
                    sk_p256_verify(table.pointer, digest.baseAddress, signature.baseAddress) == 1
                }
            }
        }
        let reference =
            (try? P256.Signing.ECDSASignature(rawRepresentation: signature)).map {
                key.isValidSignature($0, for: RawDigest(bytes: digest))
            } ?? false
        return (fast, reference)
    }

    static func scalar(_ operation: (UnsafeMutablePointer<UInt8>) -> Int32) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        let status = out.withUnsafeMutableBufferPointer { operation($0.baseAddress!) }
        precondition(status == 1)
        return out
    }

    static func multiply(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] { scalar { sk_p256_scalar_mul($0, a, b) } }
    static func inverse(_ a: [UInt8]) -> [UInt8] { scalar { sk_p256_scalar_inverse($0, a) } }
    static func negate(_ a: [UInt8]) -> [UInt8] { scalar { sk_p256_scalar_negate($0, a) } }
    /// x of k·G, if it is below the group order (it nearly always is).
    static func x(of k: [UInt8]) throws -> [UInt8]? {
        let point = try P256.Signing.PrivateKey(rawRepresentation: k).publicKey.rawRepresentation
        let x = [UInt8](point.prefix(32))
        return x.lexicographicallyPrecedes(order) ? x : nil
    }

    /// Both of BoringSSL's assembly variants (with and without BMI2 + ADX), where the CPU has
    /// both: every other test uses the one the CPU chooses.
    @Test(.serialized, arguments: [0, 1]) func genuineAndCorruptedSignaturesGetSwiftCryptosVerdict(assembly: Int32)
        throws
    {
        sk_p256_select_assembly(assembly)
        defer { sk_p256_select_assembly(-1) }
        var accepted = 0
        for keyIndex in 0..<24 {
            let privateKey = P256.Signing.PrivateKey()
            let key = privateKey.publicKey
            let table = try #require(P256Table(key))
            let stranger = P256.Signing.PrivateKey()
            for messageIndex in 0..<12 {
                let message = Array("message \(keyIndex)-\(messageIndex) \(UUID())".utf8)
                let digest = Array(SHA256.hash(data: message))
                let signature = Array(try privateKey.signature(for: message).rawRepresentation)
                #expect(table.isValidSignature(signature, for: message))
                var cases: [([UInt8], [UInt8])] = [(digest, signature)]
                // One bit flipped anywhere in r, s or the digest.
                for _ in 0..<6 {
                    var bad = signature
                    bad[Int.random(in: 0..<64)] ^= 1 << UInt8.random(in: 0..<8)
                    cases.append((digest, bad))
                    var badDigest = digest
                    badDigest[Int.random(in: 0..<32)] ^= 1 << UInt8.random(in: 0..<8)
                    cases.append((badDigest, signature))
                }
                // r and s swapped; another key's signature; high s (n − s, also valid).
                cases.append((digest, Array(signature[32...] + signature[..<32])))
                cases.append((digest, Array(try stranger.signature(for: message).rawRepresentation)))
                cases.append((digest, Array(signature[..<32]) + Self.negate(Array(signature[32...]))))
                for (digest, signature) in cases {
                    let (fast, reference) = Self.verdicts(table, key, digest: digest, signature: signature)
                    #expect(fast == reference, "\(signature) over \(digest)")
                    if fast { accepted += 1 }
                }
            }
        }
        #expect(accepted == 24 * 12 * 2)  // each genuine signature and its high-s twin
    }

    @Test func rAndSOutOfRangeAreRefused() throws {
        let privateKey = P256.Signing.PrivateKey()
        let table = try #require(P256Table(privateKey.publicKey))
        let message = Array("out of range".utf8)
        let digest = Array(SHA256.hash(data: message))
        let signature = Array(try privateKey.signature(for: message).rawRepresentation)
        let r = Array(signature[..<32])
        let s = Array(signature[32...])
        let zero = [UInt8](repeating: 0, count: 32)
        let ones = [UInt8](repeating: 0xff, count: 32)
        var orderPlusOne = Self.order
        orderPlusOne[31] += 1
        var orderPlusR = r
        // r + n (wraps past 2^256 or not; either way not below n)
        var carry = 0
        for index in stride(from: 31, through: 0, by: -1) {
            let sum = Int(r[index]) + Int(Self.order[index]) + carry
            orderPlusR[index] = UInt8(sum & 0xff)
            carry = sum >> 8
        }
        for (r, s) in [
            (zero, s), (r, zero), (zero, zero), (Self.order, s), (r, Self.order), (orderPlusOne, s),
            (r, orderPlusOne), (ones, s), (r, ones), (orderPlusR, s),
        ] {
            let (fast, reference) = Self.verdicts(table, privateKey.publicKey, digest: digest, signature: r + s)
            #expect(!fast)
            #expect(!reference)
        }
    }

    /// Signatures built with the private key so that the last addition is a doubling
    /// (u1·G = u2·Q = Q: valid), the sum is the point at infinity (u1·G = −u2·Q: invalid),
    /// or u1 is 0 (the digest is 0: only Q's table is used).
    @Test func signaturesBuiltToReachTheCornersOfTheArithmetic() throws {
        var checked = 0
        while checked < 16 {
            let privateKey = P256.Signing.PrivateKey()
            let d = Array(privateKey.rawRepresentation)
            let key = privateKey.publicKey
            let table = try #require(P256Table(key))
            // u2 = 1 (s = r) and u1 = d: R = Q + Q = 2Q, so r must be x(2Q).
            let two = [UInt8](repeating: 0, count: 31) + [2]
            guard let r = try Self.x(of: Self.multiply(d, two)) else { continue }
            let doubling = Self.verdicts(table, key, digest: Self.multiply(d, r), signature: r + r)
            #expect(doubling.fast && doubling.reference)
            // u1 = −d, u2 = 1: R = −Q + Q, the point at infinity.
            let infinity = Self.verdicts(table, key, digest: Self.negate(Self.multiply(d, r)), signature: r + r)
            #expect(!infinity.fast && !infinity.reference)
            // e = 0, u2 = k: R = k·Q, r = x(k·d·G), s = r / k.
            let k = Array(P256.Signing.PrivateKey().rawRepresentation)
            guard let rk = try Self.x(of: Self.multiply(k, d)) else { continue }
            let zeroDigest = [UInt8](repeating: 0, count: 32)
            let onlyQ = Self.verdicts(
                table, key, digest: zeroDigest, signature: rk + Self.multiply(rk, Self.inverse(k)))
            #expect(onlyQ.fast && onlyQ.reference)
            // The same with one bit of s changed: refused by both.
            var s = Self.multiply(rk, Self.inverse(k))
            s[31] ^= 1
            let wrong = Self.verdicts(table, key, digest: zeroDigest, signature: rk + s)
            #expect(!wrong.fast && !wrong.reference)
            checked += 1
        }
    }

    @Test func aPointOffTheCurveGetsNoTable() {
        let table = UnsafeMutableRawPointer.allocate(byteCount: sk_p256_table_size(), alignment: 64)
        defer { table.deallocate() }
        let one = [UInt8](repeating: 0, count: 31) + [1]
        #expect(sk_p256_table_init(table, one, one) == 0)
        let prime = [UInt8](hex: "ffffffff00000001000000000000000000000000ffffffffffffffffffffffff")
        #expect(sk_p256_table_init(table, prime, one) == 0)
        let gx = [UInt8](hex: "6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296")
        let gy = [UInt8](hex: "4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5")
        #expect(sk_p256_table_init(table, gx, gy) == 1)
        var wrongY = gy
        wrongY[31] ^= 1
        #expect(sk_p256_table_init(table, gx, wrongY) == 0)
    }

    /// A leaf key verifies through swift-crypto until it has been asked `tableAfter` times,
    /// then through its table, with the same answers.
    @Test func aLeafKeyBuildsItsTableOnceItKeepsComingBack() throws {
        let privateKey = P256.Signing.PrivateKey()
        let leaf = LeafKey(privateKey.publicKey)
        let stranger = P256.Signing.PrivateKey()
        func check(_ index: Int) throws {
            let message = Array("jws \(index)".utf8)[...]
            let signature = Array(try privateKey.signature(for: message).rawRepresentation)
            #expect(leaf.isValidSignature(signature, for: message))
            #expect(!leaf.isValidSignature(Array(try stranger.signature(for: message).rawRepresentation), for: message))
            #expect(!leaf.isValidSignature(signature, for: Array("jws \(index)!".utf8)[...]))
            #expect(!leaf.isValidSignature(Array(signature.prefix(63)), for: message))
        }
        for index in 0..<(LeafKey.tableAfter / 4) {
            #expect(!leaf.hasTable)
            try check(index)
        }
        #expect(leaf.hasTable)
        for index in 0..<16 { try check(1000 + index) }
    }

    /// No more tables at once than the budget allows; one freed makes room for another.
    @Test func tablesAreLimited() throws {
        let budget = P256Table.Budget(limit: 3)
        var tables: [P256Table] = []
        while let table = P256Table(P256.Signing.PrivateKey().publicKey, budget: budget) {
            tables.append(table)
            try #require(tables.count <= 3)
        }
        #expect(tables.count == 3)
        #expect(budget.count == 3)
        tables.removeLast()
        #expect(budget.count == 2)
        #expect(P256Table(P256.Signing.PrivateKey().publicKey, budget: budget) != nil)
        #expect(budget.count == 2)  // that table is gone again
        #expect(P256Table.Budget.shared.limit == 8)
    }

    /// Many threads on one table and on the generator's (built on first use).
    @Test func concurrentVerificationsAgree() async throws {
        let privateKey = P256.Signing.PrivateKey()
        let table = try #require(P256Table(privateKey.publicKey))
        let signed = try (0..<64).map { index -> ([UInt8], [UInt8]) in
            let message = Array("concurrent \(index)".utf8)
            return (message, Array(try privateKey.signature(for: message).rawRepresentation))
        }
        await withTaskGroup(of: Bool.self) { group in
            for (message, signature) in signed {
                group.addTask { table.isValidSignature(signature, for: message) }
                group.addTask { !table.isValidSignature(signature, for: message + [0]) }
            }
            for await verdict in group { #expect(verdict) }
        }
    }
}

extension Array where Element == UInt8 {
    fileprivate init(hex: String) {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        self = bytes
    }
}
