/// Untrusted text as it may appear inside a message, a reason or a detail that is logged,
/// answered or rendered later: between `quote`s, printable ASCII only, at most `limit` scalars
/// (then `…`). Every other scalar — CR, LF, escapes, look-alikes — and the characters that
/// mean something in HTML or to a quote (`"` `'` `\` `<` `>` `&`) are written as `\u{…}`, so the
/// text can never forge a log line, carry markup or pass for something else.
public enum QuotedText {
    public static func quoted(_ text: some StringProtocol, quote: Character = "\"", limit: Int = .max) -> String {
        var out = String(quote)
        for (index, scalar) in text.unicodeScalars.enumerated() {
            guard index < limit else {
                out += "…"
                break
            }
            switch scalar.value {
            case 0x22, 0x27, 0x5C, 0x3C, 0x3E, 0x26: out += "\\u{\(String(scalar.value, radix: 16))}"
            case 0x20...0x7E: out.unicodeScalars.append(scalar)
            default: out += "\\u{\(String(scalar.value, radix: 16))}"
            }
        }
        return out + String(quote)
    }
}
