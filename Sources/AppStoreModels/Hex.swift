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
