/// A small, strict JSON reader for the hot path: verifying a JWS transaction decodes its
/// payload on every call, and Foundation's `JSONDecoder` costs about as much as a quarter of
/// the P-256 signature check. Payloads that use anything unusual fall back to `JSONDecoder`
/// (see `FastDecodable`), so this only has to be right, not complete.
public enum FastJSON: Equatable, Sendable {
    case string(String)
    /// The number's text exactly as written, converted by the reader that knows its type.
    case number(String)
    case bool(Bool)
    case null
    case array([FastJSON])
    case object([String: FastJSON])

    public struct Malformed: Error, Equatable, Sendable {
        public var reason: String
    }

    /// Parses one JSON value spanning all of `bytes` (surrounding white space allowed).
    public static func parse(_ bytes: [UInt8], maxDepth: Int = 32) throws -> FastJSON {
        try bytes.withUnsafeBufferPointer { buffer in
            var reader = Reader(bytes: buffer, maxDepth: maxDepth)
            let value = try reader.value(depth: 0)
            reader.skipSpace()
            guard reader.index == buffer.count else { throw Malformed(reason: "trailing characters") }
            return value
        }
    }

    private struct Reader {
        let bytes: UnsafeBufferPointer<UInt8>
        let maxDepth: Int
        var index = 0

        init(bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
            self.bytes = bytes
            self.maxDepth = maxDepth
        }

        mutating func skipSpace() {
            while index < bytes.count {
                let byte = bytes[index]
                guard byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 else { return }
                index += 1
            }
        }

        mutating func value(depth: Int) throws -> FastJSON {
            guard depth <= maxDepth else { throw Malformed(reason: "nested too deeply") }
            skipSpace()
            guard index < bytes.count else { throw Malformed(reason: "unexpected end") }
            switch bytes[index] {
            case UInt8(ascii: "{"): return try object(depth: depth)
            case UInt8(ascii: "["): return try array(depth: depth)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"): return try literal("true", .bool(true))
            case UInt8(ascii: "f"): return try literal("false", .bool(false))
            case UInt8(ascii: "n"): return try literal("null", .null)
            default: return try number()
            }
        }

        mutating func literal(_ word: StaticString, _ value: FastJSON) throws -> FastJSON {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count else { throw Malformed(reason: "bad literal") }
            for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
                throw Malformed(reason: "bad literal")
            }
            index += count
            return value
        }

