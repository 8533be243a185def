import AppStoreModels
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// Signed answers (API.md "Purchases from the device"): with `auth.responseSigningKey`, every
/// answer to an account read or a purchase carries `StoreKeeper-Signature`, the base64 Ed25519
/// signature of
///
///     "storekeeper-response-v1" LF <StoreKeeper-Nonce request header, or empty> LF <request path> LF <body bytes>
///
/// (path as sent, without the query). A device that holds the public key rejects an answer a man
/// in the middle made or changed — seed 004's "IAPFree" attack answered the app's own server
/// calls — and, with a nonce of its own per request, one replayed from another request.
struct ResponseSigner: Sendable {
    let key: Curve25519.Signing.PrivateKey

    static let signatureHeader = HTTPField.Name("StoreKeeper-Signature")!
    static let nonceHeader = HTTPField.Name("StoreKeeper-Nonce")!
    static let context = "storekeeper-response-v1"

    /// The public key, raw 32 bytes, base64: what the app is configured with.
    var publicKeyBase64: String { key.publicKey.rawRepresentation.base64EncodedString() }
    /// SHA-256 of the raw public key, lowercase hex (`GET /v1/status`).
    var fingerprint: String { SHA256.hash(data: key.publicKey.rawRepresentation).lowercaseHex }

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
/// treats it as a network failure and retries, as it would anyway.
struct SignResponses: RouterMiddleware {
    typealias Context = StoreKeeperContext
    let signer: ResponseSigner

    func handle(
        _ request: Request, context: StoreKeeperContext,
        next: (Request, StoreKeeperContext) async throws -> Response
    ) async throws -> Response {
        let nonce = request.headers[ResponseSigner.nonceHeader] ?? ""
        guard nonce.utf8.count <= 128, nonce.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw APIError.badRequest("header 'StoreKeeper-Nonce' must be at most 128 printable ASCII characters")
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
        response.headers[ResponseSigner.signatureHeader] = try signer.signature(
            nonce: nonce, path: request.uri.path, body: body)
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
