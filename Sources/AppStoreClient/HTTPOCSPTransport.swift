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
        let response = try await httpClient.execute(httpRequest, timeout: timeout.timeAmount)
        let body = try await response.body.collect(upTo: 1024 * 1024)
        guard (200..<300).contains(Int(response.status.code)) else {
            throw AppStoreAPIError(
                kind: .httpStatus, httpStatus: Int(response.status.code), message: "OCSP responder error",
                isRetryable: true)
        }
        return Array(buffer: body)
    }
}
