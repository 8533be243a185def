// The Keychain API surface KeychainPendingStore uses, with Apple's names and shapes
// (developer.apple.com/documentation/security/keychain_services), behaving as an in-memory
// data-protection Keychain — so the store compiles and its logic runs on Linux. Test-only,
// Linux only: elsewhere the real Security framework is imported.
#if os(Linux)
    import Foundation

    public typealias OSStatus = Int32
    public typealias CFTypeRef = AnyObject
    /// Toll-free bridged with NSString in Security; a Swift string here (`kSecClass as String`).
    public typealias CFString = String
    public typealias CFDictionary = [String: Any]

    public let kSecClass: CFString = "class"
    public let kSecClassGenericPassword: CFString = "genp"
    public let kSecAttrService: CFString = "svce"
    public let kSecAttrAccount: CFString = "acct"
    public let kSecAttrAccessible: CFString = "pdmn"
    public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: CFString = "cku"
    public let kSecUseDataProtectionKeychain: CFString = "nleg"
    public let kSecValueData: CFString = "v_Data"
    public let kSecReturnData: CFString = "r_Data"
    public let kSecReturnAttributes: CFString = "r_Attributes"
    public let kSecMatchLimit: CFString = "m_Limit"
    public let kSecMatchLimitOne: CFString = "m_LimitOne"
    public let kSecMatchLimitAll: CFString = "m_LimitAll"

    public let errSecSuccess: OSStatus = 0
    public let errSecDuplicateItem: OSStatus = -25299
    public let errSecItemNotFound: OSStatus = -25300
    public let errSecInteractionNotAllowed: OSStatus = -25308
    public let errSecParam: OSStatus = -50

    /// The shim's state, for tests: the items, and whether the device is locked (before the
    /// first unlock every call answers errSecInteractionNotAllowed).
    public enum KeychainShim {
        struct Item {
            var service: String
            var account: String
            var data: Data
            var accessible: String?
        }
        nonisolated(unsafe) static var items: [Item] = []
        nonisolated(unsafe) public static var locked = false
        static let lock = NSLock()

        public static func reset() {
            lock.lock()
            defer { lock.unlock() }
            items = []
            locked = false
        }

        public static var count: Int {
            lock.lock()
            defer { lock.unlock() }
            return items.count
        }

        /// Every item's accessibility class (the store must ask for after-first-unlock).
        public static var accessibility: [String?] {
            lock.lock()
            defer { lock.unlock() }
            return items.map(\.accessible)
        }

        static func matches(_ item: Item, _ query: CFDictionary) -> Bool {
            guard query[kSecClass] as? String == kSecClassGenericPassword else { return false }
            if let service = query[kSecAttrService] as? String, service != item.service { return false }
            if let account = query[kSecAttrAccount] as? String, account != item.account { return false }
            return true
        }
    }

    // swift-format-ignore: AlwaysUseLowerCamelCase
    public func SecItemCopyMatching(_ query: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
        KeychainShim.lock.lock()
        defer { KeychainShim.lock.unlock() }
        guard !KeychainShim.locked else { return errSecInteractionNotAllowed }
        let found = KeychainShim.items.filter { KeychainShim.matches($0, query) }
        guard !found.isEmpty else { return errSecItemNotFound }
        let all = query[kSecMatchLimit] as? String == kSecMatchLimitAll
        let attributes = query[kSecReturnAttributes] as? Bool == true
        let data = query[kSecReturnData] as? Bool == true
        func shape(_ item: KeychainShim.Item) -> Any {
            guard attributes else { return item.data }
            var dictionary: [String: Any] = [kSecAttrService: item.service, kSecAttrAccount: item.account]
            if data { dictionary[kSecValueData] = item.data }
            return dictionary
        }
        if all {
            result?.pointee = found.map(shape) as AnyObject
        } else {
            result?.pointee = shape(found[0]) as AnyObject
        }
        return errSecSuccess
    }

    // swift-format-ignore: AlwaysUseLowerCamelCase
    public func SecItemAdd(_ attributes: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
        KeychainShim.lock.lock()
        defer { KeychainShim.lock.unlock() }
        guard !KeychainShim.locked else { return errSecInteractionNotAllowed }
        guard let service = attributes[kSecAttrService] as? String,
            let account = attributes[kSecAttrAccount] as? String,
            let data = attributes[kSecValueData] as? Data
        else { return errSecParam }
        guard !KeychainShim.items.contains(where: { KeychainShim.matches($0, attributes) }) else {
            return errSecDuplicateItem
        }
        KeychainShim.items.append(
            .init(service: service, account: account, data: data, accessible: attributes[kSecAttrAccessible] as? String)
        )
        return errSecSuccess
    }

    // swift-format-ignore: AlwaysUseLowerCamelCase
    public func SecItemUpdate(_ query: CFDictionary, _ attributesToUpdate: CFDictionary) -> OSStatus {
        KeychainShim.lock.lock()
        defer { KeychainShim.lock.unlock() }
        guard !KeychainShim.locked else { return errSecInteractionNotAllowed }
        var updated = false
        for index in KeychainShim.items.indices where KeychainShim.matches(KeychainShim.items[index], query) {
            if let data = attributesToUpdate[kSecValueData] as? Data { KeychainShim.items[index].data = data }
            updated = true
        }
        return updated ? errSecSuccess : errSecItemNotFound
    }

    // swift-format-ignore: AlwaysUseLowerCamelCase
    public func SecItemDelete(_ query: CFDictionary) -> OSStatus {
        KeychainShim.lock.lock()
        defer { KeychainShim.lock.unlock() }
        guard !KeychainShim.locked else { return errSecInteractionNotAllowed }
        let before = KeychainShim.items.count
        KeychainShim.items.removeAll { KeychainShim.matches($0, query) }
        return KeychainShim.items.count < before ? errSecSuccess : errSecItemNotFound
    }
#endif
