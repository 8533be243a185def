import AppStoreClient
import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Hummingbird
import LocalAppStore
import Logging
import NIOCore
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Synchronization

/// What every handler shares: the caller (authenticated, rate limited), bodies, path
/// parameters, text checks and JSON answers.
extension StoreKeeperApp {
    func decode<T: Decodable>(_ type: T.Type, _ request: Request) async throws -> T {
        if let length = request.headers[.contentLength].flatMap(Int.init), length > configuration.maxBodyBytes {
            throw APIError(
                .contentTooLarge, "payload_too_large", "request body is over \(configuration.maxBodyBytes) bytes")
        }
        var request = request
        let buffer = try await request.collectBody(upTo: configuration.maxBodyBytes)
        guard buffer.readableBytes > 0 else { throw APIError.badRequest("request body is empty") }
        do {
            return try JSONDecoder().decode(T.self, from: Data(buffer: buffer))
        } catch let error as DecodingError {
            throw APIError.badRequest(ErrorMiddleware<StoreKeeperContext>.describe(error))
        }
    }

    /// A path parameter, percent-decoded (`/v1/accounts/player%20one` is account `player one`).
    static func parameter(_ context: StoreKeeperContext, _ name: String) throws -> String {
        guard let raw = context.parameters.get(name), let value = raw.removingPercentEncoding else {
            throw APIError.badRequest("path parameter '\(name)' is missing or not valid percent-encoding")
        }
        guard !value.isEmpty, value.count <= 200 else {
            throw APIError.badRequest("path parameter '\(name)' must be 1…200 characters")
        }
        try validateText(value, field: name)
        return value
    }

    static func validateAccountId(_ accountId: String) throws {
        guard !accountId.isEmpty, accountId.count <= 128 else {
            throw APIError.badRequest("field 'accountId' must be 1…128 characters")
        }
        try validateText(accountId, field: "accountId")
    }

    /// Ids are printable text: no control characters (NUL, newlines, escapes) that could forge
    /// log lines or break a database driver.
    static func validateText(_ value: String, field: String) throws {
        guard !value.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw APIError.badRequest("field '\(field)' must not contain control characters")
        }
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: try encoder.encode(value))))
    }

    static func iso(_ date: Date) -> String {
        date.formatted(
            .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
    }
}
