import Crypto
import Foundation
import Testing
import X509

@testable import AppStoreVerification

/// The roots built into the binary are exactly Apple's published certificates.
@Suite struct AppleRootCertificateTests {
    static func fingerprint(_ der: [UInt8]) -> String {
        SHA256.hash(data: der).map { String(format: "%02x", $0) }.joined()
    }

    @Test func embeddedRootsAreApples() throws {
        // SHA-256 fingerprints published on apple.com/certificateauthority.
        #expect(
            Self.fingerprint(AppleRootCertificates.appleRootCAG3DER)
                == "63343abfb89a6a03ebb57e9b3f5fa7be7c4f5c756f3017b3a8c488c3653e9179")
        #expect(
            Self.fingerprint(AppleRootCertificates.appleIncRootDER)
                == "b0b1730ecbc7ff4505142c49f1295e6eda6bcaed7e2c68c5be91b5a11001f024")
        let g3 = try Certificate(derEncoded: AppleRootCertificates.appleRootCAG3DER)
        #expect("\(g3.subject)".contains("Apple Root CA - G3"))
        let inc = try Certificate(derEncoded: AppleRootCertificates.appleIncRootDER)
        #expect("\(inc.subject)".contains("Apple Root CA"))
    }

    @Test func defaultsTrustG3ForJWSAndIncRootForReceipts() throws {
        #expect(VerificationConfiguration().trustedRoots == [AppleRootCertificates.appleRootCAG3DER])
        #expect(try AppReceiptVerifier().trustedRoots == [AppleRootCertificates.appleIncRootDER])
    }

    @Test func rootFilesReadAsPEMOrDER() throws {
        let der = AppleRootCertificates.appleRootCAG3DER
        #expect(CertificateFile.certificates(in: der) == [der])
        let pem = try Certificate(derEncoded: der).serializeAsPEM().pemString
        let two = Array((pem + "\n" + pem).utf8)
        #expect(CertificateFile.certificates(in: two) == [der, der])
        #expect(CertificateFile.certificates(in: Array("-----BEGIN CERTIFICATE-----\nxx\n".utf8)).isEmpty)
        #expect(CertificateFile.certificates(in: [0x30, 0x03, 0x02, 0x01, 0x01]).isEmpty)
        #expect(throws: VerificationFailure.self) { try SignedDataVerifier(.init(trustedRoots: [[1, 2, 3]])) }
    }
}
