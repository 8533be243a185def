import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Crypto
import Foundation
import Hummingbird
import JWTKit
import NIOCore

/// The legacy `/verifyReceipt` endpoints (production and sandbox).
extension LocalAppStoreServer {
    func addVerifyReceipt<Context: RequestContext>(to router: some RouterMethods<Context>) {
        router.post("verifyReceipt") { request, context in
            try await self.verifyReceipt(request, context, endpoint: .production)
        }
        router.post("sandbox/verifyReceipt") { request, context in
            try await self.verifyReceipt(request, context, endpoint: .sandbox)
        }
    }

    func verifyReceipt(
        _ request: Request, _ context: some RequestContext, endpoint: AppStoreEnvironment
    ) async throws -> Response {
        if let fault = await store.takeFault("verifyReceipt") {
            if let latency = fault.latencyMilliseconds { try await Task.sleep(for: .milliseconds(latency)) }
            if let status = fault.status { return Response(status: .init(code: status)) }
            if let receiptStatus = fault.receiptStatus {
                return Self.json(VerifyReceiptResponse(status: Int64(receiptStatus)))
            }
        }
        guard let body = try? await request.decode(as: VerifyReceiptRequest.self, context: context) else {
            return Self.json(VerifyReceiptResponse(status: 21000))
        }
        if let secret = store.configuration.sharedSecret, !Self.constantTimeEqual(body.password ?? "", secret) {
            return Self.json(VerifyReceiptResponse(status: 21004))
        }
        let verifier = try AppReceiptVerifier(trustedRoots: store.pki.trustRootsDER, environments: nil)
        let receipt: AppReceipt
        do {
            receipt = try await verifier.verify(base64: body.receiptData)
        } catch let failure as VerificationFailure {
            if case .invalidSignature(let reason) = failure, reason.contains("base64") || reason.contains("PKCS#7") {
                return Self.json(VerifyReceiptResponse(status: 21002))
            }
            return Self.json(VerifyReceiptResponse(status: 21003))
        }
        let receiptEnvironment = receipt.environment ?? .production
        if receiptEnvironment == .sandbox && endpoint == .production {
            return Self.json(VerifyReceiptResponse(status: 21007, environment: .sandbox))
        }
        if receiptEnvironment == .production && endpoint == .sandbox {
            return Self.json(VerifyReceiptResponse(status: 21008, environment: .production))
        }
        let legacy = await store.legacyResponse(
            for: receipt, excludeOldTransactions: body.excludeOldTransactions == true)
        return Self.json(legacy)
    }
}
