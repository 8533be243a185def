import AsyncHTTPClient
import Foundation
import JWTKit
import NIOCore

/// The OIDC token a Pub/Sub push carries (google-play.md §2.4).
public struct PushTokenClaims: JWTPayload {
    public var iss: IssuerClaim
    public var aud: AudienceClaim
    public var exp: ExpirationClaim
    public var iat: IssuedAtClaim?
    public var email: String?
    public var emailVerified: Bool?
    public var sub: SubjectClaim?

    enum CodingKeys: String, CodingKey {
        case iss, aud, exp, iat, email, sub
        case emailVerified = "email_verified"
    }

    public init(audience: String, email: String, issuedAt: Date, lifetime: TimeInterval = 3600) {
        iss = IssuerClaim(value: "https://accounts.google.com")
        aud = AudienceClaim(value: audience)
        iat = IssuedAtClaim(value: issuedAt)
        exp = ExpirationClaim(value: issuedAt.addingTimeInterval(lifetime))
        self.email = email
        emailVerified = true
        sub = SubjectClaim(value: "1" + String(abs(email.hashValue) % 1_000_000_000))
    }

    public func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired(currentDate: Date().addingTimeInterval(-60))
    }
}

/// Verifies a push's `Authorization: Bearer <JWT>`: RS256 against Google's keys (the JWKS at
/// `certificatesURL`, cached an hour, fetched again once for an unknown `kid` — at most once a
/// minute, one fetch at a time; the token is verified with exactly the key its `kid` names),
/// `iss` Google's, `aud` and `email` as configured, `email_verified`, not expired.
public actor PushVerifier {
    public struct Refusal: Error, Sendable, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }

    let audience: String
    let serviceAccount: String
    let certificatesURL: String
    let http: HTTPClient
    var keys: JWTKeyCollection?
    /// The `kid`s of the keys fetched: a token naming another is refused, whatever key signed it.
    var kids: Set<String> = []
    var inFlight: Task<Void, any Error>?
    var fetchedAt: ContinuousClock.Instant?
    /// A failed fetch: anyone can POST a push, so a failing certificates URL is asked again at
    /// most every 10 s, not once per request.
    var failedAt: ContinuousClock.Instant?
    /// Fetches attempted (for tests).
    var fetches = 0

    /// The verifier's time (tests move it past the one-minute re-fetch bound).
    let now: @Sendable () -> ContinuousClock.Instant

    public init(
        audience: String, serviceAccount: String, certificatesURL: String, http: HTTPClient = .shared,
        clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.now = clock
        self.audience = audience
        self.serviceAccount = serviceAccount
        self.certificatesURL = certificatesURL
        self.http = http
    }

    /// The verified claims, or `Refusal` saying why not.
    public func verify(authorization: String?) async throws(Refusal) -> PushTokenClaims {
        guard let authorization, authorization.hasPrefix("Bearer "), authorization.count <= 8192 else {
            throw Refusal(message: "no OIDC bearer token")
        }
        let token = String(authorization.dropFirst("Bearer ".count))
        let claims: PushTokenClaims
        do {
            claims = try await verifySignature(token)
        } catch {
            throw Refusal(message: "the push's token does not verify against Google's keys: \(error)")
        }
        guard ["https://accounts.google.com", "accounts.google.com"].contains(claims.iss.value) else {
            throw Refusal(message: "issuer '\(claims.iss.value.prefix(80))' is not Google's")
        }
        guard claims.aud.value.contains(audience) else {
            throw Refusal(message: "audience is not the configured pushAudience")
        }
        guard claims.email == serviceAccount else {
            throw Refusal(message: "email is not the configured pushServiceAccount")
        }
        guard claims.emailVerified == true else { throw Refusal(message: "email_verified is not true") }
        return claims
    }

    func verifySignature(_ token: String) async throws -> PushTokenClaims {
        // Only RS256 is Google's: anything else is refused before a key is looked at. The `kid`
        // names the key: it is looked up here, never left to a collection's default key.
        let header = token.split(separator: ".", maxSplits: 1).first.map(String.init) ?? ""
        guard let headerData = Data(base64URL: header),
            let json = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            json["alg"] as? String == "RS256"
        else { throw Refusal(message: "alg is not RS256") }
        guard let kid = json["kid"] as? String, !kid.isEmpty, kid.utf8.count <= 256 else {
            throw Refusal(message: "the token names no key (kid)")
        }
        if keys == nil || fetchedAt.map({ now() - $0 > .seconds(3600) }) == true {
            try await refresh()
        }
        if !kids.contains(kid) {
            // A key Google just added: fetch once more — one fetch at a time, at most once a minute.
            if fetchedAt.map({ now() - $0 > .seconds(60) }) ?? true {
                try await refresh()
            }
            guard kids.contains(kid) else {
                throw Refusal(message: "key '\(kid.prefix(64))' is not one of Google's push keys")
            }
        }
        return try await keys!.verify(token, as: PushTokenClaims.self)
    }

    /// Fetches the keys; concurrent callers share one fetch in flight.
    func refresh() async throws {
        if let inFlight {
            try await inFlight.value
            return
        }
        if let failedAt, now() - failedAt < .seconds(10) {
            throw GooglePlayError(.unavailable, "Google's push certificates failed less than 10 s ago")
        }
        let task = Task { try await self.fetch() }
        inFlight = task
        defer { inFlight = nil }
        do {
            try await task.value
            failedAt = nil
        } catch {
            failedAt = now()
            throw error
        }
    }

    func fetch() async throws {
        fetches += 1
        var request = HTTPClientRequest(url: certificatesURL)
        request.method = .GET
        let answer = try await GoogleHTTP.exchange(http, request, timeout: .seconds(10), maxBody: 256 * 1024)
        guard answer.isSuccess else {
            throw GooglePlayError(.unavailable, "Google's push certificates answered \(answer.status)")
        }
        let jwks = try JSONDecoder().decode(JWKS.self, from: Data(answer.body))
        keys = try await JWTKeyCollection().add(jwks: jwks)
        kids = Set(jwks.keys.compactMap { $0.keyIdentifier?.string })
        fetchedAt = now()
    }
}

extension Data {
    /// Base64url without padding, as JWTs carry their parts.
    public init?(base64URL text: String) {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.utf8.count % 4 != 0 { base64 += "=" }
        self.init(base64Encoded: base64)
    }

    public func base64URLEncodedString() -> String {
        base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
