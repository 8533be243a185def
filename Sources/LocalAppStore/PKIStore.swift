import AppStoreSigning
import Crypto
import Foundation
import KeyFiles
import SwiftASN1
import X509
import _CryptoExtras

/// The local App Store's certificate authority, kept in its data directory so that restarts
/// (and every CLI invocation) sign with the same keys, and a root configured once stays valid.
///
/// Layout under `<data-dir>/pki/`: `<name>.pem` (certificate) and `<name>.key.pem` (private
/// key, mode 0600) for `root`, `intermediate`, `leaf` (the JWS chain) and `receipt-root`,
/// `receipt-intermediate`, `receipt-leaf` (the RSA chain of app receipts).
public enum PKIStore {
    public struct Corrupt: Error, CustomStringConvertible {
        public var description: String
    }

    static let names = ["root", "intermediate", "leaf", "receipt-root", "receipt-intermediate", "receipt-leaf"]

    /// Loads the PKI from `dataDirectory`, generating and saving it on first use.
    /// A partial or unreadable PKI is an error, never silently replaced: replacing it would
    /// invalidate every root already configured elsewhere.
    public static func loadOrCreate(dataDirectory: URL) throws -> ApplePKI {
        let directory = dataDirectory.appendingPathComponent("pki", isDirectory: true)
        let present = names.filter {
            FileManager.default.fileExists(atPath: directory.appendingPathComponent("\($0).pem").path)
        }
        if present.isEmpty {
            // Valid from two years back: what it signs with a local store's clock set in the past
            // (`demo --keep`'s months of history, a chaos run's backdated days) verifies.
            let pki = try ApplePKI.generate(
                name: "StoreKeeper Local App Store", notBefore: Date(timeIntervalSinceNow: -2 * 366 * 86_400))
            try save(pki, to: directory)
            return pki
        }
        guard present.count == names.count else {
            throw Corrupt(
                description: "\(directory.path) holds only \(present.joined(separator: ", ")); "
                    + "restore the missing files or remove the directory to start a new PKI")
        }
        return try load(from: directory)
    }

    static func save(_ pki: ApplePKI, to directory: URL) throws {
        guard let receiptRoot = pki.receiptRoot, let receiptIntermediate = pki.receiptIntermediate,
            let receiptLeaf = pki.receiptLeaf
        else { throw Corrupt(description: "a local App Store PKI needs its receipt chain") }
        try FileManager.default.createDirectory(
            at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let items: [(String, Certificate, String)] = [
            ("root", pki.root.certificate, pki.root.privateKey.pemRepresentation),
            ("intermediate", pki.intermediate.certificate, pki.intermediate.privateKey.pemRepresentation),
            ("leaf", pki.leaf.certificate, pki.leaf.privateKey.pemRepresentation),
            ("receipt-root", receiptRoot.certificate, receiptRoot.privateKey.pemRepresentation),
            ("receipt-intermediate", receiptIntermediate.certificate, receiptIntermediate.privateKey.pemRepresentation),
            ("receipt-leaf", receiptLeaf.certificate, receiptLeaf.privateKey.pemRepresentation),
        ]
        // Keys first, certificates last: a certificate file marks its pair complete.
        for (name, _, keyPEM) in items {
            try write(keyPEM, to: directory.appendingPathComponent("\(name).key.pem"), permissions: 0o600)
        }
        for (name, certificate, _) in items {
            try write(
                try certificate.serializeAsPEM().pemString, to: directory.appendingPathComponent("\(name).pem"),
                permissions: 0o644)
        }
    }

    static func load(from directory: URL) throws -> ApplePKI {
        func certificate(_ name: String) throws -> Certificate {
            do {
                return try Certificate(pemEncoded: try read(directory.appendingPathComponent("\(name).pem")))
            } catch let error as Corrupt {
                throw error
            } catch {
                throw Corrupt(description: "\(name).pem in \(directory.path) is not a PEM certificate")
            }
        }
        func key<Key>(_ name: String, _ make: (String) throws -> Key) throws -> Key {
            do {
                return try make(try read(directory.appendingPathComponent("\(name).key.pem")))
            } catch let error as Corrupt {
                throw error
            } catch {
                throw Corrupt(description: "\(name).key.pem in \(directory.path) is not the expected private key")
            }
        }
        let pki = ApplePKI(
            root: .init(
                certificate: try certificate("root"),
                privateKey: try key("root", P384.Signing.PrivateKey.init(pemRepresentation:))),
            intermediate: .init(
                certificate: try certificate("intermediate"),
                privateKey: try key("intermediate", P384.Signing.PrivateKey.init(pemRepresentation:))),
            leaf: .init(
                certificate: try certificate("leaf"),
                privateKey: try key("leaf", P256.Signing.PrivateKey.init(pemRepresentation:))),
            receiptRoot: .init(
                certificate: try certificate("receipt-root"),
                privateKey: try key("receipt-root", _RSA.Signing.PrivateKey.init(pemRepresentation:))),
            receiptIntermediate: .init(
                certificate: try certificate("receipt-intermediate"),
                privateKey: try key("receipt-intermediate", _RSA.Signing.PrivateKey.init(pemRepresentation:))),
            receiptLeaf: .init(
                certificate: try certificate("receipt-leaf"),
                privateKey: try key("receipt-leaf", _RSA.Signing.PrivateKey.init(pemRepresentation:))))
        // Each certificate must belong to the key stored beside it.
        guard pki.leaf.certificate.publicKey == Certificate.PublicKey(pki.leaf.privateKey.publicKey),
            pki.root.certificate.publicKey == Certificate.PublicKey(pki.root.privateKey.publicKey),
            pki.intermediate.certificate.publicKey == Certificate.PublicKey(pki.intermediate.privateKey.publicKey)
        else { throw Corrupt(description: "a certificate in \(directory.path) does not match its private key") }
        return pki
    }

    /// The trust roots, PEM: the JWS root first, then the receipt root.
    public static func rootsPEM(_ pki: ApplePKI) throws -> String {
        var pem = try pki.root.certificate.serializeAsPEM().pemString + "\n"
        if let receiptRoot = pki.receiptRoot { pem += try receiptRoot.certificate.serializeAsPEM().pemString + "\n" }
        return pem
    }

    private static func read(_ url: URL) throws -> String {
        guard let data = FileManager.default.contents(atPath: url.path) else {
            throw Corrupt(description: "cannot read \(url.path)")
        }
        return String(decoding: data, as: UTF8.self)
    }

    private static func write(_ text: String, to url: URL, permissions: Int) throws {
        if permissions == 0o600 {
            // A private key: never on disk with wider permissions, not even for an instant.
            do {
                return try KeyFiles.writePrivate(Data(text.utf8), to: url.path)
            } catch {
                throw Corrupt(description: "cannot write \(url.path)")
            }
        }
        let temporary = url.appendingPathExtension("tmp")
        guard
            FileManager.default.createFile(
                atPath: temporary.path, contents: Data(text.utf8), attributes: [.posixPermissions: permissions])
        else { throw Corrupt(description: "cannot write \(temporary.path)") }
        if FileManager.default.fileExists(atPath: url.path) { try FileManager.default.removeItem(at: url) }
        try FileManager.default.moveItem(at: temporary, to: url)
    }
}
