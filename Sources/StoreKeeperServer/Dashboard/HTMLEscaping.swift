import Mustache

/// HTML escaping over UTF-8 bytes, never over `Character`s.
///
/// A `Character` is a grapheme cluster: `"\u{600}<"` (a prepended concatenation mark before
/// `<`), `">\u{301}"` and `"\"\u{301}"` (a combining accent after the delimiter) are each one
/// `Character` equal to no single delimiter, so an escaper that looks characters up in a table
/// lets the delimiter through raw. swift-mustache 2.1.1's built-in HTML escaper does exactly
/// that (README, "dependencies used differently"). The five bytes escaped here are ASCII and
/// never occur inside a multi-byte UTF-8 sequence, so walking bytes escapes every one of them,
/// whatever comes before or after.
enum HTMLEscaping {
    static func escape(_ text: String) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count + 16)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "&"): out.append(contentsOf: "&amp;".utf8)
            case UInt8(ascii: "<"): out.append(contentsOf: "&lt;".utf8)
            case UInt8(ascii: ">"): out.append(contentsOf: "&gt;".utf8)
            case UInt8(ascii: "\""): out.append(contentsOf: "&quot;".utf8)
            case UInt8(ascii: "'"): out.append(contentsOf: "&#39;".utf8)
            default: out.append(byte)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The dashboard templates' content type: every `{{x}}` goes through `escape`. Each template
    /// names it in its first line (`DashboardController.library`), since swift-mustache's default
    /// for a template is its own escaper and cannot be replaced.
    struct ContentType: MustacheContentType {
        static let name = "STOREKEEPER_HTML"
        static let pragma = "{{% CONTENT_TYPE: \(name) }}"

        func escapeText(_ text: String) -> String { HTMLEscaping.escape(text) }
    }
}
