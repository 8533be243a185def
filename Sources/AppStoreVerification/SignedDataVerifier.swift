import AppStoreModels
import Crypto
import Foundation
import SwiftASN1
import X509

/// What a verifier accepts: which roots, which app, which environments, at what time.
public struct VerificationConfiguration: Sendable {
    /// When to evaluate certificate validity.
    public enum ValidationTime: Sendable, Hashable {
        /// At the payload's own signing date (`signedDate`, or `receiptCreationDate` for app
        /// transactions), so old genuine data still verifies after its leaf expired. Apple's
        /// behaviour with online checks off.
        case signedDate
        /// At the current time.
        case now
        /// At a fixed time (tests, reproducing a past decision).
        case fixed(Date)
    }

    /// Trust anchors, DER. Default: Apple Root CA - G3 only. Never taken from the JWS itself.
    public var trustedRoots: [[UInt8]]
    /// The app's bundle id; nil skips the check (support tooling only).
    public var bundleId: String?
    /// The app's App Store id, required to match in Production; nil skips the check.
    public var appAppleId: Int64?
    /// More apps of the same deployment, each with its own bundle id and App Store id: data
    /// signed for any of them (or for `bundleId`) is accepted and checked against its own app.
    public var otherApps: [AppIdentity] = []
    /// Accepted environments; nil accepts any.
    public var environments: Set<AppStoreEnvironment>?
    public var validationTime: ValidationTime
    /// OCSP checks of the chain; off (nil) by default. When on, validity is evaluated now.
    public var onlineChecks: OnlineChecks?
    /// How many verified chains to remember; 0 disables the cache.
    public var chainCacheCapacity: Int

    public init(
        trustedRoots: [[UInt8]] = [AppleRootCertificates.appleRootCAG3DER],
        bundleId: String? = nil,
        appAppleId: Int64? = nil,
        environments: Set<AppStoreEnvironment>? = [.production],
        validationTime: ValidationTime = .signedDate,
        onlineChecks: OnlineChecks? = nil,
        chainCacheCapacity: Int = 64
    ) {
        self.trustedRoots = trustedRoots
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.environments = environments
        self.validationTime = validationTime
        self.onlineChecks = onlineChecks
        self.chainCacheCapacity = chainCacheCapacity
    }
}

/// One App Store app a verifier accepts besides `VerificationConfiguration.bundleId`.
public struct AppIdentity: Sendable, Hashable {
    public var bundleId: String
    /// Its App Store id, required to match in Production; nil skips the check.
    public var appAppleId: Int64?

    public init(bundleId: String, appAppleId: Int64?) {
        self.bundleId = bundleId
        self.appAppleId = appAppleId
    }
}

/// A notification whose payload and every nested signed object were verified.
public struct VerifiedNotification: Hashable, Sendable {
    public var payload: ResponseBodyV2DecodedPayload
    public var transaction: JWSTransactionDecodedPayload?
    public var renewalInfo: JWSRenewalInfoDecodedPayload?
    public var appTransaction: AppTransaction?
}

/// Verifies App Store JWS objects offline (Apple's JWS documentation §2): ES256 only, x5c of exactly
/// three, path leaf → intermediate → a configured root, RFC 5280 validity at the signing date,
/// Apple's OIDs, the signature, then the per-kind checks.
///
/// Thread-safe; keep one per configuration so its verified-chain cache pays off.
public final class SignedDataVerifier: Sendable {
    public let configuration: VerificationConfiguration
    private let roots: [Certificate]
    private let cache: VerifiedChainCache

    public init(_ configuration: VerificationConfiguration) throws {
        self.configuration = configuration
        self.roots = try configuration.trustedRoots.map { der in
            do {
                return try Certificate(derEncoded: der)
            } catch {
                throw VerificationFailure.invalidChain("a configured trust root is not a DER certificate")
            }
        }
        self.cache = VerifiedChainCache(capacity: configuration.chainCacheCapacity)
    }

    /// Number of chains currently cached (diagnostics, tests).
    public var cachedChainCount: Int { cache.count }

    /// Number of cached leaf keys checked through a precomputed table (tests).
    var leafKeyTableCount: Int { cache.tableCount }

    // MARK: Per kind

