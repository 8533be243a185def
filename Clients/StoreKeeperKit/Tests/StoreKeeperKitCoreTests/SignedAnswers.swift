import Foundation

@testable import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(CryptoKit)
    import CryptoKit
#else
    import Crypto
#endif

/// Signs answers as the server does (v2: key id, nonce, method, path, status, the request
/// body's digest, the answer), written from the protocol's text, not from the SDK's code.
enum SignedAnswers {
    static func keyId(_ key: Curve25519.Signing.PrivateKey) -> String {
        String(
            SHA256.hash(data: key.publicKey.rawRepresentation).map { String(format: "%02x", $0) }.joined().prefix(16))
    }

    static func header(
        key: Curve25519.Signing.PrivateKey, nonce: String, method: String, path: String, status: Int,
        requestBody: Data, body: Data
    ) throws -> String {
        let id = keyId(key)
        let digest = SHA256.hash(data: requestBody).map { String(format: "%02x", $0) }.joined()
        var message = Data("storekeeper-response-v2\n\(id)\n\(nonce)\n\(method)\n\(path)\n\(status)\n\(digest)\n".utf8)
        message.append(body)
        return "keyid=\(id);v2=" + Data(try key.signature(for: message)).base64EncodedString()
    }

    static func v1Header(key: Curve25519.Signing.PrivateKey, nonce: String, path: String, body: Data) throws -> String {
        var message = Data("storekeeper-response-v1\n\(nonce)\n\(path)\n".utf8)
        message.append(body)
        return Data(try key.signature(for: message)).base64EncodedString()
    }

    static func publicKey(_ key: Curve25519.Signing.PrivateKey) throws -> ResponseSigningKey {
        try ResponseSigningKey(key.publicKey.rawRepresentation.base64EncodedString())
    }
}

/// A server that answers every purchase "delivered" for the transactions the request names,
/// signed the way `sign` says (or not), counting requests.
final class SigningServer: HTTPTransport, @unchecked Sendable {
    enum Signature {
        case v2(Curve25519.Signing.PrivateKey)
        case v1(Curve25519.Signing.PrivateKey)
        case none
        /// A man in the middle changed the request's body: the server signs what it received.
        case requestChangedInTransit(Curve25519.Signing.PrivateKey)
        /// A signed 200 whose status line a man in the middle rewrote.
        case statusChanged(Curve25519.Signing.PrivateKey)
    }
    let signature: Locked<Signature>
    let requests = Locked(0)
    /// An unsigned 503 with this Retry-After instead (the load shedder).
    let shed = Locked<Int?>(nil)

    init(_ signature: Signature) { self.signature = Locked(signature) }

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        requests.withValue { $0 += 1 }
        let url = request.url!
        if let retryAfter = shed.withValue({ $0 }) {
            return (
                Data(#"{"error":{"code":"overloaded","message":"busy","retryable":true}}"#.utf8),
                HTTPURLResponse(
                    url: url, statusCode: 503, httpVersion: nil, headerFields: ["Retry-After": String(retryAfter)])!
            )
        }
        let requestBody = request.httpBody ?? Data()
        if url.path.hasSuffix("/orders") {
            let json = (try? JSONSerialization.jsonObject(with: requestBody)) as? [String: Any] ?? [:]
            let order =
                #"{"orderId":"o-\#(UUID().uuidString)","appAccountToken":"\#(UUID().uuidString)","status":"created","productId":"\#(json["productId"] as? String ?? "")","quantity":1,"accountId":"\#(json["accountId"] as? String ?? "")"}"#
            return (Data(order.utf8), HTTPURLResponse(url: url, statusCode: 201, httpVersion: nil, headerFields: [:])!)
        }
        if url.path.contains("/cancel") {
            return (Data("{}".utf8), HTTPURLResponse(url: url, statusCode: 200, httpVersion: nil, headerFields: [:])!)
        }
        let body: Data
        if url.path.hasSuffix("/purchases") {
            let json = (try? JSONSerialization.jsonObject(with: requestBody)) as? [String: Any] ?? [:]
            let jws = (json["signedTransactions"] as? [String]) ?? [(json["signedTransaction"] as? String) ?? ""]
            let ids = jws.map { FakeJWS.transactionId(of: $0) ?? "?" }
            let entries = ids.map { #"{"transactionId":"\#($0)","outcome":"delivered"}"# }.joined(separator: ",")
            let account = (json["accountId"] as? String) ?? "a"
            body = Data(
                #"{"status":"delivered","transactions":[\#(entries)],"account":{"accountId":"\#(account)"}}"#.utf8)
        } else {
            let account = url.lastPathComponent
            body = Data(#"{"accountId":"\#(account)","balances":{"coins":60}}"#.utf8)
        }
        let nonce = request.value(forHTTPHeaderField: "StoreKeeper-Nonce") ?? ""
        let method = request.httpMethod ?? "GET"
        var headers = ["Content-Type": "application/json"]
        switch signature.withValue({ $0 }) {
        case .v2(let key):
            headers["StoreKeeper-Signature"] = try SignedAnswers.header(
                key: key, nonce: nonce, method: method, path: url.path, status: 200, requestBody: requestBody,
                body: body)
        case .v1(let key):
            headers["StoreKeeper-Signature"] = try SignedAnswers.v1Header(
                key: key, nonce: nonce, path: url.path, body: body)
        case .none: break
        case .requestChangedInTransit(let key):
            headers["StoreKeeper-Signature"] = try SignedAnswers.header(
                key: key, nonce: nonce, method: method, path: url.path, status: 200,
                requestBody: requestBody + Data(" ".utf8), body: body)
        case .statusChanged(let key):
            headers["StoreKeeper-Signature"] = try SignedAnswers.header(
                key: key, nonce: nonce, method: method, path: url.path, status: 409, requestBody: requestBody,
                body: body)
        }
        return (body, HTTPURLResponse(url: url, statusCode: 200, httpVersion: nil, headerFields: headers)!)
    }
}

/// The fakes' JWS are `jws-<id>`.
enum FakeJWS {
    static func transactionId(of jws: String) -> String? { jws.hasPrefix("jws-") ? String(jws.dropFirst(4)) : nil }
}
