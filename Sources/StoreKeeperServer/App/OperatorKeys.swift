import Foundation
import KeyFiles

/// What a secret key may do (`auth.keys[].scopes`): `read` reads (analytics, exports, accounts,
/// transactions, anomalies, the dashboard), `support` adds the support actions (credit, debit,
/// grants, extensions, refunds, transfers, resolving anomalies), `admin` everything (orders and
/// purchases on an account's behalf, webhooks, operations). Each includes the ones before it.
public enum KeyScope: String, Sendable, Hashable, CaseIterable, Comparable {
    case read, support, admin

    var rank: Int { Self.allCases.firstIndex(of: self)! }
    public static func < (lhs: KeyScope, rhs: KeyScope) -> Bool { lhs.rank < rhs.rank }
}

/// One configured operator key (`auth.keys[]`): who it is in the audit log (`label`), what it
/// may do, and the apps whose rows it may see and act on (nil: every app).
public struct OperatorKey: Sendable, Hashable {
    public var label: String
    public var scope: KeyScope
    public var apps: Set<String>?
    /// The secret itself (never printed: `config check` lists labels and scopes).
    public var secret: String
    /// Where its requests come from when not the API itself (`dashboard`, `mcp`): named in the
    /// audit log beside the label and scope.
    public var origin: String? = nil

    public init(label: String, scope: KeyScope, apps: Set<String>? = nil, secret: String) {
        self.label = label
        self.scope = scope
        self.apps = apps
        self.secret = secret
    }

    /// Whether it may see and act on a row of `appId` (a row with no app recorded: only a key
    /// of every app).
    public func covers(app appId: String?) -> Bool {
        guard let apps else { return true }
        return appId.map(apps.contains) ?? false
    }
}

extension ServerConfiguration {
    /// `auth.keys`: a list of `{label, key | keyFile, scopes: [read|support|admin], apps?: [appId]}`.
    mutating func readOperatorKeys(_ value: Any?) throws {
        guard let value else { return }
        guard let list = value as? [Any], !list.isEmpty, list.count <= 100 else {
            throw Invalid(key: "auth.keys", "must be a list of 1…100 keys, each {label, key or keyFile, scopes}")
        }
        var labels = Set<String>()
        var keys: [OperatorKey] = []
        for (index, item) in list.enumerated() {
            let name = "auth.keys[\(index)]"
            guard let entry = item as? [String: Any] else {
                throw Invalid(key: name, "must be an object {label, key or keyFile, scopes, apps}")
            }
            let known: Set<String> = ["label", "key", "keyFile", "scopes", "apps"]
            if let unknown = entry.keys.sorted().first(where: { !known.contains($0) }) {
                throw Invalid(key: "\(name).\(unknown)", "unknown key\(Self.suggestion(for: unknown, among: known))")
            }
            guard let label = entry["label"] as? String, !label.isEmpty, label.unicodeScalars.count <= 64,
                label.unicodeScalars.allSatisfy({ $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F })
            else { throw Invalid(key: "\(name).label", "is required: 1…64 printable ASCII characters") }
            guard labels.insert(label).inserted else { throw Invalid(key: "\(name).label", "'\(label)' is used twice") }
            let secret: String
            switch (entry["key"] as? String, entry["keyFile"] as? String) {
            case (let key?, nil):
                secret = key
            case (nil, let file?):
                if let exposure = KeyFiles.exposure(of: file) { throw Invalid(key: "\(name).keyFile", exposure) }
                guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                    throw Invalid(key: "\(name).keyFile", "cannot read \(file)")
                }
                secret = text.trimmingCharacters(in: .whitespacesAndNewlines)
            default:
                throw Invalid(key: name, "give exactly one of key and keyFile")
            }
            guard secret.utf8.count >= 32 else {
                throw Invalid(key: "\(name).key", "is \(secret.utf8.count) bytes; secret keys are at least 32")
            }
            guard let scopes = entry["scopes"] as? [String], !scopes.isEmpty else {
                throw Invalid(key: "\(name).scopes", "is required: a list of read, support, admin")
            }
            var scope = KeyScope.read
            for given in scopes {
                guard let parsed = KeyScope(rawValue: given) else {
                    throw Invalid(
                        key: "\(name).scopes", "unknown scope '\(given.prefix(40))' (valid: read, support, admin)")
                }
                scope = max(scope, parsed)
            }
            var apps: Set<String>?
            if let given = entry["apps"] {
                guard let list = given as? [String], !list.isEmpty else {
                    throw Invalid(key: "\(name).apps", "must be a list of app ids (apps[].id)")
                }
                let valid = Set(allApps.map(\.id))
                if let unknown = list.first(where: { !valid.contains($0) }) {
                    throw Invalid(
                        key: "\(name).apps",
                        "unknown app '\(unknown.prefix(64))' (valid: \(valid.sorted().joined(separator: ", ")))")
                }
                apps = Set(list)
            }
            if apps != nil, scope == .admin {
                // An admin key runs what spans every app (webhooks, operations, the status,
                // reverification): it cannot be limited. Give the limited key the support scope.
                throw Invalid(
                    key: "\(name).apps",
                    "an admin key manages every app and cannot be limited to some: use scopes [support] (or [read]) with apps, or drop apps"
                )
            }
            keys.append(OperatorKey(label: label, scope: scope, apps: apps, secret: secret))
        }
        if let clash = keys.first(where: { key in secretKeys.contains(key.secret) }) {
            throw Invalid(key: "auth.keys", "key '\(clash.label)' is also in auth.secretKeys: give each secret once")
        }
        var seen: [String: String] = [:]
        for key in keys {
            if let first = seen[key.secret] {
                throw Invalid(
                    key: "auth.keys",
                    "keys '\(first)' and '\(key.label)' have the same secret: each key needs its own (the audit log names it)"
                )
            }
            seen[key.secret] = key.label
        }
        operatorKeys = keys
    }
}
