import Foundation
import SwiftASN1
import X509

/// Reads trust roots from files as operators have them: PEM (one or many) or DER.
public enum CertificateFile {
    /// DER of every certificate in `bytes`; empty when there is none.
    public static func certificates(in bytes: [UInt8]) -> [[UInt8]] {
        if let text = String(bytes: bytes, encoding: .utf8), text.contains("-----BEGIN CERTIFICATE-----") {
            guard let documents = try? PEMDocument.parseMultiple(pemString: text) else { return [] }
            return documents.filter { $0.discriminator == "CERTIFICATE" }.map(\.derBytes)
                .filter { (try? Certificate(derEncoded: $0)) != nil }
        }
        return (try? Certificate(derEncoded: bytes)) != nil ? [bytes] : []
    }
}
