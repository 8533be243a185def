import Foundation

#if canImport(CryptoKit)
    import CryptoKit
#else
    import Crypto
#endif

/// One of the server's answer-signing public keys (`auth.responseSigningKeys`: the first signs,
/// `GET /v1/status` lists every one in `responseSigningKeys`). Given them, the SDK takes an account or purchase answer only when its
/// `StoreKeeper-Signature` verifies with the key it names, over this request's nonce, method,
/// path and body digest and the answer's status and body — a man in the middle (seed 004's
/// IAPFree) can neither forge a verdict, replay one, nor settle a changed request with it.
public struct ResponseSigningKey: Sendable, Equatable {
    let key: Curve25519.Signing.PublicKey
    public let rawRepresentation: Data
    /// The key's id as the server names it: the first 16 hex digits of SHA-256 of the raw key.
    public let keyId: String

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
        self.keyId = String(SHA256.hash(data: Data(bytes)).map { String(format: "%02x", $0) }.joined().prefix(16))
    }

    /// Whether a v2 `StoreKeeper-Signature` (`keyid=…;v2=…`) is this key's over
    /// "storekeeper-response-v2" LF keyid LF nonce LF method LF path LF status LF
    /// hex(SHA-256(request body)) LF answer body.
    public func verifiesV2(
        _ header: String?, nonce: String, method: String, path: String, status: Int, requestBody: Data, body: Data
    ) -> Bool {
        guard let header, let parsed = Self.parseV2(header), parsed.keyId == keyId,
            let bytes = Data(base64Encoded: parsed.signature)
        else { return false }
        var message = Data()
        let digest = SHA256.hash(data: requestBody).map { String(format: "%02x", $0) }.joined()
        for part in ["storekeeper-response-v2", keyId, nonce, method, path, String(status), digest] {
            message.append(Data(part.utf8))
            message.append(0x0A)
        }
        message.append(body)
        return key.isValidSignature(bytes, for: message)
    }

    /// `keyid=<id>;v2=<base64>`, or nil when the header is not a v2 signature.
    static func parseV2(_ header: String) -> (keyId: String, signature: String)? {
        var keyId: String?
        var signature: String?
        for part in header.split(separator: ";") {
            let pair = part.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1).map(String.init)
            guard pair.count == 2 else { return nil }
            if pair[0] == "keyid" { keyId = pair[1] }
            if pair[0] == "v2" { signature = pair[1] }
        }
        guard let keyId, let signature else { return nil }
        return (keyId, signature)
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

/// Why an answer did not count as the server's: what `unverified_answer` errors and
/// `PurchaseCoordinator.diagnostics` report, so a key rotation the app was not built for, or a
/// proxy that strips the header, is seen at once instead of holding purchases silently.
public enum SignatureProblem: Sendable, Equatable, CustomStringConvertible {
    /// The answer carries no `StoreKeeper-Signature` (a proxy stripped it, or a server without
    /// `auth.responseSigningKey`).
    case missing
    /// Signed by a key this build does not hold (a rotation it was not built for).
    case unknownKey(String)
    /// A v1 signature, which does not bind the request: the server predates v2.
    case unboundSignature
    /// The named key's signature does not verify over this exchange (a changed answer or request).
    case invalid(keyId: String)

    public var description: String {
        switch self {
        case .missing: "the answer is not signed (StoreKeeper-Signature missing: a proxy may strip it)"
        case .unknownKey(let id):
            "the answer is signed with key \(id), which this build does not hold (a key rotation: ship the new key)"
        case .unboundSignature: "the answer carries a v1 signature; this SDK needs a server that signs v2"
        case .invalid(let id): "the answer's signature with key \(id) does not verify (changed in transit?)"
        }
    }
}

extension Array where Element == ResponseSigningKey {
    /// Checks a v2 signature with the key it names; nil when it verifies.
    func problem(
        _ header: String?, nonce: String, method: String, path: String, status: Int, requestBody: Data, body: Data
    ) -> SignatureProblem? {
        guard let header, !header.isEmpty else { return .missing }
        guard let parsed = ResponseSigningKey.parseV2(header) else { return .unboundSignature }
        guard let key = first(where: { $0.keyId == parsed.keyId }) else { return .unknownKey(parsed.keyId) }
        return key.verifiesV2(
            header, nonce: nonce, method: method, path: path, status: status, requestBody: requestBody, body: body)
            ? nil : .invalid(keyId: parsed.keyId)
    }
}

/// Answers that did not count as the server's, counted where they were checked (HTTPBackend):
/// what `PurchaseCoordinator.diagnostics` reports and the first of which it logs as an error.
public final class SignatureDiagnostics: @unchecked Sendable {
    struct Counts {
        var count = 0
        var last: SignatureProblem?
    }
    let counts = Locked(Counts())

    public init() {}

    func record(_ problem: SignatureProblem) {
        counts.withValue {
            $0.count += 1
            $0.last = problem
        }
    }

    /// Answers refused since launch.
    public var unverifiedAnswers: Int { counts.withValue { $0.count } }
    /// The last one's reason.
    public var lastProblem: SignatureProblem? { counts.withValue { $0.last } }
}

/// Checks a configuration makes before anything runs.
public enum StoreKeeperConfigurationCheck {
    public struct Invalid: Error, CustomStringConvertible, Sendable {
        public var description: String
    }

    /// The server is reached over https (http only on this machine: a simulator against a
    /// local server).
    public static func server(_ url: URL) throws {
        let scheme = url.scheme?.lowercased()
        let host = url.host?.lowercased() ?? ""
        let local = ["localhost", "127.0.0.1", "::1", "[::1]"].contains(host)
        guard scheme == "https" || (scheme == "http" && local), !host.isEmpty else {
            throw Invalid(description: "the server URL must be https (http only for localhost): \(url)")
        }
    }
}
