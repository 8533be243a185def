import AppStoreModels
import Foundation
import Logging
import NIOConcurrencyHelpers
import Testing

@testable import StoreKeeperServer

/// The bodies written without `JSONEncoder` (accounts, deliveries, debits) are the bytes
/// `JSONEncoder` writes, and the request logger's metadata reaches its lines as before.
@Suite struct ResponseWritingTests {
    static func encoded<T: Encodable>(_ value: T) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    static func written<T: JSONWritable>(_ value: T) -> String {
        var output = JSONOutput()
        value.write(to: &output)
        return String(decoding: output.bytes, as: UTF8.self)
    }

    static func text(_ generator: inout some RandomNumberGenerator) -> String {
        let pool = Array("ab_.-09 \"\\/é😀\n\t\u{1}".unicodeScalars)
        return String(
            String.UnicodeScalarView(
                (0..<Int.random(in: 0...12, using: &generator)).map { _ in
                    pool.randomElement(using: &generator)!
                }))
    }

    static func maybe(_ generator: inout some RandomNumberGenerator) -> String? {
        Bool.random(using: &generator) ? text(&generator) : nil
    }

    static func account(_ generator: inout some RandomNumberGenerator) -> AccountJSON {
        var balances: [String: Int64] = [:]
        for _ in 0..<Int.random(in: 0...4, using: &generator) {
            balances[text(&generator)] = Int64.random(in: -1_000_000...Int64.max, using: &generator)
        }
        return AccountJSON(
            accountId: text(&generator),
            entitlements: (0..<Int.random(in: 0...3, using: &generator)).map { _ in
                AccountJSON.Entitlement(
                    id: text(&generator), active: Bool.random(using: &generator), productId: maybe(&generator),
                    expiresAt: maybe(&generator), originalTransactionId: maybe(&generator),
                    source: text(&generator), grantId: maybe(&generator))
            },
            balances: balances,
            subscriptions: (0..<Int.random(in: 0...3, using: &generator)).map { _ in
                AccountJSON.Subscription(
                    originalTransactionId: text(&generator), store: text(&generator), appId: maybe(&generator),
                    productId: text(&generator), status: text(&generator),
                    expiresAt: maybe(&generator), autoRenew: Bool.random(using: &generator),
                    commitment: Bool.random(using: &generator)
                        ? nil
                        : AccountJSON.Commitment(
                            billingPeriod: Int.random(in: 1...12, using: &generator), totalBillingPeriods: 12,
                            expiresAt: maybe(&generator),
                            renews: [nil, true, false].randomElement(using: &generator)!))
            })
    }

    @Test func accountsPurchasesAndDebitsAsJSONEncoderWritesThem() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            let account = Self.account(&generator)
            #expect(Self.written(account) == (try Self.encoded(account)))
            var purchase = PurchaseJSON(status: Self.text(&generator), transactions: [], account: account)
            for _ in 0..<Int.random(in: 0...3, using: &generator) {
                purchase.transactions.append(
                    TransactionJSON(
                        transactionId: Self.text(&generator), originalTransactionId: Self.text(&generator),
                        productId: Self.text(&generator), quantity: Int.random(in: -5...Int.max, using: &generator),
                        environment: Self.text(&generator), orderId: Self.maybe(&generator),
                        outcome: Self.text(&generator), store: Self.text(&generator), appId: Self.maybe(&generator)))
            }
            #expect(Self.written(purchase) == (try Self.encoded(purchase)))
            let debit: [String: Int64] = ["balance": Int64.random(in: Int64.min...Int64.max, using: &generator)]
            #expect(Self.written(debit) == (try Self.encoded(debit)))
        }
    }

    final class Lines: TextOutputStream, @unchecked Sendable {
        let lines = NIOLockedValueBox<[String]>([])
        func write(_ string: String) { lines.withLockedValue { $0.append(string) } }
    }

    /// What follows the timestamp: level, label, metadata, source, message.
    static func withoutTimestamp(_ line: String) -> Substring {
        line[line.range(of: " info ")!.lowerBound...]
    }

    /// Metadata set on the logger (as each request sets its id) and a statement's own metadata
    /// come out as `StreamLogHandler` writes them: sorted, the statement's winning a clash.
    @Test func lazyMetadataLinesMatchStreamLogHandler() {
        let lazyLines = Lines()
        let streamLines = Lines()
        var lazy = Logger(label: "storekeeper") { LazyMetadataLogHandler(label: $0, stream: lazyLines) }
        var stream = Logger(label: "storekeeper") {
            StreamLogHandler(label: $0, stream: streamLines, metadataProvider: nil)
        }
        lazy[metadataKey: "request_id"] = "r-1"
        stream[metadataKey: "request_id"] = "r-1"
        lazy[metadataKey: "hb.request.id"] = "7"
        stream[metadataKey: "hb.request.id"] = "7"
        lazy.debug("not at this level")
        stream.debug("not at this level")
        lazy.info("plain")
        stream.info("plain")
        lazy.info("with", metadata: ["status": "200", "request_id": "clash"])
        stream.info("with", metadata: ["status": "200", "request_id": "clash"])
        lazy[metadataKey: "request_id"] = nil
        stream[metadataKey: "request_id"] = nil
        lazy.info("removed")
        stream.info("removed")
        let lazyText = lazyLines.lines.withLockedValue { $0 }.map(Self.withoutTimestamp)
        let streamText = streamLines.lines.withLockedValue { $0 }.map(Self.withoutTimestamp)
        #expect(lazyText.count == 3)
        #expect(lazyText == streamText)
        #expect(lazyText[1].contains("hb.request.id=7 request_id=clash status=200"))
    }
}
