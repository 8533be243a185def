import AppStoreModels
import AppStoreSigning
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import JWTKit
import LocalAppStore
import NIOCore
import StoreKeeperCatalog
import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

@Suite struct RateLimiterTests {
    @Test func tokenBucketsPerAccount() {
        let limiter = RateLimiter(clientPerSecond: 2, secretPerSecond: nil)
        let start = ContinuousClock.now
        #expect(limiter.admit(.account("a"), now: start) == nil)
        #expect(limiter.admit(.account("a"), now: start) == nil)
        #expect(limiter.admit(.account("a"), now: start) == 1)  // burst of 2 spent
        #expect(limiter.admit(.account("b"), now: start) == nil)  // per account
        #expect(limiter.admit(.account("a"), now: start + .milliseconds(600)) == nil)  // refilled
        for _ in 0..<100 { #expect(limiter.admit(.secretKey, now: start) == nil) }  // unlimited by default
        let limited = RateLimiter(clientPerSecond: 2, secretPerSecond: 1)
        #expect(limited.admit(.secretKey, now: start) == nil)
        #expect(limited.admit(.secretKey, now: start) == 1)
    }
}

extension JWSTransactionDecodedPayload {
    func with(id: String, product: String) -> JWSTransactionDecodedPayload {
        var copy = self
        copy.transactionId = id
        copy.originalTransactionId = id
        copy.productId = product
        copy.type = .consumable
        copy.appAccountToken = nil
        return copy
    }
}
