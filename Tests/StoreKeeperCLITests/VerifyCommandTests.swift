import AppStoreModels
import AppStoreSigning
import Foundation
import StoreKeeperSupport
import Testing

/// `storekeeper verify` as a support engineer runs it: the real binary, real files.
@Suite struct VerifyCommandTests {
    struct Run {
        var status: Int32
        var stdout: String
        var stderr: String
        var json: [String: Any]? {
            try? JSONSerialization.jsonObject(with: Data(stdout.utf8)) as? [String: Any]
        }
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    static var binary: URL {
        // The test bundle sits in the products directory, next to the executable.
        var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for _ in 0..<4 {
            let candidate = directory.appendingPathComponent("storekeeper")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/storekeeper")
    }

    /// Runs the binary to its end. Waiting for a process blocks a thread: it happens on a thread
    /// of its own, never on the test process's cooperative pool — that pool has one thread per
    /// core (two here), and a test blocking them stalls every other test's awaits (an HTTP
    /// answer not read within its deadline, a load that never runs).
    static func run(_ arguments: [String], stdin: Data? = nil, directory: URL? = nil) async throws -> Run {
        try await offPool { try runBlocking(arguments, stdin: stdin, directory: directory) }
    }

    /// Blocking work on a new thread, awaited.
    static func offPool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread { continuation.resume(with: Result { try work() }) }
        }
    }

    static func runBlocking(_ arguments: [String], stdin: Data?, directory: URL? = nil) throws -> Run {
        let process = ChildProcess()
        process.executableURL = binary
        process.arguments = arguments
        if let directory { process.runIn(directory) }
        let out = Pipe()
        let err = Pipe()
        let input = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = input
        try process.run()
        if let stdin { input.fileHandleForWriting.write(stdin) }
        try input.fileHandleForWriting.close()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Run(
            status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
            stderr: String(decoding: stderr, as: UTF8.self))
    }

    static func temporaryFile(_ contents: Data, name: String = UUID().uuidString) throws -> String {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("storekeeper-test-\(name)")
        try contents.write(to: url)
        return url.path
    }

    static let pki = try! ApplePKI.generate(name: "CLI Test")
    static let rootPEM = try! temporaryFile(
        Data(
            (try! pki.root.certificate.serializeAsPEM().pemString + "\n"
                + pki.receiptRoot!.certificate.serializeAsPEM().pemString).utf8),
        name: "root.pem")

