import Foundation
import StoreKeeperSupport
import Testing

/// `JSONOutput` writes what `JSONEncoder` writes with `[.sortedKeys, .withoutEscapingSlashes]`.
@Suite struct JSONOutputTests {
    static func encoded<T: Encodable>(_ value: T) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    static func written(_ body: (inout JSONOutput) -> Void) -> String {
        var output = JSONOutput()
        body(&output)
        return String(decoding: output.bytes, as: UTF8.self)
    }

    /// Every character class an id, a product or a note could hold: each control character,
    /// quotes, backslashes, slashes, DEL, line separators, accents, emoji.
    static func randomString(_ generator: inout some RandomNumberGenerator) -> String {
        let pool: [Unicode.Scalar] =
            (0..<0x20).map { Unicode.Scalar(UInt8($0)) } + ["\"", "\\", "/", "\u{7F}", "\u{2028}", "é", "😀", "中"]
            + "abcXYZ019-_. ".unicodeScalars
        var text = String.UnicodeScalarView()
        for _ in 0..<Int.random(in: 0...24, using: &generator) {
            text.append(pool.randomElement(using: &generator)!)
        }
        return String(text)
    }

    @Test func stringsIntegersAndBooleans() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2_000 {
            let strings = (0..<3).map { _ in Self.randomString(&generator) }
            #expect(
                Self.written { json in
                    json.beginArray()
                    for string in strings { json.string(string) }
                    json.endArray()
                } == (try Self.encoded(strings)))
        }
        let integers: [Int64] = [0, 1, -1, Int64.min, Int64.max, 1_000_000]
        #expect(
            Self.written { json in
                json.beginArray()
                for value in integers { json.integer(value) }
                json.bool(true)
                json.bool(false)
                json.endArray()
            } == "[0,1,-1,-9223372036854775808,9223372036854775807,1000000,true,false]")
        #expect(
            Self.written { json in
                json.beginArray()
                json.endArray()
            } == (try Self.encoded([Int]())))
    }

    /// Objects of integers come out in `JSONEncoder`'s sorted key order, whatever the keys.
    @Test func integerObjectsSortLikeJSONEncoder() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<1_000 {
            var values: [String: Int64] = [:]
            for _ in 0..<Int.random(in: 0...6, using: &generator) {
                values[Self.randomString(&generator)] = Int64.random(in: Int64.min...Int64.max, using: &generator)
            }
            #expect(Self.written { $0.object(values) } == (try Self.encoded(values)))
        }
        let tricky: [String: Int64] = ["a10": 1, "a9": 2, "B": 3, "a": 4, "_x": 5, "é": 6, "": 7, "A": 8]
        #expect(Self.written { $0.object(tricky) } == (try Self.encoded(tricky)))
    }

    /// Nested objects and arrays separate their members exactly once; nil fields are left out.
    @Test func nestingAndOptionalFields() throws {
        struct Inner: Encodable {
            var a: Bool
            var b: String?
            var c: Int
        }
        struct Outer: Encodable {
            var list: [Inner]
            var name: String
            var totals: [String: Int64]
        }
        let value = Outer(
            list: [Inner(a: true, b: nil, c: 1), Inner(a: false, b: "x", c: -2)], name: "n", totals: ["z": 1, "y": 2])
        let written = Self.written { json in
            json.beginObject()
            json.key("list")
            json.beginArray()
            for inner in value.list {
                json.beginObject()
                json.field("a", inner.a)
                json.field("b", inner.b)
                json.field("c", inner.c)
                json.endObject()
            }
            json.endArray()
            json.field("name", value.name)
            json.key("totals")
            json.object(value.totals)
            json.endObject()
        }
        #expect(written == (try Self.encoded(value)))
    }
}
