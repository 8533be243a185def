import AppStoreModels
import Crypto
import Foundation

/// Signs payloads as the App Store does: ES256, compact serialization, `x5c` of
/// leaf, intermediate, root (standard base64 DER).
public struct JWSSigner: Sendable {
    public let key: P256.Signing.PrivateKey
    public let x5c: [String]

    /// The default header (`alg`, `x5c`) as its base64url segment: the same for every signature,
    /// so serialized once (with the chain it is ~2 KB of JSON).
    private let defaultHeaderSegment: String

    public init(key: P256.Signing.PrivateKey, chain: [[UInt8]]) {
        self.key = key
        let x5c = chain.map { Data($0).base64EncodedString() }
        self.x5c = x5c
        let header =
            (try? JSONSerialization.data(withJSONObject: ["alg": "ES256", "x5c": x5c], options: [.sortedKeys]))
        defaultHeaderSegment = Base64.encodeURL(header ?? Data())
    }

    /// Signs an Encodable payload.
    public func sign<Payload: Encodable>(_ payload: Payload) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return try sign(payloadBytes: Array(encoder.encode(payload)))
    }

    /// Signs raw payload bytes, optionally with a custom header (tests build forgeries this way).
    public func sign(payloadBytes: [UInt8], header: [String: Any]? = nil) throws -> String {
        let headerSegment =
            try header.map { Self.base64URL(try JSONSerialization.data(withJSONObject: $0, options: [.sortedKeys])) }
            ?? defaultHeaderSegment
        let signingInput = headerSegment + "." + Self.base64URL(payloadBytes)
        let signature = try key.signature(for: Array(signingInput.utf8))
        return signingInput + "." + Self.base64URL(signature.rawRepresentation)
    }

    public static func base64URL<Bytes: DataProtocol>(_ bytes: Bytes) -> String {
        Base64.encodeURL(bytes)
    }
}
