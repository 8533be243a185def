import Foundation

/// Base64 decoding for the two alphabets Apple's signed data uses. Strict: one encoding per
/// byte string (no stray bits, padding only where standard base64 allows it), so an edit to
/// any character of a signed segment changes the decoded bytes.
enum Base64 {
    private static let table: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, char) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8.enumerated() {
            table[Int(char)] = UInt8(index)
        }
        return table
    }()

    /// Decodes base64url without padding (RFC 7515 §2), as JWS segments are.
    static func decodeURL(_ input: ArraySlice<UInt8>) -> [UInt8]? {
        decode(input, standard: false)
    }

    /// Decodes standard base64 (x5c entries, uploaded receipts); padding optional,
    /// ASCII white space (line breaks in pasted receipts) skipped.
    static func decodeStandard<S: Collection>(_ input: S) -> [UInt8]? where S.Element == UInt8 {
        decode(ArraySlice(input), standard: true)
    }

    private static func decode(_ input: ArraySlice<UInt8>, standard: Bool) -> [UInt8]? {
        let (plus, slash): (UInt8, UInt8) =
            standard ? (UInt8(ascii: "+"), UInt8(ascii: "/")) : (UInt8(ascii: "-"), UInt8(ascii: "_"))
        var output = [UInt8]()
        output.reserveCapacity(input.count * 3 / 4 + 2)
        var accumulator: UInt32 = 0
        var bits: UInt32 = 0
        var padding = 0
        let ok: Bool = table.withUnsafeBufferPointer { table in
            input.withUnsafeBufferPointer { bytes in
                for byte in bytes {
                    var value = table[Int(byte)]
                    if value == 0xFF {
                        if byte == plus {
                            value = 62
                        } else if byte == slash {
                            value = 63
                        } else if standard && byte == UInt8(ascii: "=") {
                            padding += 1
                            continue
                        } else if standard && (byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09) {
                            continue
                        } else {
                            return false
                        }
                    }
                    // Data after padding is not base64.
                    if padding > 0 { return false }
                    accumulator = (accumulator << 6) | UInt32(value)
                    bits += 6
                    if bits >= 8 {
                        bits -= 8
                        output.append(UInt8(truncatingIfNeeded: accumulator >> bits))
                    }
                }
                return true
            }
        }
        // 6 leftover bits cannot come from whole bytes; more than two '=' is not base64;
        // leftover bits must be zero.
        guard ok, bits < 6, padding <= 2 else { return nil }
        if bits > 0 && accumulator & ((1 << bits) - 1) != 0 { return nil }
        return output
    }
}
