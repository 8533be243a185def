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
        let digits: StaticString = "0123456789abcdef"
        return digits.withUTF8Buffer { digits in
            String(unsafeUninitializedCapacity: 36) { text in
                var at = 0
                for (index, byte) in enumerated() {
                    if index == 4 || index == 6 || index == 8 || index == 10 {
                        text[at] = UInt8(ascii: "-")
                        at += 1
                    }
                    text[at] = digits[Int(byte >> 4)]
                    text[at + 1] = digits[Int(byte & 0xF)]
                    at += 2
                }
                return at
            }
        }
    }
}
