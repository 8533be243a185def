import AppStoreModels
import Crypto
import Foundation
import Hummingbird
import JWTKit
import StoreKeeperCore

/// Who is calling: an operator/back end with a secret key (`auth.secretKeys`: admin of every
/// app), an operator key with a scope (`auth.keys`), or an app with a client token bound to one
/// account (docs/api.md "Authentication").
public enum Caller: Sendable, Hashable {
    case secretKey
    case key(OperatorKey)
    case account(String)

    /// An operator's key of any scope.
    var isKey: Bool {
        switch self {
        case .secretKey, .key: true
        case .account: false
        }
    }

    /// What it may do: `admin` for `auth.secretKeys`; nil for a client token.
    var scope: KeyScope? {
        switch self {
        case .secretKey: .admin
        case .key(let key): key.scope
        case .account: nil
        }
    }

    /// Who it is in the audit log: the key's label (`secret key` for `auth.secretKeys`).
    var label: String {
        switch self {
        case .secretKey: "secret key"
        case .key(let key): key.label
        case .account(let id): "account \(Identifiers.quoted(id))"
        }
    }

    /// Who did it, in the audit log: `operator:<label> (<scope>)` — `operator:secret key (admin)`
    /// for `auth.secretKeys` — with the origin when it is not the API itself:
    /// `operator:<label> (<scope>, dashboard)`, `operator:<label> (<scope>, mcp)`.
    var auditActor: String {
        switch self {
        case .secretKey: "operator:secret key (admin)"
        case .key(let key): "operator:\(key.label) (\(key.scope.rawValue)\(key.origin.map { ", \($0)" } ?? ""))"
        case .account(let id): "account:\(id)"
        }
    }

    /// The same caller acting through `origin` (the MCP desk names itself; the dashboard's
    /// roles are keys): the audit log says where each write came from.
    func through(_ origin: String) -> Caller {
        switch self {
        case .secretKey:
            var key = OperatorKey(label: "secret key", scope: .admin, secret: "")
            key.origin = origin
            return .key(key)
        case .key(var key):
            key.origin = origin
            return .key(key)
        case .account: return self
        }
    }

    /// Whether the caller may act on `accountId`.
    func mayActOn(_ accountId: String) -> Bool {
        switch self {
        case .secretKey, .key: true
        // Byte-wise, as the database compares: `==` would let "\u{212A}ate" act on "Kate".
        case .account(let own): Identifiers.same(own, accountId)
        }
    }

    /// A client token acts on its own account only; a key needs `scope` (a back end's
    /// purchases and orders: admin; support's actions: support; reads: read).
    func require(_ accountId: String, scope: KeyScope = .admin) throws {
        if isKey { return try requireScope(scope) }
        guard mayActOn(accountId) else { throw APIError.forbidden("a client token may act only on its own account") }
    }

    /// Operators' endpoints: a key whose scope includes `scope`.
    func requireScope(_ scope: KeyScope) throws {
        guard let own = self.scope else { throw APIError.forbidden("operators' endpoints need a secret key") }
        guard own >= scope else {
            throw APIError.forbidden(
                "key '\(label)' has the \(own.rawValue) scope; this needs \(scope.rawValue)")
        }
    }

    /// Operators' configuration-level endpoints: an admin key.
    func requireSecretKey() throws { try requireScope(.admin) }

    /// Whether it may see and act on a row of `appId`.
    func covers(app appId: String?) -> Bool {
        switch self {
        case .secretKey: true
        case .key(let key): key.covers(app: appId)
        case .account: true
        }
    }

    /// The apps a key is limited to (nil: every app).
    var limitedApps: Set<String>? {
        if case .key(let key) = self { return key.apps }
        return nil
    }

    /// A route that reads or acts on every app's rows at once (the audit log, dead letters,
    /// rejected proofs, revenue, a mass extension…): a key limited to some apps is refused.
    func requireEveryApp(_ what: String) throws {
        guard let apps = limitedApps else { return }
        throw APIError.forbidden(
            "key '\(label)' is limited to apps \(apps.sorted().joined(separator: ", ")); \(what) spans every app")
    }

    /// A route with an `appId` filter: a key limited to some apps must name one of them.
    func requireAppFilter(_ appId: String?) throws {
        guard let apps = limitedApps else { return }
        guard let appId, apps.contains(appId) else {
            throw APIError.forbidden(
                "key '\(label)' is limited to apps \(apps.sorted().joined(separator: ", ")): give appId, one of them")
        }
    }

    /// A row of another app than the key's is as if it did not exist.
    func requireApp(_ appId: String?, notFound: @autoclosure () -> APIError) throws {
        guard covers(app: appId) else { throw notFound() }
    }
}

