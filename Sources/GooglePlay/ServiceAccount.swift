import AsyncHTTPClient
import Foundation
import JWTKit
import KeyFiles
import NIOCore
import NIOHTTP1
import Synchronization

/// A Google service account's JSON key (`type: service_account`): what signs the assertion
/// exchanged for access tokens (google-play.md §1).
public struct ServiceAccountKey: Codable, Sendable, Hashable {
    public var type: String?
    public var projectId: String?
    public var privateKeyId: String?
    public var privateKey: String
    public var clientEmail: String
    public var tokenURI: String

    enum CodingKeys: String, CodingKey {
        case type
        case projectId = "project_id"
        case privateKeyId = "private_key_id"
        case privateKey = "private_key"
        case clientEmail = "client_email"
        case tokenURI = "token_uri"
    }

    public init(
        projectId: String?, privateKeyId: String?, privateKey: String, clientEmail: String, tokenURI: String
    ) {
        self.type = "service_account"
        self.projectId = projectId
        self.privateKeyId = privateKeyId
        self.privateKey = privateKey
        self.clientEmail = clientEmail
        self.tokenURI = tokenURI
    }

    /// Reads and checks a key file: a service account's, with an RSA private key.
    public static func load(path: String) throws -> ServiceAccountKey {
        guard let data = FileManager.default.contents(atPath: path), data.count <= 64 * 1024 else {
            throw GooglePlayError(.configuration, "cannot read the service-account key file \(path)")
        }
        let key: ServiceAccountKey
        do {
            key = try JSONDecoder().decode(ServiceAccountKey.self, from: data)
        } catch {
            throw GooglePlayError(.configuration, "\(path) is not a Google service-account JSON key: \(error)")
        }
        guard key.type == nil || key.type == "service_account" else {
            throw GooglePlayError(.configuration, "\(path): type is '\(key.type ?? "")', not service_account")
        }
        guard (try? Insecure.RSA.PrivateKey(pem: key.privateKey)) != nil else {
            throw GooglePlayError(.configuration, "\(path): private_key is not an RSA private key in PEM")
        }
        // The assertion is exchanged for a bearer token there: never in clear text, but on this
        // machine (the local Google Play in tests and the demo).
        guard let url = URL(string: key.tokenURI), let scheme = url.scheme?.lowercased(),
            scheme == "https" || (scheme == "http" && ["127.0.0.1", "localhost", "::1"].contains(url.host ?? ""))
        else {
            throw GooglePlayError(.configuration, "\(path): token_uri must be an https URL")
        }
        if let exposure = KeyFiles.exposure(of: path) { throw GooglePlayError(.configuration, exposure) }
        return key
    }
}

/// The assertion's claims (RS256, at most one hour).
public struct ServiceAccountAssertion: JWTPayload {
    public var iss: IssuerClaim
    public var scope: String
    public var aud: AudienceClaim
    public var iat: IssuedAtClaim
    public var exp: ExpirationClaim

    public static let androidPublisherScope = "https://www.googleapis.com/auth/androidpublisher"

    public init(issuer: String, audience: String, issuedAt: Date, lifetime: TimeInterval = 3600) {
        iss = IssuerClaim(value: issuer)
        scope = Self.androidPublisherScope
        aud = AudienceClaim(value: audience)
        iat = IssuedAtClaim(value: issuedAt)
        exp = ExpirationClaim(value: issuedAt.addingTimeInterval(min(lifetime, 3600)))
    }

    public func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
    }
}

