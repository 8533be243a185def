import AppStoreModels
import Foundation
import GooglePlay
import StoreKeeperCore

/// A second (third…) App Store app of the deployment: its own bundle and App Store id,
/// verified with the same roots and environments, read through the Server API with the same
/// In-App Purchase key (keys belong to the developer team, not to an app).
public struct AppStoreAppConfiguration: Sendable, Hashable {
    public var id: String
    public var bundleId: String
    public var appAppleId: Int64?

    public init(id: String, bundleId: String, appAppleId: Int64? = nil) {
        self.id = id
        self.bundleId = bundleId
        self.appAppleId = appAppleId
    }
}

/// One Google Play app of the deployment (docs/api.md "Several apps, two stores").
public struct GooglePlayAppConfiguration: Sendable, Hashable {
    public var id: String
    public var packageName: String
    /// Google's JSON key of the service account that reads purchases.
    public var serviceAccountKeyFile: String?
    /// The key itself (tests and the local Google Play give it in code).
    public var serviceAccountKey: ServiceAccountKey?
    /// The Android Publisher root; Google's paths are appended.
    public var apiBaseURL = "https://androidpublisher.googleapis.com"
    /// The audience and service account Pub/Sub pushes carry in their OIDC token.
    public var pushAudience: String?
    public var pushServiceAccount: String?
    /// Google's JWKS for push tokens.
    public var pushCertificatesURL = "https://www.googleapis.com/oauth2/v3/certs"

    public init(id: String, packageName: String) {
        self.id = id
        self.packageName = packageName
    }
}

