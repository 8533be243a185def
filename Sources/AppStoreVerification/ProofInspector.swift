import AppStoreModels
import Foundation

/// Recognises any proof of purchase an app or Apple hands over, verifies it and renders it
/// as JSON: the engine of `storekeeper verify`.
public struct ProofInspector: Sendable {
    public enum Kind: String, Sendable {
        case transaction = "JWS transaction"
        case renewalInfo = "JWS renewal info"
        case notification = "App Store Server Notification"
        case appTransaction = "JWS app transaction"
        case appReceipt = "app receipt"
    }

    public struct Output: Sendable {
        public var kind: Kind
        /// The decoded payload, pretty-printed with sorted keys, Apple's field names.
        public var json: String
    }

    let jwsVerifier: SignedDataVerifier
    let receiptVerifier: AppReceiptVerifier

    /// - Parameter rootsDER: trust roots for every kind; nil means Apple's real roots
    ///   (G3 for JWS, Apple Inc. Root for receipts).
    public init(
        rootsDER: [[UInt8]]?, bundleId: String?, appAppleId: Int64?, environment: AppStoreEnvironment?,
        validationTime: VerificationConfiguration.ValidationTime = .signedDate
    ) throws {
        let environments = environment.map { Set([$0]) }
        jwsVerifier = try SignedDataVerifier(
            .init(
                trustedRoots: rootsDER ?? [AppleRootCertificates.appleRootCAG3DER], bundleId: bundleId,
                appAppleId: appAppleId, environments: environments, validationTime: validationTime))
        receiptVerifier = try AppReceiptVerifier(
            trustedRoots: rootsDER ?? [AppleRootCertificates.appleIncRootDER], bundleId: bundleId,
            environments: environments, validationTime: validationTime)
    }

    public func inspect(_ input: [UInt8]) async throws -> Output {
        let text = String(decoding: input, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        // A notification POST body as Apple sends it.
        if text.hasPrefix("{"), let body = try? JSONDecoder().decode(ResponseBodyV2.self, from: Data(text.utf8)),
            let signedPayload = body.signedPayload
        {
            let verified = try await jwsVerifier.verifyNotification(signedPayload)
            return Output(kind: .notification, json: try Self.render(verified.payload))
        }
        if text.split(separator: ".", omittingEmptySubsequences: false).count == 3, !text.contains(" ") {
            switch Self.jwsKind(text) {
            case .notification:
                return Output(
                    kind: .notification, json: try Self.render(await jwsVerifier.verifyNotification(text).payload))
            case .renewalInfo:
                return Output(kind: .renewalInfo, json: try Self.render(await jwsVerifier.verifyRenewalInfo(text)))
            case .appTransaction:
                return Output(
                    kind: .appTransaction, json: try Self.render(await jwsVerifier.verifyAppTransaction(text)))
            default:
                return Output(kind: .transaction, json: try Self.render(await jwsVerifier.verifyTransaction(text)))
            }
        }
        let receipt: AppReceipt
        if input.first == 0x30 {
            receipt = try await receiptVerifier.verify(input)
        } else {
            receipt = try await receiptVerifier.verify(base64: text)
        }
        return Output(kind: .appReceipt, json: try Self.render(receipt.receiptInfo))
    }

    /// Which payload a JWS carries, from its (not yet verified) field names; verification
    /// then checks it as that kind.
    static func jwsKind(_ jws: String) -> Kind {
        guard let compact = try? CompactJWS(jws),
            let payload = try? compact.payloadBytes(),
            let object = try? JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any]
        else { return .transaction }
        if object["notificationType"] != nil || object["notificationUUID"] != nil { return .notification }
        if object["transactionId"] != nil { return .transaction }
        if object["receiptType"] != nil || object["appTransactionId"] != nil && object["originalTransactionId"] == nil {
            return .appTransaction
        }
        if object["autoRenewStatus"] != nil || object["autoRenewProductId"] != nil
            || object["originalTransactionId"] != nil
        {
            return .renewalInfo
        }
        return .transaction
    }

    static func render<T: Encodable>(_ value: T) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }
}
