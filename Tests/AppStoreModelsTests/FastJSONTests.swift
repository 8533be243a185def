import AppStoreModels
import Foundation
import Testing

/// The hot-path decoder agrees with `JSONDecoder` whenever it answers at all.
@Suite struct FastJSONTests {
    static let sample = """
        {"transactionId":"2000000511223344","originalTransactionId":"2000000500000001","webOrderLineItemId":"2000000077665544",
         "bundleId":"com.example.app","productId":"com.example.pro.monthly","subscriptionGroupIdentifier":"21345678",
         "purchaseDate":1767225600000,"originalPurchaseDate":1764547200000,"expiresDate":1769904000000,"quantity":1,
         "type":"Auto-Renewable Subscription","appAccountToken":"7e3fb20b-4cdb-47cc-936d-99d65f608138",
         "inAppOwnershipType":"PURCHASED","signedDate":1767225605000,"revocationReason":1,"revocationDate":1767225609000,
         "revocationType":"REFUND_PRORATED","revocationPercentage":50000,"isUpgraded":false,"offerType":4,
         "offerIdentifier":"winback","offerDiscountType":"PAY_AS_YOU_GO","offerPeriod":"P1M","environment":"Production",
         "storefront":"DEU","storefrontId":"143443","transactionReason":"RENEWAL","currency":"EUR","price":4990,
         "appTransactionId":"705000000123456789","billingPlanType":"MONTHLY","unknownField":{"a":[1,2,{"b":null}]},
         "commitmentInfo":{"billingPeriodNumber":2,"totalBillingPeriods":12,"commitmentExpiresDate":1798761600000,
         "commitmentPrice":59880,"extra":"x"}}
        """

    @Test func fastDecoderMatchesJSONDecoderOnAFullPayload() throws {
        let bytes = Array(Self.sample.utf8)
        guard case .object(let fields) = try FastJSON.parse(bytes) else {
            Issue.record("not an object")
            return
        }
        let fast = try JWSTransactionDecodedPayload(fast: .init(fields))
        #expect(fast == (try JSONDecoder().decode(JWSTransactionDecodedPayload.self, from: Data(bytes))))
        #expect(fast.commitmentInfo?.commitmentPrice == 59880)
    }

    @Test func readsEscapesAndUnicode() throws {
        let value = try FastJSON.parse(Array(#"{"k":"a\"b\\c\/d\n\t\u00e9\ud83d\ude00 ü"}"#.utf8))
        #expect(value == .object(["k": .string("a\"b\\c/d\n\té😀 ü")]))
        #expect(
            try FastJSON.parse(Array(" [1, -0.5e3, true, false, null, {}] ".utf8))
                == .array([.number("1"), .number("-0.5e3"), .bool(true), .bool(false), .null, .object([:])]))
    }

    @Test(arguments: [
        "", "{", "}", "{\"a\":}", "{\"a\" 1}", "{\"a\":1,}", "[1,]", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}",
        "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00x\"}", "{\"a\":tru}", "{\"a\":1} x",
        "{\"a\":1,\"a\":2}", "{\"a\":\"\u{01}\"}", "{a:1}", String(repeating: "[", count: 100),
    ])
    func rejectsMalformedJSON(text: String) {
        #expect(throws: FastJSON.Malformed.self) { try FastJSON.parse(Array(text.utf8)) }
    }

