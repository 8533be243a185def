import AppStoreModels
import StoreKeeperSupport

/// Why a proof of purchase was not accepted.
///
/// Each case is one error code of the HTTP API (docs/api.md), so the HTTP layer
/// maps failures in one place and callers switch on cases rather than parse strings.
public enum VerificationFailure: Error, Hashable, Sendable, CustomStringConvertible {
    /// Not a well-formed signed object, a signature that does not verify, or an
    /// algorithm other than ES256 / RSA as Apple uses them.
    case invalidSignature(String)
    /// The certificates do not form leaf → Apple intermediate → trusted root, lack Apple's
    /// OIDs, or were not valid at the signing date.
    case invalidChain(String)
    /// Signed for another app (`bundleId`).
    case wrongBundle(expected: String, actual: String?)
    /// Signed for another App Store app id (`appAppleId`, checked in Production).
    case wrongApp(expected: Int64, actual: Int64?)
    /// Signed for an environment this server does not accept.
    case wrongEnvironment(expected: [String], actual: String?)
    /// Genuine, but refunded or revoked by Apple.
    case revoked(String)
    /// Apple (an OCSP responder or the App Store) could not be reached; try again later.
    case appleUnavailable(String)

    /// The API error code (`invalid_signature`, `invalid_chain`, …).
    public var code: String {
        switch self {
        case .invalidSignature: "invalid_signature"
        case .invalidChain: "invalid_chain"
        case .wrongBundle: "wrong_bundle"
        case .wrongApp: "wrong_app"
        case .wrongEnvironment: "wrong_environment"
        case .revoked: "revoked"
        case .appleUnavailable: "apple_unavailable"
        }
    }

    /// Whether the same proof may verify later. Only Apple being unreachable is transient;
    /// everything else is a property of the proof itself.
    public var isRetryable: Bool {
        if case .appleUnavailable = self { return true }
        return false
    }

    /// One line for a human: what was wrong.
    public var reason: String {
        switch self {
        case .invalidSignature(let reason), .invalidChain(let reason), .revoked(let reason),
            .appleUnavailable(let reason):
            return reason
        case .wrongBundle(let expected, let actual):
            return "bundleId is \(actual.map { Self.quoted($0) } ?? "missing"), expected \(Self.quoted(expected))"
        case .wrongApp(let expected, let actual):
            return "appAppleId is \(actual.map(String.init) ?? "missing"), expected \(expected)"
        case .wrongEnvironment(let expected, let actual):
            return
                "environment is \(actual.map { Self.quoted($0) } ?? "missing"), accepted: \(expected.joined(separator: ", "))"
        }
    }

    public var description: String { "\(code): \(reason)" }

    /// Untrusted text (from a proof nobody has verified yet) as it may appear in a reason, which
    /// is logged and answered: `QuotedText` in single quotes, at most `limit` scalars.
    public static func quoted(_ text: some StringProtocol, limit: Int = 64) -> String {
        QuotedText.quoted(text, quote: "'", limit: limit)
    }
}
