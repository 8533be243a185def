import Crypto
import Foundation
import Hummingbird
import HummingbirdTesting
import JWTKit
import Synchronization
import Testing
import _CryptoExtras

@testable import GooglePlay

/// Audit 3, finding 5: a push is verified with exactly the key its `kid` names; a key Google
/// just added is fetched once (single flight, at most once a minute), not refused for an hour.
@Suite struct PushKeyRotationTests {
    struct Key {
        let id: String
        let keys: JWTKeyCollection
        let jwk: [String: String]

        init(_ id: String) async throws {
            let rsa = try Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048))
            self.id = id
            keys = await JWTKeyCollection().add(rsa: rsa, digestAlgorithm: .sha256, kid: JWKIdentifier(string: id))
            let (modulus, exponent) = try rsa.publicKey.getKeyPrimitives()
            jwk = [
                "kty": "RSA", "alg": "RS256", "use": "sig", "kid": id, "n": modulus.base64URLEncodedString(),
                "e": exponent.base64URLEncodedString(),
            ]
        }

        func token(kid: String? = nil) async throws -> String {
            try await keys.sign(
                PushTokenClaims(audience: "aud", email: "pubsub@p.iam.gserviceaccount.com", issuedAt: Date()),
                kid: JWKIdentifier(string: kid ?? id))
        }
    }

    final class Clock: Sendable {
        let offset = Mutex(Duration.zero)
        let start = ContinuousClock.now
        var now: ContinuousClock.Instant { start + offset.withLock { $0 } }
        func advance(_ duration: Duration) { offset.withLock { $0 += duration } }
    }

    @Test func aRotatedKeyIsFetchedOnceAndTheKidIsNeverIgnored() async throws {
        let first = try await Key("first")
        let second = try await Key("second")
        let served = Mutex([first.jwk])
        let router = Router()
        router.get("certs") { _, _ -> Response in
            let body = try JSONSerialization.data(withJSONObject: ["keys": served.withLock { $0 }])
            return Response(
                status: .ok, headers: [.contentType: "application/json"],
                body: .init(byteBuffer: ByteBuffer(data: body)))
        }
        try await Application(router: router).test(.live) { client in
            let clock = Clock()
            let verifier = PushVerifier(
                audience: "aud", serviceAccount: "pubsub@p.iam.gserviceaccount.com",
                certificatesURL: "http://127.0.0.1:\(client.port!)/certs", clock: { clock.now })
            _ = try await verifier.verify(authorization: "Bearer \(try await first.token())")
            #expect(await verifier.fetches == 1)

            // The real key under another kid: refused, whatever key would verify it.
            for kid in ["whatever", ""] {
                await #expect(throws: PushVerifier.Refusal.self) {
                    _ = try await verifier.verify(authorization: "Bearer \(try await first.token(kid: kid))")
                }
            }
            // Google adds a key and signs with it. Within a minute of the last fetch it is not
            // asked again (anyone can POST a push) …
            served.withLock { $0.append(second.jwk) }
            await #expect(throws: PushVerifier.Refusal.self) {
                _ = try await verifier.verify(authorization: "Bearer \(try await second.token())")
            }
            let afterTheKidsAbove = await verifier.fetches
            #expect(afterTheKidsAbove == 1)
            // … after it, one fetch — shared by every push arriving at once — and it verifies.
            clock.advance(.seconds(61))
            let tokens = try await (0..<8).asyncMap { _ in try await second.token() }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for token in tokens {
                    group.addTask { _ = try await verifier.verify(authorization: "Bearer \(token)") }
                }
                try await group.waitForAll()
            }
            #expect(await verifier.fetches == 2)
            // Signed by the first key but naming the second: verified with the second, refused.
            await #expect(throws: PushVerifier.Refusal.self) {
                _ = try await verifier.verify(authorization: "Bearer \(try await first.token(kid: "second"))")
            }
            // The old key still verifies while Google serves it.
            _ = try await verifier.verify(authorization: "Bearer \(try await first.token())")
            #expect(await verifier.fetches == 2)
        }
    }
}

extension Sequence {
    fileprivate func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
