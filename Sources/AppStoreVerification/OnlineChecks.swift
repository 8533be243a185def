import Foundation
import Synchronization
import X509

/// Sends an OCSP request. The verifier stays free of I/O; the HTTP implementation lives in
/// `AppStoreClient` (`HTTPOCSPTransport`) and tests can pass their own responder.
public protocol OCSPTransport: Sendable {
    /// POSTs the DER request to `uri` and returns the DER response body.
    /// Throws when the responder cannot be reached or answers non-2xx.
    func send(request: [UInt8], to uri: String) async throws -> [UInt8]
}

/// OCSP revocation checking of leaf and intermediate, hard-fail (Apple's JWS documentation §2 step 7).
public struct OnlineChecks: Sendable {
    public var transport: any OCSPTransport
    /// How long a chain whose OCSP answer was good is reused without asking again (Apple's
    /// libraries: 15 minutes).
    public var freshness: Duration

    public init(transport: any OCSPTransport, freshness: Duration = .seconds(15 * 60)) {
        self.transport = transport
        self.freshness = freshness
    }
}

/// Adapts an `OCSPTransport` to swift-certificates and remembers whether the network failed,
/// so a failed check can be reported as retryable instead of as a bad chain.
final class RecordingOCSPRequester: OCSPRequester {
    let transport: any OCSPTransport
    private let networkFailure = Mutex<String?>(nil)

    init(transport: any OCSPTransport) { self.transport = transport }

    var recordedNetworkFailure: String? { networkFailure.withLock { $0 } }

    func query(request: [UInt8], uri: String) async -> OCSPRequesterQueryResult {
        do {
            return .response(try await transport.send(request: request, to: uri))
        } catch {
            networkFailure.withLock { $0 = "OCSP responder \(uri) unreachable: \(error)" }
            // Terminal: hard-fail means no answer is no pass (a non-terminal error would pass).
            return .terminalError(error)
        }
    }
}
