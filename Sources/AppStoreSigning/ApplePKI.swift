import AppStoreVerification
import Crypto
import Foundation
import SwiftASN1
import X509
import _CryptoExtras

/// A certificate authority shaped like Apple's (Apple's JWS documentation §2): a P-384 root, an
/// intermediate carrying the WWDR OID, a P-256 leaf carrying the receipt-signing OID; and for
/// app receipts the same three levels in RSA. Everything it signs verifies with
/// `AppStoreVerification` when its root is trusted, and with nothing else.
public struct ApplePKI: Sendable {
    public struct Level<Key: Sendable>: Sendable {
        public var certificate: Certificate
        public var privateKey: Key
        public var derBytes: [UInt8] { certificate.derBytes }

        public init(certificate: Certificate, privateKey: Key) {
            self.certificate = certificate
            self.privateKey = privateKey
        }
    }

    public var root: Level<P384.Signing.PrivateKey>
    public var intermediate: Level<P384.Signing.PrivateKey>
    public var leaf: Level<P256.Signing.PrivateKey>
    /// The receipt-signing chain (RSA), present when generated with `includeReceiptChain`.
    public var receiptRoot: Level<_RSA.Signing.PrivateKey>?
    public var receiptIntermediate: Level<_RSA.Signing.PrivateKey>?
    public var receiptLeaf: Level<_RSA.Signing.PrivateKey>?

    public init(
        root: Level<P384.Signing.PrivateKey>, intermediate: Level<P384.Signing.PrivateKey>,
        leaf: Level<P256.Signing.PrivateKey>, receiptRoot: Level<_RSA.Signing.PrivateKey>? = nil,
        receiptIntermediate: Level<_RSA.Signing.PrivateKey>? = nil, receiptLeaf: Level<_RSA.Signing.PrivateKey>? = nil
    ) {
        self.root = root
        self.intermediate = intermediate
        self.leaf = leaf
        self.receiptRoot = receiptRoot
        self.receiptIntermediate = receiptIntermediate
        self.receiptLeaf = receiptLeaf
    }

    /// Generates fresh keys and certificates valid from `notBefore` for `years`.
    public static func generate(
        name: String = "StoreKeeper Local App Store",
        notBefore: Date = Date(timeIntervalSince1970: 1_600_000_000),
        years: Int = 30,
        includeReceiptChain: Bool = true
    ) throws -> ApplePKI {
        let notAfter = notBefore.addingTimeInterval(Double(years) * 365.25 * 86_400)
        let rootKey = P384.Signing.PrivateKey()
        let rootName = try DistinguishedName.named("\(name) Root CA - G3")
        let root = try CertificateFactory.make(
            subject: rootName, issuer: rootName, publicKey: .init(rootKey.publicKey),
            issuerKey: .init(rootKey), isCA: true, notBefore: notBefore, notAfter: notAfter)
        let intermediateKey = P384.Signing.PrivateKey()
        let intermediate = try CertificateFactory.make(
            subject: try .named("\(name) Worldwide Developer Relations Certification Authority"),
            issuer: rootName, publicKey: .init(intermediateKey.publicKey), issuerKey: .init(rootKey), isCA: true,
            appleOIDs: [AppleOID.wwdrIntermediate], notBefore: notBefore, notAfter: notAfter)
        let leafKey = P256.Signing.PrivateKey()
        let leaf = try CertificateFactory.make(
            subject: try .named("\(name) Receipt Signing"), issuer: intermediate.subject,
            publicKey: .init(leafKey.publicKey), issuerKey: .init(intermediateKey), isCA: false,
            appleOIDs: [AppleOID.receiptSigning], notBefore: notBefore, notAfter: notAfter)

        var pki = ApplePKI(
            root: .init(certificate: root, privateKey: rootKey),
            intermediate: .init(certificate: intermediate, privateKey: intermediateKey),
            leaf: .init(certificate: leaf, privateKey: leafKey))
        if includeReceiptChain {
            let rsaRootKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            let rsaRootName = try DistinguishedName.named("\(name) Inc. Root")
            let rsaRoot = try CertificateFactory.make(
                subject: rsaRootName, issuer: rsaRootName, publicKey: .init(rsaRootKey.publicKey),
                issuerKey: .init(rsaRootKey), signatureAlgorithm: .sha256WithRSAEncryption, isCA: true,
                notBefore: notBefore, notAfter: notAfter)
            let rsaIntermediateKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            let rsaIntermediate = try CertificateFactory.make(
                subject: try .named("\(name) WWDR Receipts"), issuer: rsaRootName,
                publicKey: .init(rsaIntermediateKey.publicKey), issuerKey: .init(rsaRootKey),
                signatureAlgorithm: .sha256WithRSAEncryption, isCA: true,
                appleOIDs: [AppleOID.wwdrIntermediate], notBefore: notBefore, notAfter: notAfter)
            let rsaLeafKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            let rsaLeaf = try CertificateFactory.make(
                subject: try .named("\(name) Mac App Store and iTunes Store Receipt Signing"),
                issuer: rsaIntermediate.subject, publicKey: .init(rsaLeafKey.publicKey),
                issuerKey: .init(rsaIntermediateKey), signatureAlgorithm: .sha256WithRSAEncryption, isCA: false,
                appleOIDs: [AppleOID.receiptSigning],
                notBefore: notBefore, notAfter: notAfter)
            pki.receiptRoot = .init(certificate: rsaRoot, privateKey: rsaRootKey)
            pki.receiptIntermediate = .init(certificate: rsaIntermediate, privateKey: rsaIntermediateKey)
            pki.receiptLeaf = .init(certificate: rsaLeaf, privateKey: rsaLeafKey)
        }
        return pki
    }