/// Access tokens for one service account: signed assertions exchanged at `token_uri`, cached
/// for their lifetime less five minutes, one refresh at a time (google-play.md §1).
public actor AccessTokenSource {
    public let key: ServiceAccountKey
    let http: HTTPClient
    let keys: JWTKeyCollection
    var cached: (token: String, renewAt: ContinuousClock.Instant)?
    var refreshing: Task<String, any Error>?
    let timeout: Duration

    public init(key: ServiceAccountKey, http: HTTPClient = .shared, timeout: Duration = .seconds(10)) async throws {
        self.key = key
        self.http = http
        self.timeout = timeout
        self.keys = await JWTKeyCollection().add(
            rsa: try Insecure.RSA.PrivateKey(pem: key.privateKey), digestAlgorithm: .sha256,
            kid: key.privateKeyId.map { JWKIdentifier(string: $0) })
    }

    /// A valid access token, fetched when none is cached or it expires within five minutes.
    /// The cached token while it is fresh, read without a hop to the actor (every Developer
    /// API call asks for it); nil when `token()` must fetch one.
    public nonisolated var freshToken: String? {
        fresh.withLock { cached in cached.flatMap { ContinuousClock.now < $0.renewAt ? $0.token : nil } }
    }
    // A copy of `cached`, written with it.
    private nonisolated let fresh = Mutex<(token: String, renewAt: ContinuousClock.Instant)?>(nil)

    public func token() async throws -> String {
        if let cached, ContinuousClock.now < cached.renewAt { return cached.token }
        if let refreshing { return try await refreshing.value }
        let task = Task { try await self.fetch() }
        refreshing = task
        defer { refreshing = nil }
        return try await task.value
    }

    /// Forgets the cached token (after an API 401: retry once with a new one).
    public func invalidate() {
        cached = nil
        fresh.withLock { $0 = nil }
    }

    func fetch() async throws -> String {
        let assertion = try await keys.sign(
            ServiceAccountAssertion(issuer: key.clientEmail, audience: key.tokenURI, issuedAt: Date()),
            kid: key.privateKeyId.map { JWKIdentifier(string: $0) })
        var request = HTTPClientRequest(url: key.tokenURI)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)"
        request.body = .bytes(ByteBuffer(string: form))
        let answer = try await GoogleHTTP.exchange(http, request, timeout: timeout, maxBody: 64 * 1024)
        struct TokenAnswer: Decodable {
            var accessToken: String?
            var expiresIn: Int?
            var error: String?
            var errorDescription: String?

            enum CodingKeys: String, CodingKey {
                case accessToken = "access_token"
                case expiresIn = "expires_in"
                case error
                case errorDescription = "error_description"
            }
        }
        let decoded = try? JSONDecoder().decode(TokenAnswer.self, from: Data(answer.body))
        guard answer.isSuccess, let token = decoded?.accessToken, !token.isEmpty else {
            let detail = [decoded?.error, decoded?.errorDescription].compactMap { $0 }.joined(separator: ": ")
            throw GooglePlayError(
                answer.status >= 500 || answer.status == 429 ? .unavailable : .unauthorized,
                "Google's token endpoint answered \(answer.status)\(detail.isEmpty ? "" : " (\(detail))")",
                status: answer.status)
        }
        let lifetime = max(60, min(decoded?.expiresIn ?? 3600, 3600))
        let entry = (token: token, renewAt: ContinuousClock.now + .seconds(max(30, lifetime - 300)))
        cached = entry
        fresh.withLock { $0 = entry }
        return token
    }
}

/// One HTTP exchange with a Google host, transport failures classified as retryable.
enum GoogleHTTP {
    struct Answer {
        var status: Int
        var body: [UInt8]
        var isSuccess: Bool { (200..<300).contains(status) }
    }

    static func exchange(_ client: HTTPClient, _ request: HTTPClientRequest, timeout: Duration, maxBody: Int)
        async throws -> Answer
    {
        do {
            let (seconds, attoseconds) = timeout.components
            let response = try await client.execute(
                request, timeout: .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
            let body = try await response.body.collect(upTo: maxBody)
            return Answer(status: Int(response.status.code), body: Array(buffer: body))
        } catch let error as HTTPClientError
            where error == .deadlineExceeded || error == .readTimeout || error == .connectTimeout
        {
            throw GooglePlayError(.unavailable, "Google did not answer in time")
        } catch {
            throw GooglePlayError(.unavailable, "cannot reach Google: \(error)")
        }
    }

    /// One Developer API call through the hand-written client (the hot path).
    static func exchange(
        _ connections: HTTP1Connections, _ method: HTTPMethod, origin: HTTP1Connections.Origin, target: String,
        headers: [(String, String)], body: [UInt8]?, timeout: Duration, maxBody: Int
    ) async throws -> Answer {
        let (seconds, attoseconds) = timeout.components
        do {
            let answer = try await connections.exchange(
                method, origin: origin, target: target, headers: headers, body: body,
                deadline: .now() + .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000),
                maxBody: maxBody)
            return Answer(status: answer.status, body: answer.body)
        } catch HTTP1Connections.Failure.deadlineExceeded {
            throw GooglePlayError(.unavailable, "Google did not answer in time")
        } catch {
            throw GooglePlayError(.unavailable, "cannot reach Google: \(error)")
        }
    }
}

/// What went wrong talking to Google, classified as the spec's §9 table does.
public struct GooglePlayError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// 404/410, 400 `invalidValue`: the token (or package) is unknown for good.
        case notFound
        /// 400 `invalidPurchaseState` and other final refusals of the request.
        case refused
        /// 401/403: credentials or Console permissions; an operator must act.
        case unauthorized
        /// 409, 429, 5xx, timeouts, network: try again with backoff.
        case unavailable
        /// A malformed answer, or a local configuration problem.
        case configuration
        case malformed
    }

    public var kind: Kind
    public var message: String
    public var status: Int?
    public var reason: String?

    public init(_ kind: Kind, _ message: String, status: Int? = nil, reason: String? = nil) {
        self.kind = kind
        self.message = message
        self.status = status
        self.reason = reason
    }

    public var isRetryable: Bool { kind == .unavailable }
    public var description: String { message }
}
