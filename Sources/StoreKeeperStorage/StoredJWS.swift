import Crypto
import Foundation
import StoreKeeperSupport
import Synchronization

/// How a notification's `signedPayload` is kept: exactly the text Apple sent, with the JWS
/// headers stored once instead of in every row.
///
/// Each of a notification's three JWS (the payload, and the transaction and renewal info signed
/// inside it) carries the same ~4 KB header: `alg` and the `x5c` certificate chain. Those
/// headers were 90 % of a stored notification (12 KB). Every byte is written twice on SQLite
/// (WAL, then checkpoint) and TOAST-compressed on PostgreSQL, on the single writer's path.
///
/// Packed, a notification is `~1.<header id>.<signature>.<payload JSON>`. The payload is kept
/// as JSON text, not base64url. Inside it, each signed string's header segment is replaced by
/// `~<header id>`. A header id is the SHA-256 of the segment (base64url); the `jws_headers`
/// table maps it back. Unpacking gives back the original text byte for byte (see `pack` for
/// why), and anything `pack` cannot keep that way is stored as sent.
enum StoredJWS {
    static let marker = "~1."
    /// Headers shorter than this are not worth a reference (an `x5c` header is ~4 KB).
    static let minimumHeader = 64
    /// The length of a header id: SHA-256, base64url without padding.
    static let idLength = 43

    struct Packed: Sendable {
        var text: String
        /// Every header the text refers to, by id.
        var headers: [String: String]
    }

    struct UnknownHeader: Error, CustomStringConvertible {
        var id: String
        var description: String { "stored JWS header \(id) is not recorded" }
    }

    /// A text that starts with the packed form's marker and is not a packed form (a compact
    /// JWS never does: its header is base64url).
    struct Unstorable: Error, CustomStringConvertible {
        var description: String { "a signed payload cannot start with \(marker)" }
    }

    private static let dot = UInt8(ascii: ".")
    private static let quote = UInt8(ascii: "\"")
    private static let tilde = UInt8(ascii: "~")

    static func id<Bytes: Collection>(_ segment: Bytes) -> String where Bytes.Element == UInt8 {
        Base64.encodeURL(Array(SHA256.hash(data: Array(segment))))
    }

    /// The ids of the last headers seen: a notification's three are usually one, the same for
    /// months; comparing 4 KB costs far less than hashing it.
    private static let recentIds = Mutex<[(segment: [UInt8], id: String)]>([])

    static func cachedId(_ segment: UnsafeBufferPointer<UInt8>) -> String {
        guard let wanted = segment.baseAddress else { return id(segment) }
        let found = recentIds.withLock { recent -> String? in
            recent.first { entry in
                entry.segment.count == segment.count
                    && entry.segment.withUnsafeBufferPointer { memcmp($0.baseAddress!, wanted, segment.count) == 0 }
            }?.id
        }
        if let found { return found }
        let computed = id(segment)
        recentIds.withLock { recent in
            if recent.count >= 8 { recent.removeFirst() }
            recent.append((Array(segment), computed))
        }
        return computed
    }

