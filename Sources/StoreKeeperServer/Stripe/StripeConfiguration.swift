import Foundation
import Stripe

/// A Stripe app of the deployment (`apps` entry with `store: stripe`): web checkout for the
/// apps' players, sold with the catalog's `storeProducts.stripe` prices.
public struct StripeAppConfiguration: Sendable, Hashable {
    public var id: String
    /// A file holding the secret (or restricted) key, `sk_…`/`rk_…`, readable by the server only.
    public var secretKeyFile: String?
    /// The key itself (tests and the local Stripe give it in code).
    public var secretKey: String?
    /// Every webhook signing secret (`whsec_…`) that verifies: several while a rolled one still signs.
    public var webhookSecrets: [String] = []
    public var apiVersion = StripeClient.pinnedVersion
    public var apiBaseURL = "https://api.stripe.com"
    /// Where Checkout sends the buyer after paying (a `redemption=<code>` is appended for a
    /// buyer without an account) and when they go back.
    public var successURL = "https://example.com/purchase/done"
    public var cancelURL = "https://example.com/purchase/cancel"
    /// Disputes for this app: `revoke_when_lost` or `revoke_when_opened`; nil: the catalog's
    /// `refunds.disputes` (default `revoke_when_lost`). Inquiries never revoke.
    public var disputePolicy: String?
    /// How long a redemption code of a purchase made without an account stays valid.
    public var redemptionMinutes = 60
    /// The Google Play app (`apps[].id`) whose package reports this app's payments to Google's
    /// `externalTransactions` (its US programs): orders may then carry the Android app's
    /// `externalTransactionToken`. Nil: nothing is reported to Google.
    public var googlePlayAppId: String?
    /// Where the billing portal may send a customer back (`returnURL` must start with one of
    /// them); empty: `successURL`'s origin only.
    public var portalReturnURLs: [String] = []

    public init(id: String) { self.id = id }

    /// Whether the billing portal may return to `url`: one of `portalReturnURLs` (or, with none,
    /// `successURL`'s scheme, host and port) is its prefix, ending at a path boundary.
    public func allowsReturn(to url: String) -> Bool {
        var allowed = portalReturnURLs
        if allowed.isEmpty, let success = URLComponents(string: successURL), let scheme = success.scheme,
            let host = success.host
        {
            allowed = ["\(scheme)://\(host)\(success.port.map { ":\($0)" } ?? "")/"]
        }
        return allowed.contains { prefix in
            guard url.hasPrefix(prefix) else { return false }
            if prefix.hasSuffix("/") || url.count == prefix.count { return true }
            let next = url[url.index(url.startIndex, offsetBy: prefix.count)]
            return next == "/" || next == "?" || next == "#"
        }
    }

    static let keys: Set<String> = [
        "id", "store", "secretKeyFile", "webhookSecrets", "apiVersion", "apiBaseURL", "successURL", "cancelURL",
        "disputePolicy", "redemptionMinutes", "googlePlayAppId", "portalReturnURLs",
    ]
}