extension ServerConfiguration {
    /// Reads `apps`: a list of `{id, store: app_store | google_play, …}`. An App Store entry
    /// gives the `apple.*` identity keys (bundleId, appAppleId, environments) in place of the
    /// one-app shorthand; Google Play entries give `packageName`, `serviceAccountKeyFile`,
    /// `apiBaseURL`, `pushAudience`, `pushServiceAccount`, `pushCertificatesURL`.
    mutating func readApps(_ value: Any?) throws {
        guard let value else { return }
        guard let list = value as? [Any], !list.isEmpty, list.count <= 100 else {
            throw Invalid(key: "apps", "must be a list of 1…100 apps, each {id, store, …}")
        }
        var ids = Set<String>()
        var appStoreApps = 0
        for (index, item) in list.enumerated() {
            let name = "apps[\(index)]"
            guard let app = item as? [String: Any] else { throw Invalid(key: name, "must be an object {id, store, …}") }
            func text(_ key: String, required: Bool = false) throws -> String? {
                guard let raw = app[key] else {
                    if required { throw Invalid(key: "\(name).\(key)", "is required") }
                    return nil
                }
                if let number = raw as? Int { return String(number) }
                guard let string = raw as? String, !string.isEmpty, string.count <= 2048 else {
                    throw Invalid(key: "\(name).\(key)", "must be a non-empty string")
                }
                return string
            }
            let id = try text("id", required: true)!
            guard id.count <= 64, id.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "._-".contains($0)) })
            else { throw Invalid(key: "\(name).id", "must be 1…64 characters of letters, digits, '.', '_' or '-'") }
            guard ids.insert(id).inserted else { throw Invalid(key: "\(name).id", "'\(id)' is used twice") }
            switch try text("store", required: true) {
            case "app_store":
                let known: Set<String> = ["id", "store", "bundleId", "appAppleId", "environments"]
                if let unknown = app.keys.first(where: { !known.contains($0) }) {
                    throw Invalid(
                        key: "\(name).\(unknown)",
                        "unknown key for an app_store app\(Self.suggestion(for: unknown, among: known))")
                }
                appStoreApps += 1
                guard appStoreApps == 1 else {
                    // A further App Store app: its own identity, the first one's trust and key.
                    guard app["environments"] == nil else {
                        throw Invalid(
                            key: "\(name).environments",
                            "environments are one setting for every App Store app: give them on the first")
                    }
                    var other = AppStoreAppConfiguration(id: id, bundleId: try text("bundleId", required: true)!)
                    if let appleId = try text("appAppleId") {
                        guard let value = Int64(appleId), value > 0 else {
                            throw Invalid(key: "\(name).appAppleId", "must be a number")
                        }
                        other.appAppleId = value
                    }
                    otherAppStoreApps.append(other)
                    continue
                }
                appStoreAppId = id
                if let bundleId = try text("bundleId") { self.bundleId = bundleId }
                if let appleId = try text("appAppleId") {
                    guard let value = Int64(appleId), value > 0 else {
                        throw Invalid(key: "\(name).appAppleId", "must be a number")
                    }
                    appAppleId = value
                }
                if let list = app["environments"] {
                    let names =
                        (list as? [String]) ?? (list as? String).map { $0.split(separator: ",").map(String.init) }
                    guard let names, !names.isEmpty else {
                        throw Invalid(key: "\(name).environments", "must be a list of Production, Sandbox")
                    }
                    var parsed = Set<AppStoreEnvironment>()
                    for environment in names {
                        let value = AppStoreEnvironment(rawValue: environment.trimmingCharacters(in: .whitespaces))
                        guard value == .production || value == .sandbox else {
                            throw Invalid(
                                key: "\(name).environments", "unknown environment '\(environment.prefix(40))'")
                        }
                        parsed.insert(value)
                    }
                    environments = parsed
                }
            case "google_play":
                let known: Set<String> = [
                    "id", "store", "packageName", "serviceAccountKeyFile", "apiBaseURL", "pushAudience",
                    "pushServiceAccount", "pushCertificatesURL",
                ]
                if let unknown = app.keys.first(where: { !known.contains($0) }) {
                    throw Invalid(
                        key: "\(name).\(unknown)",
                        "unknown key for a google_play app\(Self.suggestion(for: unknown, among: known))")
                }
                var google = GooglePlayAppConfiguration(id: id, packageName: try text("packageName", required: true)!)
                google.serviceAccountKeyFile = try text("serviceAccountKeyFile")
                if let url = try text("apiBaseURL") { google.apiBaseURL = url }
                google.pushAudience = try text("pushAudience")
                google.pushServiceAccount = try text("pushServiceAccount")
                if let url = try text("pushCertificatesURL") { google.pushCertificatesURL = url }
                googlePlayApps.append(google)
            case "stripe":
                try readStripeApp(app, name: name, id: id)
            default:
                throw Invalid(key: "\(name).store", "must be app_store, google_play or stripe")
            }
        }
        if appStoreApps == 0, bundleId == nil { hasAppStoreApp = false }
    }

    /// Google Play apps' rules (what `validate` checks).
    func validateGooglePlayApps() throws {
        var packages = Set<String>()
        for app in googlePlayApps {
            let name = "apps[\(app.id)]"
            guard
                app.packageName.count <= 255,
                app.packageName.split(separator: ".").count >= 2,
                app.packageName.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "._".contains($0)) })
            else { throw Invalid(key: "\(name).packageName", "must be an Android package name (com.example.app)") }
            guard packages.insert(app.packageName).inserted else {
                throw Invalid(key: "\(name).packageName", "'\(app.packageName)' is configured twice")
            }
            if mode == .configured {
                guard app.serviceAccountKeyFile != nil || app.serviceAccountKey != nil else {
                    throw Invalid(
                        key: "\(name).serviceAccountKeyFile",
                        "is required: purchases are read from Google with the service account")
                }
                if let file = app.serviceAccountKeyFile {
                    do {
                        _ = try ServiceAccountKey.load(path: file)
                    } catch let error as GooglePlayError {
                        throw Invalid(key: "\(name).serviceAccountKeyFile", error.message)
                    }
                }
                guard app.pushAudience != nil, app.pushServiceAccount != nil else {
                    throw Invalid(
                        key: "\(name).pushAudience",
                        "pushAudience and pushServiceAccount are required: an unverified push is never trusted")
                }
            }
            for (key, url) in [("apiBaseURL", app.apiBaseURL), ("pushCertificatesURL", app.pushCertificatesURL)] {
                // (The Developer API's client takes scheme, host and port, no user info.)
                guard let parsed = URL(string: url), parsed.scheme == "https" || parsed.scheme == "http",
                    parsed.host != nil, key != "apiBaseURL" || HTTP1Connections.Origin(url: url) != nil
                else { throw Invalid(key: "\(name).\(key)", "must be an http(s) URL") }
            }
        }
        let ids = allApps.map(\.id)
        if let twice = ids.first(where: { id in ids.filter { $0 == id }.count > 1 }) {
            throw Invalid(key: "apps", "app id '\(twice)' is used twice")
        }
        var bundles: Set<String> = bundleId.map { [$0] } ?? []
        for app in otherAppStoreApps {
            guard bundles.insert(app.bundleId).inserted else {
                throw Invalid(key: "apps[\(app.id)].bundleId", "'\(app.bundleId)' is configured twice")
            }
        }
    }

    /// The app an order or purchase names, or the only one of `store` (nil `appId`).
    public func appId(for store: String, given: String?) -> String? {
        switch store {
        case "google_play":
            if let given { return googlePlayApps.contains { $0.id == given } ? given : nil }
            return googlePlayApps.count == 1 ? googlePlayApps[0].id : nil
        case "stripe":
            if let given { return stripeApps.contains { $0.id == given } ? given : nil }
            return stripeApps.count == 1 ? stripeApps[0].id : nil
        default:
            let own = appStoreAppId ?? bundleId ?? "app_store"
            if let given {
                return given == own || otherAppStoreApps.contains(where: { $0.id == given }) ? given : nil
            }
            return hasAppStoreApp && otherAppStoreApps.isEmpty ? own : nil
        }
    }

    /// Every app: (id, store).
    public var allApps: [(id: String, store: String)] {
        (hasAppStoreApp ? [(appStoreAppId ?? bundleId ?? "app_store", "app_store")] : [])
            + otherAppStoreApps.map { ($0.id, "app_store") } + googlePlayApps.map { ($0.id, "google_play") }
            + stripeApps.map { ($0.id, "stripe") }
    }

    /// Which app a store's identity belongs to: an App Store bundle id or a Google Play
    /// package name → the app's id. Stored with each purchase and subscription.
    public var appDirectory: AppDirectory {
        var apps: [String: String] = [:]
        if hasAppStoreApp { apps[bundleId ?? "com.example.app"] = appStoreAppId ?? bundleId ?? "app_store" }
        for app in otherAppStoreApps { apps[app.bundleId] = app.id }
        for app in googlePlayApps { apps[app.packageName] = app.id }
        for app in stripeApps { apps[Self.stripeIdentity(app.id)] = app.id }
        return AppDirectory(apps, environments: Set(environments.map(\.rawValue)))
    }

    /// A Stripe app's store identity (what its transactions carry as `storeIdentity`).
    public static func stripeIdentity(_ appId: String) -> String { "stripe:\(appId)" }

    /// The bundle id of App Store app `appId` (nil: the first one's).
    public func bundleId(ofApp appId: String?) -> String? {
        if let appId, let other = otherAppStoreApps.first(where: { $0.id == appId }) { return other.bundleId }
        return bundleId
    }
}
