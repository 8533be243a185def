import SwiftASN1
import X509

/// Apple's certificate-policy OIDs (Apple's JWS documentation §2 step 6).
public enum AppleOID {
    /// Mac App Store and iTunes Store receipt signing: on the leaf.
    public static let receiptSigning: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 11, 1]
    /// Apple Worldwide Developer Relations: on the intermediate.
    public static let wwdrIntermediate: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 2, 1]
}

/// The path must be exactly leaf → intermediate → root.
struct ChainLengthPolicy: VerifierPolicy {
    let length: Int
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []

    mutating func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) async -> PolicyEvaluationResult {
        let (count, expected) = (chain.count, length)
        return count == expected
            ? .meetsPolicy
            : .failsToMeetPolicy(reason: "certificate path has \(count) certificates, expected \(expected)")
    }
}

/// The leaf carries the receipt-signing OID and the intermediate the WWDR OID. Presence
/// of the extension is what counts, as in Apple's libraries.
struct AppleOIDPolicy: VerifierPolicy {
    // Apple's extensions are not critical today; handling them here keeps a chain valid if
    // Apple ever marks them critical.
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = [AppleOID.receiptSigning, AppleOID.wwdrIntermediate]

    mutating func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) async -> PolicyEvaluationResult {
        guard chain.count >= 2 else {
            return .failsToMeetPolicy(reason: "certificate path too short for Apple's OIDs")
        }
        guard chain[0].extensions[oid: AppleOID.receiptSigning] != nil else {
            return .failsToMeetPolicy(
                reason: "leaf certificate lacks Apple's receipt-signing OID 1.2.840.113635.100.6.11.1")
        }
        guard chain[1].extensions[oid: AppleOID.wwdrIntermediate] != nil else {
            return .failsToMeetPolicy(
                reason: "intermediate certificate lacks Apple's WWDR OID 1.2.840.113635.100.6.2.1")
        }
        return .meetsPolicy
    }
}
