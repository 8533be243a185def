import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Crypto
import Foundation
import SwiftASN1
import Testing
import X509
import _CryptoExtras

/// Shared keys for the suite: generating RSA keys is slow, so each PKI is made once.
enum TestPKI {
    static let genuine = try! ApplePKI.generate(name: "Test Apple")
    static let other = try! ApplePKI.generate(name: "Test Apple", includeReceiptChain: false)

    static let bundleId = "com.example.app"
    static let appAppleId: Int64 = 1_234_567_890
    static let signedDate: Int64 = 1_767_225_605_000  // 2026-01-01

    static func verifier(
        roots: [[UInt8]] = [genuine.root.derBytes], environments: Set<AppStoreEnvironment>? = [.production, .sandbox],
        cache: Int = 64
    ) throws -> SignedDataVerifier {
        try SignedDataVerifier(
            .init(
                trustedRoots: roots, bundleId: bundleId, appAppleId: appAppleId, environments: environments,
                chainCacheCapacity: cache))
    }

    static func transaction(
        id: String = "2000000000000001", bundleId: String = bundleId, environment: AppStoreEnvironment = .sandbox,
        signedDate: Int64 = signedDate
    ) -> JWSTransactionDecodedPayload {
        JWSTransactionDecodedPayload(
            transactionId: id, originalTransactionId: id, bundleId: bundleId, productId: "coins_60",
            purchaseDate: signedDate - 5000, originalPurchaseDate: signedDate - 5000, quantity: 1,
            type: .consumable, inAppOwnershipType: .purchased, signedDate: signedDate, environment: environment,
            transactionReason: .purchase, currency: "USD", price: 990)
    }

    /// A JWS signed by `key` whose x5c is the given chain (leaf first).
    static func sign<P: Encodable>(_ payload: P, key: P256.Signing.PrivateKey, chain: [Certificate]) throws -> String {
        try JWSSigner(key: key, chain: chain.map(\.derBytes)).sign(payload)
    }

    /// A three-level chain built to order, for forgeries.
    struct CustomChain {
        var rootKey = P384.Signing.PrivateKey()
        var intermediateKey = P384.Signing.PrivateKey()
        var leafKey = P256.Signing.PrivateKey()
        var root: Certificate
        var intermediate: Certificate
        var leaf: Certificate

        init(
            rootName: DistinguishedName, intermediateName: DistinguishedName, leafName: DistinguishedName,
            intermediateOIDs: [ASN1ObjectIdentifier] = [AppleOID.wwdrIntermediate],
            leafOIDs: [ASN1ObjectIdentifier] = [AppleOID.receiptSigning],
            leafNotBefore: Date = Date(timeIntervalSince1970: 1_600_000_000),
            leafNotAfter: Date = Date(timeIntervalSince1970: 2_500_000_000),
            useRootKey: P384.Signing.PrivateKey? = nil, useRoot: Certificate? = nil,
            useIntermediateKey: P384.Signing.PrivateKey? = nil, useIntermediate: Certificate? = nil
        ) throws {
            let start = Date(timeIntervalSince1970: 1_600_000_000)
            let end = Date(timeIntervalSince1970: 2_500_000_000)
            if let useRootKey { rootKey = useRootKey }
            root =
                try useRoot
                ?? CertificateFactory.make(
                    subject: rootName, issuer: rootName, publicKey: .init(rootKey.publicKey),
                    issuerKey: .init(rootKey), isCA: true, notBefore: start, notAfter: end)
            if let useIntermediateKey { intermediateKey = useIntermediateKey }
            intermediate =
                try useIntermediate
                ?? CertificateFactory.make(
                    subject: intermediateName, issuer: root.subject, publicKey: .init(intermediateKey.publicKey),
                    issuerKey: .init(rootKey), isCA: true, appleOIDs: intermediateOIDs, notBefore: start, notAfter: end)
            leaf = try CertificateFactory.make(
                subject: leafName, issuer: intermediate.subject, publicKey: .init(leafKey.publicKey),
                issuerKey: .init(intermediateKey), isCA: false, appleOIDs: leafOIDs, notBefore: leafNotBefore,
                notAfter: leafNotAfter)
        }

        func sign<P: Encodable>(_ payload: P, x5c: [Certificate]? = nil) throws -> String {
            try TestPKI.sign(payload, key: leafKey, chain: x5c ?? [leaf, intermediate, root])
        }
    }

    /// A chain under the genuine test root, with the genuine names, to vary one property.
    static func chainUnderGenuineRoot(
        intermediateOIDs: [ASN1ObjectIdentifier] = [AppleOID.wwdrIntermediate],
        leafOIDs: [ASN1ObjectIdentifier] = [AppleOID.receiptSigning],
        leafNotBefore: Date = Date(timeIntervalSince1970: 1_600_000_000),
        leafNotAfter: Date = Date(timeIntervalSince1970: 2_500_000_000)
    ) throws -> CustomChain {
        try CustomChain(
            rootName: genuine.root.certificate.subject, intermediateName: genuine.intermediate.certificate.subject,
            leafName: genuine.leaf.certificate.subject, intermediateOIDs: intermediateOIDs, leafOIDs: leafOIDs,
            leafNotBefore: leafNotBefore, leafNotAfter: leafNotAfter, useRootKey: genuine.root.privateKey,
            useRoot: genuine.root.certificate)
    }
}

/// Expects `body` to throw exactly the failure code given.
func expectFailure(
    _ code: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Void
) async {
    do {
        try await body()
        Issue.record("expected \(code), but verification succeeded", sourceLocation: sourceLocation)
    } catch let failure as VerificationFailure {
        #expect(failure.code == code, "\(failure)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected VerificationFailure \(code), got \(error)", sourceLocation: sourceLocation)
    }
}
