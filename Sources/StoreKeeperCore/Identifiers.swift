import Foundation
import StoreKeeperSupport

/// Ids as the database sees them: a sequence of bytes.
///
/// Swift's `String ==` (and `Hashable`) is Unicode canonical equivalence: `"\u{212A}ate"`
/// (KELVIN SIGN) equals `"Kate"`, NFD `"jose\u{301}"` equals NFC `"jos\u{E9}"`, `"\u{37E}"`
/// (GREEK QUESTION MARK) equals `";"`. The database compares bytes, so an account that Swift
/// thinks is the caller's could be another row. Two defences, both kept:
/// - every id is NFC at every entry point (`isNFC`; the server refuses others with 400), and two
///   NFC strings are canonically equivalent only when their bytes are equal, so `==`,
///   dictionaries and sets agree with the database on every stored id;
/// - every comparison that decides who may act on, or receive, something is byte-wise (`same`).
public enum Identifiers {
    /// Byte-wise equality: what the database's `=` on text does.
    @inlinable
    public static func same(_ lhs: String?, _ rhs: String?) -> Bool {
        switch (lhs, rhs) {
        case (nil, nil): true
        case (let lhs?, let rhs?): lhs.utf8.elementsEqual(rhs.utf8)
        default: false
        }
    }

    /// Whether `text` is in Unicode Normalization Form C (and so the only spelling of itself
    /// that an id may have). ASCII is NFC without looking further.
    public static func isNFC(_ text: String) -> Bool {
        if text.utf8.allSatisfy({ $0 < 0x80 }) { return true }
        return text.precomposedStringWithCanonicalMapping.utf8.elementsEqual(text.utf8)
    }

    /// Client-supplied text (an account id) as it appears inside an anomaly's or audit entry's
    /// detail: `QuotedText` in double quotes (printable ASCII only), so whatever renders the
    /// detail later (a dashboard, a log, a terminal) shows text, never markup or a look-alike.
    public static func quoted(_ text: String) -> String { QuotedText.quoted(text) }
}

/// The deployment's apps by their store identity: an App Store bundle id or a Google Play
/// package name → the app's id (`apps[].id`). What every stored purchase and subscription
/// records as its app.
public struct AppDirectory: Sendable, Hashable {
    public var apps: [String: String]
    /// The environments the deployment accepts payments from (raw values: `Production`,
    /// `Sandbox`); nil: any. The delivery path refuses the others, for every store.
    public var environments: Set<String>?

    public init(_ apps: [String: String] = [:], environments: Set<String>? = nil) {
        self.apps = apps
        self.environments = environments
    }

    /// The app of a transaction: its `bundleId` (Apple's, or the package name a Google
    /// purchase is read for); nil for a web payment or an unknown identity.
    public func appId(ofStoreIdentity identity: String?) -> String? {
        identity.flatMap { apps[$0] }
    }
}