    /// `jws` with its headers by reference, or nil when it is not a compact JWS whose payload is
    /// base64url JSON text (kept as sent, then).
    ///
    /// What comes back is exactly `jws`, by construction: the payload decoded only if it is
    /// canonical base64url (`Base64.decodeURL` is strict, so encoding it again gives the same
    /// segment), it is valid UTF-8 without NUL, and it has no `"~` of its own — so the only
    /// `"~` that `unpack` finds are the references written here. The tests check this under
    /// mutation.
    static func pack(_ jws: String) -> Packed? {
        let bytes = Array(jws.utf8)
        guard let firstDot = bytes.firstIndex(of: dot),
            let secondDot = bytes[(firstDot + 1)...].firstIndex(of: dot),
            !bytes[(secondDot + 1)...].contains(dot),
            firstDot >= minimumHeader,
            let json = Base64.decodeURL(bytes[(firstDot + 1)..<secondDot]),
            String(validating: json, as: UTF8.self) != nil
        else { return nil }
        var headers: [String: String] = [:]
        let outerId = bytes.withUnsafeBufferPointer { cachedId(UnsafeBufferPointer(rebasing: $0[..<firstDot])) }
        headers[outerId] = String(decoding: bytes[..<firstDot], as: UTF8.self)
        var output = Array(marker.utf8)
        output.reserveCapacity(output.count + idLength + bytes.count - secondDot + json.count)
        output += outerId.utf8
        output.append(dot)
        output += bytes[(secondDot + 1)...]
        output.append(dot)
        // Each JSON string that starts with a long base64url segment and a dot: a signed JWS.
        // Copied in runs between them (byte by byte was 4 % of accepting a notification).
        let packed = json.withUnsafeBufferPointer { json -> Bool in
            let count = json.count
            guard let base = json.baseAddress, memchr(base, 0, count) == nil else { return false }
            var copied = 0
            var index = 0
            while index < count, let found = memchr(base + index, Int32(quote), count - index) {
                let start = base.distance(to: found.assumingMemoryBound(to: UInt8.self)) + 1
                guard start < count else { break }
                if json[start] == tilde { return false }
                var end = start
                while end < count, Base64.isURLAlphabet(json[end]) { end += 1 }
                index = end == start ? start : end
                guard end < count, json[end] == dot, end - start >= minimumHeader else { continue }
                let segment = UnsafeBufferPointer(rebasing: json[start..<end])
                let segmentId = cachedId(segment)
                if headers[segmentId] == nil { headers[segmentId] = String(decoding: segment, as: UTF8.self) }
                output += UnsafeBufferPointer(rebasing: json[copied..<start])
                output.append(tilde)
                output += segmentId.utf8
                copied = end
            }
            output += UnsafeBufferPointer(rebasing: json[copied...])
            return true
        }
        guard packed else { return nil }
        return Packed(text: String(decoding: output, as: UTF8.self), headers: headers)
    }

    /// The text as it was sent. `header` gives a header segment by id.
    static func unpack(_ stored: String, header: (String) throws -> String?) throws -> String {
        guard stored.hasPrefix(marker) else { return stored }
        let bytes = Array(stored.utf8)
        var index = marker.utf8.count
        func segment(at start: Int) throws -> String {
            guard start + idLength <= bytes.count else { throw UnknownHeader(id: "") }
            let id = String(decoding: bytes[start..<(start + idLength)], as: UTF8.self)
            guard let segment = try header(id) else { throw UnknownHeader(id: id) }
            return segment
        }
        let outer = try segment(at: index)
        index += idLength
        guard index < bytes.count, bytes[index] == dot,
            let signatureEnd = bytes[(index + 1)...].firstIndex(of: dot)
        else { throw UnknownHeader(id: "") }
        let signature = bytes[(index + 1)..<signatureEnd]
        var json: [UInt8] = []
        json.reserveCapacity(bytes.count * 2)
        index = signatureEnd + 1
        while index < bytes.count {
            let byte = bytes[index]
            json.append(byte)
            index += 1
            guard byte == quote, index + idLength + 1 < bytes.count, bytes[index] == tilde,
                bytes[index + 1 + idLength] == dot
            else { continue }
            json += try segment(at: index + 1).utf8
            index += 1 + idLength
        }
        var result = outer
        result.reserveCapacity(outer.utf8.count + json.count * 4 / 3 + signature.count + 4)
        result += "."
        result += Base64.encodeURL(json)
        result += "."
        result += String(decoding: signature, as: UTF8.self)
        return result
    }
}

/// Header segments by id, as read from `jws_headers` (content-addressed, so never stale).
final class JWSHeaderCache: Sendable {
    private let entries = Mutex<[String: String]>([:])
    /// Apple rotates its signing certificates rarely; a cache this large is never full in use.
    let limit = 256

    func get(_ id: String) -> String? { entries.withLock { $0[id] } }

    func put(_ headers: [String: String]) {
        entries.withLock { entries in
            if entries.count + headers.count > limit { entries.removeAll() }
            entries.merge(headers) { old, _ in old }
        }
    }
}
