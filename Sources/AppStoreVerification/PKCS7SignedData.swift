import Crypto
import Foundation
import SwiftASN1
import X509
import _CryptoExtras

/// A PKCS#7 / CMS `SignedData` with attached content (RFC 2315, RFC 5652), as app receipts are.
///
/// Hand-read with swift-asn1's BER parser: Apple's receipts use BER and unsorted SETs that
/// strict DER readers (including swift-certificates' CMS) refuse.
struct PKCS7SignedData {
    /// The `eContent` octets exactly as signed.
    var eContent: [UInt8]
    /// The receipt payload: `eContent`, or its inner OCTET STRING for Xcode receipts.
    var payload: ArraySlice<UInt8>
    var certificates: [Certificate]
    var signer: SignerInfo

    struct SignerInfo {
        var issuer: DistinguishedName
        var serialNumber: ArraySlice<UInt8>
        var digestAlgorithm: ASN1ObjectIdentifier
        /// The signed attributes re-tagged as SET, i.e. the bytes the signature covers.
        var signedAttributes: [UInt8]?
        var messageDigest: ArraySlice<UInt8>?
        var signatureAlgorithm: ASN1ObjectIdentifier
        var signature: ArraySlice<UInt8>
    }

    enum OID {
        static let signedData: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 7, 2]
        static let data: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 7, 1]
        static let messageDigest: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 9, 4]
        static let sha1: ASN1ObjectIdentifier = [1, 3, 14, 3, 2, 26]
        static let sha256: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 1]
        static let sha384: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 2]
        static let sha512: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 3]
        static let rsaEncryption: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 1, 1]
        static let sha1WithRSA: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 1, 5]
        static let sha256WithRSA: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 1, 11]
        static let sha384WithRSA: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 1, 12]
        static let sha512WithRSA: ASN1ObjectIdentifier = [1, 2, 840, 113_549, 1, 1, 13]
        static let ecdsaWithSHA256: ASN1ObjectIdentifier = [1, 2, 840, 10045, 4, 3, 2]
    }

    private static let contextZero = ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)
    private static let contextOne = ASN1Identifier(tagWithNumber: 1, tagClass: .contextSpecific)

    private static func malformed(_ reason: String) -> VerificationFailure {
        .invalidSignature("receipt is not a PKCS#7 signed receipt: \(reason)")
    }

    init(_ bytes: [UInt8]) throws {
        let root: ASN1Node
        do {
            // The container is a few certificates and one big OCTET STRING: a few thousand
            // elements. More means a hostile shape, refused before swift-asn1 builds it.
            try ASN1Budget.check(bytes[...], maxNodes: 20_000)
            root = try BER.parse(bytes)
        } catch let error as ASN1Budget.Exceeded {
            throw Self.malformed(error.description)
        } catch {
            throw Self.malformed("not ASN.1")
        }
        // ContentInfo ::= SEQUENCE { contentType OID, content [0] EXPLICIT SignedData }
        var info = try Self.children(root, .sequence, "ContentInfo")
        guard let typeNode = info.next(), (try? ASN1ObjectIdentifier(berEncoded: typeNode)) == OID.signedData else {
            throw Self.malformed("content type is not signedData")
        }
        guard let wrapper = info.next() else { throw Self.malformed("missing SignedData") }
        var wrapped = try Self.children(wrapper, Self.contextZero, "SignedData wrapper")
        guard let signedDataNode = wrapped.next() else { throw Self.malformed("missing SignedData") }

        // SignedData ::= SEQUENCE { version, digestAlgorithms SET, encapContentInfo,
        //   certificates [0] IMPLICIT SET OF Certificate OPTIONAL, crls [1] OPTIONAL, signerInfos SET }
        var fields = try Self.children(signedDataNode, .sequence, "SignedData")
        guard let versionNode = fields.next(), versionNode.identifier == .integer,
            let digestSet = fields.next(), digestSet.identifier == .set,
            case .constructed(let digestNodes) = digestSet.content,
            let encap = fields.next()
        else { throw Self.malformed("SignedData is incomplete") }
        // Apple's receipts (and RFC 5652 for this shape) are version 1; accepting only that
        // leaves no unsigned field that could be edited unnoticed.
        guard Self.isVersionOne(versionNode) else { throw Self.malformed("SignedData version is not 1") }
        let digestAlgorithms = try digestNodes.map(Self.algorithm)

        var encapFields = try Self.children(encap, .sequence, "EncapsulatedContentInfo")
        guard let contentType = encapFields.next(), (try? ASN1ObjectIdentifier(berEncoded: contentType)) == OID.data
        else { throw Self.malformed("encapsulated content is not data") }
        guard let explicit = encapFields.next() else { throw Self.malformed("receipt has no attached content") }
        var explicitChildren = try Self.children(explicit, Self.contextZero, "eContent")
        guard let octets = explicitChildren.next() else { throw Self.malformed("receipt has no attached content") }
        let eContent = try Self.octetStringBytes(octets)
        var payload = eContent[...]
        // Xcode receipts wrap the payload in one more OCTET STRING.
        if eContent.first == 0x04, let inner = try? BER.parse(eContent), inner.identifier == .octetString,
            let innerBytes = try? Self.octetStringBytes(inner)
        {
            payload = innerBytes[...]
        }

        var certificates: [Certificate] = []
        var next = fields.next()
        if let node = next, node.identifier == Self.contextZero {
            guard case .constructed(let certificateNodes) = node.content else {
                throw Self.malformed("certificates are not a SET")
            }
            for certificateNode in certificateNodes {
                guard certificates.count < 16 else { throw Self.malformed("more than 16 certificates") }
                do {
                    certificates.append(try Certificate(derEncoded: Array(certificateNode.encodedBytes)))
                } catch {
                    throw VerificationFailure.invalidChain("receipt holds a certificate that is not valid DER")
                }
            }
            next = fields.next()
        }
        if let node = next, node.identifier == Self.contextOne { next = fields.next() }
        guard let signerInfos = next, signerInfos.identifier == .set,
            case .constructed(let signers) = signerInfos.content
        else { throw Self.malformed("missing signerInfos") }
        var signerIterator = signers.makeIterator()
        guard let signerNode = signerIterator.next(), signerIterator.next() == nil else {
            throw Self.malformed("a receipt has exactly one signer")
        }
        self.eContent = eContent
        self.payload = payload
        self.certificates = certificates
        self.signer = try Self.signerInfo(signerNode)
        // RFC 5652 §5.1: the signer's digest algorithm is listed in the SignedData.
        guard digestAlgorithms.contains(signer.digestAlgorithm) else {
            throw Self.malformed("the signer's digest algorithm is not listed in SignedData")
        }
    }

    // SignerInfo ::= SEQUENCE { version, sid IssuerAndSerialNumber, digestAlgorithm,
    //   signedAttrs [0] IMPLICIT OPTIONAL, signatureAlgorithm, signature OCTET STRING, … }
    private static func signerInfo(_ node: ASN1Node) throws -> SignerInfo {
        var fields = try children(node, .sequence, "SignerInfo")
        guard let version = fields.next(), isVersionOne(version), let sid = fields.next(),
            let digestNode = fields.next()
        else { throw malformed("SignerInfo is incomplete or not version 1") }
        var sidFields = try children(sid, .sequence, "signer identifier")
        guard let issuerNode = sidFields.next(), let serialNode = sidFields.next(), serialNode.identifier == .integer,
            case .primitive(let serial) = serialNode.content,
            let issuer = try? DistinguishedName(derEncoded: issuerNode)
        else { throw malformed("signer is not identified by issuer and serial number") }
        let digestAlgorithm = try algorithm(digestNode)

        var signedAttributes: [UInt8]?
        var messageDigest: ArraySlice<UInt8>?
        var nextNode = fields.next()
        if let attributesNode = nextNode, attributesNode.identifier == contextZero {
            // The signature covers the attributes encoded as a SET, not with their [0] tag.
            var encoded = Array(attributesNode.encodedBytes)
            encoded[0] = 0x31
            signedAttributes = encoded
            guard case .constructed(let attributes) = attributesNode.content else {
                throw malformed("signed attributes are not constructed")
            }
            for attribute in attributes {
                var attributeFields = try children(attribute, .sequence, "attribute")
                guard let typeNode = attributeFields.next(), let valuesNode = attributeFields.next() else { continue }
                guard (try? ASN1ObjectIdentifier(berEncoded: typeNode)) == OID.messageDigest else { continue }
                var values = try children(valuesNode, .set, "messageDigest values")
                guard let value = values.next(), value.identifier == .octetString,
                    case .primitive(let digest) = value.content
                else { throw malformed("messageDigest attribute is not an OCTET STRING") }
                messageDigest = digest
            }
            guard messageDigest != nil else { throw malformed("signed attributes lack messageDigest") }
            nextNode = fields.next()
        }
        guard let signatureAlgorithmNode = nextNode, let signatureNode = fields.next(),
            signatureNode.identifier == .octetString, case .primitive(let signature) = signatureNode.content
        else { throw malformed("SignerInfo lacks a signature") }
        return SignerInfo(
            issuer: issuer, serialNumber: serial, digestAlgorithm: digestAlgorithm,
            signedAttributes: signedAttributes, messageDigest: messageDigest,
            signatureAlgorithm: try algorithm(signatureAlgorithmNode), signature: signature)
    }

    /// Checks the signer's signature and returns the signer's certificate (not yet its chain).
    func verifySignature() throws -> Certificate {
        guard
            let certificate = certificates.first(where: {
                $0.issuer == signer.issuer
                    && Self.trimmed($0.serialNumber.bytes).elementsEqual(Self.trimmed(signer.serialNumber))
            })
        else {
            throw VerificationFailure.invalidChain("the receipt's signing certificate is not in the receipt")
        }
        let signedBytes: [UInt8]
        if let attributes = signer.signedAttributes, let expected = signer.messageDigest {
            guard let digest = try Self.digest(eContent, algorithm: signer.digestAlgorithm),
                digest.elementsEqual(expected)
            else {
                throw VerificationFailure.invalidSignature("receipt content does not match its signed digest")
            }
            signedBytes = attributes
        } else {
            signedBytes = eContent
        }

        let hash = try Self.hashAlgorithm(signature: signer.signatureAlgorithm, digest: signer.digestAlgorithm)
        let valid: Bool
        if let rsaKey = _RSA.Signing.PublicKey(certificate.publicKey) {
            let signature = _RSA.Signing.RSASignature(rawRepresentation: signer.signature)
            switch hash {
            case OID.sha1:
                valid = rsaKey.isValidSignature(
                    signature, for: Insecure.SHA1.hash(data: signedBytes), padding: .insecurePKCS1v1_5)
            case OID.sha256:
                valid = rsaKey.isValidSignature(
                    signature, for: SHA256.hash(data: signedBytes), padding: .insecurePKCS1v1_5)
            case OID.sha384:
                valid = rsaKey.isValidSignature(
                    signature, for: SHA384.hash(data: signedBytes), padding: .insecurePKCS1v1_5)
            default:
                valid = rsaKey.isValidSignature(
                    signature, for: SHA512.hash(data: signedBytes), padding: .insecurePKCS1v1_5)
            }
        } else if let ecKey = P256.Signing.PublicKey(certificate.publicKey), hash == OID.sha256 {
            guard let signature = try? P256.Signing.ECDSASignature(derRepresentation: signer.signature) else {
                throw VerificationFailure.invalidSignature("receipt signature is not a DER ECDSA signature")
            }
            valid = ecKey.isValidSignature(signature, for: SHA256.hash(data: signedBytes))
        } else {
            throw VerificationFailure.invalidSignature("receipt signing key type is not supported")
        }
        guard valid else { throw VerificationFailure.invalidSignature("receipt signature does not verify") }
        return certificate
    }

    /// The hash the signature uses; the digest and signature algorithms must agree.
    private static func hashAlgorithm(
        signature: ASN1ObjectIdentifier, digest: ASN1ObjectIdentifier
    ) throws -> ASN1ObjectIdentifier {
        let implied: ASN1ObjectIdentifier?
        switch signature {
        case OID.rsaEncryption: implied = nil
        case OID.sha1WithRSA: implied = OID.sha1
        case OID.sha256WithRSA, OID.ecdsaWithSHA256: implied = OID.sha256
        case OID.sha384WithRSA: implied = OID.sha384
        case OID.sha512WithRSA: implied = OID.sha512
        default: throw VerificationFailure.invalidSignature("receipt signature algorithm \(signature) is not supported")
        }
        guard [OID.sha1, OID.sha256, OID.sha384, OID.sha512].contains(digest) else {
            throw VerificationFailure.invalidSignature("receipt digest algorithm \(digest) is not supported")
        }
        if let implied, implied != digest {
            throw VerificationFailure.invalidSignature("receipt digest and signature algorithms disagree")
        }
        return digest
    }

    private static func digest(_ bytes: [UInt8], algorithm: ASN1ObjectIdentifier) throws -> [UInt8]? {
        switch algorithm {
        case OID.sha1: Array(Insecure.SHA1.hash(data: bytes))
        case OID.sha256: Array(SHA256.hash(data: bytes))
        case OID.sha384: Array(SHA384.hash(data: bytes))
        case OID.sha512: Array(SHA512.hash(data: bytes))
        default: nil
        }
    }

    /// AlgorithmIdentifier ::= SEQUENCE { algorithm OID, parameters ANY OPTIONAL }; for the
    /// hash and RSA algorithms used here the parameters are absent or NULL.
    private static func algorithm(_ node: ASN1Node) throws -> ASN1ObjectIdentifier {
        var fields = try children(node, .sequence, "AlgorithmIdentifier")
        guard let oidNode = fields.next(), let oid = try? ASN1ObjectIdentifier(berEncoded: oidNode) else {
            throw malformed("AlgorithmIdentifier lacks an OID")
        }
        if let parameters = fields.next() {
            guard parameters.identifier == .null, case .primitive(let bytes) = parameters.content, bytes.isEmpty,
                fields.next() == nil
            else { throw malformed("algorithm parameters must be absent or NULL") }
        }
        return oid
    }

    private static func isVersionOne(_ node: ASN1Node) -> Bool {
        guard node.identifier == .integer, case .primitive(let bytes) = node.content else { return false }
        return bytes.elementsEqual([1])
    }

    private static func children(
        _ node: ASN1Node, _ identifier: ASN1Identifier, _ what: String
    ) throws -> ASN1NodeCollection.Iterator {
        guard node.identifier == identifier, case .constructed(let children) = node.content else {
            throw malformed("\(what) has the wrong type")
        }
        return children.makeIterator()
    }

    /// An OCTET STRING's bytes, primitive or BER-constructed (chunks concatenated).
    private static func octetStringBytes(_ node: ASN1Node) throws -> [UInt8] {
        guard node.identifier == .octetString else { throw malformed("content is not an OCTET STRING") }
        switch node.content {
        case .primitive(let bytes):
            return Array(bytes)
        case .constructed(let chunks):
            var result: [UInt8] = []
            for chunk in chunks {
                guard chunk.identifier == .octetString, case .primitive(let bytes) = chunk.content else {
                    throw malformed("constructed OCTET STRING holds a non-primitive chunk")
                }
                result.append(contentsOf: bytes)
            }
            return result
        }
    }

    /// A serial number's magnitude: leading zero bytes carry no value, so both sides drop them.
    private static func trimmed(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        var slice = bytes
        while slice.count > 1, slice.first == 0 { slice = slice.dropFirst() }
        return slice
    }
}
