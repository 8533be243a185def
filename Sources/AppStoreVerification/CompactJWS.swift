import AppStoreModels
import Foundation

/// A JWS in compact serialization, split and decoded but not yet verified.
struct CompactJWS {
    /// The exact bytes the signature covers: `BASE64URL(header) "." BASE64URL(payload)`.
    let signingInput: ArraySlice<UInt8>
    let header: JWSDecodedHeader
    let payload: [UInt8]
    let signature: [UInt8]

    /// Limits that keep a hostile input from costing more than a genuine one.
    static let maxHeaderBytes = 16 * 1024
    static let maxTotalBytes = 512 * 1024

    init(_ jws: String) throws {
        var text = Array(jws.utf8)
        // Tolerate surrounding white space (a JWS pasted from a ticket), nothing else.
        while let last = text.last, last == 0x20 || last == 0x0A || last == 0x0D || last == 0x09 { text.removeLast() }
        let leading = text.prefix(while: { $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }).count
        if leading > 0 { text.removeFirst(leading) }

        guard !text.isEmpty else { throw VerificationFailure.invalidSignature("empty JWS") }
        guard text.count <= Self.maxTotalBytes else {
            throw VerificationFailure.invalidSignature("JWS is \(text.count) bytes, limit \(Self.maxTotalBytes)")
        }
        let dots = text.indices.filter { text[$0] == UInt8(ascii: ".") }
        guard dots.count == 2 else {
            throw VerificationFailure.invalidSignature(
                "JWS compact serialization has 3 segments, found \(dots.count + 1)")
        }
        let headerSegment = text[..<dots[0]]
        let payloadSegment = text[(dots[0] + 1)..<dots[1]]
        let signatureSegment = text[(dots[1] + 1)...]
        guard headerSegment.count <= Self.maxHeaderBytes else {
            throw VerificationFailure.invalidSignature(
                "JWS header is \(headerSegment.count) bytes, limit \(Self.maxHeaderBytes)")
        }
        guard let headerBytes = Base64.decodeURL(headerSegment) else {
            throw VerificationFailure.invalidSignature("JWS header is not base64url")
        }
        guard let payload = Base64.decodeURL(payloadSegment), !payload.isEmpty else {
            throw VerificationFailure.invalidSignature("JWS payload is not base64url")
        }
        guard let signature = Base64.decodeURL(signatureSegment) else {
            throw VerificationFailure.invalidSignature("JWS signature is not base64url")
        }
        let header: JWSDecodedHeader
        do {
            header = try JSONDecoder().decode(JWSDecodedHeader.self, from: Data(headerBytes))
        } catch {
            throw VerificationFailure.invalidSignature("JWS header is not a JSON object with string fields")
        }
        self.signingInput = text[..<dots[1]]
        self.header = header
        self.payload = payload
        self.signature = signature
    }

    /// Decodes the payload. A payload that is not the expected JSON object is malformed input.
    func decodePayload<T: Decodable>(_ type: T.Type) throws -> T {
        do {
            return try JSONDecoder().decode(T.self, from: Data(payload))
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
