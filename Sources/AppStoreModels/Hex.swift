/// Bytes as lower-case hexadecimal: digests in keys, signatures and fingerprints. Written
/// out by hand: `String(format: "%02x")` per byte cost a tenth of a debit's time.
extension Sequence where Element == UInt8 {
    public var lowercaseHex: String {
        let digits: StaticString = "0123456789abcdef"
        var bytes: [UInt8] = []
        bytes.reserveCapacity(underestimatedCount * 2)
        digits.withUTF8Buffer { digits in
            for byte in self {
                bytes.append(digits[Int(byte >> 4)])
                bytes.append(digits[Int(byte & 0xF)])
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

extension Collection where Element == UInt8 {
    /// 16 bytes in a UUID's text form, lower case: 8-4-4-4-12 hexadecimal digits (the caller
    /// sets the version and variant bits).
    public var uuidText: String {
        precondition(count == 16, "a UUID is 16 bytes")
        let hex = Array(lowercaseHex.utf8)
        var text: [UInt8] = []
        text.reserveCapacity(36)
        for (index, digit) in hex.enumerated() {
            if index == 8 || index == 12 || index == 16 || index == 20 { text.append(UInt8(ascii: "-")) }
            text.append(digit)
        }
        return String(decoding: text, as: UTF8.self)
    }
}