        mutating func object(depth: Int) throws -> FastJSON {
            index += 1
            // Apple's payloads have up to ~35 fields; sizing once avoids rehashing as it grows.
            var result = [String: FastJSON](minimumCapacity: depth == 0 ? 40 : 8)
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return .object(result)
            }
            while true {
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else {
                    throw Malformed(reason: "expected a key")
                }
                let key = try string()
                // Decoders disagree on duplicate keys; refuse, and let the caller fall back.
                guard result[key] == nil else { throw Malformed(reason: "duplicate key '\(key)'") }
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else {
                    throw Malformed(reason: "expected ':'")
                }
                index += 1
                result[key] = try value(depth: depth + 1)
                skipSpace()
                guard index < bytes.count else { throw Malformed(reason: "unterminated object") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                } else if bytes[index] == UInt8(ascii: "}") {
                    index += 1
                    return .object(result)
                } else {
                    throw Malformed(reason: "expected ',' or '}'")
                }
            }
        }

        mutating func array(depth: Int) throws -> FastJSON {
            index += 1
            var result: [FastJSON] = []
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(result)
            }
            while true {
                result.append(try value(depth: depth + 1))
                skipSpace()
                guard index < bytes.count else { throw Malformed(reason: "unterminated array") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                } else if bytes[index] == UInt8(ascii: "]") {
                    index += 1
                    return .array(result)
                } else {
                    throw Malformed(reason: "expected ',' or ']'")
                }
            }
        }

        mutating func string() throws -> String {
            index += 1
            let start = index
            // Fast path: no escapes. Eight bytes at a time while none of them is a quote, a
            // backslash or a control character (a notification's payload is mostly two 5 KB
            // signed strings).
            if let base = bytes.baseAddress {
                let ones: UInt64 = 0x0101_0101_0101_0101
                let highs: UInt64 = 0x8080_8080_8080_8080
                while index + 8 <= bytes.count {
                    let word = UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self)
                    let quotes = word ^ (ones &* 0x22)
                    let backslashes = word ^ (ones &* 0x5C)
                    // A byte is flagged when it is zero (the quote or backslash) or below 0x20.
                    let flagged =
                        ((quotes &- ones) & ~quotes) | ((backslashes &- ones) & ~backslashes)
                        | ((word &- ones &* 0x20) & ~word)
                    if flagged & highs != 0 { break }
                    index += 8
                }
            }
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    let slice = UnsafeBufferPointer(rebasing: bytes[start..<index])
                    index += 1
                    guard let text = String(validating: slice, as: UTF8.self) else {
                        throw Malformed(reason: "string is not UTF-8")
                    }
                    return text
                }
                if byte == UInt8(ascii: "\\") { break }
                guard byte >= 0x20 else { throw Malformed(reason: "control character in string") }
                index += 1
            }
            var scalars = Array(bytes[start..<index])
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    guard let text = String(validating: scalars, as: UTF8.self) else {
                        throw Malformed(reason: "string is not UTF-8")
                    }
                    return text
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { throw Malformed(reason: "unterminated escape") }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scalars.append(escape)
                    case UInt8(ascii: "b"): scalars.append(0x08)
                    case UInt8(ascii: "f"): scalars.append(0x0C)
                    case UInt8(ascii: "n"): scalars.append(0x0A)
                    case UInt8(ascii: "r"): scalars.append(0x0D)
                    case UInt8(ascii: "t"): scalars.append(0x09)
                    case UInt8(ascii: "u"):
                        var code = try hex4()
                        if (0xD800..<0xDC00).contains(code) {
                            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                                bytes[index + 1] == UInt8(ascii: "u")
                            else { throw Malformed(reason: "lone surrogate") }
                            index += 2
                            let low = try hex4()
                            guard (0xDC00..<0xE000).contains(low) else { throw Malformed(reason: "bad surrogate") }
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        } else if (0xDC00..<0xE000).contains(code) {
                            throw Malformed(reason: "lone surrogate")
                        }
                        guard let scalar = Unicode.Scalar(code) else { throw Malformed(reason: "bad \\u escape") }
                        scalars.append(contentsOf: Array(String(Character(scalar)).utf8))
                    default:
                        throw Malformed(reason: "bad escape")
                    }
                default:
                    guard byte >= 0x20 else { throw Malformed(reason: "control character in string") }
                    scalars.append(byte)
                }
            }
            throw Malformed(reason: "unterminated string")
        }

        mutating func hex4() throws -> UInt32 {
            guard index + 4 <= bytes.count else { throw Malformed(reason: "short \\u escape") }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[index]
                index += 1
                let digit: UInt8
                switch byte {
                case 0x30...0x39: digit = byte - 0x30
                case 0x41...0x46: digit = byte - 0x41 + 10
                case 0x61...0x66: digit = byte - 0x61 + 10
                default: throw Malformed(reason: "bad \\u escape")
                }
                value = value << 4 | UInt32(digit)
            }
            return value
        }

        /// RFC 8259 number grammar, kept as text.
        mutating func number() throws -> FastJSON {
            let start = index
            if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw Malformed(reason: "unexpected character") }
            if bytes[index] == UInt8(ascii: "0") {
                index += 1
            } else {
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                index += 1
                guard index < bytes.count, isDigit(bytes[index]) else { throw Malformed(reason: "bad number") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                    index += 1
                }
                guard index < bytes.count, isDigit(bytes[index]) else { throw Malformed(reason: "bad number") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            return .number(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
        }

        func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }
    }
}

extension FastJSON {
    /// Typed reads of an object's fields; absent and `null` are both nil, anything else of the
    /// wrong shape throws `Unsupported`.
    public struct Fields {
        public let values: [String: FastJSON]
        public init(_ values: [String: FastJSON]) { self.values = values }

        public struct Unsupported: Error {
            public init() {}
        }

        public func string(_ key: String) throws -> String? {
            switch values[key] {
            case nil, .null?: return nil
            case .string(let value)?: return value
            default: throw Unsupported()
            }
        }

        public func bool(_ key: String) throws -> Bool? {
            switch values[key] {
            case nil, .null?: return nil
            case .bool(let value)?: return value
            default: throw Unsupported()
            }
        }

        public func int64(_ key: String) throws -> Int64? {
            switch values[key] {
            case nil, .null?: return nil
            case .number(let text)?:
                guard let value = Int64(text) else { throw Unsupported() }
                return value
            default: throw Unsupported()
            }
        }

        public func int32(_ key: String) throws -> Int32? {
            guard let value = try int64(key) else { return nil }
            guard let narrow = Int32(exactly: value) else { throw Unsupported() }
            return narrow
        }

        public func strings(_ key: String) throws -> [String]? {
            switch values[key] {
            case nil, .null?: return nil
            case .array(let items)?:
                return try items.map {
                    guard case .string(let value) = $0 else { throw Unsupported() }
                    return value
                }
            default: throw Unsupported()
            }
        }

        public func object(_ key: String) throws -> Fields? {
            switch values[key] {
            case nil, .null?: return nil
            case .object(let fields)?: return Fields(fields)
            default: throw Unsupported()
            }
        }

        /// Fields this reader does not model make the payload fall back to `JSONDecoder`.
        public func absent(_ key: String) throws {
            if let value = values[key], value != .null { throw Unsupported() }
        }
    }
}
