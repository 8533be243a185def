import Crypto
import Foundation
import StoreKeeperSupport

/// Stripe's webhook signature (`Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`), exactly as
/// Stripe's SDKs check it: HMAC-SHA256 keyed with the UTF-8 bytes of the whole `whsec_…` secret
/// (prefix included, never base64-decoded) over `"<t>.<raw body>"`; any `v1` matching any
/// configured secret, compared in constant time; `v0` and unknown schemes ignored; a timestamp
/// older than the tolerance (300 s) refused, and one further ahead than the tolerance too.
public enum StripeSignature {
    public enum Failure: Error, Equatable, CustomStringConvertible {
        case notSigned
        case malformedHeader
        case noV1Signature
        case timestampOutsideTolerance
        case noMatchingSignature

        public var description: String {
            switch self {
            case .notSigned: "no Stripe-Signature header"
            case .malformedHeader: "the Stripe-Signature header is not t=…,v1=…"
            case .noV1Signature: "the Stripe-Signature header carries no v1 signature"
            case .timestampOutsideTolerance: "the signature's timestamp is outside the 300 s tolerance"
            case .noMatchingSignature: "no v1 signature matches a configured webhook secret"
            }
        }
    }

    public static let defaultTolerance: TimeInterval = 300

    /// Verifies `header` over the raw `body` against every secret; returns the signed timestamp.
    @discardableResult
    public static func verify(
        header: String?, body: some Collection<UInt8>, secrets: [String], now: Date = Date(),
        tolerance: TimeInterval = defaultTolerance
    ) throws(Failure) -> Int64 {
        guard let header, !header.isEmpty else { throw .notSigned }
        guard header.utf8.count <= 8192 else { throw .malformedHeader }
        var timestamp: (text: Substring, value: Int64)?
        var signatures: [[UInt8]] = []
        for part in header.split(separator: ",", omittingEmptySubsequences: false) {
            let pair = part.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard pair.count == 2 else { throw .malformedHeader }
            let key = pair[0].trimmingCharacters(in: .whitespaces)
            switch key {
            case "t":
                guard pair[1].count <= 20, pair[1].allSatisfy({ $0.isASCII && $0.isNumber }),
                    let value = Int64(pair[1])
                else { throw .malformedHeader }
                timestamp = (pair[1], value)
            case "v1":
                // An undecodable v1 is skipped, as Stripe's SDKs skip it.
                if let bytes = hexBytes(pair[1]), bytes.count == 32 { signatures.append(bytes) }
            default:
                continue  // v0 (test-only) and future schemes: never accepted.
            }
        }
        guard let timestamp else { throw .malformedHeader }
        guard !signatures.isEmpty else { throw .noV1Signature }
        let age = now.timeIntervalSince1970 - Double(timestamp.value)
        guard age <= tolerance, age >= -tolerance else { throw .timestampOutsideTolerance }
        var payload = Array(timestamp.text.utf8)
        payload.append(UInt8(ascii: "."))
        payload.append(contentsOf: body)
        for secret in secrets {
            let expected = Array(
                HMAC<SHA256>.authenticationCode(for: payload, using: SymmetricKey(data: Array(secret.utf8))))
            var matched = false
            for signature in signatures where constantTimeEqual(signature, expected) { matched = true }
            if matched { return timestamp.value }
        }
        throw .noMatchingSignature
    }

    /// The header Stripe sends for `body` at `timestamp`, one `v1` per secret (several while a
    /// rolled secret still signs).
    public static func header(body: some Collection<UInt8>, secrets: [String], timestamp: Int64) -> String {
        var payload = Array(String(timestamp).utf8)
        payload.append(UInt8(ascii: "."))
        payload.append(contentsOf: body)
        let parts = secrets.map { secret in
            "v1="
                + Array(HMAC<SHA256>.authenticationCode(for: payload, using: SymmetricKey(data: Array(secret.utf8))))
                .lowercaseHex
        }
        return (["t=\(timestamp)"] + parts).joined(separator: ",")
    }

    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for index in a.indices { difference |= a[index] ^ b[index] }
        return difference == 0
    }

    static func hexBytes(_ text: Substring) -> [UInt8]? {
        guard text.utf8.count % 2 == 0, text.utf8.count <= 128 else { return nil }
        var bytes: [UInt8] = []
        var high: UInt8?
        for unit in text.utf8 {
            let nibble: UInt8
            switch unit {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = unit - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = unit - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): nibble = unit - UInt8(ascii: "A") + 10
            default: return nil
            }
            if let first = high {
                bytes.append(first << 4 | nibble)
                high = nil
            } else {
                high = nibble
            }
        }
        return bytes
    }
}

/// Stripe's request encoding: `application/x-www-form-urlencoded` with bracket nesting
/// (`line_items[0][price]=price_1&metadata[storekeeper_token]=…`), pairs kept in order.
public struct StripeForm: Sendable, Hashable {
    public var pairs: [(String, String)] = []

    public init(_ pairs: [(String, String)] = []) { self.pairs = pairs }

    public mutating func add(_ key: String, _ value: String?) {
        if let value { pairs.append((key, value)) }
    }

    public var encoded: String {
        pairs.map { "\(Self.escape($0.0))=\(Self.escape($0.1))" }.joined(separator: "&")
    }

    static func escape(_ text: String) -> String {
        if text.utf8.allSatisfy({
            ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2D
                || $0 == 0x2E || $0 == 0x5F || $0 == 0x7E || $0 == 0x5B || $0 == 0x5D
        }) {
            return text
        }
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~[]")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }

    /// Parses a form body (the local Stripe reads requests with it).
    public static func parse(_ body: String) -> [(String, String)] {
        body.split(separator: "&").compactMap { part in
            let pair = part.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if !part.utf8.contains(where: { $0 == UInt8(ascii: "%") || $0 == UInt8(ascii: "+") }) {
                // Nothing encoded (the common case): no Foundation decoding.
                guard let key = pair.first else { return nil }
                return (String(key), pair.count > 1 ? String(pair[1]) : "")
            }
            guard let key = pair.first?.replacingOccurrences(of: "+", with: " ").removingPercentEncoding else {
                return nil
            }
            let value =
                pair.count > 1 ? (pair[1].replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "") : ""
            return (key, value)
        }
    }

    public static func == (lhs: StripeForm, rhs: StripeForm) -> Bool {
        lhs.pairs.map { [$0.0, $0.1] } == rhs.pairs.map { [$0.0, $0.1] }
    }

    public func hash(into hasher: inout Hasher) {
        for (key, value) in pairs {
            hasher.combine(key)
            hasher.combine(value)
        }
    }
}
