/// JSON written straight into bytes, for the bodies the server answers most (accounts,
/// deliveries, debits). `JSONEncoder` builds a tree of boxed values, sorts every object's keys
/// and walks it again: 4–5 % of an account read's CPU (`bench --accounts`).
///
/// The output is byte for byte what `JSONEncoder` writes with `[.sortedKeys,
/// .withoutEscapingSlashes]`, as long as the caller writes an object's keys in sorted order
/// (tests compare the two for every type written this way).
public struct JSONOutput: Sendable {
    public private(set) var bytes: [UInt8] = []
    private var needsComma = false

    public init(capacity: Int = 256) {
        bytes.reserveCapacity(capacity)
    }

    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
        needsComma = false
    }

    public mutating func beginObject() {
        separate()
        bytes.append(UInt8(ascii: "{"))
    }

    public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    public mutating func beginArray() {
        separate()
        bytes.append(UInt8(ascii: "["))
    }

    public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    /// An object's key; its value is written next.
    public mutating func key(_ key: String) {
        string(key)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    public mutating func string(_ value: String) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        var value = value
        value.withUTF8 { utf8 in
            var start = 0
            for index in 0..<utf8.count {
                let byte = utf8[index]
                guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
                bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start..<index]))
                start = index + 1
                bytes.append(UInt8(ascii: "\\"))
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): bytes.append(byte)
                case 0x0A: bytes.append(UInt8(ascii: "n"))
                case 0x0D: bytes.append(UInt8(ascii: "r"))
                case 0x09: bytes.append(UInt8(ascii: "t"))
                case 0x08: bytes.append(UInt8(ascii: "b"))
                case 0x0C: bytes.append(UInt8(ascii: "f"))
                default:
                    let digits: StaticString = "0123456789abcdef"
                    bytes.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                    digits.withUTF8Buffer { digits in
                        bytes.append(digits[Int(byte >> 4)])
                        bytes.append(digits[Int(byte & 0xF)])
                    }
                }
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start...]))
        }
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    public mutating func integer<T: BinaryInteger>(_ value: T) {
        separate()
        bytes.append(contentsOf: value.description.utf8)
        needsComma = true
    }

    public mutating func null() {
        separate()
        bytes.append(contentsOf: "null".utf8)
        needsComma = true
    }

    public mutating func bool(_ value: Bool) {
        separate()
        let literal: StaticString = value ? "true" : "false"
        literal.withUTF8Buffer { bytes.append(contentsOf: $0) }
        needsComma = true
    }

    /// `"key":"value"`, or nothing for nil, as synthesized `Encodable` leaves out a nil optional.
    public mutating func field(_ name: String, _ value: String?) {
        guard let value else { return }
        key(name)
        string(value)
    }

    public mutating func field<T: BinaryInteger>(_ name: String, _ value: T) {
        key(name)
        integer(value)
    }

    public mutating func field(_ name: String, _ value: Bool) {
        key(name)
        bool(value)
    }

    /// An object of integers, keys in sorted order (as `JSONEncoder`'s `.sortedKeys`).
    public mutating func object<T: BinaryInteger>(_ values: [String: T]) {
        beginObject()
        for (name, value) in values.sorted(by: { $0.key < $1.key }) {
            field(name, value)
        }
        endObject()
    }
}
