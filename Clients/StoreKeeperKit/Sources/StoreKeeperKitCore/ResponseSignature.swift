import Foundation

#if canImport(CryptoKit)
    import CryptoKit
#else
    import Crypto
#endif

/// The server's answer-signing public key (`auth.responseSigningKey`; `GET /v1/status` shows
/// it as `responseSigningKey.publicKey`). Given one, the SDK takes an account or purchase answer
/// only when its `StoreKeeper-Signature` verifies over this request's nonce, path and body —
/// a man in the middle (seed 004's IAPFree) can neither forge a verdict nor replay one.
public struct ResponseSigningKey: Sendable, Equatable {
    let key: Curve25519.Signing.PublicKey
    public let rawRepresentation: Data

    public static func == (lhs: ResponseSigningKey, rhs: ResponseSigningKey) -> Bool {
        lhs.rawRepresentation == rhs.rawRepresentation
    }

    /// The raw 32-byte key in base64 (as `/v1/status` gives it), or a PEM `PUBLIC KEY`
    /// (SubjectPublicKeyInfo, as `openssl pkey -pubout` writes it).
    public init(_ text: String) throws {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        var base64 = trimmed
        if trimmed.hasPrefix("-----BEGIN PUBLIC KEY-----") {
            base64 = trimmed.replacingOccurrences(of: "-----BEGIN PUBLIC KEY-----", with: "")
                .replacingOccurrences(of: "-----END PUBLIC KEY-----", with: "")
                .components(separatedBy: .whitespacesAndNewlines).joined()
        }
        guard var bytes = Data(base64Encoded: base64) else {
            throw ResponseSigningKeyError(description: "not base64 or a PEM public key")
        }
        // Ed25519 SubjectPublicKeyInfo: 30 2a 30 05 06 03 2b 65 70 03 21 00, then the 32 bytes.
        let prefix = Data([0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00])
        if bytes.count == 44, bytes.starts(with: prefix) { bytes = bytes.dropFirst(12) }
        guard bytes.count == 32, let key = try? Curve25519.Signing.PublicKey(rawRepresentation: bytes) else {
            throw ResponseSigningKeyError(description: "not an Ed25519 public key (32 bytes)")
        }
        self.key = key
        self.rawRepresentation = Data(bytes)
    }

    /// Whether `signature` (base64) signs "storekeeper-response-v1" LF nonce LF path LF body.
    public func verifies(_ signature: String?, nonce: String, path: String, body: Data) -> Bool {
        guard let signature, let bytes = Data(base64Encoded: signature) else { return false }
        var message = Data("storekeeper-response-v1\n".utf8)
        message.append(Data(nonce.utf8))
        message.append(0x0A)
        message.append(Data(path.utf8))
        message.append(0x0A)
        message.append(body)
        return key.isValidSignature(bytes, for: message)
    }
}

public struct ResponseSigningKeyError: Error, CustomStringConvertible, Sendable {
    public var description: String
}
