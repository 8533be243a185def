import AppStoreModels
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import Synchronization

/// Signed answers (docs/api.md "Purchases from the device"): with `auth.responseSigningKey`, every
/// answer to an account read or a purchase carries `StoreKeeper-Signature`, an Ed25519
/// signature a device verifies with the public key it was built with. Two versions:
///
/// - **v2** (asked for with the request header `StoreKeeper-Signature-Version: 2`, as
///   StoreKeeperKit does): the header is `keyid=<key id>;v2=<base64 signature>` over
///
///       "storekeeper-response-v2" LF keyid LF nonce LF method LF path LF status LF
///       hex(SHA-256(request body)) LF <answer body bytes>
///
///   so an answer binds the key that signed it (a device holding the current and the next key
///   picks by id through a rotation), the request it answers (method, path, the exact body the
///   server read) and its status — a man in the middle can neither change what the device
///   sent nor settle other entries with a genuine answer.
/// - **v1** (requests without the header: SDKs from before v2, kept working through an upgrade):
///   the base64 signature of `"storekeeper-response-v1" LF nonce LF path LF body`.
///
/// Either way `StoreKeeper-Signature-Key` names the signing key's id: the first 16 hex digits of
/// the SHA-256 of its raw 32-byte public key (what `GET /v1/status` lists).
struct ResponseSigner: Sendable {
    let key: Curve25519.Signing.PrivateKey

    static let signatureHeader = HTTPField.Name("StoreKeeper-Signature")!
    static let keyHeader = HTTPField.Name("StoreKeeper-Signature-Key")!
    static let versionHeader = HTTPField.Name("StoreKeeper-Signature-Version")!
    static let nonceHeader = HTTPField.Name("StoreKeeper-Nonce")!
    static let context = "storekeeper-response-v1"
    static let contextV2 = "storekeeper-response-v2"

    init(key: Curve25519.Signing.PrivateKey) {
        self.key = key
        keyId = Self.keyId(of: key.publicKey.rawRepresentation)
    }

    /// The public key, raw 32 bytes, base64: what the app is configured with.
    var publicKeyBase64: String { key.publicKey.rawRepresentation.base64EncodedString() }
    /// SHA-256 of the raw public key, lowercase hex (`GET /v1/status`).
    var fingerprint: String { SHA256.hash(data: key.publicKey.rawRepresentation).lowercaseHex }
    /// The key's id: the fingerprint's first 16 hex digits.
    let keyId: String

    static func keyId(of rawPublicKey: Data) -> String {
        String(SHA256.hash(data: rawPublicKey).lowercaseHex.prefix(16))
    }

    func signature(nonce: String, path: String, body: ByteBuffer) throws -> String {
        var message = Data()
        message.reserveCapacity(body.readableBytes + path.utf8.count + nonce.utf8.count + 32)
        message.append(contentsOf: Self.context.utf8)
        message.append(0x0A)
        message.append(contentsOf: nonce.utf8)
        message.append(0x0A)
        message.append(contentsOf: path.utf8)
        message.append(0x0A)
        message.append(contentsOf: body.readableBytesView)
        return try key.signature(for: message).base64EncodedString()
    }

    /// The v2 header value: `keyid=…;v2=…`.
    func signatureV2(
        nonce: String, method: String, path: String, status: Int, requestBodyDigest: String, body: ByteBuffer
    ) throws -> String {
        let message = Self.messageV2(
            keyId: keyId, nonce: nonce, method: method, path: path, status: status,
            requestBodyDigest: requestBodyDigest, body: Array(body.readableBytesView))
        return "keyid=\(keyId);v2=" + (try key.signature(for: message).base64EncodedString())
    }

    static func messageV2(
        keyId: String, nonce: String, method: String, path: String, status: Int, requestBodyDigest: String,
        body: [UInt8]
    ) -> Data {
        var message = Data()
        message.reserveCapacity(body.count + path.utf8.count + nonce.utf8.count + 160)
        for part in [contextV2, keyId, nonce, method, path, String(status), requestBodyDigest] {
            message.append(contentsOf: part.utf8)
            message.append(0x0A)
        }
        message.append(contentsOf: body)
        return message
    }

    /// Whether `signature` is ours for that request and body (tests, and what an app does).
    static func isValid(
        _ signature: String, publicKey: Curve25519.Signing.PublicKey, nonce: String, path: String, body: [UInt8]
    ) -> Bool {
        guard let bytes = Data(base64Encoded: signature) else { return false }
        var message = Data(context.utf8)
        message.append(0x0A)
        message.append(contentsOf: nonce.utf8)
        message.append(0x0A)
        message.append(contentsOf: path.utf8)
        message.append(0x0A)
        message.append(contentsOf: body)
        return publicKey.isValidSignature(bytes, for: message)
    }

    /// Whether a v2 header value is ours for that exchange (tests).
    static func isValidV2(
        _ header: String, publicKey: Curve25519.Signing.PublicKey, nonce: String, method: String, path: String,
        status: Int, requestBody: [UInt8], body: [UInt8]
    ) -> Bool {
        var keyId: String?
        var signature: String?
        for part in header.split(separator: ";") {
            let pair = part.split(separator: "=", maxSplits: 1).map(String.init)
            guard pair.count == 2 else { return false }
            if pair[0] == "keyid" { keyId = pair[1] }
            if pair[0] == "v2" { signature = pair[1] }
        }
        guard let keyId, let signature, let bytes = Data(base64Encoded: signature),
            keyId == Self.keyId(of: publicKey.rawRepresentation)
        else { return false }
        let message = messageV2(
            keyId: keyId, nonce: nonce, method: method, path: path, status: status,
            requestBodyDigest: SHA256.hash(data: requestBody).lowercaseHex, body: body)
        return publicKey.isValidSignature(bytes, for: message)
    }

