import Foundation

/// A StoreKit 1 app receipt as decoded from its ASN.1 payload (Apple's receipt documentation §4.3).
public struct AppReceipt: Hashable, Sendable {
    /// Attribute 0: `Production`, `ProductionSandbox`, `Xcode`, … (undocumented but observed).
    public var receiptType: String?
    /// Attribute 1: the app's App Store id.
    public var appItemId: Int64?
    /// Attribute 2.
    public var bundleId: String?
    /// Attribute 2 exactly as stored (with its UTF8String tag), an input to the device hash.
    public var bundleIdValueBytes: [UInt8]?
    /// Attribute 3.
    public var applicationVersion: String?
    /// Attribute 4.
    public var opaqueValue: [UInt8]?
    /// Attribute 5: SHA-1 of device id ‖ opaque value ‖ bundle id bytes.
    public var sha1Hash: [UInt8]?
    /// Attribute 8.
    public var requestDate: Date?
    /// Attribute 12: when the App Store signed it; certificates are validated at this time.
    public var creationDate: Date?
    /// Attribute 15.
    public var downloadId: Int64?
    /// Attribute 16.
    public var versionExternalIdentifier: Int64?
    /// Attribute 18.
    public var originalPurchaseDate: Date?
    /// Attribute 19.
    public var originalApplicationVersion: String?
    /// Attribute 21 (VPP only).
    public var expirationDate: Date?
    /// Attribute 17, once per in-app purchase, in receipt order (which is not chronological).
    public var inAppPurchases: [AppReceiptInAppPurchase]

    public init(inAppPurchases: [AppReceiptInAppPurchase] = []) {
        self.inAppPurchases = inAppPurchases
    }

    /// The environment, from attribute 0.
    public var environment: AppStoreEnvironment? {
        switch receiptType {
        case nil: nil
        case "Production", "ProductionVPP": .production
        case "ProductionSandbox", "ProductionVPPSandbox", "Sandbox": .sandbox
        case "Xcode": .xcode
        case let other?: AppStoreEnvironment(rawValue: other)
        }
    }
}

/// One in-app purchase inside an app receipt (attribute 17; receipts.md §4.4).
public struct AppReceiptInAppPurchase: Hashable, Sendable {
    public var quantity: Int64?
    public var productId: String?
    public var transactionId: String?
    public var purchaseDate: Date?
    public var originalTransactionId: String?
    public var originalPurchaseDate: Date?
    /// Attribute 1707 (undocumented).
    public var productType: Int64?
    public var subscriptionExpirationDate: Date?
    public var webOrderLineItemId: String?
    public var cancellationDate: Date?
    public var isTrialPeriod: Bool?
    public var isInIntroOfferPeriod: Bool?
    public var promotionalOfferId: String?

    public init(
        quantity: Int64? = nil, productId: String? = nil, transactionId: String? = nil, purchaseDate: Date? = nil,
        originalTransactionId: String? = nil, originalPurchaseDate: Date? = nil, productType: Int64? = nil,
        subscriptionExpirationDate: Date? = nil, webOrderLineItemId: String? = nil, cancellationDate: Date? = nil,
        isTrialPeriod: Bool? = nil, isInIntroOfferPeriod: Bool? = nil, promotionalOfferId: String? = nil
    ) {
        self.quantity = quantity
        self.productId = productId
        self.transactionId = transactionId
        self.purchaseDate = purchaseDate
        self.originalTransactionId = originalTransactionId
        self.originalPurchaseDate = originalPurchaseDate
        self.productType = productType
        self.subscriptionExpirationDate = subscriptionExpirationDate
        self.webOrderLineItemId = webOrderLineItemId
        self.cancellationDate = cancellationDate
        self.isTrialPeriod = isTrialPeriod
        self.isInIntroOfferPeriod = isInIntroOfferPeriod
        self.promotionalOfferId = promotionalOfferId
    }
}

extension AppReceipt {
    /// The receipt in verifyReceipt's JSON shape (`receipt` object), as Apple would decode it.
    public var receiptInfo: ReceiptInfo {
        var info = ReceiptInfo()
        info.receiptType = receiptType
        info.appItemId = appItemId.map { .integer($0) }
        info.adamId = info.appItemId
        info.bundleId = bundleId
        info.applicationVersion = applicationVersion
        info.downloadId = downloadId.map { .integer($0) }
        info.versionExternalIdentifier = versionExternalIdentifier.map { .integer($0) }
        info.originalApplicationVersion = originalApplicationVersion
        (info.receiptCreationDate, info.receiptCreationDateMs, info.receiptCreationDatePst) =
            LegacyDateFormat.triplet(creationDate)
        (info.requestDate, info.requestDateMs, info.requestDatePst) = LegacyDateFormat.triplet(requestDate)
        (info.originalPurchaseDate, info.originalPurchaseDateMs, info.originalPurchaseDatePst) =
            LegacyDateFormat.triplet(originalPurchaseDate)
        (info.expirationDate, info.expirationDateMs, info.expirationDatePst) = LegacyDateFormat.triplet(expirationDate)
        info.inApp = inAppPurchases.map(\.receiptInApp)
        return info
    }
}

extension AppReceiptInAppPurchase {
    /// The purchase in verifyReceipt's JSON shape (`in_app[]`).
    public var receiptInApp: ReceiptInApp {
        var item = ReceiptInApp()
        item.quantity = quantity.map { .string(String($0)) }
        item.productId = productId
        item.transactionId = transactionId
        item.originalTransactionId = originalTransactionId
        (item.purchaseDate, item.purchaseDateMs, item.purchaseDatePst) = LegacyDateFormat.triplet(purchaseDate)
        (item.originalPurchaseDate, item.originalPurchaseDateMs, item.originalPurchaseDatePst) =
            LegacyDateFormat.triplet(originalPurchaseDate)
        (item.expiresDate, item.expiresDateMs, item.expiresDatePst) =
            LegacyDateFormat.triplet(subscriptionExpirationDate)
        (item.cancellationDate, item.cancellationDateMs, item.cancellationDatePst) =
            LegacyDateFormat.triplet(cancellationDate)
        item.webOrderLineItemId = webOrderLineItemId
        item.isTrialPeriod = isTrialPeriod.map { .string($0 ? "true" : "false") }
        item.isInIntroOfferPeriod = isInIntroOfferPeriod.map { .string($0 ? "true" : "false") }
        item.promotionalOfferId = promotionalOfferId
        return item
    }
}

/// verifyReceipt's date triplets: `2018-09-05 05:03:52 Etc/GMT`, epoch ms, Pacific time.
public enum LegacyDateFormat {
    public static func triplet(_ date: Date?) -> (String?, LegacyValue?, String?) {
        guard let date else { return (nil, nil, nil) }
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        return (
            format(date, timeZone: TimeZone(identifier: "UTC")!, name: "Etc/GMT"),
            .string(String(milliseconds)),
            format(date, timeZone: TimeZone(identifier: "America/Los_Angeles")!, name: "America/Los_Angeles")
        )
    }

    private static func format(_ date: Date, timeZone: TimeZone, name: String) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let c = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
        func two(_ value: Int?) -> String {
            let v = value ?? 0
            return v < 10 ? "0\(v)" : "\(v)"
        }
        return "\(c.year ?? 0)-\(two(c.month))-\(two(c.day)) \(two(c.hour)):\(two(c.minute)):\(two(c.second)) \(name)"
    }
}
