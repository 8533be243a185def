import AsyncHTTPClient
import Foundation
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Requests through AsyncHTTPClient. `URLSession` on Linux (swift-corelibs-foundation, libcurl)
/// stalled for good with 20 simulated devices × a few requests in flight — no answer and no
/// timeout (a 1,000-purchase run froze at ~750 requests); on iOS `URLSession` is the SDK's
/// default and the right one.
public struct AsyncHTTPTransport: HTTPTransport {
    let client: HTTPClient

    public init(client: HTTPClient = .shared) { self.client = client }

    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        guard let url = request.url else { throw BackendError.malformed("request without URL") }
        var outgoing = HTTPClientRequest(url: url.absoluteString)
        outgoing.method = HTTPMethod(rawValue: request.httpMethod ?? "GET")
        for (name, value) in request.allHTTPHeaderFields ?? [:] { outgoing.headers.add(name: name, value: value) }
        if let body = request.httpBody { outgoing.body = .bytes(ByteBuffer(bytes: body)) }
        let timeout = TimeAmount.milliseconds(Int64(max(1, request.timeoutInterval) * 1000))
        let response = try await client.execute(outgoing, timeout: timeout)
        let body = try await response.body.collect(upTo: 16 * 1024 * 1024)
        var headers: [String: String] = [:]
        for header in response.headers { headers[header.name] = header.value }
        guard
            let http = HTTPURLResponse(
                url: url, statusCode: Int(response.status.code), httpVersion: "HTTP/1.1", headerFields: headers)
        else { throw BackendError.malformed("no HTTP response") }
        return (Data(buffer: body), http)
    }
}
