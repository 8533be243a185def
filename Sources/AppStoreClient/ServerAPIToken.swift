import Foundation
import JWTKit

/// The claims of an App Store Server API bearer token (Apple's App Store Server API documentation §2).
public struct ServerAPIClaims: JWTPayload, Equatable {
    public var iss: IssuerClaim
    public var iat: IssuedAtClaim
    public var exp: ExpirationClaim
    public var aud: AudienceClaim
    public var bid: String

    public static let audience = "appstoreconnect-v1"
    /// Apple rejects tokens that live longer than this.
    public static let maxLifetime: TimeInterval = 60 * 60

    public init(issuerId: String, bundleId: String, issuedAt: Date, lifetime: TimeInterval = 5 * 60) {
        self.iss = IssuerClaim(value: issuerId)
        self.iat = IssuedAtClaim(value: issuedAt)
        self.exp = ExpirationClaim(value: issuedAt.addingTimeInterval(min(lifetime, Self.maxLifetime)))
        self.aud = AudienceClaim(value: [Self.audience])
        self.bid = bundleId
    }

    /// Apple's acceptance rules, so the local App Store can refuse tokens exactly as Apple does.
    public func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
        try aud.verifyIntendedAudience(includes: Self.audience)
        guard exp.value.timeIntervalSince(iat.value) <= Self.maxLifetime, exp.value > iat.value else {
            throw JWTError.claimVerificationFailure(failedClaim: exp, reason: "exp must be within 60 minutes of iat")
        }
    }
}

/// An App Store Connect "In-App Purchase" key: the .p8 private key with its ids.
public struct ServerAPICredentials: Sendable {
    public var issuerId: String
    public var keyId: String
    /// PKCS#8 PEM of the P-256 private key (the `.p8` file's contents).
    public var privateKeyPEM: String
    public var bundleId: String

    public init(issuerId: String, keyId: String, privateKeyPEM: String, bundleId: String) {
        self.issuerId = issuerId
        self.keyId = keyId
        self.privateKeyPEM = privateKeyPEM
        self.bundleId = bundleId
    }
}

/// Mints a fresh ES256 token per request, as Apple recommends.
struct ServerAPITokenSigner: Sendable {
    let keys: JWTKeyCollection
    let credentials: ServerAPICredentials

    init(credentials: ServerAPICredentials) async throws {
        let key = try ES256PrivateKey(pem: credentials.privateKeyPEM)
        self.keys = await JWTKeyCollection().add(ecdsa: key, kid: JWKIdentifier(string: credentials.keyId))
        self.credentials = credentials
    }

    func token(now: Date = Date()) async throws -> String {
        var header = JWTHeader()
        header.typ = "JWT"
        return try await keys.sign(
            ServerAPIClaims(issuerId: credentials.issuerId, bundleId: credentials.bundleId, issuedAt: now),
            kid: JWKIdentifier(string: credentials.keyId), header: header)
    }
}