extension ServerConfiguration {
    /// One `apps` entry with `store: stripe`.
    mutating func readStripeApp(_ app: [String: Any], name: String, id: String) throws {
        if let unknown = app.keys.first(where: { !StripeAppConfiguration.keys.contains($0) }) {
            throw Invalid(
                key: "\(name).\(unknown)",
                "unknown key for a stripe app\(Self.suggestion(for: unknown, among: StripeAppConfiguration.keys))")
        }
        func text(_ key: String) throws -> String? {
            guard let raw = app[key] else { return nil }
            guard let string = raw as? String, !string.isEmpty, string.count <= 2048 else {
                throw Invalid(key: "\(name).\(key)", "must be a non-empty string")
            }
            return string
        }
        var stripe = StripeAppConfiguration(id: id)
        stripe.secretKeyFile = try text("secretKeyFile")
        if let raw = app["webhookSecrets"] {
            let list = (raw as? [String]) ?? (raw as? String).map { $0.split(separator: ",").map(String.init) }
            guard let list, !list.isEmpty, list.count <= 10 else {
                throw Invalid(key: "\(name).webhookSecrets", "must be a list of 1…10 webhook signing secrets (whsec_…)")
            }
            stripe.webhookSecrets = list.map { $0.trimmingCharacters(in: .whitespaces) }
        }
        if let version = try text("apiVersion") { stripe.apiVersion = version }
        if let url = try text("apiBaseURL") { stripe.apiBaseURL = url }
        if let url = try text("successURL") { stripe.successURL = url }
        if let url = try text("cancelURL") { stripe.cancelURL = url }
        if let policy = try text("disputePolicy") {
            guard ["revoke_when_lost", "revoke_when_opened"].contains(policy) else {
                throw Invalid(key: "\(name).disputePolicy", "must be revoke_when_lost or revoke_when_opened")
            }
            stripe.disputePolicy = policy
        }
        if let raw = app["redemptionMinutes"] {
            guard let minutes = raw as? Int, (5...10_080).contains(minutes) else {
                throw Invalid(key: "\(name).redemptionMinutes", "must be 5…10080 minutes")
            }
            stripe.redemptionMinutes = minutes
        }
        stripe.googlePlayAppId = try text("googlePlayAppId")
        if let raw = app["portalReturnURLs"] {
            guard let list = raw as? [String], !list.isEmpty, list.count <= 20,
                list.allSatisfy({
                    URL(string: $0).map { ["https", "http"].contains($0.scheme ?? "") && $0.host != nil } ?? false
                })
            else {
                throw Invalid(key: "\(name).portalReturnURLs", "must be a list of 1…20 http(s) URLs")
            }
            stripe.portalReturnURLs = list
        }
        stripeApps.append(stripe)
    }

    /// Stripe apps' rules (what `validate` checks).
    func validateStripeApps() throws {
        for app in stripeApps {
            let name = "apps[\(app.id)]"
            if mode == .configured {
                guard app.secretKey != nil || app.secretKeyFile != nil else {
                    throw Invalid(
                        key: "\(name).secretKeyFile", "is required: Stripe's API is called with the secret key")
                }
                guard !app.webhookSecrets.isEmpty else {
                    throw Invalid(
                        key: "\(name).webhookSecrets", "is required: an unsigned webhook is never trusted (whsec_…)")
                }
            }
            if let google = app.googlePlayAppId, !googlePlayApps.contains(where: { $0.id == google }) {
                throw Invalid(
                    key: "\(name).googlePlayAppId",
                    "names no Google Play app: '\(google.prefix(64))' (configured: \(googlePlayApps.map(\.id).joined(separator: ", ")))"
                )
            }
            for secret in app.webhookSecrets
            where !secret.hasPrefix("whsec_") || secret.utf8.count < "whsec_".count + 16 {
                throw Invalid(
                    key: "\(name).webhookSecrets",
                    "each secret is Stripe's whsec_… signing secret (whsec_ and at least 16 more characters)")
            }
            for (key, url) in [
                ("apiBaseURL", app.apiBaseURL), ("successURL", app.successURL), ("cancelURL", app.cancelURL),
            ] {
                guard let parsed = URL(string: url), parsed.scheme == "https" || parsed.scheme == "http",
                    parsed.host != nil
                else { throw Invalid(key: "\(name).\(key)", "must be an http(s) URL") }
            }
        }
    }

    /// The secret key of a Stripe app: given, or read from its file (trimmed).
    static func stripeSecretKey(_ app: StripeAppConfiguration) throws -> String {
        if let key = app.secretKey { return key }
        guard let file = app.secretKeyFile else {
            throw Invalid(key: "apps[\(app.id)].secretKeyFile", "is required")
        }
        guard let data = FileManager.default.contents(atPath: file),
            let key = String(data: data, encoding: .utf8)?.trimmingCharacters(in: .whitespacesAndNewlines),
            key.hasPrefix("sk_") || key.hasPrefix("rk_")
        else {
            throw Invalid(
                key: "apps[\(app.id)].secretKeyFile",
                "'\(file)' must hold a Stripe secret or restricted key (sk_…, rk_…)")
        }
        return key
    }
}
