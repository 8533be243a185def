import AppStoreModels
import AppStoreVerification
import ArgumentParser
import Foundation

/// `storekeeper verify`: what a support engineer runs on a receipt or JWS from a ticket.
struct VerifyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract:
            "Verify an App Store JWS (transaction, renewal info, notification, app transaction) or an app receipt.",
        discussion: """
            Detects the kind of FILE ('-' for standard input), verifies it offline against Apple's roots \
            (or --root), and prints the decoded payload as JSON. On failure prints '<error_code>: <reason>' \
            to standard error and exits 1.
            """
    )

    @Option(
        name: .customLong("root"), help: "A trusted root certificate (PEM or DER). Repeatable. Default: Apple's roots.")
    var roots: [String] = []

    @Option(name: .customLong("bundle-id"), help: "Require this bundle id.")
    var bundleId: String?

    @Option(name: .customLong("app-apple-id"), help: "Require this App Store app id (checked in Production).")
    var appAppleId: Int64?

    @Option(name: .customLong("environment"), help: "Require this environment (Production, Sandbox, …).")
    var environment: String?

    @Flag(name: .customLong("now"), help: "Check certificate validity now instead of at the signing date.")
    var validateNow = false

    @Argument(help: "The file to verify, or '-' for standard input.")
    var file: String

    func run() async throws {
        do {
            let input = try readInput()
            let output = try await ProofInspector(
                rootsDER: try loadRoots(), bundleId: bundleId, appAppleId: appAppleId,
                environment: environment.map { AppStoreEnvironment(rawValue: $0) },
                validationTime: validateNow ? .now : .signedDate
            ).inspect(input)
            FileHandle.standardError.write(Data("verified: \(output.kind.rawValue)\n".utf8))
            FileHandle.standardOutput.write(Data((output.json + "\n").utf8))
        } catch let failure as VerificationFailure {
            FileHandle.standardError.write(Data("\(failure.code): \(failure.reason)\n".utf8))
            throw ExitCode(1)
        } catch let error as InputError {
            FileHandle.standardError.write(Data("bad_request: \(error.message)\n".utf8))
            throw ExitCode(1)
        }
    }

    struct InputError: Error { var message: String }

    private func readInput() throws -> [UInt8] {
        let data: Data?
        if file == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            data = FileManager.default.contents(atPath: file)
        }
        guard let data else { throw InputError(message: "cannot read \(file)") }
        guard data.count <= 64 * 1024 * 1024 else { throw InputError(message: "\(file) is larger than 64 MiB") }
        return [UInt8](data)
    }

    private func loadRoots() throws -> [[UInt8]]? {
        guard !roots.isEmpty else { return nil }
        return try roots.flatMap { path -> [[UInt8]] in
            guard let data = FileManager.default.contents(atPath: path) else {
                throw InputError(message: "cannot read root certificate \(path)")
            }
            let certificates = CertificateFile.certificates(in: [UInt8](data))
            guard !certificates.isEmpty else { throw InputError(message: "\(path) holds no PEM or DER certificate") }
            return certificates
        }
    }
}
