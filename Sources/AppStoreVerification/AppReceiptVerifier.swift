import AppStoreModels
import Foundation
import SwiftASN1
import X509

/// Verifies a StoreKit 1 app receipt offline (shared/spec/receipts.md §4.6): the PKCS#7
/// signature, its chain to Apple Inc. Root at the receipt's creation date, Apple's OIDs,
/// then the bundle id and environment.
public struct AppReceiptVerifier: Sendable {
    /// Trust anchors, DER. Default: Apple Inc. Root.
    public var trustedRoots: [[UInt8]]
    public var bundleId: String?
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
        // Signature first (cheap, and says whether the certificates are even relevant), then
        // the path from the signer to a trusted root.
        let signer = try content.verifySignature()
        let chain = try await ChainValidator.validate(
            leaf: signer, intermediates: content.certificates, roots: roots, at: time, onlineChecks: nil)
        // Every certificate the receipt carries is on the path or a copy of a trusted root, so
        // no byte of the receipt is left unchecked.
        for certificate in content.certificates where !chain.contains(certificate) && !roots.contains(certificate) {
            throw VerificationFailure.invalidChain(
                "receipt carries a certificate that is not on its signing path: \(certificate.subject)")
        }

        if let expected = bundleId, receipt.bundleId != expected {
            throw VerificationFailure.wrongBundle(expected: expected, actual: receipt.bundleId)
        }
        // Receipts without attribute 0 predate it and cannot be placed; the chain still held.
        if let accepted = environments, let environment = receipt.environment, !accepted.contains(environment) {
            throw VerificationFailure.wrongEnvironment(
                expected: accepted.map(\.rawValue).sorted(), actual: environment.rawValue)
        }
        return receipt
    }
}