    @Test func genuineTransactionPrintsItsPayload() async throws {
        let result = try await Self.run([
            "verify", Self.fixtures.appendingPathComponent("apple-transaction-sandbox-consumable.jws").path,
        ])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.json?["transactionId"] as? String == "2000000847061981")
        #expect(result.json?["price"] as? Int == 230000)
        #expect(result.stderr.contains("JWS transaction"))
    }

    @Test func genuineReceiptBase64AndDERPrintTheReceipt() async throws {
        let path = Self.fixtures.appendingPathComponent("apple-receipt-production.b64").path
        let base64 = try await Self.run([
            "verify", "--bundle-id", "org.getpure.pure-iphone", "--environment", "Production", path,
        ])
        #expect(base64.status == 0, "\(base64.stderr)")
        #expect(base64.json?["bundle_id"] as? String == "org.getpure.pure-iphone")
        #expect((base64.json?["in_app"] as? [Any])?.count == 4)
        let der = Data(
            base64Encoded: try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(
                in: .whitespacesAndNewlines))!
        let derRun = try await Self.run(["verify", try Self.temporaryFile(der)])
        #expect(derRun.status == 0)
        #expect(derRun.stdout == base64.stdout)
        let stdin = try await Self.run(["verify", "-"], stdin: der)
        #expect(stdin.status == 0)
        #expect(stdin.stdout == base64.stdout)
    }

    @Test func failuresPrintTheCodeAndExitOne() async throws {
        let jws = Self.fixtures.appendingPathComponent("apple-transaction-sandbox-consumable.jws").path
        let wrongBundle = try await Self.run(["verify", "--bundle-id", "com.other", jws])
        #expect(wrongBundle.status == 1)
        #expect(wrongBundle.stderr.hasPrefix("wrong_bundle: "))
        #expect(wrongBundle.stdout.isEmpty)
        let wrongEnvironment = try await Self.run(["verify", "--environment", "Production", jws])
        #expect(wrongEnvironment.status == 1)
        #expect(wrongEnvironment.stderr.hasPrefix("wrong_environment: "))
        let now = try await Self.run(["verify", "--now", jws])
        #expect(now.status == 1)
        #expect(now.stderr.hasPrefix("invalid_chain: "))
        var edited = Array(try String(contentsOfFile: jws, encoding: .utf8).utf8)
        edited[edited.count / 2] = edited[edited.count / 2] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let tampered = try await Self.run(["verify", try Self.temporaryFile(Data(edited))])
        #expect(tampered.status == 1)
        #expect(tampered.stderr.hasPrefix("invalid_signature: "))
        let garbage = try await Self.run(["verify", try Self.temporaryFile(Data("hello world".utf8))])
        #expect(garbage.status == 1)
        #expect(garbage.stderr.hasPrefix("invalid_signature: "))
        #expect(garbage.stderr.split(separator: "\n").count == 1)
        let missing = try await Self.run(["verify", "/nonexistent/receipt"])
        #expect(missing.status == 1)
        #expect(missing.stderr.hasPrefix("bad_request: "))
        let empty = try await Self.run(["verify", "-"], stdin: Data())
        #expect(empty.status == 1)
    }

    @Test func customRootsVerifyEveryKindAndAppleRootsRefuseThem() async throws {
        let signer = Self.pki.jwsSigner
        let signedDate: Int64 = 1_767_225_605_000
        let transaction = try signer.sign(
            JWSTransactionDecodedPayload(
                transactionId: "5", bundleId: "com.example.app", productId: "coins_60", signedDate: signedDate,
                environment: .sandbox))
        let renewal = try signer.sign(
            JWSRenewalInfoDecodedPayload(
                originalTransactionId: "5", autoRenewProductId: "pro", autoRenewStatus: .on, signedDate: signedDate,
                environment: .sandbox))
        let app = try signer.sign(
            AppTransaction(
                appAppleId: 1, appTransactionId: "705", bundleId: "com.example.app", receiptCreationDate: signedDate,
                receiptType: .sandbox))
        let notification = try signer.sign(
            ResponseBodyV2DecodedPayload(
                notificationType: .oneTimeCharge, notificationUUID: "n-1", signedDate: signedDate,
                data: NotificationData(
                    appAppleId: 1, bundleId: "com.example.app", environment: .sandbox,
                    signedTransactionInfo: transaction)))
        let postBody = try JSONEncoder().encode(ResponseBodyV2(signedPayload: notification))
        var receipt = AppReceipt(inAppPurchases: [
            AppReceiptInAppPurchase(quantity: 1, productId: "coins_60", transactionId: "5")
        ])
        receipt.bundleId = "com.example.app"
        receipt.receiptType = "ProductionSandbox"
        receipt.creationDate = Date(timeIntervalSince1970: 1_767_225_600)
        let receiptBytes = try Self.pki.receiptSigner!.sign(receipt)

        let cases: [(Data, String, String)] = [
            (Data(transaction.utf8), "transactionId", "JWS transaction"),
            (Data(renewal.utf8), "autoRenewProductId", "renewal info"),
            (Data(app.utf8), "appTransactionId", "app transaction"),
            (Data(notification.utf8), "notificationUUID", "Notification"),
            (postBody, "notificationUUID", "Notification"),
            (Data(Data(receiptBytes).base64EncodedString().utf8), "in_app", "app receipt"),
        ]
        for (input, field, kind) in cases {
            let path = try Self.temporaryFile(input)
            let trusted = try await Self.run(["verify", "--root", Self.rootPEM, "--bundle-id", "com.example.app", path])
            #expect(trusted.status == 0, "\(kind): \(trusted.stderr)")
            #expect(trusted.json?[field] != nil, "\(kind): \(trusted.stdout)")
            #expect(trusted.stderr.contains(kind))
            let apple = try await Self.run(["verify", path])
            #expect(apple.status == 1, "\(kind) must not verify with Apple's roots")
            #expect(apple.stderr.hasPrefix("invalid_chain: "), "\(kind): \(apple.stderr)")
        }
        let badRoot = try await Self.run(["verify", "--root", try Self.temporaryFile(Data("not a cert".utf8)), "x"])
        #expect(badRoot.status == 1)
        #expect(badRoot.stderr.hasPrefix("bad_request: "))
    }
}
