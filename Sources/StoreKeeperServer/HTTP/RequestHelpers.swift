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

/// What every controller's handlers share: bodies (up to `maxBodyBytes`), path parameters, text
/// checks and JSON answers. Each controller holds its own dependencies and conforms.
protocol RequestHandling {
    /// `limits.maxBodyBytes`: a longer body is refused 413 before it is read.
    var maxBodyBytes: Int { get }
}

extension StoreKeeperApp: RequestHandling {
    var maxBodyBytes: Int { configuration.maxBodyBytes }
}

extension RequestHandling {
    func decode<T: RequestBody>(_ type: T.Type, _ request: Request) async throws -> T {
        if let length = request.headers[.contentLength].flatMap(Int.init), length > maxBodyBytes {
            throw APIError(.contentTooLarge, "payload_too_large", "request body is over \(maxBodyBytes) bytes")
        }
        var request = request
        let buffer = try await request.collectBody(upTo: maxBodyBytes)
        return try Self.decodeBody(T.self, Data(buffer: buffer))
    }

    /// A request body as JSON, then its own checks (`RequestBody.validate`): the one decoding
    /// path of every handler, and what the `requests` fuzz target feeds hostile bytes to.
    static func decodeBody<T: RequestBody>(_ type: T.Type, _ data: Data) throws -> T {
        guard !data.isEmpty else { throw APIError.badRequest("request body is empty") }
        let body: T
        do {
            // The large bodies (a notification's or a retention request's JWS) have a hand-written
            // reader that yields what JSONDecoder would, or hands over to it (`FastDecodable`).
            if let fast = T.self as? any FastDecodable.Type, let decoded = try fast.decode(json: [UInt8](data)) as? T {
                body = decoded
            } else {
                body = try JSONDecoder().decode(T.self, from: data)
            }
        } catch let error as DecodingError {
            throw APIError.badRequest(ErrorMiddleware<StoreKeeperContext>.describe(error))
        }
        try body.validate()
        return body
    }

    /// A path parameter, percent-decoded (`/v1/accounts/player%20one` is account `player one`).
    static func parameter(_ context: StoreKeeperContext, _ name: String) throws -> String {
        // Most parameters hold no escape: decoded only when they do.
        guard let raw = context.parameters.get(name),
            let value = raw.utf8.contains(UInt8(ascii: "%")) ? raw.removingPercentEncoding : String(raw)
        else {
            throw APIError.badRequest("path parameter '\(name)' is missing or not valid percent-encoding")
        }
        // Characters as users count them, and bytes as the database stores them: one `Character`
        // may carry any number of combining scalars.
        guard !value.isEmpty, value.count <= 200, value.utf8.count <= 800 else {
            throw APIError.badRequest("path parameter '\(name)' must be 1…200 characters")
        }
        try validateText(value, field: name)
        return value
    }

    static func validateAccountId(_ accountId: String) throws {
        guard !accountId.isEmpty, accountId.count <= 128, accountId.utf8.count <= 512 else {
            throw APIError.badRequest("field 'accountId' must be 1…128 characters")
        }
        try validateText(accountId, field: "accountId")
    }

    /// Ids are printable text: no control characters (NUL, newlines, escapes) that could forge
    /// log lines or break a database driver.
    /// `requireNFC` (ids, the default): one spelling per id. Free text (a note, a search) may be
    /// in any normalization form.
    static func validateText(_ value: String, field: String, requireNFC: Bool = true) throws {
        // Unicode's control characters (Cc): U+0000–001F and U+007F–009F; ASCII is decided
        // without looking the category up.
        let isControl: (Unicode.Scalar) -> Bool = { scalar in
            scalar.value < 0x80
                ? scalar.value < 0x20 || scalar.value == 0x7F : scalar.properties.generalCategory == .control
        }
        guard !value.unicodeScalars.contains(where: isControl) else {
            throw APIError.badRequest("field '\(field)' must not contain control characters")
        }
        // One spelling per id: the database compares bytes, Swift compares canonical equivalence
        // (`Identifiers`), and the two agree only on NFC text.
        guard !requireNFC || Identifiers.isNFC(value) else {
            throw APIError.badRequest(
                "field '\(field)' must be in Unicode Normalization Form C (NFC): the same text has one spelling")
        }
    }

    /// An id Apple issues (a transaction id, an app transaction id): 1…64 ASCII digits — not
    /// `Character.isNumber`, which takes "٣", "½" and a digit with a combining mark.
    static func isAppleNumericId(_ value: String) -> Bool {
        !value.isEmpty && value.utf8.count <= 64
            && value.utf8.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: try encoder.encode(value))))
    }

    /// The bodies answered most, written without `JSONEncoder` (the same bytes).
    static func json<T: JSONWritable>(_ value: T, status: HTTPResponse.Status = .ok) throws -> Response {
        var output = JSONOutput()
        value.write(to: &output)
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: output.bytes)))
    }

    static func iso(_ date: Date) -> String {
        date.formatted(
            .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
    }
}

/// A JSON request body and the checks it can make on its own (lengths, ranges, control
/// characters); what needs the catalog, the database or the clock stays in the handler.
protocol RequestBody: Decodable {
    func validate() throws
}

/// The request bodies by name, for the `requests` fuzz target (`scripts/fuzz requests`): each
/// decoded and validated exactly as its handler does. Throws `APIError` for bad input; anything
/// else (a crash, a hang) is a bug.
public enum RequestBodies {
    public static let names = [
        "order", "purchase", "debit", "notification", "resolve", "retention", "extend", "massExtend", "grant",
        "consent", "externalToken", "supportRefund", "transfer",
    ]

    public static func decode(_ name: String, _ data: Data) throws {
        typealias App = StoreKeeperApp
        switch name {
        case "order": _ = try App.decodeBody(App.CreateOrderBody.self, data)
        case "purchase": _ = try App.decodeBody(App.PurchaseBody.self, data)
        case "debit": _ = try App.decodeBody(App.DebitBody.self, data)
        case "notification": _ = try App.decodeBody(App.NotificationBody.self, data)
        case "resolve": _ = try App.decodeBody(AnomaliesController.ResolveBody.self, data)
        case "retention": _ = try App.decodeBody(RealtimeRequestBody.self, data)
        case "extend": _ = try App.decodeBody(App.ExtendBody.self, data)
        case "massExtend": _ = try App.decodeBody(App.MassExtendBody.self, data)
        case "grant": _ = try App.decodeBody(App.GrantBody.self, data)
        case "consent": _ = try App.decodeBody(App.ConsentBody.self, data)
        case "externalToken": _ = try App.decodeBody(App.ExternalTokenBody.self, data)
        case "supportRefund": _ = try App.decodeBody(App.SupportRefundBody.self, data)
        case "transfer": _ = try App.decodeBody(App.TransferBody.self, data)
        default: preconditionFailure("no request body '\(name)'")
        }
    }
}

extension RealtimeRequestBody: RequestBody {
    func validate() throws {
        guard let signedPayload, !signedPayload.isEmpty else {
            throw APIError.badRequest("field 'signedPayload' is required")
        }
    }
}
