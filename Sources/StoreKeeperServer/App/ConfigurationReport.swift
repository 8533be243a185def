import AppStoreModels
import AppStoreVerification
import Configuration
import Crypto
import Foundation
import KeyFiles
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Yams

extension ServerConfiguration {
    /// Every key with its effective value, secrets masked — what `storekeeper config check` prints.
    public var effectiveValues: [(key: String, value: String)] {
        func mask(_ secret: String?) -> String {
            guard let secret else { return "-" }
            return "****** (\(secret.utf8.count) bytes)"
        }
        func list(_ values: [String]) -> String { values.isEmpty ? "-" : values.joined(separator: ", ") }
        let masked = Self.maskedURL
        let maskedURL = masked(databaseURL)
        return [
            ("mode", mode.rawValue), ("http.host", host), ("http.port", String(port)), ("database.url", maskedURL),
            ("database.readReplicaURL", readReplicaURL.map(masked) ?? "(none: every read on database.url)"),
            ("database.maxReplicaLagSeconds", readReplicaURL == nil ? "(no replica)" : String(maxReplicaLagSeconds)),
            ("apple.bundleId", bundleId ?? "-"), ("apple.appAppleId", appAppleId.map(String.init) ?? "-"),
            ("apple.environments", environments.map(\.rawValue).sorted().joined(separator: ", ")),
            (
                "apple.rootCertificates",
                rootCertificateFiles.isEmpty ? "(Apple's, built in)" : list(rootCertificateFiles)
            ),
            ("apple.serverAPI.issuerId", serverAPIIssuerId ?? "-"), ("apple.serverAPI.keyId", serverAPIKeyId ?? "-"),
            ("apple.serverAPI.privateKeyFile", serverAPIPrivateKeyFile ?? "-"),
            ("apple.serverAPI.baseURL", serverAPIBaseURL ?? "(Apple's)"),
            ("apple.verifyReceipt.productionURL", verifyReceiptProductionURL ?? "(Apple's)"),
            ("apple.verifyReceipt.sandboxURL", verifyReceiptSandboxURL ?? "(Apple's)"),
            ("apple.sharedSecret", mask(sharedSecret)),
            ("auth.secretKeys", secretKeys.isEmpty ? "-" : secretKeys.map { mask($0) }.joined(separator: ", ")),
            (
                "auth.keys",
                operatorKeys.isEmpty
                    ? "-"
                    : operatorKeys.map {
                        "\($0.label) (\($0.scope.rawValue)\($0.apps.map { "; apps " + $0.sorted().joined(separator: ", ") } ?? ""))"
                    }.joined(separator: ", ")
            ),
            ("auth.clientTokenSecret", mask(clientTokenSecret)),
            ("auth.responseSigningKey", responseSigningKey == nil ? "(not set)" : "(set)"),
            (
                "auth.responseSigningKeys",
                responseSigningKeys.isEmpty ? "(not set)" : "(\(responseSigningKeys.count) set)"
            ),
            ("catalog", catalog.map { "\($0.products.count) products" } ?? "(demo catalog)"),
            ("limits.maxBodyBytes", String(maxBodyBytes)),
            ("limits.maxOpenOrdersPerAccount", String(maxOpenOrdersPerAccount)),
            ("limits.maxOrdersPerAccountPerDay", String(maxOrdersPerAccountPerDay)),
            ("limits.orderRetentionDays", String(orderRetentionDays)),
            ("limits.maxUnconfirmedExternalTokensPerAccount", String(maxUnconfirmedExternalTokensPerAccount)),
            ("limits.unconfirmedExternalTokenDays", String(unconfirmedExternalTokenDays)),
            ("limits.maxUnconfirmedExternalTokens", String(maxUnconfirmedExternalTokens)),
            ("http.idleTimeoutSeconds", String(idleTimeoutSeconds)),
            ("http.shutdownGraceSeconds", String(shutdownGraceSeconds)),
            ("limits.maxInFlightRequests", String(maxInFlightRequests)),
            ("database.startupTimeoutSeconds", String(databaseStartupTimeoutSeconds)),
            ("auth.clientTokenMaxLifetimeSeconds", String(clientTokenMaxLifetimeSeconds)),
            ("auth.metricsToken", mask(metricsToken)),
            ("limits.clientRequestsPerSecond", String(clientRequestsPerSecond)),
            ("limits.secretRequestsPerSecond", secretRequestsPerSecond.map(String.init) ?? "unlimited"),
            ("limits.requestTimeoutSeconds", String(requestTimeoutSeconds)),
            ("ownership.policy", ownershipPolicy.rawValue), ("webhooks.url", webhookURL.map(masked) ?? "-"),
            ("webhooks.secret", mask(webhookSecret)), ("localAppStore.enabled", String(localAppStoreEnabled)),
            ("rejectedProofs.retentionDays", String(rejectedProofsRetentionDays)),
            ("rejectedProofs.maxBytesPerDay", String(rejectedProofsMaxBytesPerDay)),
            ("rejectedProofs.maxBytesTotal", String(rejectedProofsMaxBytesTotal)),
            ("apple.consumption.enabled", String(consumptionEnabled)),
            ("apple.setAppAccountToken", String(setAppAccountToken)),
            ("apple.finishTransactions", String(finishTransactions)),
            ("apple.externalPurchase.reporting", String(externalPurchaseReporting)),
            ("apple.smallBusinessProgram", String(smallBusinessProgram)),
            ("webhooks.maxAttemptHours", String(webhookMaxAttemptHours)),
            ("localGooglePlay.enabled", String(localGooglePlayEnabled)),
            ("localStripe.enabled", String(localStripeEnabled)),
        ] + appLines
    }

