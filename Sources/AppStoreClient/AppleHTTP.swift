import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// One HTTP exchange with an Apple host, with transport failures already classified.
enum AppleHTTP {
    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: [UInt8]
        var isSuccess: Bool { (200..<300).contains(status) }
    }

    /// POSTs or GETs `request` and collects at most `maxBody` bytes of the answer.
    /// Throws `AppStoreAPIError` `.timeout` or `.network` (both retryable) when no answer came.
    static func exchange(
        _ client: HTTPClient, _ request: HTTPClientRequest, timeout: Duration, maxBody: Int
    ) async throws -> Answer {
        do {
            let response = try await client.execute(request, timeout: timeout.timeAmount)
            let body = try await response.body.collect(upTo: maxBody)
            return Answer(status: Int(response.status.code), headers: response.headers, body: Array(buffer: body))
        } catch {
            throw transportError(error)
        }
    }

    static func transportError(_ error: any Error) -> AppStoreAPIError {
        if let clientError = error as? HTTPClientError,
            clientError == .deadlineExceeded || clientError == .readTimeout || clientError == .connectTimeout
        {
            return AppStoreAPIError(kind: .timeout, message: "Apple did not answer in time", isRetryable: true)
        }
        return AppStoreAPIError(kind: .network, message: "cannot reach Apple: \(error)", isRetryable: true)
    }
}
