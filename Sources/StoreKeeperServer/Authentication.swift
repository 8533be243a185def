import Crypto
import Foundation
import Hummingbird
import JWTKit

/// Who is calling: an operator/back end with a secret key, or an app with a client token
/// bound to one account (API.md "Authentication").
public enum Caller: Sendable, Hashable {
    case secretKey
    case account(String)

    /// Whether the caller may act on `accountId`.
    func mayActOn(_ accountId: String) -> Bool {
        switch self {
        case .secretKey: true
        case .account(let own): own == accountId
        }
    }

    func require(_ accountId: String) throws {
        guard mayActOn(accountId) else { throw APIError.forbidden("a client token may act only on its own account") }
    }

    func requireSecretKey() throws {
        guard self == .secretKey else { throw APIError.forbidden("operators' endpoints need a secret key") }
    }
}

/// The claims of a client token: HS256, `sub` = accountId, `exp` required.
public struct ClientTokenClaims: JWTPayload {
    public var sub: SubjectClaim
    public var exp: ExpirationClaim

    public init(accountId: String, expires: Date) {
        sub = SubjectClaim(value: accountId)
        exp = ExpirationClaim(value: expires)
    }

    public func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
        guard !sub.value.isEmpty else { throw JWTError.claimVerificationFailure(failedClaim: sub, reason: "empty sub") }
    }
}

struct Authenticator: Sendable {
    let secretKeyDigests: [SHA256.Digest]
    let clientTokens: JWTKeyCollection?

    init(secretKeys: [String], clientTokenSecret: String?) async {
        secretKeyDigests = secretKeys.filter { !$0.isEmpty }.map { SHA256.hash(data: Data($0.utf8)) }
        if let clientTokenSecret, !clientTokenSecret.isEmpty {
            clientTokens = await JWTKeyCollection().add(
                hmac: HMACKey(from: clientTokenSecret), digestAlgorithm: .sha256)
        } else {
            clientTokens = nil
        }
    }

    func authenticate(_ request: Request) async throws -> Caller {
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer ") else {
            throw APIError.unauthenticated
        }
        let credential = String(header.dropFirst("Bearer ".count)).trimmingCharacters(in: .whitespaces)
        guard !credential.isEmpty else { throw APIError.unauthenticated }
        // Comparing digests in constant time: equal-length inputs, no early exit on a secret.
        let presented = SHA256.hash(data: Data(credential.utf8))
        var matched = false
        for digest in secretKeyDigests where Self.constantTimeEqual(digest, presented) { matched = true }
        if matched { return .secretKey }
        if let clientTokens, credential.split(separator: ".").count == 3,
            let claims = try? await clientTokens.verify(credential, as: ClientTokenClaims.self)
        {
            return .account(claims.sub.value)
        }
        throw APIError.unauthenticated
    }

    static func constantTimeEqual(_ lhs: SHA256.Digest, _ rhs: SHA256.Digest) -> Bool {
        var difference: UInt8 = 0
        for (a, b) in zip(lhs, rhs) { difference |= a ^ b }
        return difference == 0
    }
}

/// Lets a request through only with a secret key: the local App Store's routes beside a
/// configuration (`localAppStore.enabled`), where an app user must not mint purchases.
struct SecretKeyRequired<Context: RequestContext>: RouterMiddleware {
    let authenticator: Authenticator

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        try await authenticator.authenticate(request).requireSecretKey()
        return try await next(request, context)
    }
}