    /// A `JWSTransaction`: signature, chain, `bundleId`, `environment`.
    public func verifyTransaction(_ jws: String) async throws -> JWSTransactionDecodedPayload {
        let payload = try await verifySignedPayload(
            jws, decode: JWSTransactionDecodedPayload.decode(json:), signingDate: { $0.signedDate })
        try checkBundle(payload.bundleId)
        try checkEnvironment(payload.environment)
        return payload
    }

    /// A `JWSRenewalInfo`: signature, chain, `environment` (it has no bundle id).
    public func verifyRenewalInfo(_ jws: String) async throws -> JWSRenewalInfoDecodedPayload {
        let payload = try await verifySignedPayload(
            jws, decode: JWSRenewalInfoDecodedPayload.decode(json:), signingDate: { $0.signedDate })
        try checkEnvironment(payload.environment)
        return payload
    }

    /// A `JWSAppTransaction`: signature, chain (at `receiptCreationDate`), `bundleId`,
    /// `appAppleId` in Production, `receiptType` as environment.
    public func verifyAppTransaction(_ jws: String) async throws -> AppTransaction {
        let payload = try await verifySignedPayload(jws, as: AppTransaction.self) { $0.receiptCreationDate }
        try checkBundle(payload.bundleId)
        try checkApp(payload.appAppleId, bundleId: payload.bundleId, environment: payload.receiptType)
        try checkEnvironment(payload.receiptType)
        return payload
    }

    /// A notification `signedPayload`, and every signed object nested in it.
    public func verifyNotification(_ signedPayload: String) async throws -> VerifiedNotification {
        let payload = try await verifySignedPayload(
            signedPayload, decode: ResponseBodyV2DecodedPayload.decode(json:), signingDate: { $0.signedDate })
        let bundleId: String?
        let appAppleId: Int64?
        let environment: AppStoreEnvironment?
        if let data = payload.data {
            (bundleId, appAppleId, environment) = (data.bundleId, data.appAppleId, data.environment)
        } else if let summary = payload.summary {
            (bundleId, appAppleId, environment) = (summary.bundleId, summary.appAppleId, summary.environment)
        } else if let token = payload.externalPurchaseToken {
            (bundleId, appAppleId, environment) = (token.bundleId, token.appAppleId, token.environment)
        } else if let appData = payload.appData {
            (bundleId, appAppleId, environment) = (appData.bundleId, appData.appAppleId, appData.environment)
        } else {
            throw VerificationFailure.wrongBundle(expected: configuration.bundleId ?? "(any)", actual: nil)
        }
        try checkBundle(bundleId)
        try checkApp(appAppleId, bundleId: bundleId, environment: environment)
        try checkEnvironment(environment)

        var verified = VerifiedNotification(payload: payload)
        if let signed = payload.data?.signedTransactionInfo {
            verified.transaction = try await verifyTransaction(signed)
        }
        if let signed = payload.data?.signedRenewalInfo {
            verified.renewalInfo = try await verifyRenewalInfo(signed)
        }
        if let signed = payload.appData?.signedAppTransactionInfo {
            verified.appTransaction = try await verifyAppTransaction(signed)
        }
        return verified
    }

    /// A Retention Messaging request (`Get Retention Message`): signature, chain, `appAppleId`
    /// (whenever one is configured — in Sandbox too: an unauthenticated caller must not get our
    /// offers signed for another app's request), `environment`.
    public func verifyRealtimeRequest(_ signedPayload: String) async throws -> DecodedRealtimeRequestBody {
        let payload = try await verifySignedPayload(signedPayload, decode: DecodedRealtimeRequestBody.decode(json:)) {
            $0.signedDate
        }
        // The request names no bundle: it must be one of the configured apps'.
        if configuration.appAppleId != nil || !configuration.otherApps.isEmpty {
            let known = ([configuration.appAppleId] + configuration.otherApps.map(\.appAppleId)).compactMap { $0 }
            if !known.isEmpty, payload.appAppleId.map(known.contains) != true {
                throw VerificationFailure.wrongApp(expected: known[0], actual: payload.appAppleId)
            }
        }
        try checkEnvironment(payload.environment)
        return payload
    }

