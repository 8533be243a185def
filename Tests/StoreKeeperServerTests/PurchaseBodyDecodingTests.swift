import Foundation
import Testing

@testable import StoreKeeperServer

/// `POST /v1/purchases`' body is read by the hand-written reader: the same body as
/// `JSONDecoder` reads for every store's shape, and the same refusal where `JSONDecoder`
/// refuses (a field of another type, a missing account, a number out of range).
@Suite struct PurchaseBodyDecodingTests {
    typealias Body = StoreKeeperApp.PurchaseBody

    static func both(_ json: String) -> (fast: String, standard: String) {
        let data = Data(json.utf8)
        let fast = Result { try StoreKeeperApp.decodeBody(Body.self, data) }
        let standard = Result { try JSONDecoder().decode(Body.self, from: data) }
        func text(_ result: Result<Body, any Error>) -> String {
            switch result {
            case .success(let body): String(describing: body)
            case .failure: "refused"
            }
        }
        // decodeBody also validates: a body JSONDecoder reads that validation refuses is refused.
        let validated = standard.flatMap { body in Result { try body.validate() }.map { body } }
        return (text(fast), text(validated))
    }

    @Test(arguments: [
        #"{"accountId":"u42","signedTransaction":"a.b.c"}"#,
        #"{"accountId":"u42","orderId":"o-1","signedTransactions":["a.b.c","d.e.f"]}"#,
        #"{"accountId":"u42","receipt":"MIIB","transactionId":"2000000000000001"}"#,
        #"{"accountId":"u\"4\\2 e\u0301","transactionId":"2000000000000001","unknown":{"x":[1,2]}}"#,
        #"{"store":"google_play","appId":"android","accountId":"gp-1","productId":"coins_60","purchaseToken":"tok.en-_1"}"#,
        #"{"store":"web","accountId":"w1","productId":"coins_60","paymentId":"pay_1","price":"0.99","currency":"USD","quantity":2,"taxAmount":0.1,"taxCountry":"DE","expiresAt":"2026-12-01T00:00:00Z","originalPaymentId":"pay_0"}"#,
        #"{"store":"web","accountId":"w1","productId":"coins_60","paymentId":"pay_1","price":0.99,"currency":"USD","quantity":3}"#,
        #"{"accountId":42,"signedTransaction":"a.b.c"}"#,
        #"{"signedTransaction":"a.b.c"}"#,
        #"{"accountId":"u42","signedTransaction":"a.b.c","quantity":1.5}"#,
        #"{"accountId":"u42","signedTransaction":"a.b.c","quantity":99999999999999999999}"#,
        #"{"accountId":"u42","signedTransactions":["a",1]}"#,
        #"{"accountId":"u42","signedTransaction":null,"transactionId":"2000000000000001"}"#,
        #"["accountId"]"#,
    ])
    func theHandWrittenReaderAgreesWithJSONDecoder(json: String) {
        let (fast, standard) = Self.both(json)
        #expect(fast == standard, "\(json)")
    }
}