    /// A URL with whatever credential it carries masked: the password of its user info (the user
    /// too), and the value of any query item whose name says it is a secret (token, key, secret,
    /// password, signature, auth…).
    static func maskedURL(_ url: String) -> String {
        guard var components = URLComponents(string: url) else { return url }
        var changed = false
        if components.password != nil {
            components.password = "******"
            changed = true
        }
        if let items = components.queryItems, !items.isEmpty {
            let secretWords = ["token", "key", "secret", "password", "pass", "sig", "auth", "credential", "code"]
            components.queryItems = items.map { item in
                let name = item.name.lowercased()
                guard secretWords.contains(where: name.contains), item.value?.isEmpty == false else { return item }
                changed = true
                return URLQueryItem(name: item.name, value: "******")
            }
        }
        guard changed else { return url }
        return components.string ?? "******"
    }

    /// One line per app: its store, identity and what it trusts.
    var appLines: [(key: String, value: String)] {
        var lines: [(key: String, value: String)] = []
        if hasAppStoreApp {
            lines.append(
                (
                    "apps.\(appStoreAppId ?? bundleId ?? "app_store")",
                    "app_store, bundleId \(bundleId ?? "-"), appAppleId \(appAppleId.map(String.init) ?? "-"), environments \(environments.map(\.rawValue).sorted().joined(separator: "+")), trusts Apple's roots\(usesLocalAppStore ? " and the local App Store" : "")"
                ))
        }
        for app in otherAppStoreApps {
            lines.append(
                (
                    "apps.\(app.id)",
                    "app_store, bundleId \(app.bundleId), appAppleId \(app.appAppleId.map(String.init) ?? "-"), environments \(environments.map(\.rawValue).sorted().joined(separator: "+")), trusts Apple's roots\(usesLocalAppStore ? " and the local App Store" : ""), Server API key of the first App Store app"
                ))
        }
        for app in googlePlayApps {
            lines.append(
                (
                    "apps.\(app.id)",
                    "google_play, packageName \(app.packageName), service account \(app.serviceAccountKeyFile ?? (app.serviceAccountKey != nil ? "(given)" : "-")), API \(app.apiBaseURL), pushes: OIDC against \(app.pushCertificatesURL), aud \(app.pushAudience ?? "-"), email \(app.pushServiceAccount ?? "-")"
                ))
        }
        for app in stripeApps {
            // Never a secret: the key's file, how many webhook secrets verify.
            lines.append(
                (
                    "apps.\(app.id)",
                    "stripe, secret key \(app.secretKeyFile ?? (app.secretKey != nil ? "(given)" : "-")), API \(Self.maskedURL(app.apiBaseURL)) version \(app.apiVersion), \(app.webhookSecrets.count) webhook secret\(app.webhookSecrets.count == 1 ? "" : "s"), success \(Self.maskedURL(app.successURL)), disputes \(app.disputePolicy ?? "catalog's"), redemption \(app.redemptionMinutes) min\(app.googlePlayAppId.map { ", reports to Google Play app \($0)" } ?? "")"
                ))
        }
        return lines
    }

