import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Crypto
import Foundation
import Hummingbird
import JWTKit
import NIOCore

/// Apple's error bodies, JSON answers, query strings, revisions and token checks.
extension LocalAppStoreServer {
    static func transactionId(_ context: some RequestContext, code: Int64 = 4_000_006) throws -> String {
        guard let id = context.parameters.get("id"), !id.isEmpty, id.count <= 64, id.allSatisfy(\.isNumber) else {
            throw AppleErrorResponse(status: 400, code: code)
        }
        return id
    }

    struct AppleErrorResponse: Error, HTTPResponseError {
        var status: HTTPResponse.Status
        var code: Int64
        init(status: Int, code: Int64) {
            self.status = .init(code: status)
            self.code = code
        }
        func response(from request: Request, context: some RequestContext) throws -> Response {
            LocalAppStoreServer.appleError(Int(status.code), code)
        }
    }

    static func appleError(_ status: Int, _ code: Int64) -> Response {
        var response = json(ServerAPIErrorPayload(errorCode: code, errorMessage: errorMessages[code] ?? "Error."))
        response.status = .init(code: status)
        return response
    }

    static let errorMessages: [Int64: String] = [
        4_000_000: "Invalid request.", 4_000_005: "Invalid request revision.", 4_000_006: "Invalid transaction id.",
        4_000_008: "Invalid original transaction id.", 4_000_009: "Invalid extend by days value.",
        4_000_010: "Invalid extend reason code.", 4_000_011: "Invalid request identifier.",
        4_000_013: "Start date after end date.", 4_000_014: "Invalid pagination token.",
        4_000_015: "Invalid start date.",
        4_000_016: "Invalid end date.", 4_000_019: "Multiple filters supplied.", 4_000_021: "Invalid sort.",
        4_000_022: "Invalid product type.", 4_000_030: "Invalid revoked.", 4_000_035: "Customer did not consent.",
        4_000_041: "Invalid sample content provided.", 4_000_183: "Invalid app account token.",
        4_000_187: "Transaction id is not an original transaction id.",
        4_000_023: "Invalid product id.", 4_000_162: "Invalid header.", 4_000_163: "Invalid body.",
        4_000_211: "Invalid performance test request.", 4_000_212: "Invalid request id.",
        4_000_213: "A performance test is already running.", 4_000_215: "Invalid realtime URL.",
        4_040_015: "Message not found.", 4_040_018: "Performance test run not found.",
        4_040_020: "Default message not found.", 4_040_021: "Realtime URL not found.",
        4_090_001: "Message already exists.", 4_030_004: "Subscription extension ineligible.",
        4_030_005: "Subscription has reached the maximum number of extensions.",
        4_040_009: "Mass extension request not found.", 4_040_005: "Original transaction id not found.",
        4_040_007: "Server notification URL not found.", 4_040_008: "Test notification not found.",
        4_040_010: "Transaction id not found.", 4_290_000: "Rate limit exceeded.",
        5_000_000: "An unknown error occurred.",
    ]

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func query(_ request: Request) -> [(String, String)] {
        guard let query = request.uri.query, !query.isEmpty else { return [] }
        return query.split(separator: "&").map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1).map {
                String($0).removingPercentEncoding ?? String($0)
            }
            return (parts[0], parts.count > 1 ? parts[1] : "")
        }
    }

    /// Page tokens are opaque to clients; here they carry the offset.
    static func revision(offset: Int) -> String { Data("page:\(offset)".utf8).base64EncodedString() }

    static func offset(fromRevision revision: String?) -> Int? {
        guard let revision else { return 0 }
        guard let data = Data(base64Encoded: revision), let text = String(data: data, encoding: .utf8),
            text.hasPrefix("page:"), let offset = Int(text.dropFirst(5)), offset >= 0
        else { return nil }
        return offset
    }

    static func keyId(of token: String) -> String? {
        guard let header = token.split(separator: ".").first else { return nil }
        guard let data = Base64.decodeURL(header).map({ Data($0) }),
            let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        else { return nil }
        return object["kid"] as? String
    }

    static func unverifiedTransaction(_ jws: String) throws -> JWSTransactionDecodedPayload {
        let parts = jws.split(separator: ".")
        guard parts.count == 3 else { throw HTTPError(.badRequest) }
        return try JSONDecoder().decode(JWSTransactionDecodedPayload.self, from: Data(Base64.decodeURL(parts[1]) ?? []))
    }

    /// Compares a presented secret with the configured one without an early exit on the first
    /// differing byte (digests of equal length, every byte visited).
    static func constantTimeEqual(_ presented: String, _ secret: String) -> Bool {
        let a = Array(SHA256.hash(data: Data(presented.utf8)))
        let b = Array(SHA256.hash(data: Data(secret.utf8)))
        var difference: UInt8 = 0
        for index in 0..<a.count { difference |= a[index] ^ b[index] }
        return difference == 0
    }
}
