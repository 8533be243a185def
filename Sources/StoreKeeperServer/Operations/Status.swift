import Foundation

/// The version this server reports in `/v1/status` and stamps on kept rejected proofs.
public enum StoreKeeperVersion {
    public static let current = "0.8.0"

    /// The commit this binary was built from: the `STOREKEEPER_COMMIT` file a release puts
    /// beside the executable (`scripts/release`), else nil (a development build). The
    /// executable's real path (Linux's `/proc/self/exe`), never `argv[0]`: a command found on
    /// `PATH` is a bare name, which would read a file of the current directory.
    public static var commit: String? {
        guard let executable = executablePath else { return nil }
        let file = URL(fileURLWithPath: executable).resolvingSymlinksInPath().deletingLastPathComponent()
            .appendingPathComponent("STOREKEEPER_COMMIT")
        guard let data = FileManager.default.contents(atPath: file.path) else { return nil }
        let text = String(decoding: data.prefix(64), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return text.isEmpty || !text.allSatisfy(\.isHexDigit) ? nil : text
    }

    /// The running executable's absolute path.
    static var executablePath: String? {
        if let linked = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            return linked
        }
        return Bundle.main.executablePath.flatMap { $0.hasPrefix("/") ? $0 : nil }
    }

    /// What `storekeeper --version` prints.
    public static var description: String {
        "storekeeper \(current) (" + (commit.map { "commit \($0)" } ?? "a development build, commit unknown") + ")"
    }
}

/// `GET /v1/status`: what this server is and what it trusts (docs/api.md "Operators").
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
    /// Every answer-signing key an app build should carry now (`auth.responseSigningKeys`): the
    /// one answers are signed with first (`use: "signing"`), then the others (`use: "published"`:
    /// the next one during a rotation).
    var responseSigningKeys: [SigningKey]?

    struct SigningKey: Encodable {
        var algorithm = "Ed25519"
        /// What `StoreKeeper-Signature-Key` and a v2 signature name: the first 16 hex digits of
        /// the SHA-256 of the raw public key.
        var id: String
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
        let keys = app.responseSigningKeys.all.enumerated().map { index, signer in
            SigningKey(
                id: signer.keyId, use: index == 0 ? "signing" : "published", publicKey: signer.publicKeyBase64,
                sha256: signer.fingerprint)
        }
        responseSigningKey = keys.first
        responseSigningKeys = keys.isEmpty ? nil : keys
    }
}
