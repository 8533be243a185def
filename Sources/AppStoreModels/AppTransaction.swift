/// The decoded payload of a `JWSAppTransaction` (Apple's JWS documentation §6).
public struct AppTransaction: Codable, Hashable, Sendable {
    public var appAppleId: Int64?
    public var appTransactionId: String?
    public var bundleId: String?
    public var applicationVersion: String?
    public var versionExternalIdentifier: Int64?
    public var originalApplicationVersion: String?
    public var originalPlatform: PurchasePlatform?
    public var originalPurchaseDate: Int64?
    public var preorderDate: Int64?
    public var receiptCreationDate: Int64?
    public var receiptType: AppStoreEnvironment?
    public var deviceVerification: String?
    public var deviceVerificationNonce: String?

    public init(
        appAppleId: Int64? = nil, appTransactionId: String? = nil, bundleId: String? = nil,
        applicationVersion: String? = nil, versionExternalIdentifier: Int64? = nil,
        originalApplicationVersion: String? = nil, originalPlatform: PurchasePlatform? = nil,
        originalPurchaseDate: Int64? = nil, preorderDate: Int64? = nil, receiptCreationDate: Int64? = nil,
        receiptType: AppStoreEnvironment? = nil, deviceVerification: String? = nil,
        deviceVerificationNonce: String? = nil
    ) {
        self.appAppleId = appAppleId
        self.appTransactionId = appTransactionId
        self.bundleId = bundleId
        self.applicationVersion = applicationVersion
        self.versionExternalIdentifier = versionExternalIdentifier
        self.originalApplicationVersion = originalApplicationVersion
        self.originalPlatform = originalPlatform
        self.originalPurchaseDate = originalPurchaseDate
        self.preorderDate = preorderDate
        self.receiptCreationDate = receiptCreationDate
        self.receiptType = receiptType
        self.deviceVerification = deviceVerification
        self.deviceVerificationNonce = deviceVerificationNonce
    }
}

/// The protected header of an App Store JWS.
public struct JWSDecodedHeader: Codable, Hashable, Sendable {
    public var alg: String?
    public var x5c: [String]?
    public var kid: String?
    public var typ: String?

    public init(alg: String? = nil, x5c: [String]? = nil, kid: String? = nil, typ: String? = nil) {
        self.alg = alg
        self.x5c = x5c
        self.kid = kid
        self.typ = typ
    }
}