    /// A notification this server verified when it accepted it, read back from its own
    /// database: decoded, **not verified** — never for anything that came from outside.
    public static func decodeVerifiedEarlier(notification signedPayload: String) throws -> VerifiedNotification {
        let payload = try CompactJWS(signedPayload).decodePayload(ResponseBodyV2DecodedPayload.decode(json:))
        var decoded = VerifiedNotification(payload: payload)
        if let signed = payload.data?.signedTransactionInfo {
            decoded.transaction = try CompactJWS(signed).decodePayload(JWSTransactionDecodedPayload.decode(json:))
        }
        if let signed = payload.data?.signedRenewalInfo {
            decoded.renewalInfo = try CompactJWS(signed).decodePayload(JWSRenewalInfoDecodedPayload.decode(json:))
        }
        if let signed = payload.appData?.signedAppTransactionInfo {
            decoded.appTransaction = try CompactJWS(signed).decodePayload {
                try JSONDecoder().decode(AppTransaction.self, from: Data($0))
            }
        }
        return decoded
    }

    // MARK: Checks

    private func checkBundle(_ actual: String?) throws {
        guard let expected = configuration.bundleId else { return }
        guard actual == expected || configuration.otherApps.contains(where: { $0.bundleId == actual }) else {
            let all = ([expected] + configuration.otherApps.map(\.bundleId)).joined(separator: " or ")
            throw VerificationFailure.wrongBundle(expected: all, actual: actual)
        }
    }

    /// The App Store id of the configured app `bundleId` names (checked by `checkBundle` first).
    private func checkApp(_ actual: Int64?, bundleId: String?, environment: AppStoreEnvironment?) throws {
        let expected =
            configuration.otherApps.first(where: { $0.bundleId == bundleId && bundleId != configuration.bundleId })
            .map(\.appAppleId) ?? configuration.appAppleId
        guard let expected, environment == .production else { return }
        guard actual == expected else { throw VerificationFailure.wrongApp(expected: expected, actual: actual) }
    }

    private func checkEnvironment(_ actual: AppStoreEnvironment?) throws {
        guard let accepted = configuration.environments else { return }
        guard let actual, accepted.contains(actual) else {
            throw VerificationFailure.wrongEnvironment(
                expected: accepted.map(\.rawValue).sorted(), actual: actual?.rawValue)
        }
    }

    // MARK: Signature and chain

    /// Verifies signature and chain of any App Store JWS and decodes its payload, without the
    /// per-kind checks. `signingDate` reads the payload's own signing time (epoch ms).
    public func verifySignedPayload<T: Decodable>(
        _ jws: String, as type: T.Type, signingDate: (T) -> Int64?
    ) async throws -> T {
        try await verifySignedPayload(
            jws, decode: { try JSONDecoder().decode(T.self, from: Data($0)) }, signingDate: signingDate)
    }

    /// The same with a payload decoder of the caller's choice (the hot kinds use `FastDecodable`).
    func verifySignedPayload<T>(
        _ jws: String, decode: ([UInt8]) throws -> T, signingDate: (T) -> Int64?
    ) async throws -> T {
        let compact = try CompactJWS(jws)
        let header = compact.headerBytes
        let certificates: VerifiedChainCache.Key
        if let known = cache.certificates(forHeader: header) {
            certificates = known
        } else {
            certificates = try Self.certificates(in: compact.decodeHeader())
            cache.remember(header: header, certificates: certificates)
        }
        let payload = try compact.decodePayload(decode)
        let validationTime = self.validationTime(signedMilliseconds: signingDate(payload))
        let leafKey = try await verifiedLeafKey(certificates, validationTime: validationTime)

        let signature = try compact.signatureBytes()
        guard signature.count == 64 else {
            throw VerificationFailure.invalidSignature("ES256 signature must be 64 bytes (R || S)")
        }
        guard leafKey.isValidSignature(signature, for: compact.signingInput) else {
            throw VerificationFailure.invalidSignature("signature does not match the signed data")
        }
        return payload
    }

