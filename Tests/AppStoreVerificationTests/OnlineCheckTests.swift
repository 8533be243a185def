import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import Synchronization
import Testing
import X509

@testable import AppStoreVerification

/// Optional OCSP checks: off by default, hard-fail when on, unreachable responder = retryable.
@Suite struct OnlineCheckTests {
    struct Unreachable: Error {}

    final class ScriptedTransport: OCSPTransport {
        let answer: @Sendable () throws -> [UInt8]
        let calls = Mutex<[String]>([])
        init(answer: @escaping @Sendable () throws -> [UInt8]) { self.answer = answer }
        func send(request: [UInt8], to uri: String) async throws -> [UInt8] {
            calls.withLock { $0.append(uri) }
            return try answer()
        }
    }

    /// A chain whose leaf names an OCSP responder, valid today (online checks validate now).
    static func chainWithOCSP() throws -> (P256.Signing.PrivateKey, [Certificate]) {
        let genuine = TestPKI.genuine
        let key = P256.Signing.PrivateKey()
        let leaf = try CertificateFactory.make(
            subject: try .named("OCSP leaf"), issuer: genuine.intermediate.certificate.subject,
            publicKey: .init(key.publicKey), issuerKey: .init(genuine.intermediate.privateKey), isCA: false,
            appleOIDs: [AppleOID.receiptSigning], notBefore: Date().addingTimeInterval(-86_400),
            notAfter: Date().addingTimeInterval(86_400 * 365), ocspURI: "http://ocsp.invalid/ocsp")
        return (key, [leaf, genuine.intermediate.certificate, genuine.root.certificate])
    }

    static func verifier(_ transport: ScriptedTransport) throws -> SignedDataVerifier {
        try SignedDataVerifier(
            .init(
                trustedRoots: [TestPKI.genuine.root.derBytes], bundleId: TestPKI.bundleId, environments: nil,
                onlineChecks: OnlineChecks(transport: transport)))
    }

    @Test func unreachableResponderIsRetryable() async throws {
        let (key, chain) = try Self.chainWithOCSP()
        let jws = try TestPKI.sign(
            TestPKI.transaction(signedDate: Int64(Date().timeIntervalSince1970 * 1000)), key: key, chain: chain)
        let transport = ScriptedTransport { throw Unreachable() }
        do {
            _ = try await Self.verifier(transport).verifyTransaction(jws)
            Issue.record("verified without an OCSP answer")
        } catch let failure as VerificationFailure {
            #expect(failure.code == "apple_unavailable")
            #expect(failure.isRetryable)
        }
        #expect(transport.calls.withLock { $0 } == ["http://ocsp.invalid/ocsp"])
    }

    @Test func garbageAnswerIsAPermanentChainFailure() async throws {
        let (key, chain) = try Self.chainWithOCSP()
        let jws = try TestPKI.sign(
            TestPKI.transaction(signedDate: Int64(Date().timeIntervalSince1970 * 1000)), key: key, chain: chain)
        let transport = ScriptedTransport { [0x30, 0x03, 0x0A, 0x01, 0x06] }  // OCSPResponse: unauthorized
        await expectFailure("invalid_chain") { _ = try await Self.verifier(transport).verifyTransaction(jws) }
    }

    @Test func offByDefaultAndNoNetworkWithoutIt() async throws {
        #expect(VerificationConfiguration().onlineChecks == nil)
        let (key, chain) = try Self.chainWithOCSP()
        let jws = try TestPKI.sign(
            TestPKI.transaction(signedDate: Int64(Date().timeIntervalSince1970 * 1000)), key: key, chain: chain)
        _ = try await TestPKI.verifier().verifyTransaction(jws)
    }
}
