import AppStoreModels
import AppStoreSigning
import Crypto
import Foundation
import Testing
import X509

@testable import AppStoreVerification

@Suite struct JWSVerificationTests {
    let signer = TestPKI.genuine.jwsSigner

    // MARK: Accepted

    @Test func validTransactionVerifiesAndDecodes() async throws {
        let verifier = try TestPKI.verifier()
        let payload = try await verifier.verifyTransaction(signer.sign(TestPKI.transaction()))
        #expect(payload == TestPKI.transaction())
        #expect(verifier.cachedChainCount == 1)
    }

    @Test func cachedChainIsReusedAndStillChecksEverySignature() async throws {
        let verifier = try TestPKI.verifier()
        for index in 0..<5 {
            _ = try await verifier.verifyTransaction(signer.sign(TestPKI.transaction(id: "\(index)")))
        }
        #expect(verifier.cachedChainCount == 1)
        // Same x5c (cache hit), signature by another key: rejected.
        let impostor = JWSSigner(
            key: P256.Signing.PrivateKey(),
            chain: TestPKI.genuine.jwsSigner.x5c.map {
                [UInt8](Data(base64Encoded: $0)!)
            })
        await expectFailure("invalid_signature") {
            _ = try await verifier.verifyTransaction(impostor.sign(TestPKI.transaction()))
        }
    }

    /// Past `LeafKey.tableAfter` JWS the leaf key is checked through its table: genuine JWS
    /// still verify, and a JWS with the same x5c signed by another key, or with its signature
    /// altered, is still refused.
    @Test func aLeafKeyThatKeepsComingBackIsCheckedThroughItsTableWithTheSameAnswers() async throws {
        let verifier = try TestPKI.verifier()
        let impostor = JWSSigner(
            key: P256.Signing.PrivateKey(),
            chain: TestPKI.genuine.jwsSigner.x5c.map { [UInt8](Data(base64Encoded: $0)!) })
        for index in 0..<(LeafKey.tableAfter + 16) {
            let jws = try signer.sign(TestPKI.transaction(id: "t\(index)"))
            #expect(try await verifier.verifyTransaction(jws).transactionId == "t\(index)")
            await expectFailure("invalid_signature") {
                _ = try await verifier.verifyTransaction(impostor.sign(TestPKI.transaction(id: "t\(index)")))
            }
            // The signature's last character changed (a different S, or a non-canonical one).
            var altered = jws
            let last = altered.removeLast()
            altered.append(last == "A" ? "Q" : "A")
            await expectFailure("invalid_signature") { _ = try await verifier.verifyTransaction(altered) }
        }
        #expect(verifier.leafKeyTableCount == (P256Table.available ? 1 : 0))
    }

    @Test func cacheDisabledGivesSameAnswers() async throws {
        let verifier = try TestPKI.verifier(cache: 0)
        _ = try await verifier.verifyTransaction(signer.sign(TestPKI.transaction()))
        #expect(verifier.cachedChainCount == 0)
        let chain = try TestPKI.CustomChain(
            rootName: TestPKI.genuine.root.certificate.subject,
            intermediateName: TestPKI.genuine.intermediate.certificate.subject,
            leafName: TestPKI.genuine.leaf.certificate.subject)
        await expectFailure("invalid_chain") {
            _ = try await verifier.verifyTransaction(chain.sign(TestPKI.transaction()))
        }
    }

    @Test func renewalInfoVerifies() async throws {
        let info = JWSRenewalInfoDecodedPayload(
            originalTransactionId: "1", productId: "pro_monthly", autoRenewProductId: "pro_monthly",
            autoRenewStatus: .on, signedDate: TestPKI.signedDate, environment: .sandbox)
        let verified = try await TestPKI.verifier().verifyRenewalInfo(signer.sign(info))
        #expect(verified == info)
        await expectFailure("wrong_environment") {
            _ = try await TestPKI.verifier(environments: [.production]).verifyRenewalInfo(signer.sign(info))
        }
    }

