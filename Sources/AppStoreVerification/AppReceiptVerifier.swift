import AppStoreModels
import Foundation
import SwiftASN1
import X509

/// Verifies a StoreKit 1 app receipt offline (Apple's receipt documentation §4.6): the PKCS#7
/// signature, its chain to Apple Inc. Root at the receipt's creation date, Apple's OIDs,
/// then the bundle id and environment.
public struct AppReceiptVerifier: Sendable {
    /// Trust anchors, DER. Default: Apple Inc. Root.
    public var trustedRoots: [[UInt8]]
    public var bundleId: String?
    /// More bundle ids accepted besides `bundleId` (a deployment with several App Store apps).
    public var otherBundleIds: Set<String> = []
    public var environments: Set<AppStoreEnvironment>?
    public var validationTime: VerificationConfiguration.ValidationTime
    /// Receipts larger than this are rejected before parsing (10,000 purchases are ~4 MB).
    public var maxReceiptBytes: Int

    private let roots: [Certificate]

    public init(
        trustedRoots: [[UInt8]] = [AppleRootCertificates.appleIncRootDER],
        bundleId: String? = nil,
        environments: Set<AppStoreEnvironment>? = [.production],
        validationTime: VerificationConfiguration.ValidationTime = .signedDate,
        maxReceiptBytes: Int = 32 * 1024 * 1024
    ) throws {
        self.trustedRoots = trustedRoots
        self.bundleId = bundleId
        self.environments = environments
        self.validationTime = validationTime
        self.maxReceiptBytes = maxReceiptBytes
        self.roots = try trustedRoots.map { der in
            do {
                return try Certificate(derEncoded: der)
            } catch {
                throw VerificationFailure.invalidChain("a configured trust root is not a DER certificate")
            }
        }
    }

    /// Verifies a receipt given as base64 text (as apps upload it).
    public func verify(base64 text: String) async throws -> AppReceipt {
        guard text.utf8.count <= maxReceiptBytes / 3 * 4 + 4 else {
            throw VerificationFailure.invalidSignature("receipt exceeds \(maxReceiptBytes) bytes")
        }
        guard let bytes = Base64.decodeStandard(text.utf8), !bytes.isEmpty else {
            throw VerificationFailure.invalidSignature("receipt is not base64")
        }
        return try await verify(bytes)
    }

    /// Verifies a receipt given as its raw PKCS#7 bytes (DER or BER).
    public func verify(_ bytes: [UInt8]) async throws -> AppReceipt {
        guard bytes.count <= maxReceiptBytes else {
            throw VerificationFailure.invalidSignature("receipt exceeds \(maxReceiptBytes) bytes")
        }
        let content = try PKCS7SignedData(bytes)
        // Apple's shape before any path building, and the signer's path to a trusted root
        // before the payload is parsed: a hostile receipt costs a few signature checks.
        let signer = try content.verifySignature()
        let intermediate = try Self.appleShapedIntermediate(content.certificates, signer: signer, roots: roots)
        try Self.checkIssued(signer, by: intermediate)
        guard let root = roots.first(where: { $0.subject == intermediate.issuer }) else {
            throw VerificationFailure.invalidChain("the receipt's intermediate is not issued by a trusted root")
        }
        try Self.checkIssued(intermediate, by: root)
        let receipt: AppReceipt
        do {
            receipt = try AppReceiptParser.parsePayload(content.payload)
        } catch let error as AppReceiptParser.MalformedReceipt {
            throw VerificationFailure.invalidSignature("malformed receipt: \(error.reason)")
        }

        let time: Date
        switch validationTime {
        case .now: time = Date()
        case .fixed(let date): time = date
        case .signedDate: time = receipt.creationDate ?? Date()
        }
        // The full RFC 5280 path (validity at the receipt's date, Apple's rules) over exactly
        // one candidate intermediate: one path to try, whatever the receipt carries.
        _ = try await ChainValidator.validate(
            leaf: signer, intermediates: [intermediate], roots: roots, at: time, onlineChecks: nil)

        if let expected = bundleId, receipt.bundleId != expected,
            !(receipt.bundleId.map(otherBundleIds.contains) ?? false)
        {
            throw VerificationFailure.wrongBundle(
                expected: ([expected] + otherBundleIds.sorted()).joined(separator: " or "), actual: receipt.bundleId)
        }
        // Receipts without attribute 0 predate it and cannot be placed; the chain still held.
        if let accepted = environments, let environment = receipt.environment, !accepted.contains(environment) {
            throw VerificationFailure.wrongEnvironment(
                expected: accepted.map(\.rawValue).sorted(), actual: environment.rawValue)
        }
        return receipt
    }

    /// A receipt carries Apple's shape: its signer, one intermediate, and optionally a copy of a
    /// trusted root — nothing else, no two certificates with one subject or one key. Returns
    /// the intermediate.
    static func appleShapedIntermediate(_ certificates: [Certificate], signer: Certificate, roots: [Certificate])
        throws -> Certificate
    {
        let others = certificates.filter { $0 != signer && !roots.contains($0) }
        guard others.count == 1, let intermediate = others.first, certificates.count <= 3 else {
            throw VerificationFailure.invalidChain(
                "a receipt carries its signer and one intermediate (found \(certificates.count) certificates)")
        }
        var subjects = Set<DistinguishedName>()
        var keys = Set<Certificate.PublicKey>()
        for certificate in certificates {
            guard subjects.insert(certificate.subject).inserted, keys.insert(certificate.publicKey).inserted else {
                throw VerificationFailure.invalidChain("the receipt's certificates repeat a subject or a key")
            }
        }
        return intermediate
    }

    /// `certificate` names `issuer` and carries its signature.
    static func checkIssued(_ certificate: Certificate, by issuer: Certificate) throws {
        guard certificate.issuer == issuer.subject,
            issuer.publicKey.isValidSignature(certificate.signature, for: certificate)
        else {
            throw VerificationFailure.invalidChain("the receipt's certificates do not chain to a trusted root")
        }
    }
}
