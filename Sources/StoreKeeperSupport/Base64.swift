/// Base64 decoding for the two alphabets Apple's signed data uses. Strict: one encoding per
/// byte string (no stray bits, padding only where standard base64 allows it), so an edit to
/// any character of a signed segment changes the decoded bytes. Encoding writes base64url
/// without padding, as JWS segments are written.
public enum Base64 {
    private static let table: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, char) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8.enumerated() {
            table[Int(char)] = UInt8(index)
        }
        return table
    }()

    /// The URL alphabet's values; 0xFF for anything else.
    private static let urlTable: [UInt8] = {
        var table = Self.table
        table[Int(UInt8(ascii: "-"))] = 62
        table[Int(UInt8(ascii: "_"))] = 63
        return table
    }()

    /// Whether `byte` is a character of the base64url alphabet.
    @inlinable
    public static func isURLAlphabet(_ byte: UInt8) -> Bool {
        // Comparisons, not the table: called per byte from other modules.
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
            return true
        default: return false
        }
    }

    /// Decodes base64url without padding (RFC 7515 §2), as JWS segments are: four characters
    /// to three bytes at a time, into storage allocated once (a notification's three JWS are
    /// ~10 KB of base64). Exactly as strict as `decode(_:standard:)` (tests compare the two).
    public static func decodeURL(_ input: ArraySlice<UInt8>) -> [UInt8]? {
        let count = input.count
        let remainder = count % 4
        guard remainder != 1 else { return nil }
        let outputCount = count / 4 * 3 + max(0, remainder - 1)
        var valid = true
        let output = [UInt8](unsafeUninitializedCapacity: outputCount) { output, initialized in
            initialized = 0
            valid = urlTable.withUnsafeBufferPointer { table in
                input.withUnsafeBufferPointer { input in
                    var read = 0
                    var written = 0
                    while read + 4 <= count {
                        let a = table[Int(input[read])]
                        let b = table[Int(input[read + 1])]
                        let c = table[Int(input[read + 2])]
                        let d = table[Int(input[read + 3])]
                        guard (a | b | c | d) & 0x80 == 0 else { return false }
                        let word = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6 | UInt32(d)
                        output[written] = UInt8(truncatingIfNeeded: word >> 16)
                        output[written + 1] = UInt8(truncatingIfNeeded: word >> 8)
                        output[written + 2] = UInt8(truncatingIfNeeded: word)
                        read += 4
                        written += 3
                    }
                    if remainder >= 2 {
                        let a = table[Int(input[read])]
                        let b = table[Int(input[read + 1])]
                        let c = remainder == 3 ? table[Int(input[read + 2])] : 0
                        // Leftover bits must be zero: one encoding per byte string.
                        guard (a | b | c) & 0x80 == 0, remainder == 3 ? c & 0x03 == 0 : b & 0x0F == 0 else {
                            return false
                        }
                        output[written] = a << 2 | b >> 4
                        if remainder == 3 { output[written + 1] = (b & 0x0F) << 4 | c >> 2 }
                    }
                    return true
                }
            }
            if valid { initialized = outputCount }
        }
        return valid ? output : nil
    }

    /// Decodes standard base64 (x5c entries, uploaded receipts); padding optional,
    /// ASCII white space (line breaks in pasted receipts) skipped.
    public static func decodeStandard<S: Collection>(_ input: S) -> [UInt8]? where S.Element == UInt8 {
        decode(ArraySlice(input), standard: true)
    }

    /// Decodes base64url text without padding; nil if it is not exactly that.
    public static func decodeURL<S: StringProtocol>(_ text: S) -> [UInt8]? {
        decodeURL(ArraySlice(text.utf8))
    }

    /// Encodes as base64url without padding (RFC 7515 §2). By hand: Foundation's base64 and
    /// three `replacingOccurrences` took most of the time of signing a JWS. Written straight
    /// into the string's storage (appending byte by byte to an array was 5 % of accepting a
    /// notification, when stored notifications were re-encoded).
    public static func encodeURL<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        let count = bytes.count
        guard count > 0 else { return "" }
        let length = count / 3 * 4 + [0, 2, 3][count % 3]
        let encode = { (input: UnsafeBufferPointer<UInt8>) -> String in
            String(unsafeUninitializedCapacity: length) { output in
                urlAlphabet.withUTF8Buffer { alphabet in
                    var read = 0
                    var write = 0
                    while read + 3 <= count {
                        let word = UInt32(input[read]) << 16 | UInt32(input[read + 1]) << 8 | UInt32(input[read + 2])
                        output[write] = alphabet[Int(word >> 18)]
                        output[write + 1] = alphabet[Int(word >> 12 & 0x3F)]
                        output[write + 2] = alphabet[Int(word >> 6 & 0x3F)]
                        output[write + 3] = alphabet[Int(word & 0x3F)]
                        read += 3
                        write += 4
                    }
                    let rest = count - read
                    if rest > 0 {
                        let word = UInt32(input[read]) << 16 | (rest == 2 ? UInt32(input[read + 1]) << 8 : 0)
                        output[write] = alphabet[Int(word >> 18)]
                        output[write + 1] = alphabet[Int(word >> 12 & 0x3F)]
                        if rest == 2 { output[write + 2] = alphabet[Int(word >> 6 & 0x3F)] }
                    }
                }
                return length
            }
        }
        if let encoded = bytes.withContiguousStorageIfAvailable(encode) { return encoded }
        return Array(bytes).withUnsafeBufferPointer(encode)
    }

    private static let urlAlphabet: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

    static func decode(_ input: ArraySlice<UInt8>, standard: Bool) -> [UInt8]? {
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
