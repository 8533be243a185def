import Foundation

/// Base64 decoding for the two alphabets Apple's signed data uses, with hard size limits.
enum Base64 {
    private static let table: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, char) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8.enumerated() {
            table[Int(char)] = UInt8(index)
        }
        table[Int(UInt8(ascii: "-"))] = 62  // base64url
        table[Int(UInt8(ascii: "_"))] = 63
        table[Int(UInt8(ascii: "+"))] = 62  // standard
        table[Int(UInt8(ascii: "/"))] = 63
        return table
    }()

    /// Decodes base64url without padding (RFC 7515 §2), as JWS segments are.
    /// Returns nil for any character outside the alphabet, padding, or an impossible length.
    static func decodeURL<S: Collection>(_ input: S) -> [UInt8]? where S.Element == UInt8 {
        decode(input, allowStandard: false)
    }

    /// Decodes standard base64 (x5c entries, uploaded receipts); padding optional,
    /// ASCII white space (line breaks in pasted receipts) skipped.
    static func decodeStandard<S: Collection>(_ input: S) -> [UInt8]? where S.Element == UInt8 {
        decode(input, allowStandard: true)
    }

    private static func decode<S: Collection>(_ input: S, allowStandard: Bool) -> [UInt8]?
    where S.Element == UInt8 {
        var output = [UInt8]()
        output.reserveCapacity(input.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        var padding = 0
        for byte in input {
            if allowStandard {
                if byte == UInt8(ascii: "=") {
                    padding += 1
                    continue
                }
                if byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { continue }
                if byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_") { return nil }
            } else if byte == UInt8(ascii: "+") || byte == UInt8(ascii: "/") || byte == UInt8(ascii: "=") {
                return nil
            }
            // Data after padding is not base64.
            if padding > 0 { return nil }
            let value = table[Int(byte)]
            if value == 0xFF { return nil }
            accumulator = (accumulator << 6) | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        // 6 leftover bits cannot come from whole bytes; more than two '=' is not base64; and
        // leftover bits must be zero, so each byte string has exactly one encoding and an
        // edit to any character of a signed segment changes the signed bytes.
        if bits >= 6 || padding > 2 { return nil }
        if bits > 0 && accumulator & ((1 << UInt32(bits)) - 1) != 0 { return nil }
        return output
    }
}
