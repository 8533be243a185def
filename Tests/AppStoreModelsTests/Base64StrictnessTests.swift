import Foundation
import Testing

@testable import StoreKeeperSupport

/// The fast base64url decoder accepts and rejects exactly what the general strict decoder does:
/// valid encodings, one-character edits of them, and random text over the alphabet, padding,
/// white space and bytes outside it.
@Suite struct Base64StrictnessTests {
    @Test func fastURLDecoderIsAsStrictAsTheGeneralOne() {
        var generator = SystemRandomNumberGenerator()
        let characters = Array("ABCXYZabcxyz0189-_+/= \n.".utf8) + [0x00, 0x80, 0xFF]
        for length in 0..<64 {
            for _ in 0..<40 {
                let text = (0..<length).map { _ in characters.randomElement(using: &generator)! }
                #expect(Base64.decodeURL(text[...]) == Base64.decode(text[...], standard: false), "\(text)")
            }
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            var encoded = Array(Base64.encodeURL(bytes).utf8)
            #expect(Base64.decodeURL(encoded[...]) == bytes)
            guard !encoded.isEmpty else { continue }
            for _ in 0..<20 {
                encoded[Int.random(in: 0..<encoded.count, using: &generator)] =
                    characters.randomElement(using: &generator)!
                #expect(Base64.decodeURL(encoded[...]) == Base64.decode(encoded[...], standard: false))
            }
        }
    }
}
