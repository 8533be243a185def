import Crypto
import Foundation
import Hummingbird
import HummingbirdTesting
import LocalAppStore
import LocalGooglePlay
import StoreKeeperKitCore
import StoreKeeperSimulator
import Testing

@testable import StoreKeeperServer

/// Issue 45's run: StoreKeeperKit devices (StoreKit 1 and 2, every hostile option) against a
/// production-shaped server that serves an iOS and an Android app and signs its answers, the
/// server switching to its next signing key in the middle of the run. Nothing paid is lost,
/// doubled or misattributed; the report's per-account figures are the server's own.
@Suite(.serialized) struct TwoStoreSimulationTests {
    typealias API = ServerAPITests

    @Test func aTwoAppServerWithSignedAnswersAndAKeyRotationLosesNothing() async throws {
        let play = LocalGooglePlay(
            configuration: .init(packageName: "com.example.android", catalog: .demo),
            clock: StoreClock(start: Date(), scale: 0))
        let playServer = try await LocalGooglePlayServer(store: play)
        let running = try await playServer.start()
        defer { Task { await running.stop() } }
        let current = Curve25519.Signing.PrivateKey()
        let next = Curve25519.Signing.PrivateKey()
        try await API.withServer(
            "sqlite",
            configure: { configuration in
                configuration.port = 0
                configuration.appStoreAppId = "ios"
                var google = GooglePlayAppConfiguration(id: "android", packageName: "com.example.android")
                google.serviceAccountKey = playServer.serviceAccountKey(baseURL: running.baseURL)
                google.apiBaseURL = running.baseURL
                google.pushAudience = GooglePlayServerTests.audience
                google.pushServiceAccount = GooglePlayServerTests.pushAccount
                google.pushCertificatesURL = running.baseURL + "/oauth2/v3/certs"
                configuration.googlePlayApps = [google]
                configuration.responseSigningKeys = [ResponseSigner.pem(current), ResponseSigner.pem(next)]
            }
        ) { app, _ in
            try await app.application().test(.live) { client in
                let server = URL(string: "http://127.0.0.1:\(client.port!)")!
                let control = LocalStoreControl(server: server, key: API.secret)
                let listed = try await control.responseSigningKeys()
                #expect(listed.map(\.use) == ["signing", "published"])
                var options = Simulation.Options(server: server, key: API.secret)
                options.appId = "ios"
                options.responseSigningKeys = try listed.map { try ResponseSigningKey($0.publicKey) }
                options.rotateSigningKey = { #expect(app.responseSigningKeys.rotate()) }
                options.devices = 6
                options.purchases = 90
                options.storeKit = .mixed
                options.accountsPerDevice = 2
                options.crashRate = 0.1
                options.networkFailureRate = 0.1
                options.middleboxErrorRate = 0.05
                options.clockJumpRate = 0.05
                options.replayFlood = 5
                options.tokenlessRate = 0.05
                options.fsync = false
                // A failing seed is printed; STOREKEEPER_TEST_SEED=<seed> runs it again.
                options.seed =
                    ProcessInfo.processInfo.environment["STOREKEEPER_TEST_SEED"].flatMap { UInt64($0) }
                    ?? UInt64.random(in: 1...UInt64.max)
                // What a failing run found (a problem line per transaction), printed with the seed.
                let seed = options.seed
                let report = try await Simulation(options: options).run { line in
                    if line.hasPrefix("problem:") { print("seed \(seed) \(line)") }
                }
                #expect(report.clean, "seed \(options.seed): \(report)")
                #expect(report.keyRotation?.rotated == true)
                #expect(report.keyRotation?.to == ResponseSigner(key: next).keyId)
                #expect(report.appId == "ios" && report.signedAnswers)
                #expect(report.paid > 0 && report.delivered == report.paid)
                // One entry per app account, each what the server holds for it.
                #expect(report.accounts.count == options.devices * options.accountsPerDevice)
                for account in report.accounts {
                    #expect(account.paid == account.held, "\(account)")
                    // A fresh connection (the test client's may have idled out during a long run).
                    let view = try await ClientSDKTests.get(server, "/v1/accounts/\(account.accountId)")
                    let balances = (view["balances"] as? [String: Any]) ?? [:]
                    for (currency, value) in account.held where currency != "entitlements" {
                        guard case .amount(let amount) = value else { continue }
                        #expect((balances[currency] as? Int).map(Int64.init) == amount, "\(account.accountId)")
                    }
                }
            }
        }
    }
}
