import Foundation

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
    /// detail: in double quotes, with every scalar outside printable ASCII, and `"` `\` `<` `>`
    /// `&` `'`, written as `\u{…}`. Whatever renders the detail later (a dashboard, a log, a
    /// terminal), the client's text cannot be markup, a control sequence or a look-alike.
    public static func quoted(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x22, 0x5C, 0x3C, 0x3E, 0x26, 0x27: out += "\\u{\(String(scalar.value, radix: 16))}"
            case 0x20...0x7E: out.unicodeScalars.append(scalar)
            default: out += "\\u{\(String(scalar.value, radix: 16))}"
            }
        }
        return out + "\""
    }
}