    @Test func appTransactionVerifiesAtReceiptCreationDate() async throws {
        let app = AppTransaction(
            appAppleId: TestPKI.appAppleId, appTransactionId: "705000000000001", bundleId: TestPKI.bundleId,
            applicationVersion: "12", originalApplicationVersion: "1.0", originalPlatform: .iOS,
            originalPurchaseDate: TestPKI.signedDate, receiptCreationDate: TestPKI.signedDate,
            receiptType: .production)
        #expect(try await TestPKI.verifier().verifyAppTransaction(signer.sign(app)) == app)
        var otherApp = app
        otherApp.appAppleId = 42
        await expectFailure("wrong_app") {
            _ = try await TestPKI.verifier().verifyAppTransaction(signer.sign(otherApp))
        }
        var sandbox = otherApp
        sandbox.receiptType = .sandbox  // appAppleId is only checked in Production
        _ = try await TestPKI.verifier().verifyAppTransaction(signer.sign(sandbox))
        var otherBundle = app
        otherBundle.bundleId = "com.evil.app"
        await expectFailure("wrong_bundle") {
            _ = try await TestPKI.verifier().verifyAppTransaction(signer.sign(otherBundle))
        }
    }

    @Test func notificationAndNestedObjectsVerify() async throws {
        let transaction = try signer.sign(TestPKI.transaction(environment: .production))
        let renewal = try signer.sign(
            JWSRenewalInfoDecodedPayload(
                originalTransactionId: "1", signedDate: TestPKI.signedDate, environment: .production))
        let notification = ResponseBodyV2DecodedPayload(
            notificationType: .didRenew, notificationUUID: UUID().uuidString, version: "2.0",
            signedDate: TestPKI.signedDate,
            data: NotificationData(
                appAppleId: TestPKI.appAppleId, bundleId: TestPKI.bundleId, environment: .production,
                signedTransactionInfo: transaction, signedRenewalInfo: renewal, status: .active))
        let verified = try await TestPKI.verifier().verifyNotification(signer.sign(notification))
        #expect(verified.payload == notification)
        #expect(verified.transaction?.transactionId == "2000000000000001")
        #expect(verified.renewalInfo?.originalTransactionId == "1")

        var wrongApp = notification
        wrongApp.data?.appAppleId = 99
        await expectFailure("wrong_app") { _ = try await TestPKI.verifier().verifyNotification(signer.sign(wrongApp)) }

        // The outer payload is fine but the nested transaction is for another app.
        var nestedForeign = notification
        nestedForeign.data?.signedTransactionInfo = try signer.sign(
            TestPKI.transaction(bundleId: "com.other.app", environment: .production))
        await expectFailure("wrong_bundle") {
            _ = try await TestPKI.verifier().verifyNotification(signer.sign(nestedForeign))
        }
        // A nested transaction signed by someone else.
        var nestedForged = notification
        nestedForged.data?.signedTransactionInfo = try TestPKI.other.jwsSigner.sign(
            TestPKI.transaction(environment: .production))
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyNotification(signer.sign(nestedForged))
        }
    }

    @Test func notificationSummaryAndExternalTokenAreChecked() async throws {
        let summary = ResponseBodyV2DecodedPayload(
            notificationType: .renewalExtension, subtype: .summary, notificationUUID: "u",
            signedDate: TestPKI.signedDate,
            summary: NotificationSummary(environment: .sandbox, appAppleId: 1, bundleId: TestPKI.bundleId))
        _ = try await TestPKI.verifier().verifyNotification(signer.sign(summary))
        let token = ResponseBodyV2DecodedPayload(
            notificationType: .externalPurchaseToken, subtype: .unreported, notificationUUID: "t",
            signedDate: TestPKI.signedDate,
            externalPurchaseToken: ExternalPurchaseToken(externalPurchaseId: "SANDBOX_1", bundleId: TestPKI.bundleId))
        _ = try await TestPKI.verifier(environments: [.sandbox]).verifyNotification(signer.sign(token))
        await expectFailure("wrong_environment") {
            _ = try await TestPKI.verifier(environments: [.production]).verifyNotification(signer.sign(token))
        }
        let empty = ResponseBodyV2DecodedPayload(
            notificationType: .test, notificationUUID: "e", signedDate: TestPKI.signedDate)
        await expectFailure("wrong_bundle") { _ = try await TestPKI.verifier().verifyNotification(signer.sign(empty)) }
    }

    // MARK: Per-kind checks

    @Test func wrongBundleAndEnvironmentAreRejected() async throws {
        await expectFailure("wrong_bundle") {
            _ = try await TestPKI.verifier().verifyTransaction(
                self.signer.sign(TestPKI.transaction(bundleId: "com.evil")))
        }
        await expectFailure("wrong_environment") {
            _ = try await TestPKI.verifier(environments: [.production]).verifyTransaction(
                self.signer.sign(TestPKI.transaction(environment: .sandbox)))
        }
        await expectFailure("wrong_environment") {
            _ = try await TestPKI.verifier().verifyTransaction(
                self.signer.sign(TestPKI.transaction(environment: .xcode)))
        }
    }

    // MARK: Forgeries

    @Test func anotherRootIsRejected() async throws {
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(TestPKI.other.jwsSigner.sign(TestPKI.transaction()))
        }
    }

    @Test func sameNamesWithOtherKeysAreRejected() async throws {
        let lookalike = try TestPKI.CustomChain(
            rootName: TestPKI.genuine.root.certificate.subject,
            intermediateName: TestPKI.genuine.intermediate.certificate.subject,
            leafName: TestPKI.genuine.leaf.certificate.subject)
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(lookalike.sign(TestPKI.transaction()))
        }
        // Look-alike intermediate and leaf, but x5c[2] is the genuine root certificate.
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(
                lookalike.sign(
                    TestPKI.transaction(),
                    x5c: [lookalike.leaf, lookalike.intermediate, TestPKI.genuine.root.certificate]))
        }
    }

    @Test func x5cThirdCertificateIsNeverAnAnchor() async throws {
        // Attacker's own complete chain, root included in x5c: trusting x5c[2] would accept it.
        let attacker = try TestPKI.CustomChain(
            rootName: try .named("Evil Root"), intermediateName: try .named("Evil WWDR"), leafName: try .named("Evil"))
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(attacker.sign(TestPKI.transaction()))
        }
    }

    @Test func missingAppleOIDsAreRejected() async throws {
        let noWWDR = try TestPKI.chainUnderGenuineRoot(intermediateOIDs: [])
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(noWWDR.sign(TestPKI.transaction()))
        }
        let noReceiptOID = try TestPKI.chainUnderGenuineRoot(leafOIDs: [])
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(noReceiptOID.sign(TestPKI.transaction()))
        }
        // With both OIDs the same construction is accepted: the two failures above are the OIDs.
        let proper = try TestPKI.chainUnderGenuineRoot()
        _ = try await TestPKI.verifier().verifyTransaction(proper.sign(TestPKI.transaction()))
    }

    @Test func leafExpiredAtSignedDateIsRejectedEvenWhenCached() async throws {
        let expiry = Date(timeIntervalSince1970: Double(TestPKI.signedDate) / 1000 - 86_400)
        let chain = try TestPKI.chainUnderGenuineRoot(leafNotAfter: expiry)
        let verifier = try TestPKI.verifier()
        // Signed while the leaf was valid: accepted and cached.
        let early = TestPKI.signedDate - 10 * 86_400_000
        _ = try await verifier.verifyTransaction(chain.sign(TestPKI.transaction(signedDate: early)))
        #expect(verifier.cachedChainCount == 1)
        // Signed after the leaf expired: the cached chain must not be reused.
        await expectFailure("invalid_chain") {
            _ = try await verifier.verifyTransaction(chain.sign(TestPKI.transaction()))
        }
        // Not yet valid at signedDate.
        let future = try TestPKI.chainUnderGenuineRoot(
            leafNotBefore: Date(timeIntervalSince1970: Double(TestPKI.signedDate) / 1000 + 86_400))
        await expectFailure("invalid_chain") {
            _ = try await verifier.verifyTransaction(future.sign(TestPKI.transaction()))
        }
    }

    @Test func validationTimeNowRejectsOldExpiredLeaf() async throws {
        let expiry = Date(timeIntervalSince1970: Double(TestPKI.signedDate) / 1000 + 86_400)
        let chain = try TestPKI.chainUnderGenuineRoot(leafNotAfter: expiry)
        let jws = try chain.sign(TestPKI.transaction())
        _ = try await TestPKI.verifier().verifyTransaction(jws)
        let now = try SignedDataVerifier(
            .init(
                trustedRoots: [TestPKI.genuine.root.derBytes], bundleId: TestPKI.bundleId, environments: nil,
                validationTime: .now))
        await expectFailure("invalid_chain") { _ = try await now.verifyTransaction(jws) }
    }

    @Test func twoCertificateX5cIsRejected() async throws {
        let genuine = TestPKI.genuine
        let two = try TestPKI.sign(
            TestPKI.transaction(), key: genuine.leaf.privateKey,
            chain: [genuine.leaf.certificate, genuine.intermediate.certificate])
        await expectFailure("invalid_chain") { _ = try await TestPKI.verifier().verifyTransaction(two) }
        let four = try TestPKI.sign(
            TestPKI.transaction(), key: genuine.leaf.privateKey,
            chain: [
                genuine.leaf.certificate, genuine.intermediate.certificate, genuine.root.certificate,
                genuine.root.certificate,
            ])
        await expectFailure("invalid_chain") { _ = try await TestPKI.verifier().verifyTransaction(four) }
        // The leaf signed directly by the root: path of 2, refused even though it chains.
        let direct = try TestPKI.CustomChain(
            rootName: genuine.root.certificate.subject, intermediateName: genuine.root.certificate.subject,
            leafName: try .named("Direct"), useRootKey: genuine.root.privateKey, useRoot: genuine.root.certificate,
            useIntermediateKey: genuine.root.privateKey, useIntermediate: genuine.root.certificate)
        await expectFailure("invalid_chain") {
            _ = try await TestPKI.verifier().verifyTransaction(
                direct.sign(
                    TestPKI.transaction(), x5c: [direct.leaf, genuine.root.certificate, genuine.root.certificate]))
        }
    }

    @Test func foreignLeafBeforeGenuineIntermediateIsRejected() async throws {
        let foreignKey = P256.Signing.PrivateKey()
        let foreignLeaf = try CertificateFactory.make(
            subject: TestPKI.genuine.leaf.certificate.subject, issuer: TestPKI.genuine.intermediate.certificate.subject,
            publicKey: .init(foreignKey.publicKey), issuerKey: .init(P384.Signing.PrivateKey()), isCA: false,
            appleOIDs: [AppleOID.receiptSigning], notBefore: Date(timeIntervalSince1970: 1_600_000_000),
            notAfter: Date(timeIntervalSince1970: 2_500_000_000))
        let forged = try TestPKI.sign(
            TestPKI.transaction(), key: foreignKey,
            chain: [foreignLeaf, TestPKI.genuine.intermediate.certificate, TestPKI.genuine.root.certificate])
        await expectFailure("invalid_chain") { _ = try await TestPKI.verifier().verifyTransaction(forged) }
    }

    @Test(arguments: ["none", "HS256", "RS256", "ES384", "es256", ""])
    func algorithmsOtherThanES256AreRejected(alg: String) async throws {
        let header: [String: Any] = ["alg": alg, "x5c": signer.x5c]
        let payload = try JSONEncoder().encode(TestPKI.transaction())
        let jws = try signer.sign(payloadBytes: Array(payload), header: header)
        await expectFailure("invalid_signature") { _ = try await TestPKI.verifier().verifyTransaction(jws) }
        // `alg: none` with an empty signature, the classic.
        let unsigned = jws.split(separator: ".").prefix(2).joined(separator: ".") + "."
        await expectFailure("invalid_signature") { _ = try await TestPKI.verifier().verifyTransaction(unsigned) }
    }

    @Test func tamperedPayloadIsRejected() async throws {
        let jws = try signer.sign(TestPKI.transaction())
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        var payload = TestPKI.transaction()
        payload.quantity = 10
        let tampered = parts[0] + "." + JWSSigner.base64URL(try JSONEncoder().encode(payload)) + "." + parts[2]
        await expectFailure("invalid_signature") { _ = try await TestPKI.verifier().verifyTransaction(tampered) }
    }

    @Test func everySingleSignatureBitFlipIsRejected() async throws {
        let verifier = try TestPKI.verifier()
        let jws = try signer.sign(TestPKI.transaction())
        let parts = jws.split(separator: ".").map(String.init)
        let signature = [UInt8](Data(base64Encoded: base64FromURL(parts[2]))!)
        for bit in 0..<(signature.count * 8) {
            var flipped = signature
            flipped[bit / 8] ^= UInt8(1 << (bit % 8))
            let forged = parts[0] + "." + parts[1] + "." + JWSSigner.base64URL(flipped)
            await expectFailure("invalid_signature") { _ = try await verifier.verifyTransaction(forged) }
        }
    }

    @Test func oversizedAndMalformedInputsAreRejected() async throws {
        let verifier = try TestPKI.verifier()
        let jws = try signer.sign(TestPKI.transaction())
        let parts = jws.split(separator: ".").map(String.init)
        let bigHeader = try signer.sign(
            payloadBytes: Array(try JSONEncoder().encode(TestPKI.transaction())),
            header: ["alg": "ES256", "x5c": signer.x5c, "pad": String(repeating: "A", count: 20_000)])
        let cases = [
            "", "   ", "a", "a.b", "a.b.c.d", "....", jws + "." + parts[2],
            "!!!." + parts[1] + "." + parts[2],  // non-base64 header
            parts[0] + ".%%%." + parts[2],  // non-base64 payload
            parts[0] + "." + parts[1] + ".@@",  // non-base64 signature
            parts[0] + "=." + parts[1] + "." + parts[2],  // padding is not base64url
            JWSSigner.base64URL(Array("[1,2]".utf8)) + "." + parts[1] + "." + parts[2],  // header not an object
            JWSSigner.base64URL(Array("{\"alg\":5}".utf8)) + "." + parts[1] + "." + parts[2],
            parts[0] + "." + JWSSigner.base64URL(Array("not json".utf8)) + "." + parts[2],
            parts[0] + "." + JWSSigner.base64URL(Array("{\"signedDate\":\"x\"}".utf8)) + "." + parts[2],
            bigHeader,
            String(repeating: "A", count: 600_000),
            parts[0] + "." + parts[1] + "." + String(parts[2].dropLast(4)),  // truncated signature
        ]
        for input in cases {
            await expectFailure("invalid_signature") { _ = try await verifier.verifyTransaction(input) }
        }
        let badX5C: [[String]] = [[], ["x", "y", "z"], ["", "", ""], signer.x5c.map { String($0.reversed()) }]
        for x5c in badX5C {
            let forged = try signer.sign(
                payloadBytes: Array(try JSONEncoder().encode(TestPKI.transaction())),
                header: ["alg": "ES256", "x5c": x5c])
            await expectFailure("invalid_chain") { _ = try await verifier.verifyTransaction(forged) }
        }
    }

    @Test func concurrentVerificationsShareTheCacheSafely() async throws {
        let verifier = try TestPKI.verifier(cache: 2)
        let other = try TestPKI.chainUnderGenuineRoot()
        let third = try TestPKI.chainUnderGenuineRoot()
        let inputs = try (0..<200).map { index -> (String, Bool) in
            switch index % 4 {
            case 0: (try signer.sign(TestPKI.transaction(id: "\(index)")), true)
            case 1: (try other.sign(TestPKI.transaction(id: "\(index)")), true)
            case 2: (try third.sign(TestPKI.transaction(id: "\(index)")), true)
            default: (try TestPKI.other.jwsSigner.sign(TestPKI.transaction(id: "\(index)")), false)
            }
        }
        let results = await withTaskGroup(of: (Bool, Bool).self) { group in
            for (jws, expected) in inputs {
                group.addTask {
                    let ok = (try? await verifier.verifyTransaction(jws)) != nil
                    return (ok, expected)
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.count == 200)
        #expect(results.allSatisfy { $0.0 == $0.1 })
        #expect(verifier.cachedChainCount <= 2)
    }

    @Test func failuresCarryCodesAndRetryClasses() {
        let all: [VerificationFailure] = [
            .invalidSignature("x"), .invalidChain("x"), .wrongBundle(expected: "a", actual: nil),
            .wrongApp(expected: 1, actual: 2), .wrongEnvironment(expected: ["Production"], actual: "Sandbox"),
            .revoked("x"), .appleUnavailable("x"),
        ]
        #expect(
            all.map(\.code) == [
                "invalid_signature", "invalid_chain", "wrong_bundle", "wrong_app", "wrong_environment", "revoked",
                "apple_unavailable",
            ])
        #expect(all.map(\.isRetryable) == [false, false, false, false, false, false, true])
        #expect(VerificationFailure.wrongBundle(expected: "a", actual: "b").reason.contains("'b'"))
    }
}

func base64FromURL(_ text: String) -> String {
    var result = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while result.count % 4 != 0 { result += "=" }
    return result
}
