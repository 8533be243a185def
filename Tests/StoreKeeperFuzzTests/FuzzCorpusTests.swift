import AppStoreModels
import AppStoreVerification
import Foundation
import StoreKeeperCatalog
import StoreKeeperFuzzTargets
import StoreKeeperServer
import Testing

/// Every committed fuzz input, seeds and regressions, through its target in a normal build:
/// a crash found by `scripts/fuzz` stays fixed, and the seeds still reach past the signature.
@Suite struct FuzzCorpusTests {
    static let fuzzDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Fuzz")

    static func inputs(_ kind: String, _ target: FuzzTarget) -> [URL] {
        let directory = fuzzDirectory.appendingPathComponent(kind).appendingPathComponent(target.rawValue)
        let files = (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? []
        return files.filter { !$0.lastPathComponent.hasPrefix(".") }.sorted { $0.path < $1.path }
    }

    @Test(arguments: FuzzTarget.allCases)
    func seedsAndRegressionsRunClean(_ target: FuzzTarget) async throws {
        let fuzzer = try Fuzzer(extraRoots: Fuzzer.roots(in: Self.fuzzDirectory.appendingPathComponent("trust")))
        let seeds = Self.inputs("corpus", target)
        #expect(seeds.count >= 2, "the seed corpus of \(target.rawValue) is missing")
        for file in seeds + Self.inputs("regressions", target) {
            await fuzzer.run(target, [UInt8](try Data(contentsOf: file)))
        }
    }
}

/// The seeds are worth mutating only if they pass every check: each signed seed verifies, each
/// catalog and configuration loads, each request body decodes.
@Suite struct FuzzSeedTests {
    static func seeds(_ target: FuzzTarget) throws -> [(name: String, bytes: [UInt8])] {
        try FuzzCorpusTests.inputs("corpus", target).map { ($0.lastPathComponent, [UInt8](try Data(contentsOf: $0))) }
    }

    static let roots = Fuzzer.roots(in: FuzzCorpusTests.fuzzDirectory.appendingPathComponent("trust"))

    @Test func signedSeedsVerify() async throws {
        let inspector = try ProofInspector(
            rootsDER: Self.roots + [AppleRootCertificates.appleRootCAG3DER, AppleRootCertificates.appleIncRootDER],
            bundleId: nil, appAppleId: nil, environment: nil)
        for seed in try Self.seeds(.jws) + Self.seeds(.receipt) where !seed.name.hasSuffix("-payload") {
            await #expect(throws: Never.self, "\(seed.name)") { _ = try await inspector.inspect(seed.bytes) }
        }
    }

    @Test func payloadSeedsDecode() throws {
        for seed in try Self.seeds(.payload) {
            #expect(throws: Never.self, "\(seed.name)") { _ = try FastJSON.parse(seed.bytes) }
        }
        for seed in try Self.seeds(.receipt) where seed.name.hasSuffix("-payload") {
            #expect(throws: Never.self, "\(seed.name)") { _ = try AppReceiptParser.parsePayload(seed.bytes[...]) }
        }
    }

    @Test func requestSeedsDecode() throws {
        for seed in try Self.seeds(.requests) {
            let name = RequestBodies.names[Int(seed.bytes[0]) % RequestBodies.names.count]
            #expect(throws: Never.self, "\(seed.name)") { try RequestBodies.decode(name, Data(seed.bytes.dropFirst())) }
        }
    }

    @Test func catalogAndConfigurationSeedsLoad() async throws {
        for seed in try Self.seeds(.catalog) {
            let text = String(decoding: seed.bytes, as: UTF8.self)
            #expect(throws: Never.self, "\(seed.name)") {
                _ = try seed.name.hasSuffix(".json") ? Catalog.parse(json: text) : Catalog.parse(yaml: text)
            }
        }
        for seed in try Self.seeds(.config) {
            await #expect(throws: Never.self, "\(seed.name)") {
                _ = try await ServerConfiguration.load(contents: Data(seed.bytes), environment: [:])
            }
        }
    }
}
