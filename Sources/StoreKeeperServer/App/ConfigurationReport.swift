import AppStoreModels
import AppStoreVerification
import Configuration
import Crypto
import Foundation
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
        func masked(_ url: String) -> String {
            guard var components = URLComponents(string: url), components.password != nil else { return url }
            components.password = "******"
            return components.string ?? "******"
        }
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
            ("ownership.policy", ownershipPolicy.rawValue), ("webhooks.url", webhookURL ?? "-"),
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
                    "stripe, secret key \(app.secretKeyFile ?? (app.secretKey != nil ? "(given)" : "-")), API \(app.apiBaseURL) version \(app.apiVersion), \(app.webhookSecrets.count) webhook secret\(app.webhookSecrets.count == 1 ? "" : "s"), success \(app.successURL), disputes \(app.disputePolicy ?? "catalog's"), redemption \(app.redemptionMinutes) min\(app.googlePlayAppId.map { ", reports to Google Play app \($0)" } ?? "")"
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
}