/// The claims of a client token: HS256, `sub` = accountId, `exp` required (at most
/// `auth.clientTokenMaxLifetimeSeconds` ahead), `nbf` honoured.
public struct ClientTokenClaims: JWTPayload {
    public var sub: SubjectClaim
    public var exp: ExpirationClaim
    public var nbf: NotBeforeClaim?

    public init(accountId: String, expires: Date, notBefore: Date? = nil) {
        sub = SubjectClaim(value: accountId)
        exp = ExpirationClaim(value: expires)
        nbf = notBefore.map { NotBeforeClaim(value: $0) }
    }

    public func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
        try nbf?.verifyNotBefore()
        guard !sub.value.isEmpty else { throw JWTError.claimVerificationFailure(failedClaim: sub, reason: "empty sub") }
    }
}

struct Authenticator: Sendable {
    let secretKeyDigests: [SHA256.Digest]
    let operatorKeys: [(digest: SHA256.Digest, key: OperatorKey)]
    let clientTokens: JWTKeyCollection?
    let clientTokenMaxLifetime: TimeInterval
    let metricsTokenDigest: SHA256.Digest?

    init(
        secretKeys: [String], operatorKeys: [OperatorKey] = [], clientTokenSecret: String?,
        clientTokenMaxLifetimeSeconds: Int = 86_400, metricsToken: String? = nil
    ) async {
        self.operatorKeys = operatorKeys.map { (SHA256.hash(data: Data($0.secret.utf8)), $0) }
        clientTokenMaxLifetime = TimeInterval(clientTokenMaxLifetimeSeconds)
        metricsTokenDigest = metricsToken.map { SHA256.hash(data: Data($0.utf8)) }
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
        // HTTP's optional whitespace (space, tab) around the credential; a header's bytes are
        // never other Unicode spaces.
        var bytes = header.utf8.dropFirst("Bearer ".count)
        while let first = bytes.first, first == 32 || first == 9 { bytes = bytes.dropFirst() }
        while let last = bytes.last, last == 32 || last == 9 { bytes = bytes.dropLast() }
        let credential = String(Substring(bytes))
        guard !credential.isEmpty else { throw APIError.unauthenticated }
        // Comparing digests in constant time: equal-length inputs, no early exit on a secret.
        let presented = SHA256.hash(data: Data(credential.utf8))
        var matched = false
        for digest in secretKeyDigests where Self.constantTimeEqual(digest, presented) { matched = true }
        if matched { return .secretKey }
        var scoped: OperatorKey?
        for entry in operatorKeys where Self.constantTimeEqual(entry.digest, presented) { scoped = scoped ?? entry.key }
        if let scoped { return .key(scoped) }
        if let clientTokens, Self.headerAlgorithm(of: credential) == "HS256",
            let claims = try? await clientTokens.verify(credential, as: ClientTokenClaims.self),
            claims.exp.value.timeIntervalSinceNow <= clientTokenMaxLifetime + Self.clockLeeway
        {
            // The account id in `sub` is an id like any other: NFC, no control characters.
            try StoreKeeperApp.validateAccountId(claims.sub.value)
            return .account(claims.sub.value)
        }
        throw APIError.unauthenticated
    }

    /// Which configured secret key `credential` is (the dashboard's sign-in), compared in
    /// constant time; nil for anything else.
    /// The `auth.keys` entry a presented secret is (digests compared in constant time).
    func operatorKey(_ credential: String) -> OperatorKey? {
        let presented = SHA256.hash(data: Data(credential.utf8))
        var scoped: OperatorKey?
        for entry in operatorKeys where Self.constantTimeEqual(entry.digest, presented) { scoped = scoped ?? entry.key }
        return scoped
    }

    func secretKeyIndex(_ credential: String) -> Int? {
        let presented = SHA256.hash(data: Data(credential.utf8))
        var matched: Int?
        for (index, digest) in secretKeyDigests.enumerated() where Self.constantTimeEqual(digest, presented) {
            matched = matched ?? index
        }
        return matched
    }

    /// Clocks of the app's backend and this server may differ a little.
    static let clockLeeway: TimeInterval = 60

    /// The `alg` of a compact JWS header, read before any key is chosen: client tokens are
    /// HS256 and nothing else.
    static func headerAlgorithm(of token: String) -> String? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count <= 512 else { return nil }
        guard let data = Base64.decodeURL(parts[0]).map({ Data($0) }),
            let header = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        else { return nil }
        return header["alg"] as? String
    }

    /// `/metrics`: a secret key or `auth.metricsToken`.
    func authenticateMetrics(_ request: Request) async throws {
        if let metricsTokenDigest, let header = request.headers[.authorization], header.hasPrefix("Bearer ") {
            let presented = SHA256.hash(data: Data(header.dropFirst("Bearer ".count).utf8))
            if Self.constantTimeEqual(metricsTokenDigest, presented) { return }
        }
        try await authenticate(request).requireSecretKey()
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
