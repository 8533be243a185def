import AppStoreModels
import Foundation
import LocalAppStore
import SQLKit
import StoreKeeperStorage
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Durable before acknowledged, for App Store Server Notifications: `storekeeper serve` killed
/// with SIGKILL while notifications arrive; after the restart every notification answered 200
/// is recorded, and all of them are applied.
extension CrashRecoveryTests {
    @Test func killedWhileNotificationsArriveLosesNoAcknowledgedOne() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("crash-n-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let first = try ServerProcess(directory: directory)
        try await first.waitUntilListening()
        // Signed the way the demo's local App Store signs (its keys are on disk): 200
        // ONE_TIME_CHARGE notifications.
        let pki = try PKIStore.loadOrCreate(
            dataDirectory: directory.appendingPathComponent("storekeeper-data/local-store"))
        let issuer = TransactionIssuer()
        var bodies: [(uuid: String, body: String)] = []
        for index in 0..<200 {
            let transaction = issuer.transaction(
                for: .init(bundleId: "com.example.app", productId: "coins_60"), at: Date(),
                id: String(5_000_000_000_000_000 + index))
            let uuid = UUID().uuidString.lowercased()
            let payload = ResponseBodyV2DecodedPayload(
                notificationType: .oneTimeCharge, notificationUUID: uuid, version: "2.0",
                signedDate: transaction.signedDate,
                data: NotificationData(
                    appAppleId: 1_234_567_890, bundleId: "com.example.app", environment: .production,
                    signedTransactionInfo: try pki.jwsSigner.sign(transaction)))
            bodies.append((uuid, #"{"signedPayload":"\#(try pki.jwsSigner.sign(payload))"}"#))
        }

        let acknowledged = Acknowledged()
        let port = first.port
        // A session of its own: the suite's other server tests share URLSession.shared.
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 16
        let session = URLSession(configuration: configuration)
        let all = bodies
        let load = Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<8 {
                    group.addTask {
                        for index in stride(from: worker, to: all.count, by: 8) {
                            var request = URLRequest(
                                url: URL(string: "http://127.0.0.1:\(port)/v1/notifications/apple")!)
                            request.httpMethod = "POST"
                            request.timeoutInterval = 30
                            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
                            request.httpBody = Data(all[index].body.utf8)
                            guard let (_, response) = try? await session.data(for: request),
                                (response as? HTTPURLResponse)?.statusCode == 200
                            else { continue }
                            acknowledged.indices.withLock { _ = $0.insert(index) }
                        }
                    }
                }
            }
        }
        let deadline = Date().addingTimeInterval(90)
        while acknowledged.indices.withLock({ $0.count }) < 20, Date() < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        first.kill()
        await load.value
        let before = acknowledged.indices.withLock { $0 }
        #expect(before.count >= 20)

        // Restarted: every acknowledged notification is there, and the job runner applies
        // whatever was pending when the process died.
        let second = try ServerProcess(directory: directory)
        try await second.waitUntilListening()
        let database = try await Database.open(url: "sqlite:\(directory.path)/storekeeper.sqlite")
        let notifications = NotificationStore(database: database)
        for index in before {
            #expect(
                try await notifications.notification(bodies[index].uuid) != nil,
                "acknowledged notification \(index) was lost")
        }
        // Under the whole suite's load (two cores) applying 200 notifications can take a while.
        let settled = Date().addingTimeInterval(90)
        while try await notifications.pendingCount() > 0, Date() < settled {
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(try await notifications.pendingCount() == 0)
        let counts = try await notifications.counts()
        #expect(counts.values.reduce(0, +) >= before.count)
        try? await database.close()
        second.kill()
    }
}
