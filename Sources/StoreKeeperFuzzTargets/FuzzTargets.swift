import AppStoreModels
import AppStoreVerification
import Foundation
import GooglePlay
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperServer

/// What each libFuzzer target feeds hostile bytes to (`scripts/fuzz TARGET SECONDS`). A target
/// may throw away any input with an error; a crash, an ASan report, a leak or a hang is a bug,
/// and the input that caused it becomes a file in `Fuzz/regressions/TARGET/`.
public enum FuzzTarget: String, CaseIterable, Sendable {
    /// Compact JWS of every kind Apple signs (transactions, renewal info, app transactions,
    /// notifications, retention requests) through the verifier: split, header, x5c, the chain
    /// to a root, the signature; and `storekeeper verify`'s recognition of any proof.
    case jws
    /// The decoded payloads behind a good signature: the hand-written JSON parser
    /// (`FastJSON`) and the payload decoders of the hot kinds.
    case payload
    /// StoreKit 1 app receipts: PKCS#7 / BER / DER through the verifier, and the receipt's
    /// inner ASN.1 set as the parser sees it after a good signature.
    case receipt
    /// The HTTP request bodies (orders, purchases, debits, notifications, anomaly resolve,
    /// retention, extend, grant), decoded and validated as their handlers do. The first byte
    /// picks the body.
    case requests
    /// The catalog loader, YAML and JSON.
    case catalog
    /// The configuration loader (YAML or JSON, with an inline catalog).
    case config
}

/// Runs fuzz inputs. Keep one: its verifiers trust Apple's roots plus the local App Store
/// roots the seed corpus was signed with, so the seeds reach past the signature.
public final class Fuzzer: Sendable {
    let verifier: SignedDataVerifier
    let inspector: ProofInspector
    let receiptVerifier: AppReceiptVerifier

    /// - Parameter extraRoots: DER roots trusted beside Apple's (`Fuzz/trust/*.der`).
    public init(extraRoots: [[UInt8]]) throws {
        let jwsRoots = [AppleRootCertificates.appleRootCAG3DER] + extraRoots
        let receiptRoots = [AppleRootCertificates.appleIncRootDER] + extraRoots
        // Any environment and app, at each payload's own signing date, no chain cache: every
        // input walks the whole path, as a first request from a stranger does.
        verifier = try SignedDataVerifier(
            .init(trustedRoots: jwsRoots, environments: nil, validationTime: .signedDate, chainCacheCapacity: 0))
        inspector = try ProofInspector(
            rootsDER: jwsRoots + [AppleRootCertificates.appleIncRootDER], bundleId: nil, appAppleId: nil,
            environment: nil)
        receiptVerifier = try AppReceiptVerifier(trustedRoots: receiptRoots, environments: nil)
    }

    /// The roots in a directory of `.der` files (none if it does not exist).
    public static func roots(in directory: URL) -> [[UInt8]] {
        let files = (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? []
        return files.filter { $0.pathExtension == "der" }.sorted { $0.path < $1.path }.compactMap {
            (try? Data(contentsOf: $0)).map { [UInt8]($0) }
        }
    }

    /// One input, from libFuzzer's thread (not a Swift concurrency thread: it blocks on the
    /// async verifiers).
    public func runBlocking(_ target: FuzzTarget, _ bytes: [UInt8]) {
        let done = DispatchSemaphore(value: 0)
        Task {
            await self.run(target, bytes)
            done.signal()
        }
        done.wait()
    }

    public func run(_ target: FuzzTarget, _ bytes: [UInt8]) async {
        switch target {
        case .jws: await jws(bytes)
        case .payload: payload(bytes)
        case .receipt: await receipt(bytes)
        case .requests: requests(bytes)
        case .catalog: catalog(bytes)
        case .config: await config(bytes)
        }
    }

    func jws(_ bytes: [UInt8]) async {
        let text = String(decoding: bytes, as: UTF8.self)
        _ = try? await verifier.verifyTransaction(text)
        _ = try? await verifier.verifyRenewalInfo(text)
        _ = try? await verifier.verifyAppTransaction(text)
        _ = try? await verifier.verifyNotification(text)
        _ = try? await verifier.verifyRealtimeRequest(text)
        // Stored notifications are re-read without the signature (verified when they came in).
        _ = try? SignedDataVerifier.decodeVerifiedEarlier(notification: text)
        _ = try? await inspector.inspect(bytes)
    }

    func payload(_ bytes: [UInt8]) {
        _ = try? FastJSON.parse(bytes)
        _ = try? JWSTransactionDecodedPayload.decode(json: bytes)
        _ = try? JWSRenewalInfoDecodedPayload.decode(json: bytes)
        _ = try? ResponseBodyV2DecodedPayload.decode(json: bytes)
        _ = try? JSONDecoder().decode(AppTransaction.self, from: Data(bytes))
        _ = try? JSONDecoder().decode(DecodedRealtimeRequestBody.self, from: Data(bytes))
        // Google Play: a push, the notification in it, the resources read back, and what the
        // planner makes of their states.
        let decoder = JSONDecoder()
        if let push = try? decoder.decode(PubSubPush.self, from: Data(bytes)),
            let data = push.message?.data.flatMap({ Data(base64Encoded: $0) })
        {
            _ = try? decoder.decode(DeveloperNotification.self, from: data)
        }
        if let notification = try? decoder.decode(DeveloperNotification.self, from: Data(bytes)) {
            _ = notification.typeName
        }
        if let product = try? decoder.decode(ProductPurchaseV2.self, from: Data(bytes)) {
            _ = GooglePlayPlanner.readiness(purchaseState: product.purchaseStateContext?.purchaseState)
            _ = GoogleTime.parse(product.purchaseCompletionTime)
        }
        if let subscription = try? decoder.decode(SubscriptionPurchaseV2.self, from: Data(bytes)) {
            _ = GooglePlayPlanner.status(subscriptionState: subscription.subscriptionState)
            _ = subscription.lineItems?.first?.autoRenewingPlan?.recurringPrice?.milliunits
            _ = GoogleTime.parse(subscription.lineItems?.first?.expiryTime)
        }
        if let voided = try? decoder.decode(VoidedPurchasesListResponse.self, from: Data(bytes)) {
            let quantities = (voided.voidedPurchases ?? []).map(\.voidedQuantity)
            _ = GooglePlayPlanner.revocation(voidedQuantities: quantities, quantity: quantities.count)
                .portion(of: Int64.max)
        }
    }

    func receipt(_ bytes: [UInt8]) async {
        _ = try? await receiptVerifier.verify(bytes)
        _ = try? await receiptVerifier.verify(base64: String(decoding: bytes, as: UTF8.self))
        _ = try? AppReceiptParser.parsePayload(bytes[...])
        _ = try? await inspector.inspect(bytes)
    }

    func requests(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let names = RequestBodies.names
        _ = try? RequestBodies.decode(names[Int(first) % names.count], Data(bytes.dropFirst()))
    }

    func catalog(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        _ = try? Catalog.parse(yaml: text)
        _ = try? Catalog.parse(json: text)
    }

    func config(_ bytes: [UInt8]) async {
        _ = try? await ServerConfiguration.load(contents: Data(bytes), name: "fuzz.yaml", environment: [:])
    }
}
