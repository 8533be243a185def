import AppStoreModels
import Crypto
import Foundation

/// Signing what StoreKit takes to apply an offer, with the In-App Purchase key
/// (docs/offers-and-retention.md §1–2): the V1 promotional-offer signature and the V2 signed JWS
/// requests (`promotional-offer`, `introductory-offer-eligibility`).
public struct OfferSigner: Sendable {
    public let key: P256.Signing.PrivateKey
    public let keyId: String
    public let issuerId: String
    public let bundleId: String

    public init(privateKeyPEM: String, keyId: String, issuerId: String, bundleId: String) throws {
        self.key = try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM)
        self.keyId = keyId
        self.issuerId = issuerId
        self.bundleId = bundleId
    }

    init(key: P256.Signing.PrivateKey, keyId: String, issuerId: String, bundleId: String) {
        self.key = key
        self.keyId = keyId
        self.issuerId = issuerId
        self.bundleId = bundleId
    }

    /// The same In-App Purchase key signing for another app of the developer team (the
    /// signature covers the bundle id).
    public func forBundle(_ bundleId: String) -> OfferSigner {
        OfferSigner(key: key, keyId: keyId, issuerId: issuerId, bundleId: bundleId)
    }

    /// A V1 signature's fields, as StoreKit's `promotionalOffer(offerID:keyID:nonce:signature:timestamp:)` takes them.
    public struct V1: Sendable, Hashable {
        public var keyId: String
        public var nonce: UUID
        /// Milliseconds since 1970.
        public var timestamp: Int64
        /// Base64 of the DER ECDSA signature.
        public var signature: String
    }

    /// The seven fields joined by U+2063 (§1): bundle, key id, product, offer, token (lower
    /// case; empty when absent), nonce (lower case), timestamp in ms.
    public static func v1Payload(
        bundleId: String, keyId: String, productId: String, offerId: String, appAccountToken: String?, nonce: UUID,
        timestamp: Int64
    ) -> String {
        [
            bundleId, keyId, productId, offerId, appAccountToken?.lowercased() ?? "", nonce.uuidString.lowercased(),
            String(timestamp),
        ].joined(separator: "\u{2063}")
    }

    public func signV1(
        productId: String, offerId: String, appAccountToken: UUID?, nonce: UUID, timestamp: Int64
    ) throws -> V1 {
        let payload = Self.v1Payload(
            bundleId: bundleId, keyId: keyId, productId: productId, offerId: offerId,
            appAccountToken: appAccountToken?.uuidString, nonce: nonce, timestamp: timestamp)
        let signature = try key.signature(for: Array(payload.utf8))
        return V1(
            keyId: keyId, nonce: nonce, timestamp: timestamp,
            signature: signature.derRepresentation.base64EncodedString())
    }

    /// A claim's value in a V2 JWS.
    public enum Claim: Sendable, Hashable {
        case string(String)
        case integer(Int64)
        case bool(Bool)
    }

    /// The V2 JWS (§2): header `alg` ES256, `kid`, `typ` JWT; claims `iss`, `iat` (seconds, no
    /// `exp`), `aud`, `bid`, `nonce` plus the feature's claims. The JSON is written directly
    /// (keys sorted): `JSONSerialization` of a `[String: Any]` was a tenth of a retention
    /// answer's CPU (`bench --retention`).
    public func signV2(audience: String, nonce: UUID, issuedAt: Date, claims: [String: Claim]) throws -> String {
        var payload = claims
        payload["iss"] = .string(issuerId)
        payload["iat"] = .integer(Int64(issuedAt.timeIntervalSince1970))
        payload["aud"] = .string(audience)
        payload["bid"] = .string(bundleId)
        payload["nonce"] = .string(nonce.uuidString.lowercased())
        var header = JSONOutput(capacity: 64)
        header.beginObject()
        header.field("alg", "ES256")
        header.field("kid", keyId)
        header.field("typ", "JWT")
        header.endObject()
        var body = JSONOutput()
        body.beginObject()
        for (name, value) in payload.sorted(by: { $0.key < $1.key }) {
            switch value {
            case .string(let text): body.field(name, text)
            case .integer(let number): body.field(name, number)
            case .bool(let flag): body.field(name, flag)
            }
        }
        body.endObject()
        let input = Base64.encodeURL(header.bytes) + "." + Base64.encodeURL(body.bytes)
        let signature = try key.signature(for: Array(input.utf8))
        return input + "." + Base64.encodeURL(signature.rawRepresentation)
    }

    /// `promotional-offer`: `productId`, `offerIdentifier`, and `transactionId` when known.
    public func promotionalOfferJWS(
        productId: String, offerId: String, transactionId: String?, nonce: UUID, issuedAt: Date
    ) throws -> String {
        var claims: [String: Claim] = ["productId": .string(productId), "offerIdentifier": .string(offerId)]
        if let transactionId { claims["transactionId"] = .string(transactionId) }
        return try signV2(audience: "promotional-offer", nonce: nonce, issuedAt: issuedAt, claims: claims)
    }

    /// `introductory-offer-eligibility`: `productId`, `allowIntroductoryOffer`, `transactionId`.
    public func introductoryEligibilityJWS(
        productId: String, allowed: Bool, transactionId: String, nonce: UUID, issuedAt: Date
    ) throws -> String {
        try signV2(
            audience: "introductory-offer-eligibility", nonce: nonce, issuedAt: issuedAt,
            claims: [
                "productId": .string(productId), "allowIntroductoryOffer": .bool(allowed),
                "transactionId": .string(transactionId),
            ])
    }
}

/// Checking offer signatures as the App Store does (the local App Store), against the public
/// half of the In-App Purchase key it issued.
public struct OfferSignatureChecker: Sendable {
    public let keys: [String: P256.Signing.PublicKey]

    public init(keys: [String: P256.Signing.PublicKey]) { self.keys = keys }

    /// The claims of a V2 JWS whose ES256 signature checks out under the key its `kid` names.
    public struct V2Claims: Decodable, Sendable, Hashable {
        public var iss: String?
        public var iat: Int64?
        public var exp: Int64?
        public var aud: String?
        public var bid: String?
        public var nonce: String?
        public var productId: String?
        public var offerIdentifier: String?
        public var transactionId: String?
        public var allowIntroductoryOffer: Bool?
        /// Set from the header, not the payload.
        public var keyId: String?
    }

    public func verifyV1(_ payload: String, keyId: String, signatureBase64: String) -> Bool {
        guard let key = keys[keyId], let der = Data(base64Encoded: signatureBase64),
            let signature = try? P256.Signing.ECDSASignature(derRepresentation: der)
        else { return false }
        return key.isValidSignature(signature, for: Array(payload.utf8))
    }

    /// The claims of a V2 JWS whose header is ES256 with a known `kid` and whose signature
    /// verifies; nil otherwise.
    public func verifyV2(_ jws: String) -> V2Claims? {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, jws.utf8.count <= 16_384,
            let headerData = Self.base64URLDecode(parts[0]), let payloadData = Self.base64URLDecode(parts[1]),
            let signatureData = Self.base64URLDecode(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            header["alg"] as? String == "ES256", let kid = header["kid"] as? String, let key = keys[kid],
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureData),
            key.isValidSignature(signature, for: Array("\(parts[0]).\(parts[1])".utf8)),
            var claims = try? JSONDecoder().decode(V2Claims.self, from: payloadData)
        else { return nil }
        claims.keyId = kid
        return claims
    }

    static func base64URLDecode(_ text: Substring) -> Data? {
        Base64.decodeURL(text).map { Data($0) }
    }
}
