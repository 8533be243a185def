import AppStoreModels
import AppStoreSigning
import AppStoreVerification
import Foundation
import Testing

@testable import LocalAppStore

@Suite struct PKIStoreTests {
    static func temporaryDirectory() -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("local-store-\(UUID().uuidString)")
    }

    @Test func firstStartGeneratesAndRestartsKeepTheKeys() throws {
        let directory = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let first = try PKIStore.loadOrCreate(dataDirectory: directory)
        let second = try PKIStore.loadOrCreate(dataDirectory: directory)
        #expect(first.root.derBytes == second.root.derBytes)
        #expect(first.leaf.derBytes == second.leaf.derBytes)
        #expect(first.receiptRoot?.derBytes == second.receiptRoot?.derBytes)
        #expect(first.leaf.privateKey.rawRepresentation == second.leaf.privateKey.rawRepresentation)
        let keyAttributes = try FileManager.default.attributesOfItem(
            atPath: directory.appendingPathComponent("pki/leaf.key.pem").path)
        #expect((keyAttributes[.posixPermissions] as? Int) == 0o600)
        #expect(try PKIStore.rootsPEM(first).components(separatedBy: "-----BEGIN CERTIFICATE-----").count == 3)
    }

    @Test func whatItSignsVerifiesWithItsRootsAndNeverWithApples() async throws {
        let directory = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        _ = try PKIStore.loadOrCreate(dataDirectory: directory)
        let pki = try PKIStore.loadOrCreate(dataDirectory: directory)  // signs with the reloaded keys
        let purchase = TransactionIssuer.Purchase(bundleId: "com.example.app", productId: "coins_60", quantity: 2)
        let jws = try pki.jwsSigner.sign(
            TransactionIssuer().transaction(for: purchase, at: Date(), id: TransactionIds.next()))
        let local = try SignedDataVerifier(.init(trustedRoots: pki.trustRootsDER, bundleId: "com.example.app"))
        #expect(try await local.verifyTransaction(jws).quantity == 2)
        await #expect(throws: VerificationFailure.invalidChain("certificate chain rejected: no path to a trusted root"))
        {
            _ = try await SignedDataVerifier(.init(bundleId: "com.example.app")).verifyTransaction(jws)
        }

        var receipt = AppReceipt(inAppPurchases: [
            AppReceiptInAppPurchase(quantity: 1, productId: "coins_60", transactionId: "1")
        ])
        receipt.bundleId = "com.example.app"
        receipt.receiptType = "Production"
        receipt.creationDate = Date()
        let signed = try pki.receiptSigner!.sign(receipt)
        #expect(try await AppReceiptVerifier(trustedRoots: pki.trustRootsDER).verify(signed).inAppPurchases.count == 1)
        await #expect(throws: VerificationFailure.self) { _ = try await AppReceiptVerifier().verify(signed) }
    }

    @Test func aPartialOrDamagedPKIIsAnErrorNotAReplacement() throws {
        let directory = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        _ = try PKIStore.loadOrCreate(dataDirectory: directory)
        let pkiDirectory = directory.appendingPathComponent("pki")
        let leaf = pkiDirectory.appendingPathComponent("leaf.pem")
        let saved = try Data(contentsOf: leaf)

        try FileManager.default.removeItem(at: leaf)
        #expect(throws: PKIStore.Corrupt.self) { try PKIStore.loadOrCreate(dataDirectory: directory) }
        #expect(!FileManager.default.fileExists(atPath: leaf.path))  // nothing was regenerated

        try Data("garbage".utf8).write(to: leaf)
        #expect(throws: PKIStore.Corrupt.self) { try PKIStore.loadOrCreate(dataDirectory: directory) }

        // A certificate that belongs to another key.
        let other = try ApplePKI.generate(includeReceiptChain: false)
        try Data(try other.leaf.certificate.serializeAsPEM().pemString.utf8).write(to: leaf)
        #expect(throws: PKIStore.Corrupt.self) { try PKIStore.loadOrCreate(dataDirectory: directory) }

        try saved.write(to: leaf)
        try Data("not a key".utf8).write(to: pkiDirectory.appendingPathComponent("root.key.pem"))
        #expect(throws: PKIStore.Corrupt.self) { try PKIStore.loadOrCreate(dataDirectory: directory) }
    }
}

@Suite struct TransactionIssuerTests {
    @Test func idsAreSixteenDigitsAndUniqueUnderConcurrency() async {
        let ids = await withTaskGroup(of: [String].self) { group in
            for _ in 0..<8 { group.addTask { (0..<500).map { _ in TransactionIds.next() } } }
            return await group.reduce(into: []) { $0 += $1 }
        }
        #expect(Set(ids).count == 4000)
        #expect(ids.allSatisfy { $0.count == 16 && $0.allSatisfy(\.isNumber) })
    }

    @Test func shapesFollowTheProductType() {
        let now = Date(timeIntervalSince1970: 1_767_225_600)
        let issuer = TransactionIssuer()
        let coins = issuer.transaction(
            for: .init(bundleId: "b", productId: "coins", quantity: 3, unitPrice: 990), at: now, id: "1")
        #expect(coins.quantity == 3)
        #expect(coins.price == 2970)
        #expect(coins.expiresDate == nil)
        #expect(coins.webOrderLineItemId == nil)
        #expect(coins.purchaseDate == 1_767_225_600_000)
        let token = UUID()
        let pro = issuer.transaction(
            for: .init(
                bundleId: "b", productId: "pro", type: .autoRenewable, quantity: 5, appAccountToken: token,
                environment: .sandbox, subscriptionGroupIdentifier: "pro"),
            at: now, id: "2")
        #expect(pro.quantity == 1)
        let expectedExpiry: Int64 = 1_767_225_600_000 + 30 * 86_400_000
        #expect(pro.expiresDate == expectedExpiry)
        #expect(pro.subscriptionGroupIdentifier == "pro")
        #expect(pro.webOrderLineItemId?.count == 16)
        #expect(pro.appAccountToken == token.uuidString.lowercased())
        #expect(pro.environment == .sandbox)
    }
}