    /// Steps 3 of the procedure: ES256 and exactly three base64 DER certificates.
    private static func certificates(in header: JWSDecodedHeader) throws -> VerifiedChainCache.Key {
        guard header.alg == "ES256" else {
            throw VerificationFailure.invalidSignature(
                "JWS algorithm is \(header.alg.map { VerificationFailure.quoted($0, limit: 16) } ?? "missing"); only ES256 is accepted"
            )
        }
        guard let x5c = header.x5c, x5c.count == 3 else {
            throw VerificationFailure.invalidChain(
                "x5c must hold exactly 3 certificates, found \(header.x5c?.count ?? 0)")
        }
        guard let leafDER = Base64.decodeStandard(x5c[0].utf8), !leafDER.isEmpty,
            let intermediateDER = Base64.decodeStandard(x5c[1].utf8), !intermediateDER.isEmpty
        else {
            throw VerificationFailure.invalidChain("x5c entries must be base64 DER certificates")
        }
        return .init(leaf: Bytes(leafDER), intermediate: Bytes(intermediateDER))
    }

    private func validationTime(signedMilliseconds: Int64?) -> Date {
        if configuration.onlineChecks != nil { return Date() }
        switch configuration.validationTime {
        case .now: return Date()
        case .fixed(let date): return date
        case .signedDate:
            guard let milliseconds = signedMilliseconds else { return Date() }
            return Date(timeIntervalSince1970: Double(milliseconds) / 1000)
        }
    }

    private func verifiedLeafKey(
        _ key: VerifiedChainCache.Key, validationTime: Date
    ) async throws -> LeafKey {
        let freshAfter = configuration.onlineChecks.map { Date() - TimeInterval($0.freshness.components.seconds) }
        if let entry = cache.lookup(key, at: validationTime, freshAfter: freshAfter) {
            return entry.leafKey
        }

        let leaf: Certificate
        let intermediate: Certificate
        do {
            leaf = try Certificate(derEncoded: key.leaf.storage)
            intermediate = try Certificate(derEncoded: key.intermediate.storage)
        } catch {
            throw VerificationFailure.invalidChain("x5c holds a certificate that is not valid DER")
        }
        guard leaf.subject != intermediate.subject, leaf.publicKey != intermediate.publicKey else {
            throw VerificationFailure.invalidChain("x5c repeats a subject or a key")
        }
        guard let leafKey = P256.Signing.PublicKey(leaf.publicKey).map(LeafKey.init) else {
            throw VerificationFailure.invalidChain("leaf certificate key is not P-256")
        }
        let chain = try await ChainValidator.validate(
            leaf: leaf, intermediates: [intermediate], roots: roots, at: validationTime,
            onlineChecks: configuration.onlineChecks)
        cache.insert(
            .init(
                leafKey: leafKey,
                validFrom: chain.map(\.notValidBefore).max() ?? validationTime,
                validUntil: chain.map(\.notValidAfter).min() ?? validationTime,
                verifiedAt: Date()),
            for: key)
        return leafKey
    }
}

/// Full RFC 5280 path validation plus Apple's rules, shared by JWS and app receipts.
enum ChainValidator {
    /// Returns the validated path, leaf first, root last.
    static func validate(
        leaf: Certificate, intermediates: [Certificate], roots: [Certificate], at validationTime: Date,
        onlineChecks: OnlineChecks?
    ) async throws -> [Certificate] {
        let rootStore = CertificateStore(roots)
        let intermediateStore = CertificateStore(intermediates)
        let result: CertificateValidationResult
        var requester: RecordingOCSPRequester?
        if let onlineChecks {
            let recording = RecordingOCSPRequester(transport: onlineChecks.transport)
            requester = recording
            var verifier = Verifier(rootCertificates: rootStore) {
                RFC5280Policy(validationTime: validationTime)
                ChainLengthPolicy(length: 3)
                AppleOIDPolicy()
                OCSPVerifierPolicy(failureMode: .hard, requester: recording, validationTime: validationTime)
            }
            result = await verifier.validate(leaf: leaf, intermediates: intermediateStore)
        } else {
            var verifier = Verifier(rootCertificates: rootStore) {
                RFC5280Policy(validationTime: validationTime)
                ChainLengthPolicy(length: 3)
                AppleOIDPolicy()
            }
            result = await verifier.validate(leaf: leaf, intermediates: intermediateStore)
        }
        switch result {
        case .validCertificate(let chain):
            return Array(chain)
        case .couldNotValidate(let failures):
            if let networkFailure = requester?.recordedNetworkFailure {
                throw VerificationFailure.appleUnavailable(networkFailure)
            }
            let reason = failures.first.map { "\($0.policyFailureReason)" } ?? "no path to a trusted root"
            throw VerificationFailure.invalidChain("certificate chain rejected: \(reason)")
        }
    }
}
