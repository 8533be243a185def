import AppStoreModels
import Foundation

/// A JWS in compact serialization, split into its segments but not yet decoded or verified.
/// Decoding is done per segment on demand so the verifier can skip what it has seen before.
struct CompactJWS {
    let text: [UInt8]
    let headerSegment: Range<Int>
    let payloadSegment: Range<Int>
    let signatureSegment: Range<Int>

    /// Limits that keep a hostile input from costing more than a genuine one.
    static let maxHeaderBytes = 16 * 1024
    static let maxTotalBytes = 512 * 1024

    init(_ jws: String) throws {
        guard jws.utf8.count <= Self.maxTotalBytes + 64 else {
            throw VerificationFailure.invalidSignature(
                "JWS is \(jws.utf8.count) bytes, limit \(Self.maxTotalBytes)")
        }
        let text = Array(jws.utf8)
        // Tolerate surrounding white space (a JWS pasted from a ticket), nothing else.
        var start = 0
        var end = text.count
        while start < end, Self.isSpace(text[start]) { start += 1 }
        while end > start, Self.isSpace(text[end - 1]) { end -= 1 }
        guard start < end else { throw VerificationFailure.invalidSignature("empty JWS") }
        guard end - start <= Self.maxTotalBytes else {
            throw VerificationFailure.invalidSignature("JWS is \(end - start) bytes, limit \(Self.maxTotalBytes)")
        }
        guard let firstDot = Self.dot(in: text, from: start, to: end),
            let secondDot = Self.dot(in: text, from: firstDot + 1, to: end),
            Self.dot(in: text, from: secondDot + 1, to: end) == nil
        else {
            throw VerificationFailure.invalidSignature("JWS compact serialization must have exactly 3 segments")
        }
        guard firstDot - start <= Self.maxHeaderBytes else {
            throw VerificationFailure.invalidSignature(
                "JWS header is \(firstDot - start) bytes, limit \(Self.maxHeaderBytes)")
        }
        self.text = text
        self.headerSegment = start..<firstDot
        self.payloadSegment = (firstDot + 1)..<secondDot
        self.signatureSegment = (secondDot + 1)..<end
    }

    private static func dot(in text: [UInt8], from start: Int, to end: Int) -> Int? {
        guard start < end else { return nil }
        return text.withUnsafeBufferPointer { buffer in
            guard let found = memchr(buffer.baseAddress! + start, Int32(UInt8(ascii: ".")), end - start) else {
                return nil
            }
            return buffer.baseAddress!.distance(to: found.assumingMemoryBound(to: UInt8.self))
        }
    }

    private static func isSpace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09
    }

    /// The exact bytes the signature covers: `BASE64URL(header) "." BASE64URL(payload)`.
    var signingInput: ArraySlice<UInt8> { text[headerSegment.lowerBound..<payloadSegment.upperBound] }

    var headerBytes: ArraySlice<UInt8> { text[headerSegment] }

    func decodeHeader() throws -> JWSDecodedHeader {
        guard let bytes = Base64.decodeURL(text[headerSegment]) else {
            throw VerificationFailure.invalidSignature("JWS header is not base64url")
        }
        do {
            return try JSONDecoder().decode(JWSDecodedHeader.self, from: Data(bytes))
        } catch {
            throw VerificationFailure.invalidSignature("JWS header is not a JSON object with string fields")
        }
    }

    func payloadBytes() throws -> [UInt8] {
        guard let payload = Base64.decodeURL(text[payloadSegment]), !payload.isEmpty else {
            throw VerificationFailure.invalidSignature("JWS payload is not base64url")
        }
        return payload
    }

    func signatureBytes() throws -> [UInt8] {
        guard let signature = Base64.decodeURL(text[signatureSegment]) else {
            throw VerificationFailure.invalidSignature("JWS signature is not base64url")
        }
        return signature
    }

    /// Decodes the payload. A payload that is not the expected JSON object is malformed input.
    func decodePayload<T>(_ decode: ([UInt8]) throws -> T) throws -> T {
        let bytes = try payloadBytes()
        do {
            return try decode(bytes)
        } catch {
            throw VerificationFailure.invalidSignature("JWS payload is not a valid \(T.self): \(Self.describe(error))")
        }
    }

    static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context),
            DecodingError.keyNotFound(_, let context), DecodingError.dataCorrupted(let context):
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? "not a JSON object" : "field '\(path)' has the wrong type"
        default:
            return "not JSON"
        }
    }
}
