// Apple platforms; on Linux against the Security shim (an in-memory Keychain), for the tests.
#if canImport(Security) && (canImport(Darwin) || SECURITY_SHIM)
    import Foundation
    import Security
    import StoreKeeperKitCore

    /// The pending records in the Keychain, one generic-password item per record (an update
    /// rewrites one small item, never the history), this device only, readable after the first
    /// unlock so a background launch can re-drive; on macOS in the data-protection Keychain.
    /// They survive app updates and crashes, and each Keychain write is atomic. Before the first
    /// unlock the Keychain cannot be read: `load` throws, and the coordinator reads it again
    /// later without writing anything meanwhile. Version 1's single item is handed over as the
    /// `legacy` record and migrated.
    public final class KeychainPendingStore: PendingStore, @unchecked Sendable {
        let service: String
        let legacyService: String
        let legacyAccount: String

        public init(
            service: String = "StoreKeeperKit.records", legacyService: String = "StoreKeeperKit",
            legacyAccount: String = "pending-state"
        ) {
            self.service = service
            self.legacyService = legacyService
            self.legacyAccount = legacyAccount
        }

        func base(_ service: String) -> [String: Any] {
            var query: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service,
            ]
            #if os(macOS)
                query[kSecUseDataProtectionKeychain as String] = true
            #endif
            return query
        }

        func item(_ key: String) -> [String: Any] {
            guard key != PendingRecords.legacyKey else {
                var query = base(legacyService)
                query[kSecAttrAccount as String] = legacyAccount
                return query
            }
            var query = base(service)
            query[kSecAttrAccount as String] = key
            return query
        }

        public func load() throws -> [String: Data] {
            var records: [String: Data] = [:]
            var lookup = base(service)
            lookup[kSecReturnAttributes as String] = true
            lookup[kSecReturnData as String] = true
            lookup[kSecMatchLimit as String] = kSecMatchLimitAll
            var result: CFTypeRef?
            let status = SecItemCopyMatching(lookup as CFDictionary, &result)
            switch status {
            case errSecSuccess:
                for entry in result as? [[String: Any]] ?? [] {
                    guard let key = entry[kSecAttrAccount as String] as? String,
                        let data = entry[kSecValueData as String] as? Data
                    else { continue }
                    records[key] = data
                }
            case errSecItemNotFound:
                break
            default:
                throw PendingStoreError("Keychain read failed: \(status)")
            }
            var legacy = item(PendingRecords.legacyKey)
            legacy[kSecReturnData as String] = true
            legacy[kSecMatchLimit as String] = kSecMatchLimitOne
            var old: CFTypeRef?
            let legacyStatus = SecItemCopyMatching(legacy as CFDictionary, &old)
            if legacyStatus == errSecSuccess, let data = old as? Data {
                records[PendingRecords.legacyKey] = data
            } else if legacyStatus != errSecItemNotFound {
                throw PendingStoreError("Keychain read failed: \(legacyStatus)")
            }
            return records
        }

        public func write(_ records: [String: Data], removing: [String]) throws {
            // Writes first, then removals: a crash between leaves a record twice at worst,
            // which loading settles (a verdict wins over what it settled).
            for (key, data) in records.sorted(by: { $0.key < $1.key }) {
                let query = item(key)
                var status = SecItemUpdate(query as CFDictionary, [kSecValueData as String: data] as CFDictionary)
                if status == errSecItemNotFound {
                    var add = query
                    add[kSecValueData as String] = data
                    add[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly
                    status = SecItemAdd(add as CFDictionary, nil)
                }
                guard status == errSecSuccess else { throw PendingStoreError("Keychain write failed: \(status)") }
            }
            for key in removing {
                let status = SecItemDelete(item(key) as CFDictionary)
                guard status == errSecSuccess || status == errSecItemNotFound else {
                    throw PendingStoreError("Keychain delete failed: \(status)")
                }
            }
        }
    }
#endif
