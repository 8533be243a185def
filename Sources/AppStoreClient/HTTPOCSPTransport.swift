import AppStoreVerification
import AsyncHTTPClient
import Foundation
import NIOCore

/// OCSP over HTTP POST (`application/ocsp-request`), for `OnlineChecks`.
public struct HTTPOCSPTransport: OCSPTransport {
    let httpClient: HTTPClient
    let timeout: Duration

    public init(httpClient: HTTPClient = .shared, timeout: Duration = .seconds(30)) {
        self.httpClient = httpClient
        self.timeout = timeout
    }

    public func send(request: [UInt8], to uri: String) async throws -> [UInt8] {
        var httpRequest = HTTPClientRequest(url: uri)
        httpRequest.method = .POST
        httpRequest.headers.add(name: "Content-Type", value: "application/ocsp-request")
        httpRequest.body = .bytes(ByteBuffer(bytes: request))
        let answer = try await AppleHTTP.exchange(httpClient, httpRequest, timeout: timeout, maxBody: 1024 * 1024)
        guard answer.isSuccess else {
            throw AppStoreAPIError(
                kind: .httpStatus, httpStatus: answer.status, message: "OCSP responder answered HTTP \(answer.status)",
                isRetryable: true)
        }
        return answer.body
    }
}
