import AppStoreModels
import AppStoreVerification
import Configuration
import Crypto
import Foundation
import GooglePlay
import KeyFiles
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage
import Yams

extension ServerConfiguration {
    /// The rules every configuration must meet, whether read from a file or built in code.
    /// Files it names are read here, so a missing or unparsable one stops the server at start.
    public func validate() throws {
        guard (0...65535).contains(port) else { throw Invalid(key: "http.port", "must be 0…65535") }
        guard maxBodyBytes > 0 else { throw Invalid(key: "limits.maxBodyBytes", "must be positive") }
        guard (1...100_000).contains(maxOpenOrdersPerAccount) else {
            throw Invalid(key: "limits.maxOpenOrdersPerAccount", "must be 1…100000")
        }
        // The storage bounds (docs/security.md), each within its range.
        for (key, value, range) in [
            ("limits.maxOrdersPerAccountPerDay", maxOrdersPerAccountPerDay, 1...1_000_000),
            ("limits.orderRetentionDays", orderRetentionDays, 1...3650),
            ("limits.maxUnconfirmedExternalTokensPerAccount", maxUnconfirmedExternalTokensPerAccount, 1...10_000),
            ("limits.unconfirmedExternalTokenDays", unconfirmedExternalTokenDays, 1...365),
            ("limits.maxUnconfirmedExternalTokens", maxUnconfirmedExternalTokens, 1...100_000_000),
        ] where !range.contains(value) {
            throw Invalid(key: key, "must be \(range.lowerBound)…\(range.upperBound)")
        }
        guard (1...1_000_000).contains(maxInFlightRequests) else {
            throw Invalid(key: "limits.maxInFlightRequests", "must be 1…1000000")
        }
        guard (1...3600).contains(databaseStartupTimeoutSeconds) else {
            throw Invalid(key: "database.startupTimeoutSeconds", "must be 1…3600")
        }
        guard (0...600).contains(shutdownGraceSeconds) else {
            throw Invalid(key: "http.shutdownGraceSeconds", "must be 0…600")
        }
        guard (1...3600).contains(idleTimeoutSeconds) else {
            throw Invalid(key: "http.idleTimeoutSeconds", "must be 1…3600")
        }
        guard (60...31_536_000).contains(clientTokenMaxLifetimeSeconds) else {
            throw Invalid(key: "auth.clientTokenMaxLifetimeSeconds", "must be 60…31536000")
        }
        for (index, key) in secretKeys.enumerated() where key.utf8.count < 32 {
            throw Invalid(
                key: "auth.secretKeys", "key \(index + 1) is \(key.utf8.count) bytes; secret keys are at least 32")
        }
        if let token = metricsToken, token.utf8.count < 32 {
            throw Invalid(key: "auth.metricsToken", "must be at least 32 bytes")
        }
        guard requestTimeoutSeconds > 0 else { throw Invalid(key: "limits.requestTimeoutSeconds", "must be positive") }
        guard (10...86_400).contains(dashboardSessionIdleSeconds) else {
            throw Invalid(key: "dashboard.sessionIdleSeconds", "must be 10…86400")
        }
        guard (1...720).contains(dashboardSessionMaxHours) else {
            throw Invalid(key: "dashboard.sessionMaxHours", "must be 1…720")
        }
        guard clientRequestsPerSecond >= 0 else {
            throw Invalid(key: "limits.clientRequestsPerSecond", "must not be negative")
        }
        if let responseSigningKey { _ = try Self.responseSigner(responseSigningKey) }
        if !responseSigningKeys.isEmpty {
            guard responseSigningKey == nil else {
                throw Invalid(
                    key: "auth.responseSigningKeys",
                    "set auth.responseSigningKeys (several, the first signs) or auth.responseSigningKey (one), not both"
                )
            }
            guard responseSigningKeys.count <= 8 else {
                throw Invalid(key: "auth.responseSigningKeys", "at most 8 keys")
            }
            let signers = try responseSigningKeys.map { try Self.responseSigner($0, key: "auth.responseSigningKeys") }
            guard Set(signers.map(\.keyId)).count == signers.count else {
                throw Invalid(key: "auth.responseSigningKeys", "the same key is listed twice")
            }
        }
        guard (1...36_500).contains(rejectedProofsRetentionDays) else {
            throw Invalid(key: "rejectedProofs.retentionDays", "must be 1…36500")
        }
        guard (1_048_576...(1 << 40)).contains(rejectedProofsMaxBytesPerDay) else {
            throw Invalid(key: "rejectedProofs.maxBytesPerDay", "must be 1 MiB…1 TiB (in bytes)")
        }
        guard (rejectedProofsMaxBytesPerDay...(1 << 42)).contains(rejectedProofsMaxBytesTotal) else {
            throw Invalid(
                key: "rejectedProofs.maxBytesTotal", "must be at least rejectedProofs.maxBytesPerDay, at most 4 TiB")
        }
        guard (1...8_760).contains(webhookMaxAttemptHours) else {
            throw Invalid(key: "webhooks.maxAttemptHours", "must be 1…8760")
        }
        do {
            try Database.validate(url: databaseURL)
        } catch let error as Database.InvalidURL {
            throw Invalid(key: "database.url", error.description.replacingOccurrences(of: "database.url: ", with: ""))
        }
        if let readReplicaURL {
            guard databaseURL.hasPrefix("postgres"), readReplicaURL.hasPrefix("postgres") else {
                throw Invalid(
                    key: "database.readReplicaURL",
                    "a read replica is a PostgreSQL streaming replica of a PostgreSQL database.url")
            }
            do {
                try Database.validate(url: readReplicaURL)
            } catch let error as Database.InvalidURL {
                throw Invalid(key: "database.readReplicaURL", error.description)
            }
        }
        guard (1...3_600).contains(maxReplicaLagSeconds) else {
            throw Invalid(key: "database.maxReplicaLagSeconds", "must be 1…3600")
        }
        try validateGooglePlayApps()
        try validateStripeApps()
        if mode == .configured, hasAppStoreApp {
            guard let bundleId, !bundleId.isEmpty else {
                throw Invalid(key: "apple.bundleId", "is required: every signed object is checked against it")
            }
            if environments.contains(.production), appAppleId == nil {
                throw Invalid(
                    key: "apple.appAppleId",
                    "is required when Production is accepted (Apple signs it into every Production object)")
            }
            for app in otherAppStoreApps where environments.contains(.production) && app.appAppleId == nil {
                throw Invalid(
                    key: "apps[\(app.id)].appAppleId",
                    "is required when Production is accepted (Apple signs it into every Production object)")
            }
        }
        for app in otherAppStoreApps {
            guard !app.bundleId.isEmpty, app.bundleId.count <= 255,
                app.bundleId.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || ".-".contains($0)) })
            else { throw Invalid(key: "apps[\(app.id)].bundleId", "must be a bundle id (com.example.app)") }
        }
        if let secret = clientTokenSecret, secret.utf8.count < 32 {
            throw Invalid(key: "auth.clientTokenSecret", "must be at least 32 bytes (HS256 needs a 256-bit key)")
        }
        if let url = webhookURL {
            guard let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme?.lowercased() ?? ""),
                parsed.host?.isEmpty == false
            else { throw Invalid(key: "webhooks.url", "must be an http(s) URL") }
            // Events are always signed: a backend must be able to tell them from forgeries.
            guard let secret = webhookSecret, secret.utf8.count >= 16 else {
                throw Invalid(key: "webhooks.secret", "at least 16 bytes, is required with webhooks.url")
            }
        }
        for file in rootCertificateFiles { _ = try Self.rootCertificates(in: file) }
        let serverAPI = [serverAPIIssuerId, serverAPIKeyId, serverAPIPrivateKeyFile]
        if serverAPI.contains(where: { $0 != nil }) {
            for (key, value) in zip(
                ["apple.serverAPI.issuerId", "apple.serverAPI.keyId", "apple.serverAPI.privateKeyFile"], serverAPI)
            where value?.isEmpty != false {
                throw Invalid(key: key, "is required with the other apple.serverAPI keys")
            }
            _ = try serverAPIPrivateKeyPEM()
        }
        let offers = [offersIssuerId, offersKeyId, offersPrivateKeyFile]
        if offers.contains(where: { $0 != nil }) {
            for (key, value) in zip(
                ["apple.offers.issuerId", "apple.offers.keyId", "apple.offers.privateKeyFile"], offers)
            where value?.isEmpty != false {
                throw Invalid(key: key, "is required with the other apple.offers keys")
            }
            _ = try offersPrivateKeyPEM()
        }
        guard (1...1000).contains(sharedAppleIdAccounts) else {
            throw Invalid(key: "offers.sharedAppleIdAccounts", "must be 1…1000")
        }
        // Offers are signed with the In-App Purchase key: a catalog that has them (or the
        // once-per-account intro policy) without a key would sign nothing.
        let needsKey =
            introductoryOffers == .oncePerAccount
            || (catalog?.products.contains { $0.offers?.isEmpty == false } ?? false)
            || (catalog?.retention.contains { $0.promotionalOffer != nil } ?? false)
        if needsKey, mode == .configured, !localAppStoreEnabled, offersKeyId == nil, serverAPIKeyId == nil {
            throw Invalid(
                key: "apple.offers.privateKeyFile",
                "the catalog's offers (or offers.introductoryOffers: once_per_account) need the In-App Purchase key: set apple.offers.* or apple.serverAPI.*"
            )
        }
    }

    /// The In-App Purchase key that signs offers: `apple.offers.*`, else `apple.serverAPI.*`.
    func offerKey() throws -> (issuerId: String, keyId: String, pem: String)? {
        if let pem = try offersPrivateKeyPEM(), let issuerId = offersIssuerId, let keyId = offersKeyId {
            return (issuerId, keyId, pem)
        }
        if let pem = try serverAPIPrivateKeyPEM(), let issuerId = serverAPIIssuerId, let keyId = serverAPIKeyId {
            return (issuerId, keyId, pem)
        }
        return nil
    }

    func offersPrivateKeyPEM() throws -> String? {
        guard let file = offersPrivateKeyFile else { return nil }
        guard let data = FileManager.default.contents(atPath: file) else {
            throw Invalid(key: "apple.offers.privateKeyFile", "cannot read \(file)")
        }
        let pem = String(decoding: data, as: UTF8.self)
        guard (try? P256.Signing.PrivateKey(pemRepresentation: pem)) != nil else {
            throw Invalid(key: "apple.offers.privateKeyFile", "\(file) is not an ES256 .p8 private key (PEM)")
        }
        if let exposure = KeyFiles.exposure(of: file) { throw Invalid(key: "apple.offers.privateKeyFile", exposure) }
        return pem
    }

    /// The certificates of one `apple.rootCertificates` file, or the error naming the key.
    static func rootCertificates(in file: String) throws -> [[UInt8]] {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw Invalid(key: "apple.rootCertificates", "cannot read \(file)")
        }
        let certificates = CertificateFile.certificates(in: [UInt8](data))
        guard !certificates.isEmpty else {
            throw Invalid(key: "apple.rootCertificates", "\(file) holds no PEM or DER certificate")
        }
        return certificates
    }

    /// The App Store Connect key's PEM, checked to be an ES256 (P-256) private key.
    func serverAPIPrivateKeyPEM() throws -> String? {
        guard let file = serverAPIPrivateKeyFile else { return nil }
        guard let data = FileManager.default.contents(atPath: file) else {
            throw Invalid(key: "apple.serverAPI.privateKeyFile", "cannot read \(file)")
        }
        let pem = String(decoding: data, as: UTF8.self)
        guard (try? P256.Signing.PrivateKey(pemRepresentation: pem)) != nil else {
            throw Invalid(key: "apple.serverAPI.privateKeyFile", "\(file) is not an ES256 .p8 private key (PEM)")
        }
        if let exposure = KeyFiles.exposure(of: file) {
            throw Invalid(key: "apple.serverAPI.privateKeyFile", exposure)
        }
        return pem
    }
}

extension ServerConfiguration {
    /// `auth.responseSigningKey`: the PEM itself, or the path of a file holding it.
    static func responseSigner(_ value: String, key name: String = "auth.responseSigningKey") throws
        -> ResponseSigner
    {
        let pem: String
        if value.contains("-----BEGIN") {
            pem = value
        } else if let data = FileManager.default.contents(atPath: value) {
            pem = String(decoding: data, as: UTF8.self)
        } else {
            throw Invalid(key: name, "neither a PEM key nor a readable file: \(value.prefix(200))")
        }
        let signer: ResponseSigner
        do {
            signer = ResponseSigner(key: try ResponseSigner.key(pem: pem))
        } catch {
            throw Invalid(
                key: name,
                "not an Ed25519 private key in PEM (openssl genpkey -algorithm ed25519 writes one)")
        }
        if !value.contains("-----BEGIN"), let exposure = KeyFiles.exposure(of: value) {
            throw Invalid(key: name, exposure)
        }
        return signer
    }
}
