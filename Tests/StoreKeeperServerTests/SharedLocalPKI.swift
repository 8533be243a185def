import Foundation
import LocalAppStore

/// One local App Store PKI for every test server of the run, copied into each server's data
/// directory before it starts. Generating one (three RSA-2048 keys) per server, dozens of
/// servers at once on two cores, kept Swift's pool busy for tens of seconds — long enough for
/// other tests' database deadlines, met on a thread of their own, to pass.
enum SharedLocalPKI {
    private static let generated = Task<URL, any Error> {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("shared-local-pki-\(UUID())")
        _ = try PKIStore.loadOrCreate(dataDirectory: directory)
        return directory.appendingPathComponent("pki", isDirectory: true)
    }

    /// Puts the shared PKI where `StoreKeeperApp.make` looks for it under `dataDirectory`.
    static func seed(_ dataDirectory: URL) async throws {
        let source = try await generated.value
        let localStore = dataDirectory.appendingPathComponent("local-store", isDirectory: true)
        try FileManager.default.createDirectory(at: localStore, withIntermediateDirectories: true)
        try FileManager.default.copyItem(at: source, to: localStore.appendingPathComponent("pki", isDirectory: true))
    }
}
