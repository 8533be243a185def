import AppStoreVerification
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import StoreKeeperServer

/// `GET /openapi.json` is the document, and the document is true: every route the server
/// registers is in it and every path in it is registered; every error code the server can emit
/// is listed and nothing else; and every operation, called without credentials and with a key
/// and a hostile body, answers only with a status its entry documents.
///
/// The local App Store's routes (`/local-app-store/…`, Apple's API imitated, documented in
/// docs/local-app-store.md) are the one part left out.
@Suite struct OpenAPITests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// `/v1/orders/:orderId` and `/v1/orders/{orderId}` both as `/v1/orders/{}`.
    static func normalized(_ path: String) -> String {
        "/"
            + path.split(separator: "/").map { part in
                part.hasPrefix(":") || (part.hasPrefix("{") && part.hasSuffix("}")) ? "{}" : String(part)
            }.joined(separator: "/")
    }

    static func document(_ client: any TestClientProtocol) async throws -> [String: Any] {
        try await client.execute(uri: "/openapi.json", method: .get) { response in
            #expect(response.status == .ok)
            #expect(response.headers[.contentType] == "application/json")
            return try #require(try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any])
        }
    }

    /// "METHOD /path" → its documented response statuses.
    static func operations(_ document: [String: Any]) throws -> [String: Set<String>] {
        let paths = try #require(document["paths"] as? [String: [String: Any]])
        var operations: [String: Set<String>] = [:]
        for (path, item) in paths {
            for (method, operation) in item {
                guard ["get", "post", "put", "delete", "patch"].contains(method) else { continue }
                let responses = ((operation as? [String: Any])?["responses"] as? [String: Any]) ?? [:]
                operations["\(method.uppercased()) \(normalized(path))"] = Set(responses.keys)
            }
        }
        return operations
    }

    @Test func theServedDocumentListsExactlyTheRegisteredRoutes() async throws {
        try await ServerAPITests.withServer("sqlite") { app, client in
            let documented = try Self.operations(try await Self.document(client))
            let registered = Set(
                app.routes().routes.map { "\($0.method) \(Self.normalized($0.path.description))" }
                    // A catch-all (`/dashboard/**`, any other dashboard address: a 404 page) has
                    // no OpenAPI form; /dashboard's description says what it answers.
                    .filter { !$0.contains(" /local-app-store") && !$0.hasSuffix("/**") })
            let undocumented = registered.subtracting(documented.keys).sorted()
            let unregistered = Set(documented.keys).subtracting(registered).sorted()
            #expect(undocumented.isEmpty, "registered but not in docs/openapi.yaml: \(undocumented)")
            #expect(unregistered.isEmpty, "in docs/openapi.yaml but not registered: \(unregistered)")
            #expect(registered.count > 30, "\(registered.count) routes")
        }
    }

    /// Every code an `APIError` is built with in the server's sources (and the raw JSON bodies
    /// of the load shedder and the deadline), plus the verification failures', against the
    /// `Error.code` enum of the document.
    @Test func theDocumentedErrorCodesAreExactlyTheOnesTheServerEmits() async throws {
        var emitted: Set<String> = []
        let sources = Self.root.appendingPathComponent("Sources/StoreKeeperServer")
        let files =
            FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil)?
            .compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" } ?? []
        #expect(files.count > 20)
        let patterns = [
            #/APIError\(\s*\.[a-zA-Z]+,\s*"([a-z_]+)"/#, #/\.init\(\s*\.[a-zA-Z]+,\s*"([a-z_]+)"/#,
            #/"code":"([a-z_]+)"/#,
        ]
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            for pattern in patterns {
                for match in text.matches(of: pattern) { emitted.insert(String(match.output.1)) }
            }
        }
        let failures: [VerificationFailure] = [
            .invalidSignature(""), .invalidChain(""), .wrongBundle(expected: "", actual: nil),
            .wrongApp(expected: 0, actual: nil), .wrongEnvironment(expected: [], actual: nil), .revoked(""),
            .appleUnavailable(""),
        ]
        emitted.formUnion(failures.map(\.code))
        emitted.formUnion(
            [APIError.refusal(.revoked), .refusal(.ownedByOtherAccount(owner: "")), .refusal(.orderOfAnotherAccount)]
                .map(\.code))
        let emittedCodes = emitted
        try await ServerAPITests.withServer("sqlite") { _, client in
            let emitted = emittedCodes
            let document = try await Self.document(client)
            let schemas = try #require((document["components"] as? [String: Any])?["schemas"] as? [String: Any])
            let error = try #require(
                ((schemas["Error"] as? [String: Any])?["properties"] as? [String: Any])?["error"] as? [String: Any])
            let code = try #require((error["properties"] as? [String: Any])?["code"] as? [String: Any])
            let documented = Set(try #require(code["enum"] as? [String]))
            #expect(
                emitted.subtracting(documented).isEmpty,
                "emitted but not documented: \(emitted.subtracting(documented).sorted())")
            #expect(
                documented.subtracting(emitted).isEmpty,
                "documented but never emitted: \(documented.subtracting(emitted).sorted())")
        }
    }

    /// Each operation called for real (path parameters `x`): with no credentials, then with a
    /// secret key and a body that is JSON but not what it wants. Whatever it answers must be a
    /// status its entry lists.
    @Test func everyOperationAnswersOnlyWithDocumentedStatuses() async throws {
        try await ServerAPITests.withServer("sqlite") { _, client in
            let operations = try Self.operations(try await Self.document(client))
            var wrong: [String] = []
            for (operation, statuses) in operations.sorted(by: { $0.key < $1.key }) {
                let parts = operation.split(separator: " ", maxSplits: 1)
                let method = HTTPRequest.Method(rawValue: String(parts[0]))!
                let path = String(parts[1]).replacingOccurrences(of: "{}", with: "x")
                for token in [nil, ServerAPITests.secret] {
                    var headers: HTTPFields = [.contentType: "application/json"]
                    if let token { headers[.authorization] = "Bearer \(token)" }
                    let body: ByteBuffer? = method == .get || method == .delete ? nil : ByteBuffer(string: "{}")
                    let status = try await client.execute(uri: path, method: method, headers: headers, body: body) {
                        $0.status
                    }
                    if !statuses.contains(String(status.code)) && !statuses.contains("default") {
                        wrong.append("\(operation) (\(token == nil ? "no credentials" : "secret key")): \(status.code)")
                    }
                }
            }
            #expect(wrong.isEmpty, "undocumented answers: \(wrong)")
        }
    }
}
