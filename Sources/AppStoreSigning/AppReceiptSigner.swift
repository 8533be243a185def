import AppStoreModels
import Foundation
import SwiftASN1
@_spi(CMS) import X509
import _CryptoExtras

/// Writes app receipts as devices hold them: the ASN.1 payload of receipts.md §4.2, in a
/// PKCS#7 SignedData signed with SHA-256/RSA by a receipt-signing certificate.
public struct AppReceiptSigner: Sendable {
    public let certificate: Certificate
    public let privateKey: _RSA.Signing.PrivateKey
    public let intermediates: [Certificate]

    public init(certificate: Certificate, privateKey: _RSA.Signing.PrivateKey, intermediates: [Certificate]) {
        self.certificate = certificate
        self.privateKey = privateKey
        self.intermediates = intermediates
    }

    /// The signed receipt (DER). With `signedAttributes` the signature covers content type,
    /// message digest and signing time, as newer Apple receipts do; without, the content itself.
    public func sign(_ receipt: AppReceipt, signedAttributes: Bool = true) throws -> [UInt8] {
        try sign(
            payload: AppReceiptEncoder.payload(receipt),
            signingTime: signedAttributes ? receipt.creationDate ?? Date() : nil)
    }

    public func sign(payload: [UInt8], signingTime: Date?) throws -> [UInt8] {
        try CMS.sign(
            payload, signatureAlgorithm: .sha256WithRSAEncryption,
            additionalIntermediateCertificates: intermediates, certificate: certificate,
            privateKey: Certificate.PrivateKey(privateKey), signingTime: signingTime, detached: false)
    }
}

/// DER encoding of the receipt payload; the inverse of `AppReceiptParser`.
public enum AppReceiptEncoder {
    public static func payload(_ receipt: AppReceipt) throws -> [UInt8] {
        var attributes: [(Int64, [UInt8])] = []
        func add(_ type: Int64, _ value: [UInt8]?) { if let value { attributes.append((type, value)) } }
        add(0, try receipt.receiptType.map(utf8))
        add(1, try receipt.appItemId.map(integer))
        add(2, try receipt.bundleIdValueBytes ?? receipt.bundleId.map(utf8))
        add(3, try receipt.applicationVersion.map(utf8))
        add(4, receipt.opaqueValue)
        add(5, receipt.sha1Hash)
        add(8, try receipt.requestDate.map(date))
        add(12, try receipt.creationDate.map(date))
        add(15, try receipt.downloadId.map(integer))
        add(16, try receipt.versionExternalIdentifier.map(integer))
        add(18, try receipt.originalPurchaseDate.map(date))
        add(19, try receipt.originalApplicationVersion.map(utf8))
        add(21, try receipt.expirationDate.map(date))
        for purchase in receipt.inAppPurchases {
            add(17, try inAppPayload(purchase))
        }
        return try set(attributes)
    }

    public static func inAppPayload(_ purchase: AppReceiptInAppPurchase) throws -> [UInt8] {
        var attributes: [(Int64, [UInt8])] = []
        func add(_ type: Int64, _ value: [UInt8]?) { if let value { attributes.append((type, value)) } }
        add(1701, try purchase.quantity.map(integer))
        add(1702, try purchase.productId.map(utf8))
        add(1703, try purchase.transactionId.map(utf8))
        add(1704, try purchase.purchaseDate.map(date))
        add(1705, try purchase.originalTransactionId.map(utf8))
        add(1706, try purchase.originalPurchaseDate.map(date))
        add(1707, try purchase.productType.map(integer))
        // Apple writes an empty IA5String for "no expiry / not cancelled".
        add(1708, try purchase.subscriptionExpirationDate.map(date) ?? ia5(""))
        add(1711, try purchase.webOrderLineItemId.flatMap { Int64($0) }.map(integer))
        add(1712, try purchase.cancellationDate.map(date) ?? ia5(""))
        add(1713, try purchase.isTrialPeriod.map { try integer($0 ? 1 : 0) })
        add(1719, try purchase.isInIntroOfferPeriod.map { try integer($0 ? 1 : 0) })
        add(1721, try purchase.promotionalOfferId.map(utf8))
        return try set(attributes)
    }

    static func set(_ attributes: [(Int64, [UInt8])]) throws -> [UInt8] {
        var serializer = DER.Serializer()
        try serializer.appendConstructedNode(identifier: .set) { coder in
            for (type, value) in attributes {
                try coder.appendConstructedNode(identifier: .sequence) { coder in
                    try coder.serialize(type)
                    try coder.serialize(Int64(1))
                    coder.appendPrimitiveNode(identifier: .octetString) { $0.append(contentsOf: value) }
                }
            }
        }
        return serializer.serializedBytes
    }

    static func utf8(_ text: String) throws -> [UInt8] { string(text, as: .utf8String) }

    static func ia5(_ text: String) throws -> [UInt8] { string(text, as: .ia5String) }

    private static func string(_ text: String, as identifier: ASN1Identifier) -> [UInt8] {
        var serializer = DER.Serializer()
        serializer.appendPrimitiveNode(identifier: identifier) { $0.append(contentsOf: Array(text.utf8)) }
        return serializer.serializedBytes
    }

    static func integer(_ value: Int64) throws -> [UInt8] {
        var serializer = DER.Serializer()
        try serializer.serialize(value)
        return serializer.serializedBytes
    }

    static func date(_ date: Date) throws -> [UInt8] {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        return try ia5(formatter.string(from: date))
    }
}
