import Crypto
import Foundation
import KeyFiles
import StoreKeeperCatalog

/// The App Store Connect "In-App Purchase" key of the local App Store, kept beside its PKI:
/// `server-api-key.p8` (the private key a server signs its tokens with) and
/// `server-api-key.json` (issuer id and key id). Generated on first use.
public enum ServerAPIKeyStore {
    public struct Credentials: Codable, Sendable, Hashable {
        public var issuerId: String
        public var keyId: String
        public var privateKeyPEM: String
    }

    struct Identity: Codable {
        var issuerId: String
        var keyId: String
    }

    public static func loadOrCreate(dataDirectory: URL) throws -> Credentials {
        let keyFile = dataDirectory.appendingPathComponent("server-api-key.p8")
        let identityFile = dataDirectory.appendingPathComponent("server-api-key.json")
        if let pem = FileManager.default.contents(atPath: keyFile.path),
            let identityData = FileManager.default.contents(atPath: identityFile.path)
        {
            let identity: Identity
            do {
                identity = try JSONDecoder().decode(Identity.self, from: identityData)
                _ = try P256.Signing.PrivateKey(pemRepresentation: String(decoding: pem, as: UTF8.self))
            } catch {
                throw PKIStore.Corrupt(description: "\(keyFile.path) or \(identityFile.path) is damaged")
            }
            return Credentials(
                issuerId: identity.issuerId, keyId: identity.keyId, privateKeyPEM: String(decoding: pem, as: UTF8.self))
        }
        try FileManager.default.createDirectory(at: dataDirectory, withIntermediateDirectories: true)
        let key = P256.Signing.PrivateKey()
        let identity = Identity(
            issuerId: UUID().uuidString.lowercased(),
            keyId: String((0..<10).map { _ in "ABCDEFGHJKLMNPQRSTUVWXYZ23456789".randomElement()! }))
        do {
            try KeyFiles.writePrivate(Data(key.pemRepresentation.utf8), to: keyFile.path)
        } catch {
            throw PKIStore.Corrupt(description: "cannot write the Server API key to \(dataDirectory.path)")
        }
        guard FileManager.default.createFile(atPath: identityFile.path, contents: try JSONEncoder().encode(identity))
        else { throw PKIStore.Corrupt(description: "cannot write the Server API key to \(dataDirectory.path)") }
        return Credentials(issuerId: identity.issuerId, keyId: identity.keyId, privateKeyPEM: key.pemRepresentation)
    }

    public static func publicKeyPEM(_ credentials: Credentials) throws -> String {
        try P256.Signing.PrivateKey(pemRepresentation: credentials.privateKeyPEM).publicKey.pemRepresentation
    }
}

extension Catalog {
    /// The catalog the local App Store uses when none is given: one product of each kind.
    public static let demo: Catalog = {
        // The literal is fixed and valid; tests parse it too.
        try! Catalog.parse(
            yaml: """
                products:
                  - { id: coins_60, type: consumable, grants: { currency: coins, amount: 60 }, prices: { USA: { currency: USD, price: 0.99 }, JPN: { currency: JPY, price: 160 }, DEU: { currency: EUR, price: 1.09 }, FRA: { currency: EUR, price: 1.09 }, GBR: { currency: GBP, price: 0.99 }, BRA: { currency: BRL, price: 5.9 } }, storeProducts: { stripe: price_coins_60 } }
                  - { id: coins_300, type: consumable, grants: { currency: coins, amount: 300 }, prices: { USA: { currency: USD, price: 4.99 }, JPN: { currency: JPY, price: 800 }, DEU: { currency: EUR, price: 5.49 }, FRA: { currency: EUR, price: 5.49 }, GBR: { currency: GBP, price: 4.99 }, BRA: { currency: BRL, price: 27.9 } }, storeProducts: { stripe: price_coins_300 } }
                  - { id: remove_ads, type: non_consumable, grants: { entitlement: no_ads }, prices: { USA: { currency: USD, price: 2.99 } }, storeProducts: { stripe: price_remove_ads } }
                  - { id: pro_yearly, type: auto_renewable, group: pro, period: P1Y, grants: { entitlement: pro }, prices: { USA: { currency: USD, price: 49.99 }, JPN: { currency: JPY, price: 8000 }, DEU: { currency: EUR, price: 54.99 }, FRA: { currency: EUR, price: 54.99 }, GBR: { currency: GBP, price: 49.99 }, BRA: { currency: BRL, price: 249.9 } }, storeProducts: { stripe: price_pro_yearly } }
                  - { id: pro_monthly, type: auto_renewable, group: pro, period: P1M, grants: { entitlement: pro }, prices: { USA: { currency: USD, price: 4.99 }, JPN: { currency: JPY, price: 800 }, DEU: { currency: EUR, price: 5.49 }, FRA: { currency: EUR, price: 5.49 }, GBR: { currency: GBP, price: 4.99 }, BRA: { currency: BRL, price: 24.9 } }, storeProducts: { stripe: price_pro_monthly } }
                  - { id: season_pass, type: non_renewing, duration: P30D, grants: { entitlement: season }, prices: { USA: { currency: USD, price: 9.99 } }, storeProducts: { stripe: price_season_pass } }
                """)
    }()
}
