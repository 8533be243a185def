import AppStoreModels
import Foundation
import SwiftASN1

/// Decodes the ASN.1 payload of an app receipt (Apple's receipt documentation §4.2–4.5).
///
/// One pass over the attributes, each value parsed once: linear in the receipt's size.
/// Every length is checked by swift-asn1 against the bytes actually present and nesting is
/// bounded, so lying lengths, truncation and deep nesting are errors, never crashes.
public enum AppReceiptParser {
    public struct MalformedReceipt: Error, Hashable, Sendable, CustomStringConvertible {
        public var reason: String
        public var description: String { reason }
    }

    /// Parses the payload (the bytes of the PKCS#7 `eContent`).
    public static func parsePayload(_ bytes: ArraySlice<UInt8>, maxInAppPurchases: Int = 100_000) throws -> AppReceipt {
        var receipt = AppReceipt()
        // Each attribute is 4 elements; the payload holds ~20 plus one per purchase.
        let budget = (maxInAppPurchases + 64) * 4 + 1
        for attribute in try attributes(of: bytes, what: "receipt payload", maxNodes: budget) {
            let value = attribute.value
            switch attribute.type {
            case 0: receipt.receiptType = try string(value)
            case 1: receipt.appItemId = try integer(value)
            case 2:
                receipt.bundleId = try string(value)
                receipt.bundleIdValueBytes = Array(value)
            case 3: receipt.applicationVersion = try string(value)
            case 4: receipt.opaqueValue = Array(value)
            case 5: receipt.sha1Hash = Array(value)
            case 8: receipt.requestDate = try date(value)
            case 12: receipt.creationDate = try date(value)
            case 15: receipt.downloadId = try integer(value)
            case 16: receipt.versionExternalIdentifier = try integer(value)
            case 17: receipt.inAppPurchases.append(try inAppPurchase(value))
            case 18: receipt.originalPurchaseDate = try date(value)
            case 19: receipt.originalApplicationVersion = try string(value)
            case 21: receipt.expirationDate = try date(value)
            default: continue  // unknown and reserved types are ignored, as Apple says
            }
        }
        return receipt
    }

    static func inAppPurchase(_ bytes: ArraySlice<UInt8>) throws -> AppReceiptInAppPurchase {
        var purchase = AppReceiptInAppPurchase()
        for attribute in try attributes(of: bytes, what: "in-app purchase", maxNodes: 4 * 64 + 1) {
            let value = attribute.value
            switch attribute.type {
            case 1701: purchase.quantity = try integer(value)
            case 1702: purchase.productId = try string(value)
            case 1703: purchase.transactionId = try string(value)
            case 1704: purchase.purchaseDate = try date(value)
            case 1705: purchase.originalTransactionId = try string(value)
            case 1706: purchase.originalPurchaseDate = try date(value)
            case 1707: purchase.productType = try integer(value)
            case 1708: purchase.subscriptionExpirationDate = try date(value)
            case 1711: purchase.webOrderLineItemId = try integer(value).map(String.init)
            case 1712: purchase.cancellationDate = try date(value)
            case 1713: purchase.isTrialPeriod = try integer(value).map { $0 != 0 }
            case 1719: purchase.isInIntroOfferPeriod = try integer(value).map { $0 != 0 }
            case 1721: purchase.promotionalOfferId = try string(value)
            default: continue
            }
        }
        return purchase
    }

    struct Attribute {
        var type: Int64
        var value: ArraySlice<UInt8>
    }

    /// `SET OF SEQUENCE { type INTEGER, version INTEGER, value OCTET STRING }`.
    static func attributes(of bytes: ArraySlice<UInt8>, what: String, maxNodes: Int) throws -> [Attribute] {
        let root: ASN1Node
        do {
            try ASN1Budget.check(bytes, maxNodes: maxNodes)
            root = try BER.parse(bytes)
        } catch let error as ASN1Budget.Exceeded {
            throw MalformedReceipt(reason: "\(what): \(error.description)")
        } catch {
            throw MalformedReceipt(reason: "\(what) is not valid ASN.1 (\(error))")
        }
        guard root.identifier == .set, case .constructed(let children) = root.content else {
            throw MalformedReceipt(reason: "\(what) is not an ASN.1 SET")
        }
        var result: [Attribute] = []
        for child in children {
            guard child.identifier == .sequence, case .constructed(let fields) = child.content else {
                throw MalformedReceipt(reason: "\(what) attribute is not a SEQUENCE")
            }
            var iterator = fields.makeIterator()
            guard let typeNode = iterator.next(), let versionNode = iterator.next(), let valueNode = iterator.next()
            else {
                throw MalformedReceipt(reason: "\(what) attribute has fewer than 3 fields")
            }
            guard typeNode.identifier == .integer, case .primitive(let typeBytes) = typeNode.content,
                let type = smallInteger(typeBytes)
            else {
                throw MalformedReceipt(reason: "\(what) attribute type is not an INTEGER")
            }
            guard versionNode.identifier == .integer else {
                throw MalformedReceipt(reason: "\(what) attribute version is not an INTEGER")
            }
            guard valueNode.identifier == .octetString, case .primitive(let value) = valueNode.content else {
                throw MalformedReceipt(reason: "\(what) attribute \(type) value is not an OCTET STRING")
            }
            result.append(Attribute(type: type, value: value))
        }
        return result
    }