    /// The JWS signer of this PKI.
    public var jwsSigner: JWSSigner {
        JWSSigner(key: leaf.privateKey, chain: [leaf.derBytes, intermediate.derBytes, root.derBytes])
    }

    /// The app-receipt signer of this PKI (requires the receipt chain).
    public var receiptSigner: AppReceiptSigner? {
        guard let receiptLeaf, let receiptIntermediate else { return nil }
        return AppReceiptSigner(
            certificate: receiptLeaf.certificate, privateKey: receiptLeaf.privateKey,
            intermediates: [receiptIntermediate.certificate])
    }

    /// Trust roots to configure verifiers with: the JWS root and, if present, the receipt root.
    public var trustRootsDER: [[UInt8]] { [root.derBytes] + (receiptRoot.map { [$0.derBytes] } ?? []) }
}

/// Builds X.509 certificates for Apple-shaped chains, including deliberately wrong ones.
public enum CertificateFactory {
    public static func make(
        subject: DistinguishedName,
        issuer: DistinguishedName,
        publicKey: Certificate.PublicKey,
        issuerKey: Certificate.PrivateKey,
        signatureAlgorithm: Certificate.SignatureAlgorithm = .ecdsaWithSHA384,
        isCA: Bool,
        appleOIDs: [ASN1ObjectIdentifier] = [],
        notBefore: Date,
        notAfter: Date,
        serialNumber: Certificate.SerialNumber = .init(),
        ocspURI: String? = nil
    ) throws -> Certificate {
        let extensions = try Certificate.Extensions {
            if isCA {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            } else {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
            }
            if let ocspURI {
                AuthorityInformationAccess([.init(method: .ocspServer, location: .uniformResourceIdentifier(ocspURI))])
            }
            for oid in appleOIDs {
                // Apple's extensions carry an ASN.1 NULL; only their presence matters.
                Certificate.Extension(oid: oid, critical: false, value: [0x05, 0x00])
            }
        }
        return try Certificate(
            version: .v3, serialNumber: serialNumber, publicKey: publicKey, notValidBefore: notBefore,
            notValidAfter: notAfter, issuer: issuer, subject: subject,
            signatureAlgorithm: signatureAlgorithm, extensions: extensions,
            issuerPrivateKey: issuerKey)
    }
}

extension DistinguishedName {
    /// `CN=name, OU=…, O=…, C=US`, as Apple's names read.
    public static func named(_ commonName: String, organization: String = "StoreKeeper") throws -> Self {
        try DistinguishedName {
            CommonName(commonName)
            OrganizationalUnitName("\(organization) Certification Authority")
            OrganizationName(organization)
            CountryName("US")
        }
    }
}

extension Certificate {
    /// The certificate's DER encoding.
    public var derBytes: [UInt8] {
        // Serializing a parsed or freshly built certificate cannot fail.
        var serializer = DER.Serializer()
        do {
            try serializer.serialize(self)
        } catch {
            return []
        }
        return serializer.serializedBytes
    }
}
