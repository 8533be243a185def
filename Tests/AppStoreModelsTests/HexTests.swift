import Foundation
import StoreKeeperSupport
import Testing

/// `lowercaseHex` and `uuidText` write what Foundation writes, for any bytes.
@Suite struct HexTests {
    @Test func hexAndUUIDTextMatchFoundation() {
        var generator = SystemRandomNumberGenerator()
        #expect([UInt8]().lowercaseHex == "")
        #expect([0x00, 0x0F, 0xA0, 0xFF].lowercaseHex == "000fa0ff")
        for _ in 0..<1_000 {
            let bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
            #expect(bytes.lowercaseHex == bytes.map { String(format: "%02x", $0) }.joined())
            let uuid = UUID(
                uuid: (
                    bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9],
                    bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
                ))
            #expect(bytes.uuidText == uuid.uuidString.lowercased())
        }
    }
}

/// `Base64.encodeURL` writes what Foundation's base64 writes, in the URL alphabet without
/// padding, and `decodeURL` reads it back, for every length and byte.
@Suite struct Base64URLTests {
    @Test func encodeMatchesFoundationAndRoundTrips() {
        var generator = SystemRandomNumberGenerator()
        for length in 0..<300 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let expected = Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            let encoded = Base64.encodeURL(bytes)
            #expect(encoded == expected)
            #expect(Base64.decodeURL(encoded) == bytes)
        }
        #expect(Base64.decodeURL("a+b") == nil)
        #expect(Base64.decodeURL("YQ==") == nil)
        // Non-contiguous input (a lazy collection) encodes the same.
        let bytes = Array(0...255).map(UInt8.init)
        #expect(Base64.encodeURL(bytes.lazy.map { $0 }) == Base64.encodeURL(bytes))
    }

    @Test func urlAlphabetIsExactlyTheSixtyFourCharacters() {
        let alphabet = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        for byte in UInt8.min...UInt8.max {
            #expect(Base64.isURLAlphabet(byte) == alphabet.contains(byte), "\(byte)")
        }
    }
}
