import XCTest

#if canImport(StoreKit) && STOREKIT_SHIM || canImport(StoreKit) && canImport(Darwin)
    import StoreKit
    @testable import StoreKeeperKitCore

    /// The adapters (symlinked into this target) compile against StoreKit's API surface — on
    /// Linux the shim that declares it with Apple's signatures. Compiling is the test; these
    /// check the adapters are the protocol's, not a look-alike.
    final class StoreKitAdapterTypeCheckTests: XCTestCase {
        func testAdaptersArePaymentQueues() {
            let kinds: [Any.Type] = [StoreKit2PaymentQueue.self, StoreKit1PaymentQueue.self]
            XCTAssertTrue(kinds.allSatisfy { $0 is PaymentQueue.Type })
            XCTAssertTrue((StoreKit1PaymentQueue.self as Any.Type) is SKPaymentTransactionObserver.Type)
        }
    }
#endif