    /// A value holding a complete string TLV (UTF8String, IA5String, PrintableString).
    static func string(_ value: ArraySlice<UInt8>) throws -> String? {
        guard !value.isEmpty else { return nil }
        let node = try innerNode(value)
        guard [ASN1Identifier.utf8String, .ia5String, .printableString, .visibleString].contains(node.identifier),
            case .primitive(let content) = node.content
        else {
            throw MalformedReceipt(reason: "receipt attribute is not a string")
        }
        guard let text = String(validating: content, as: UTF8.self) else {
            throw MalformedReceipt(reason: "receipt string is not UTF-8")
        }
        return text
    }

    /// A value holding a complete INTEGER TLV that fits 64 bits.
    static func integer(_ value: ArraySlice<UInt8>) throws -> Int64? {
        guard !value.isEmpty else { return nil }
        let node = try innerNode(value)
        guard node.identifier == .integer, case .primitive(let content) = node.content,
            let number = smallInteger(content)
        else {
            throw MalformedReceipt(reason: "receipt attribute is not a 64-bit INTEGER")
        }
        return number
    }

    /// A value holding an IA5String RFC 3339 date; an empty string means "no value".
    static func date(_ value: ArraySlice<UInt8>) throws -> Date? {
        guard let text = try string(value), !text.isEmpty else { return nil }
        guard let date = RFC3339.parse(text) else {
            throw MalformedReceipt(
                reason: "receipt date \(VerificationFailure.quoted(text, limit: 40)) is not RFC 3339")
        }
        return date
    }

    private static func innerNode(_ value: ArraySlice<UInt8>) throws -> ASN1Node {
        do {
            try ASN1Budget.check(value, maxNodes: 1)
            return try BER.parse(value)
        } catch {
            throw MalformedReceipt(reason: "receipt attribute value is not a complete ASN.1 element")
        }
    }

    /// Two's-complement big-endian INTEGER content, if it fits in Int64.
    static func smallInteger(_ content: ArraySlice<UInt8>) -> Int64? {
        guard !content.isEmpty, content.count <= 8 || (content.count == 9 && content.first == 0) else { return nil }
        var result: Int64 = (content.first! & 0x80) != 0 ? -1 : 0
        for byte in content { result = (result << 8) | Int64(byte) }
        if content.count == 9 && result < 0 { return nil }
        return result
    }
}

/// RFC 3339 timestamps as receipts hold them: `2018-11-13T16:46:31Z`, optional fraction,
/// `Z`, `±HH:MM` or `±HHMM`. Hand-written because it runs for every date of every purchase.
enum RFC3339 {
    static func parse(_ text: String) -> Date? {
        var bytes = Array(text.utf8)[...]
        func number(_ digits: Int) -> Int? {
            guard bytes.count >= digits else { return nil }
            var value = 0
            for _ in 0..<digits {
                let byte = bytes.removeFirst()
                guard byte >= 0x30, byte <= 0x39 else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            return value
        }
        func expect(_ char: UInt8) -> Bool {
            guard bytes.first == char else { return false }
            bytes.removeFirst()
            return true
        }
        guard let year = number(4), expect(UInt8(ascii: "-")), let month = number(2), expect(UInt8(ascii: "-")),
            let day = number(2), expect(UInt8(ascii: "T")) || expect(UInt8(ascii: " ")),
            let hour = number(2), expect(UInt8(ascii: ":")), let minute = number(2), expect(UInt8(ascii: ":")),
            let second = number(2),
            (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61
        else { return nil }
        var fraction = 0.0
        if expect(UInt8(ascii: ".")) {
            var scale = 0.1
            var digits = 0
            while let byte = bytes.first, byte >= 0x30, byte <= 0x39 {
                fraction += Double(byte - 0x30) * scale
                scale /= 10
                digits += 1
                bytes.removeFirst()
            }
            guard digits > 0 else { return nil }
        }
        var offsetSeconds = 0
        if expect(UInt8(ascii: "Z")) || expect(UInt8(ascii: "z")) {
            offsetSeconds = 0
        } else if let sign = bytes.first, sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") {
            bytes.removeFirst()
            guard let offsetHours = number(2) else { return nil }
            _ = expect(UInt8(ascii: ":"))
            guard let offsetMinutes = number(2), offsetHours < 24, offsetMinutes < 60 else { return nil }
            offsetSeconds = (offsetHours * 3600 + offsetMinutes * 60) * (sign == UInt8(ascii: "-") ? -1 : 1)
        } else {
            return nil
        }
        guard bytes.isEmpty else { return nil }
        let days = daysFromCivil(year: year, month: month, day: day)
        let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offsetSeconds
        return Date(timeIntervalSince1970: Double(seconds) + fraction)
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
    private static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }
}
