import AppStoreModels
import AppStoreVerification
import Crypto
import Foundation
import X509

/// What this server trusts, decided once from the configuration: the roots every signed
/// transaction, notification and app receipt must chain to, and the app identity they must
/// carry. Every verifier of the server is built from it, and `/v1/status`, the startup log and
/// `storekeeper config check` show it.
///
/// - demo mode (no configuration at all): the built-in local App Store, plus Apple's roots;
/// - any configuration: Apple Root CA G3 and Apple Inc. Root (or `apple.rootCertificates`),
///   plus the local App Store's roots only when `localAppStore.enabled` is true.
public struct TrustPolicy: Sendable {
    /// One trusted root certificate.
    public struct Root: Sendable, Hashable {
        /// The certificate's subject, as RFC 4514 text.
        public var subject: String
        /// SHA-256 of the DER certificate, lowercase hex.
        public var sha256: String
        /// Where it comes from: `built-in`, the file named in `apple.rootCertificates`, or `local App Store`.
        public var source: String
        /// Whether it anchors signed data (JWS) and/or app receipts (PKCS#7).
        public var anchorsSignedData: Bool
        public var anchorsReceipts: Bool
        public var der: [UInt8]
    }

    public let mode: ServerConfiguration.Mode
    public let roots: [Root]
    public let bundleId: String
    public let appAppleId: Int64?
    public let environments: Set<AppStoreEnvironment>
    /// The deployment's further App Store apps, verified with the same roots and environments.
    public let otherApps: [AppIdentity]
    public let localAppStoreTrusted: Bool

    /// The trust set of `configuration`; `localAppStoreRoots` are the built-in local App
    /// Store's roots when it runs (demo mode or `localAppStore.enabled`).
    public init(configuration: ServerConfiguration, localAppStoreRoots: [[UInt8]]? = nil) throws {
        mode = configuration.mode
        bundleId = configuration.bundleId ?? "com.example.app"
        appAppleId = configuration.appAppleId
        environments = configuration.environments
        otherApps = configuration.otherAppStoreApps.map {
            AppIdentity(bundleId: $0.bundleId, appAppleId: $0.appAppleId)
        }
        var roots: [Root] = []
        if configuration.rootCertificateFiles.isEmpty {
            roots.append(
                try Self.root(
                    AppleRootCertificates.appleRootCAG3DER, source: "built-in", signedData: true, receipts: false))
            roots.append(
                try Self.root(
                    AppleRootCertificates.appleIncRootDER, source: "built-in", signedData: false, receipts: true))
        } else {
            for file in configuration.rootCertificateFiles {
                for der in try ServerConfiguration.rootCertificates(in: file) {
                    roots.append(try Self.root(der, source: file, signedData: true, receipts: true))
                }
            }
        }
        let local = configuration.usesLocalAppStore ? (localAppStoreRoots ?? []) : []
        for der in local {
            roots.append(try Self.root(der, source: "local App Store", signedData: true, receipts: true))
        }
        localAppStoreTrusted = !local.isEmpty
        self.roots = roots
    }

    static func root(_ der: [UInt8], source: String, signedData: Bool, receipts: Bool) throws -> Root {
        let subject: String
        do {
            subject = try Certificate(derEncoded: der).subject.description
        } catch {
            throw ServerConfiguration.Invalid(key: "apple.rootCertificates", "\(source): not an X.509 certificate")
        }
        let digest = SHA256.hash(data: der).lowercaseHex
        return Root(
            subject: subject, sha256: digest, source: source, anchorsSignedData: signedData, anchorsReceipts: receipts,
            der: der)
    }

    /// The verifier of signed transactions, renewal info and notifications under this policy.
    public func signedDataVerifier() throws -> SignedDataVerifier {
        var configuration = VerificationConfiguration(
            trustedRoots: roots.filter(\.anchorsSignedData).map(\.der), bundleId: bundleId, appAppleId: appAppleId,
            environments: environments)
        configuration.otherApps = otherApps
        return try SignedDataVerifier(configuration)
    }

    /// The verifier of StoreKit 1 app receipts under this policy.
    public func receiptVerifier() throws -> AppReceiptVerifier {
        var verifier = try AppReceiptVerifier(
            trustedRoots: roots.filter(\.anchorsReceipts).map(\.der), bundleId: bundleId, environments: environments)
        verifier.otherBundleIds = Set(otherApps.map(\.bundleId))
        return verifier
    }

    /// Verifiers that say only where a proof comes from: its signature and its chain to one of
    /// the configured roots or Apple's built-in roots, with no bundle, app or environment check.
    /// A rejected proof that passes them is kept whole for re-verification (a wrong bundle id,
    /// environment or `apple.rootCertificates` fixed later); anything else is kept as its hash,
    /// code and account only (`RejectedProofStore`).
    public func provenanceVerifiers() throws -> (signedData: SignedDataVerifier, receipts: AppReceiptVerifier) {
        let signedRoots =
            roots.filter(\.anchorsSignedData).map(\.der) + [AppleRootCertificates.appleRootCAG3DER]
        let receiptRoots = roots.filter(\.anchorsReceipts).map(\.der) + [AppleRootCertificates.appleIncRootDER]
        return (
            try SignedDataVerifier(
                .init(trustedRoots: Self.unique(signedRoots), bundleId: nil, appAppleId: nil, environments: nil)),
            try AppReceiptVerifier(trustedRoots: Self.unique(receiptRoots), bundleId: nil, environments: nil)
        )
    }

    static func unique(_ roots: [[UInt8]]) -> [[UInt8]] {
        var seen = Set<[UInt8]>()
        return roots.filter { seen.insert($0).inserted }
    }

    /// Accepted environments in a stable order (Production first).
    public var environmentList: [String] {
        environments.map(\.rawValue).sorted { ($0 == "Production" ? 0 : 1, $0) < ($1 == "Production" ? 0 : 1, $1) }
    }

    /// What startup logs and `config check` prints, one line each.
    public var lines: [String] {
        var lines = [
            "mode: \(mode.rawValue)\(mode == .demo ? " (try-out only: trusts the built-in local App Store)" : "")",
            "bundleId: \(bundleId)", "appAppleId: \(appAppleId.map(String.init) ?? "-")",
            "environments: \(environmentList.joined(separator: ", "))",
            "local App Store trusted: \(localAppStoreTrusted)",
        ]
        for app in otherApps {
            lines.insert(
                "also bundleId: \(app.bundleId), appAppleId: \(app.appAppleId.map(String.init) ?? "-")", at: 3)
        }
        for root in roots {
            let uses = [root.anchorsSignedData ? "signed data" : nil, root.anchorsReceipts ? "receipts" : nil]
                .compactMap { $0 }.joined(separator: " + ")
            lines.append("trusted root (\(root.source), \(uses)): \(root.subject) sha256=\(root.sha256)")
        }
        return lines
    }
}
