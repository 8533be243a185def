import Foundation
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The local App Store's control API (docs/local-app-store.md) as the simulated devices use it:
/// the customer pays, a parent approves, the device reads its receipt; the report reads what
/// each customer paid.
public struct LocalStoreControl: Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }

    public struct Payment: Decodable, Sendable {
        public struct Transaction: Decodable, Sendable {
            public var transactionId: String
            public var originalTransactionId: String?
            public var productId: String
            public var quantity: Int?
            public var appAccountToken: String?
            public var purchaseDate: Int64?
        }
        public var signedTransactions: [String]
        public var transactions: [Transaction]
        public var receipt: String
        public var pendingId: String?
    }

    public struct Product: Decodable, Sendable {
        public struct Grants: Decodable, Sendable {
            public var currency: String?
            public var amount: Int64?
            public var entitlement: String?
        }
        public var id: String
        public var type: String
        public var grants: Grants
    }

    public struct PaidRecord: Decodable, Sendable {
        public struct Transaction: Decodable, Sendable {
            public var transactionId: String
            public var productId: String
            public var quantity: Int
            public var appAccountToken: String?
            public var revoked: Bool
            /// Finished by the app (StoreKit holds it no longer).
            public var finished: Bool?
            public var purchaseDate: Int64?
        }
        public var appleId: String
        public var transactions: [Transaction]
        public var paid: [String: PaidValue]
    }

    /// `"coins": 120` or `"entitlements": ["no_ads"]`.
    public enum PaidValue: Codable, Sendable, Equatable {
        case amount(Int64)
        case list([String])

        public init(from decoder: Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let amount = try? container.decode(Int64.self) {
                self = .amount(amount)
            } else {
                self = .list(try container.decode([String].self))
            }
        }

        public func encode(to encoder: Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .amount(let amount): try container.encode(amount)
            case .list(let list): try container.encode(list)
            }
        }
    }

    let base: String
    let key: String
    let transport: HTTPTransport
    /// The server itself (its `/v1` API).
    let serverBase: String

    /// `server` is the StoreKeeper server; its local App Store is at `/local-app-store`.
    public init(server: URL, key: String, transport: HTTPTransport = AsyncHTTPTransport()) {
        var base = server.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        self.serverBase = base
        self.base = base + "/local-app-store/control"
        self.key = key
        self.transport = transport
    }

    func call<T: Decodable>(_ method: String, _ path: String, body: [String: Any]? = nil, as type: T.Type)
        async throws -> T
    {
        let data = try await raw(method, path, body: body)
        do {
            return try JSONDecoder().decode(T.self, from: data)
        } catch {
            throw Failure(description: "\(path): \(error)")
        }
    }

    @discardableResult
    func raw(_ method: String, _ path: String, body: [String: Any]? = nil) async throws -> Data {
        guard let url = URL(string: base + path) else { throw Failure(description: "bad path \(path)") }
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.httpMethod = method
        request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        if let body {
            request.httpBody = try JSONSerialization.data(withJSONObject: body)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response) = try await transport.send(request)
        let status = response.statusCode
        guard (200..<300).contains(status) else {
            throw Failure(
                description: "\(method) \(path): \(status) \(String(decoding: data.prefix(300), as: UTF8.self))")
        }
        return data
    }

    static func path(_ segment: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "/?#")
        return segment.addingPercentEncoding(withAllowedCharacters: allowed) ?? segment
    }

    /// The customer pays for `items` in one payment (several: a merged payment).
    public func pay(
        appleId: String, items: [(productId: String, quantity: Int)], appAccountToken: UUID?, askToBuy: Bool
    ) async throws -> Payment {
        var body: [String: Any] = [
            "appleId": appleId, "items": items.map { ["productId": $0.productId, "quantity": $0.quantity] },
            "askToBuy": askToBuy,
        ]
        if let appAccountToken { body["appAccountToken"] = appAccountToken.uuidString.lowercased() }
        return try await call("POST", "/purchases", body: body, as: Payment.self)
    }

    public func approve(_ pendingId: String) async throws -> Payment {
        try await call("POST", "/pending/\(Self.path(pendingId))/approve", as: Payment.self)
    }

    public func finish(_ transactionId: String) async throws {
        try await raw("POST", "/transactions/\(Self.path(transactionId))/finish")
    }

    public func receipt(appleId: String) async throws -> String {
        struct Receipt: Decodable { var receipt: String }
        return try await call("GET", "/customers/\(Self.path(appleId))/receipt", as: Receipt.self).receipt
    }

    public func paid(appleId: String) async throws -> PaidRecord {
        try await call("GET", "/customers/\(Self.path(appleId))/purchases", as: PaidRecord.self)
    }

    public func catalog() async throws -> [Product] {
        struct Catalog: Decodable { var products: [Product] }
        return try await call("GET", "/catalog", as: Catalog.self).products
    }

    /// The server's answer-signing keys (`GET /v1/status` → `responseSigningKeys`): the one it
    /// signs with first, then the next one during a rotation. Empty when it does not sign.
    public func responseSigningKeys() async throws -> [(keyId: String, publicKey: String, use: String)] {
        struct Status: Decodable {
            struct Key: Decodable {
                var id: String
                var publicKey: String
                var use: String
            }
            var responseSigningKeys: [Key]?
        }
        guard let url = URL(string: serverBase + "/v1/status") else { throw Failure(description: "bad server URL") }
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        let (data, response) = try await transport.send(request)
        guard response.statusCode == 200 else {
            throw Failure(description: "GET /v1/status: \(response.statusCode)")
        }
        let status = try JSONDecoder().decode(Status.self, from: data)
        return (status.responseSigningKeys ?? []).map { ($0.id, $0.publicKey, $0.use) }
    }

    /// The id of the key the server signs answers with now (nil: it does not sign).
    public func signingKeyId() async throws -> String? {
        try await responseSigningKeys().first { $0.use == "signing" }?.keyId
    }
}
