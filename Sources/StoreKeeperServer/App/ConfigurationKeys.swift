import AppStoreModels
import AppStoreVerification
import Configuration
import Crypto
import Foundation
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Yams

/// Reading keys: flattening a file into dotted keys, and "did you mean" for unknown ones.
extension ServerConfiguration {
    /// Flattens the file's object to dotted keys; lists of objects are kept for their parsers.
    static func flatten(
        _ object: [String: Any], prefix: String, into flat: inout [String: ConfigValue],
        structured: inout [String: Any]
    ) throws {
        for (name, value) in object {
            let key = prefix.isEmpty ? name : "\(prefix).\(name)"
            if structuredKeys.contains(key) {
                structured[key] = value
                continue
            }
            let secret = secretKeyNames.contains(key)
            switch value {
            case let nested as [String: Any]:
                guard !keys.contains(key) else { throw Invalid(key: key, "must be a value, not an object") }
                try flatten(nested, prefix: key, into: &flat, structured: &structured)
            case let list as [Any]:
                var strings: [String] = []
                for item in list {
                    switch item {
                    case let string as String: strings.append(string)
                    case let number as Int: strings.append(String(number))
                    case let flag as Bool: strings.append(String(flag))
                    case let number as Double: strings.append(String(number))
                    default:
                        guard keys.contains(key) else { throw Invalid(key: key, "unknown key\(suggestion(for: key))") }
                        throw Invalid(key: key, "must be a list of strings")
                    }
                }
                flat[key] = ConfigValue(.stringArray(strings), isSecret: secret)
            case let string as String: flat[key] = ConfigValue(.string(string), isSecret: secret)
            case let flag as Bool: flat[key] = ConfigValue(.bool(flag), isSecret: secret)
            case let number as Int: flat[key] = ConfigValue(.int(number), isSecret: secret)
            case let number as Double: flat[key] = ConfigValue(.double(number), isSecret: secret)
            case is NSNull: continue
            default: flat[key] = ConfigValue(.string(String(describing: value)), isSecret: secret)
            }
        }
    }

    /// ", did you mean 'apple.bundleId'?" for the nearest known key, when one is near.
    static func suggestion(for key: String, environment: Bool = false) -> String {
        let candidates =
            environment ? keys.flatMap { [environmentNames($0).apiMd, environmentNames($0).split] } : keys
        let scored = candidates.map { ($0, editDistance($0.lowercased(), key.lowercased())) }
        guard let best = scored.min(by: { $0.1 < $1.1 }), best.1 <= max(3, key.count / 4) else { return "" }
        return "; did you mean '\(best.0)'?"
    }

    /// "; did you mean 'x'?" for a key of an object whose keys are `known` (an `apps[]` entry,
    /// an `auth.keys[]` entry), listing them when nothing is close.
    static func suggestion(for key: String, among known: Set<String>) -> String {
        let scored = known.map { ($0, editDistance($0.lowercased(), key.lowercased())) }
        if let best = scored.min(by: { $0.1 < $1.1 }), best.1 <= max(3, key.count / 4) {
            return "; did you mean '\(best.0)'?"
        }
        return "; valid: \(known.sorted().joined(separator: ", "))"
    }

    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a)
        let b = Array(b)
        guard !a.isEmpty else { return b.count }
        guard !b.isEmpty else { return a.count }
        var previous = Array(0...b.count)
        for i in 1...a.count {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in 1...b.count {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return previous[b.count]
    }
}