    /// What a production deployment needs beyond a valid configuration (docs/deployment.md);
    /// `storekeeper config check` fails on any of these.
    public var productionProblems: [String] {
        var problems: [String] = []
        if mode == .demo {
            problems.append("no configuration: demo mode trusts the built-in local App Store (give --config FILE)")
        }
        if localAppStoreEnabled {
            problems.append("localAppStore.enabled is true: the local App Store is trusted beside Apple")
        }
        if localGooglePlayEnabled {
            problems.append("localGooglePlay.enabled is true: the local Google Play stands in for Google")
        }
        if localStripeEnabled {
            problems.append("localStripe.enabled is true: the local Stripe stands in for Stripe")
        }
        for app in stripeApps {
            if let file = app.secretKeyFile, let exposure = KeyFiles.exposure(of: file) {
                problems.append("apps[\(app.id)].secretKeyFile: \(exposure)")
            }
            if let url = URL(string: app.apiBaseURL), url.scheme == "http", !Self.isLoopback(url.host ?? "") {
                problems.append(
                    "apps[\(app.id)].apiBaseURL: http:// to \(url.host ?? "?") sends the Stripe secret key in clear text (https, or a loopback address)"
                )
            }
        }
        if secretKeys.isEmpty { problems.append("auth.secretKeys: no secret key, operators cannot reach the server") }
        if clientTokenSecret == nil {
            problems.append("auth.clientTokenSecret: not set, apps cannot authenticate with client tokens")
        }
        if catalog == nil {
            problems.append("catalog.file or catalog.products: no catalog, the demo one would be used")
        }
        if !rootCertificateFiles.isEmpty {
            problems.append("apple.rootCertificates: roots other than Apple's are trusted")
        }
        return problems
    }

    /// What a missing credential switches off: said by `config check`, not a failure (a
    /// deployment may choose to run without it).
    public var productionWarnings: [String] {
        var warnings: [String] = []
        if hasAppStoreApp || !otherAppStoreApps.isEmpty,
            serverAPIIssuerId == nil || serverAPIKeyId == nil || serverAPIPrivateKeyFile == nil
        {
            warnings.append(
                "apple.serverAPI: no App Store Server API key — no reconciliation, no import, no look-up of a transaction id or of the Order ID from a receipt e-mail, no catch-up after missed notifications, no refund history; StoreKit 1 receipts still verify"
            )
        }
        if responseSigningKey == nil, responseSigningKeys.isEmpty, mode == .configured {
            warnings.append(
                "auth.responseSigningKey: not set — answers are unsigned, so an app cannot tell a genuine answer from a forged one"
            )
        }
        if webhookURL == nil {
            warnings.append("webhooks.url: not set — your back end learns of deliveries and refunds only by asking")
        }
        return warnings
    }

    static func isLoopback(_ host: String) -> Bool {
        let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")).lowercased()
        return bare == "localhost" || bare == "::1" || bare.hasPrefix("127.")
    }
}
