#if canImport(Security) && canImport(Darwin)
    import Foundation
    import Security
    import StoreKeeperKitCore

    /// The pending state in the Keychain (one generic-password item, this device only,
    /// readable after first unlock so a background launch can re-drive): it survives app
    /// updates and crashes, and a Keychain write is atomic.
    public final class KeychainPendingStore: PendingStore, @unchecked Sendable {
        let service: String
        let account: String

        public init(service: String = "StoreKeeperKit", account: String = "pending-state") {
            self.service = service
            self.account = account
        }

        var query: [String: Any] {
            [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service,
                kSecAttrAccount as String: account,
            ]
        }

        public func load() throws -> PendingState {
            var lookup = query
            lookup[kSecReturnData as String] = true
            lookup[kSecMatchLimit as String] = kSecMatchLimitOne
            var result: CFTypeRef?
            let status = SecItemCopyMatching(lookup as CFDictionary, &result)
            if status == errSecItemNotFound { return PendingState() }
            guard status == errSecSuccess, let data = result as? Data else {
                throw PendingStoreError("Keychain read failed: \(status)")
            }
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .millisecondsSince1970
            return (try? decoder.decode(PendingState.self, from: data)) ?? PendingState()
        }

        public func save(_ state: PendingState) throws {
            let encoder = JSONEncoder()
            encoder.dateEncodingStrategy = .millisecondsSince1970
            let data = try encoder.encode(state)
            let update: [String: Any] = [kSecValueData as String: data]
            var status = SecItemUpdate(query as CFDictionary, update as CFDictionary)
            if status == errSecItemNotFound {
                var add = query
                add[kSecValueData as String] = data
                add[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly
                status = SecItemAdd(add as CFDictionary, nil)
            }
            guard status == errSecSuccess else { throw PendingStoreError("Keychain write failed: \(status)") }
        }
    }
#endif
