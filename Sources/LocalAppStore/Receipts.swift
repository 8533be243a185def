import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import StoreKeeperCatalog

/// App receipts (PKCS#7) for the legacy paths.
extension LocalAppStore {
    // MARK: Receipts

    /// The customer's app receipt as the device holds it: every purchase except finished
    /// consumables, signed by the receipt chain.
    public func receipt(for appleId: String) throws -> [UInt8] {
        guard let signer = pki.receiptSigner else { throw StoreError.invalid("this PKI has no receipt chain") }
        return try signer.sign(appReceipt(for: appleId))
    }

    func appReceipt(for appleId: String) -> AppReceipt {
        let customer = customers[appleId]
        let now = clock.now()
        var receipt = AppReceipt(
            inAppPurchases: (customer?.transactionIds ?? []).compactMap { id -> AppReceiptInAppPurchase? in
                guard let stored = transactions[id] else { return nil }
                if stored.payload.type == .consumable && customer?.finished.contains(id) == true { return nil }
                let payload = stored.payload
                return AppReceiptInAppPurchase(
                    quantity: Int64(payload.quantity ?? 1), productId: payload.productId,
                    transactionId: payload.transactionId,
                    purchaseDate: payload.purchaseDate.map(Date.init(milliseconds:)),
                    originalTransactionId: payload.originalTransactionId,
                    originalPurchaseDate: payload.originalPurchaseDate.map(Date.init(milliseconds:)),
                    productType: Self.receiptProductType(payload.type),
                    subscriptionExpirationDate: payload.expiresDate.map(Date.init(milliseconds:)),
                    webOrderLineItemId: payload.webOrderLineItemId.flatMap { Int64($0) }.map(String.init),
                    cancellationDate: payload.revocationDate.map(Date.init(milliseconds:)), isTrialPeriod: false,
                    isInIntroOfferPeriod: false)
            })
        receipt.receiptType = configuration.environment == .sandbox ? "ProductionSandbox" : "Production"
        receipt.appItemId = configuration.environment == .sandbox ? 0 : configuration.appAppleId
        receipt.bundleId = configuration.bundleId
        receipt.applicationVersion = "1"
        receipt.originalApplicationVersion = "1.0"
        // The device hash exactly as a device checks it (receipts.md §4.7):
        // SHA-1(identifierForVendor bytes ‖ opaque value ‖ bundle id attribute bytes).
        let opaque = (0..<16).map { _ in UInt8.random(in: 0...255) }
        let bundleBytes = Self.utf8StringTLV(configuration.bundleId)
        let deviceBytes = customer.map { withUnsafeBytes(of: $0.deviceId.uuid) { Array($0) } } ?? []
        receipt.opaqueValue = opaque
        receipt.bundleIdValueBytes = bundleBytes
        receipt.sha1Hash = Array(Insecure.SHA1.hash(data: deviceBytes + opaque + bundleBytes))
        receipt.creationDate = now
        receipt.requestDate = now
        receipt.originalPurchaseDate = now
        receipt.downloadId = customer.flatMap { Int64($0.appTransactionId) }
        return receipt
    }

    /// A DER UTF8String: tag, length, bytes.
    static func utf8StringTLV(_ text: String) -> [UInt8] {
        let bytes = Array(text.utf8)
        var length: [UInt8]
        if bytes.count < 0x80 {
            length = [UInt8(bytes.count)]
        } else {
            var value = bytes.count
            length = []
            while value > 0 {
                length.insert(UInt8(value & 0xFF), at: 0)
                value >>= 8
            }
            length.insert(0x80 | UInt8(length.count), at: 0)
        }
        return [0x0C] + length + bytes
    }

    static func receiptProductType(_ type: ProductType?) -> Int64? {
        switch type {
        case .nonConsumable?: 0
        case .consumable?: 1
        case .nonRenewing?: 2
        case .autoRenewable?: 3
        default: nil
        }
    }
}