    /// Strings are scanned eight bytes at a time: a quote, a backslash, a control character or
    /// a non-ASCII byte is found at every offset of a word, as `JSONSerialization` finds it.
    @Test func longStringsWithASpecialByteAtEveryOffset() throws {
        let specials: [[UInt8]] = [
            Array(#"\""#.utf8), Array(#"\\"#.utf8), Array(#"\n"#.utf8), Array(#"\u0041"#.utf8), [0x1F], [0x00],
            [0x7F], Array("é".utf8), Array("😀".utf8), [0xFF], Array(" ".utf8), Array("!".utf8), Array("]".utf8),
        ]
        for special in specials {
            for prefix in 0..<20 {
                for suffix in [0, 1, 7, 8, 9, 23] {
                    var bytes = Array(#"{"k":""#.utf8)
                    bytes += Array(repeating: UInt8(ascii: "a"), count: prefix) + special
                    bytes += Array(repeating: UInt8(ascii: "b"), count: suffix) + Array(#""}"#.utf8)
                    let expected = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: String]
                    let fast = try? FastJSON.parse(bytes)
                    if let expected, let text = expected["k"] {
                        #expect(fast == .object(["k": .string(text)]), "\(special) at \(prefix)")
                    } else {
                        #expect(fast == nil, "\(special) at \(prefix)")
                    }
                }
            }
        }
    }

    @Test func rejectsInvalidUTF8() {
        #expect(throws: FastJSON.Malformed.self) { try FastJSON.parse([0x22, 0xFF, 0xFE, 0x22]) }
    }

    /// Random mutations of a real payload: whenever both decoders answer, they agree; the
    /// fast path never accepts what `JSONDecoder` rejects.
    /// One to three random edits (replace, delete, insert) of JSON-ish characters.
    static func mutated(_ original: [UInt8], using rng: inout SeededGenerator) -> [UInt8] {
        let alphabet = Array("0123456789-.eE\"{}[]:,tfnul \\abcxyz".utf8)
        var bytes = original
        for _ in 0..<Int.random(in: 1...3, using: &rng) {
            let position = Int.random(in: 0..<bytes.count, using: &rng)
            switch Int.random(in: 0..<3, using: &rng) {
            case 0: bytes[position] = alphabet.randomElement(using: &rng)!
            case 1: bytes.remove(at: position)
            default: bytes.insert(alphabet.randomElement(using: &rng)!, at: position)
            }
        }
        return bytes
    }

    @Test func decodersAgreeUnderMutation() throws {
        var rng = SeededGenerator(seed: 0xFA57_0001)
        let original = Array(Self.sample.utf8)
        for _ in 0..<5000 {
            let bytes = Self.mutated(original, using: &rng)
            let reference = try? JSONDecoder().decode(JWSTransactionDecodedPayload.self, from: Data(bytes))
            let combined = try? JWSTransactionDecodedPayload.decode(json: bytes)
            #expect(combined == reference, "\(String(decoding: bytes, as: UTF8.self))")
        }
    }

    static let notification = """
        {"notificationType":"DID_RENEW","subtype":"BILLING_RECOVERY","notificationUUID":"002e14d5-51f5-4503-b5a8-c3a1af68eb20",
         "version":"2.0","signedDate":1767225605000,"extra":[1,{"x":null}],
         "data":{"appAppleId":1234567890,"bundleId":"com.example.app","bundleVersion":"42","environment":"Production",
         "signedTransactionInfo":"eyJ.a.b","signedRenewalInfo":"eyJ.c.d","status":1,
         "consumptionRequestReason":"UNINTENDED_PURCHASE","future":"x"}}
        """

    /// The notification payload's reader: the same agreement, full and mutated; a summary or
    /// other rare shapes take JSONDecoder.
    @Test func notificationDecodersAgreeUnderMutation() throws {
        let original = Array(Self.notification.utf8)
        guard case .object(let fields) = try FastJSON.parse(original) else {
            Issue.record("not an object")
            return
        }
        let fast = try ResponseBodyV2DecodedPayload(fast: .init(fields))
        #expect(fast == (try JSONDecoder().decode(ResponseBodyV2DecodedPayload.self, from: Data(original))))
        #expect(fast.data?.status == .active)
        let summary = Array(
            #"{"notificationType":"RENEWAL_EXTENSION","subtype":"SUMMARY","summary":{"succeededCount":3}}"#.utf8)
        #expect(try ResponseBodyV2DecodedPayload.decode(json: summary).summary?.succeededCount == 3)
        var rng = SeededGenerator(seed: 0xFA57_0002)
        for _ in 0..<5000 {
            let bytes = Self.mutated(original, using: &rng)
            let reference = try? JSONDecoder().decode(ResponseBodyV2DecodedPayload.self, from: Data(bytes))
            let combined = try? ResponseBodyV2DecodedPayload.decode(json: bytes)
            #expect(combined == reference, "\(String(decoding: bytes, as: UTF8.self))")
        }
    }

    /// A Get Retention Message payload and the `{"signedPayload": …}` body: the fast reader and
    /// JSONDecoder agree, whole and mutated (duplicate keys, type mismatches and malformed
    /// bytes included).
    @Test func retentionAndBodyDecodersAgreeUnderMutation() throws {
        let request = Array(
            #"{"originalTransactionId":"2000000000000001","appAppleId":1234567890,"productId":"pro_monthly","userLocale":"en-US","requestIdentifier":"0a1b2c3d-0000-4000-8000-000000000001","signedDate":1767225605000,"environment":"Production","extra":{"x":[1,2]}}"#
                .utf8)
        let body = Array(#"{"signedPayload":"eyJhbGciOiJFUzI1NiJ9.eyJ4IjoxfQ.c2ln","other":null}"#.utf8)
        #expect(
            try DecodedRealtimeRequestBody.decode(json: request)
                == (try JSONDecoder().decode(DecodedRealtimeRequestBody.self, from: Data(request))))
        #expect(try RealtimeRequestBody.decode(json: body).signedPayload == "eyJhbGciOiJFUzI1NiJ9.eyJ4IjoxfQ.c2ln")
        var rng = SeededGenerator(seed: 0xFA57_0003)
        for original in [request, body] {
            for _ in 0..<3000 {
                let bytes = Self.mutated(original, using: &rng)
                let data = Data(bytes)
                #expect(
                    (try? DecodedRealtimeRequestBody.decode(json: bytes))
                        == (try? JSONDecoder().decode(DecodedRealtimeRequestBody.self, from: data)))
                #expect(
                    (try? RealtimeRequestBody.decode(json: bytes))
                        == (try? JSONDecoder().decode(RealtimeRequestBody.self, from: data)))
            }
        }
        let duplicate = Array(#"{"signedPayload":"a","signedPayload":"b"}"#.utf8)
        #expect(
            (try? RealtimeRequestBody.decode(json: duplicate))
                == (try? JSONDecoder().decode(RealtimeRequestBody.self, from: Data(duplicate))))
    }

    @Test func typeMismatchesFallBackToJSONDecodersError() {
        #expect(throws: DecodingError.self) {
            try JWSTransactionDecodedPayload.decode(json: Array(#"{"transactionId":5}"#.utf8))
        }
        #expect(throws: DecodingError.self) {
            try JWSRenewalInfoDecodedPayload.decode(json: Array(#"{"autoRenewStatus":"on"}"#.utf8))
        }
        // Out-of-range and fractional numbers take the slow path and get its answer.
        let big = try? JWSTransactionDecodedPayload.decode(json: Array(#"{"quantity":4294967296}"#.utf8))
        #expect(big == nil)
        let advanced = try? JWSTransactionDecodedPayload.decode(
            json: Array(#"{"advancedCommerceInfo":{"x":1.5},"price":1}"#.utf8))
        #expect(advanced?.advancedCommerceInfo == .object(["x": .double(1.5)]))
    }
}

/// SplitMix64: reproducible randomness, so a failure replays.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