    // MARK: Keys as PEM (PKCS#8, RFC 8410)

    /// The DER of an Ed25519 PKCS#8 private key before its 32-byte seed.
    static let pkcs8Prefix: [UInt8] = [
        0x30, 0x2E, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
    ]

    struct InvalidKey: Error {}

    /// An Ed25519 private key from PEM (`-----BEGIN PRIVATE KEY-----`, as `openssl genpkey
    /// -algorithm ed25519` writes it).
    static func key(pem: String) throws -> Curve25519.Signing.PrivateKey {
        let lines = pem.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
        guard let begin = lines.firstIndex(of: "-----BEGIN PRIVATE KEY-----"),
            let end = lines.firstIndex(of: "-----END PRIVATE KEY-----"), begin < end,
            let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()), der.count == pkcs8Prefix.count + 32,
            Array(der.prefix(pkcs8Prefix.count)) == pkcs8Prefix
        else { throw InvalidKey() }
        return try Curve25519.Signing.PrivateKey(rawRepresentation: der.suffix(32))
    }

    static func pem(_ key: Curve25519.Signing.PrivateKey) -> String {
        let der = Data(pkcs8Prefix) + key.rawRepresentation
        return "-----BEGIN PRIVATE KEY-----\n\(der.base64EncodedString())\n-----END PRIVATE KEY-----\n"
    }
}

/// Signs the answers of the routes it is added to (account reads and purchases), errors
/// included: it turns errors into their answers itself (`ErrorMiddleware`), so a 4xx is as
/// signed as a 200. What the deadline or the load shedder answer (503) stays unsigned: a device
/// treats it as a network failure and retries after its `Retry-After`, as it would anyway.
struct SignResponses: RouterMiddleware {
    typealias Context = StoreKeeperContext
    let keys: ResponseSigningKeys
    /// `limits.maxBodyBytes`: a v2 answer hashes the request body, read here up to this.
    var maxBodyBytes = 1 << 20

    func handle(
        _ request: Request, context: StoreKeeperContext,
        next: (Request, StoreKeeperContext) async throws -> Response
    ) async throws -> Response {
        guard let signer = keys.current else { return try await next(request, context) }
        let nonce = request.headers[ResponseSigner.nonceHeader] ?? ""
        guard nonce.utf8.count <= 128, nonce.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw APIError.badRequest("header 'StoreKeeper-Nonce' must be at most 128 printable ASCII characters")
        }
        let version = request.headers[ResponseSigner.versionHeader]
        guard version == nil || version == "1" || version == "2" else {
            throw APIError.badRequest("header 'StoreKeeper-Signature-Version' must be 1 or 2")
        }
        var request = request
        var requestDigest: String?
        if version == "2" {
            // The body the handler will read, hashed first: what the answer binds.
            if let length = request.headers[.contentLength].flatMap(Int.init), length > maxBodyBytes {
                throw APIError(.contentTooLarge, "payload_too_large", "request body is over \(maxBodyBytes) bytes")
            }
            let buffer: ByteBuffer
            do {
                buffer = try await request.collectBody(upTo: maxBodyBytes)
            } catch let error as HTTPError where error.status == .contentTooLarge {
                throw APIError(.contentTooLarge, "payload_too_large", "request body is over \(maxBodyBytes) bytes")
            }
            requestDigest = SHA256.hash(data: buffer.readableBytesView).lowercaseHex
        }
        var response: Response
        do {
            response = try await ErrorMiddleware<StoreKeeperContext>().handle(request, context: context, next: next)
        } catch let error as APIError {
            response = try error.response(from: request, context: context)
        }
        let collector = Collector()
        try await response.body.write(collector)
        let body = collector.buffer
        if let requestDigest {
            response.headers[ResponseSigner.signatureHeader] = try signer.signatureV2(
                nonce: nonce, method: request.method.rawValue, path: request.uri.path, status: response.status.code,
                requestBodyDigest: requestDigest, body: body)
        } else {
            response.headers[ResponseSigner.signatureHeader] = try signer.signature(
                nonce: nonce, path: request.uri.path, body: body)
        }
        response.headers[ResponseSigner.keyHeader] = signer.keyId
        response.body = .init(byteBuffer: body)
        return response
    }

    /// Collects a response body written to it.
    final class Collector: ResponseBodyWriter, @unchecked Sendable {
        var buffer = ByteBuffer()
        func write(_ buffer: ByteBuffer) async throws { self.buffer.writeImmutableBuffer(buffer) }
        func finish(_ trailingHeaders: HTTPFields?) async throws {}
    }
}

/// The answer-signing keys in use (`auth.responseSigningKeys`): the first signs, every one is
/// published for app builds. `rotate()` makes the second the signing key (what reordering the
/// configuration and a SIGHUP do; tests and the simulator's rotation use it in place).
final class ResponseSigningKeys: Sendable {
    private let keys: Mutex<[ResponseSigner]>

    init(_ keys: [ResponseSigner] = []) { self.keys = Mutex(keys) }

    var current: ResponseSigner? { keys.withLock { $0.first } }
    var all: [ResponseSigner] { keys.withLock { $0 } }

    func set(_ signers: [ResponseSigner]) { keys.withLock { $0 = signers } }

    /// The second key signs from now on (the first stays published after it).
    @discardableResult
    func rotate() -> Bool {
        keys.withLock { keys in
            guard keys.count > 1 else { return false }
            keys = Array(keys.dropFirst()) + [keys[0]]
            return true
        }
    }
}
