import AppStoreVerification
import Foundation
import Hummingbird
import NIOCore
import StoreKeeperCore
import StoreKeeperStorage

/// Every non-2xx answer of the API: `{"error": {"code", "message", "retryable"}}` (docs/api.md).
/// HTTP mapping happens here and nowhere else.
public struct APIError: Error, HTTPResponseError, Sendable {
    public var status: HTTPResponse.Status
    public var code: String
    public var message: String
    public var retryable: Bool
    public var headers: HTTPFields = [:]

    public init(_ status: HTTPResponse.Status, _ code: String, _ message: String, retryable: Bool = false) {
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
    }

    public static func badRequest(_ message: String) -> APIError { .init(.badRequest, "bad_request", message) }
    public static let unauthenticated = APIError(.unauthorized, "unauthenticated", "missing or invalid credentials")
    public static func forbidden(_ message: String) -> APIError { .init(.forbidden, "forbidden", message) }
    public static func notFound(_ message: String) -> APIError { .init(.notFound, "not_found", message) }
    /// 503 `storage_unavailable`, retryable, `Retry-After`.
    public static var storageUnavailable: APIError {
        var error = APIError(
            .serviceUnavailable, "storage_unavailable", "the database is unavailable; retry shortly", retryable: true)
        error.headers[.retryAfter] = "2"
        return error
    }

    /// A proof that failed verification: 422 with the failure's own code.
    /// `status`: what a proof that does not verify is answered with (422 for a purchase, 400
    /// for a notification, as docs/api.md says); one that could not be checked yet is 503.
    public static func verification(
        _ failure: VerificationFailure, status: HTTPResponse.Status = .unprocessableContent
    ) -> APIError {
        if failure.isRetryable {
            return .init(.serviceUnavailable, failure.code, failure.reason, retryable: true)
        }
        return .init(status, failure.code, failure.reason)
    }

    /// A delivery the planner refused (StoreKeeperCore's decision, docs/api.md's answer).
    public static func refusal(_ refusal: DeliveryPlanner.Refusal) -> APIError {
        switch refusal {
        case .revoked:
            return .init(.unprocessableContent, "revoked", "the transaction was refunded or revoked by Apple")
        case .ownedByOtherAccount:
            return .init(.conflict, "owned_by_other_account", "this purchase belongs to another account")
        case .orderOfAnotherAccount:
            return .forbidden("order belongs to another account")
        case .orderOfAnotherApp(let order, let transaction):
            return .init(
                .conflict, "order_of_another_app",
                "the order was created for app '\(order)' but the payment is of app '\(transaction)'")
        case .wrongEnvironment(let environment):
            return .init(
                .unprocessableContent, "wrong_environment",
                "a payment of environment \(environment), which this server does not accept (environments)")
        }
    }

    struct Body: Codable {
        struct Inner: Codable {
            var code: String
            var message: String
            var retryable: Bool
        }
        var error: Inner
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let body = try encoder.encode(Body(error: .init(code: code, message: message, retryable: retryable)))
        var fields = headers
        fields[.contentType] = "application/json"
        return Response(status: status, headers: fields, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}

/// Turns anything thrown by a handler into the API's error shape: no stack traces, no
/// framework error pages.
struct ErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        do {
            return try await next(request, context)
        } catch let error as APIError {
            throw error
        } catch let error as HTTPError {
            switch error.status {
            case .contentTooLarge:
                throw APIError(.contentTooLarge, "payload_too_large", "request body is over the configured limit")
            case .notFound:
                throw APIError.notFound("no such endpoint")
            case .methodNotAllowed:
                throw APIError(.methodNotAllowed, "bad_request", "method not allowed")
            default:
                throw APIError(error.status, "bad_request", error.body ?? "bad request")
            }
        } catch let error as DecodingError {
            throw APIError.badRequest(Self.describe(error))
        } catch let error where StorageUnavailable.classify(error) != nil {
            // Down, restarting, disk full, locked, a connection lost: the client retries.
            context.logger.warning("storage unavailable", metadata: ["error": "\(error)"])
            throw APIError.storageUnavailable
        } catch is NIOTooManyBytesError {
            // A chunked body grows past the limit while it is collected (no Content-Length to check first).
            throw APIError(.contentTooLarge, "payload_too_large", "request body is over the configured limit")
        } catch {
            context.logger.error("internal error", metadata: ["error": "\(error)"])
            throw APIError(.internalServerError, "internal", "internal error", retryable: true)
        }
    }

    static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context) -> String {
            context.codingPath.map(\.stringValue).joined(separator: ".")
        }
        switch error {
        case .keyNotFound(let key, let context):
            let prefix = path(context)
            return "missing field '\(prefix.isEmpty ? key.stringValue : prefix + "." + key.stringValue)'"
        case .typeMismatch(_, let context), .valueNotFound(_, let context):
            return "field '\(path(context))' has the wrong type"
        case .dataCorrupted(let context):
            let field = path(context)
            return field.isEmpty ? "body is not valid JSON" : "field '\(field)' is invalid"
        @unknown default:
            return "malformed body"
        }
    }
}
