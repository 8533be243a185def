import Foundation

/// The version this server reports in `/v1/status` and stamps on kept rejected proofs.
public enum StoreKeeperVersion {
    public static let current = "0.7.0"
}

/// `GET /v1/status`: what this server is and what it trusts (API.md "Operators").
struct StatusJSON: Encodable {
    struct Root: Encodable {
        var subject: String
        var sha256: String
        var source: String
        var anchors: [String]
    }

    var version: String
    var mode: String
    var trustedRoots: [Root]
    var bundleId: String
    var appAppleId: String?
    var environments: [String]
    var database: String
    var localAppStoreTrusted: Bool
    var localAppStoreMounted: Bool
    /// Seconds this server's clock is ahead of Apple's (negative: behind), measured on Apple's
    /// last 401; absent until then.
    var appleClockSkewSeconds: Double?
    /// The public half of `auth.responseSigningKey` (absent when answers are not signed).
    var responseSigningKey: SigningKey?
    /// Every answer-signing key an app build should carry now: the one answers are signed with
    /// (`use: "signing"`), and during a rotation the next one (`use: "next"`).
    var responseSigningKeys: [SigningKey]?

    struct SigningKey: Encodable {
        var algorithm = "Ed25519"
        /// What `StoreKeeper-Signature-Key` and a v2 signature name.
        var keyId: String
        var use: String
        /// The raw 32-byte public key, base64: what the app is configured with.
        var publicKey: String
        /// SHA-256 of the raw public key, lowercase hex.
        var sha256: String
    }

    init(_ app: StoreKeeperApp) {
        version = StoreKeeperVersion.current
        mode = app.trust.mode.rawValue
        trustedRoots = app.trust.roots.map {
            Root(
                subject: $0.subject, sha256: $0.sha256, source: $0.source,
                anchors: [$0.anchorsSignedData ? "signedData" : nil, $0.anchorsReceipts ? "receipts" : nil]
                    .compactMap { $0 })
        }
        bundleId = app.trust.bundleId
        appAppleId = app.trust.appAppleId.map(String.init)
        environments = app.trust.environmentList
        database = app.database.kind.rawValue
        localAppStoreTrusted = app.trust.localAppStoreTrusted
        localAppStoreMounted = app.localAppStore != nil
        appleClockSkewSeconds = app.clock.withLock { $0?.skewSeconds }
        responseSigningKey = app.responseSigningKeys.current.map {
            SigningKey(keyId: $0.keyId, use: "signing", publicKey: $0.publicKeyBase64, sha256: $0.fingerprint)
        }
        if let current = responseSigningKey {
            responseSigningKeys =
                [current]
                + (app.responseSigningKeys.next.map {
                    [SigningKey(keyId: $0.keyId, use: "next", publicKey: $0.publicKeyBase64, sha256: $0.fingerprint)]
                } ?? [])
        }
    }
}
