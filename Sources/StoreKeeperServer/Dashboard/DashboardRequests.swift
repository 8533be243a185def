import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// The dashboard's HTTP plumbing: redirects, the session cookie, same-origin checks and form
/// bodies, each read on bytes.
extension DashboardController {
    static func redirect(_ location: String) -> Response {
        var headers = securityHeaders
        headers[.location] = location
        headers[.cacheControl] = "no-store"
        return Response(status: .seeOther, headers: headers)
    }

    /// The session cookie: HttpOnly, SameSite=Strict, scoped to the dashboard; Secure when the
    /// request came over TLS (a proxy's `X-Forwarded-Proto: https`).
    static func cookie(_ value: String, request: Request, maxAge: Int? = nil) -> String {
        var cookie = "\(DashboardSessions.cookieName)=\(value); Path=/dashboard; HttpOnly; SameSite=Strict"
        if let maxAge { cookie += "; Max-Age=\(maxAge)" }
        let proto = request.headers[HTTPField.Name("X-Forwarded-Proto")!]?.lowercased()
        if proto == "https" || request.uri.scheme == .https { cookie += "; Secure" }
        return cookie
    }

    static func cookieValue(_ request: Request, _ name: String) -> String? {
        // Split on bytes: `;\u{301}` is one `Character` but a cookie separator all the same.
        let prefix = Array((name + "=").utf8)
        for header in request.headers[values: .cookie] {
            for pair in header.utf8.split(separator: UInt8(ascii: ";")) {
                let trimmed = pair.drop(while: { $0 == 0x20 || $0 == 0x09 })
                if trimmed.starts(with: prefix) {
                    var value = Array(trimmed.dropFirst(prefix.count))
                    while let last = value.last, last == 0x20 || last == 0x09 { value.removeLast() }
                    return String(decoding: value, as: UTF8.self)
                }
            }
        }
        return nil
    }

    /// A form post from this dashboard: `Origin` (or, without it, `Referer`) names this host
    /// (`Host`, or a proxy's `X-Forwarded-Host`), and the browser did not mark it cross-site.
    static func sameOrigin(_ request: Request) -> Bool {
        if request.headers[HTTPField.Name("Sec-Fetch-Site")!] == "cross-site" { return false }
        guard let origin = request.headers[.origin] ?? request.headers[.referer] else { return true }
        guard let url = URL(string: origin), let originHost = url.host?.lowercased() else { return false }
        let authority = url.port.map { "\(originHost):\($0)" } ?? originHost
        let hosts = [request.head.authority, request.headers[HTTPField.Name("X-Forwarded-Host")!]]
            .compactMap { $0?.lowercased() }
        return hosts.contains(authority)
    }

    /// An `application/x-www-form-urlencoded` body, at most 16 KB.
    static func form(_ request: Request) async throws -> [String: String] {
        var request = request
        let buffer = try await request.collectBody(upTo: 16_384)
        var fields: [String: String] = [:]
        // Split and decoded on bytes, never on `Character`s (`&\u{301}` is one grapheme cluster).
        for pair in buffer.readableBytesView.split(separator: UInt8(ascii: "&")) {
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ bytes: some Collection<UInt8>) -> String? {
                String(decoding: bytes.map { $0 == UInt8(ascii: "+") ? UInt8(ascii: " ") : $0 }, as: UTF8.self)
                    .removingPercentEncoding
            }
            guard let name = parts.first.flatMap(decode), fields[name] == nil else { continue }
            fields[name] = parts.count > 1 ? decode(parts[1]) ?? "" : ""
        }
        return fields
    }

    static func pathComponent(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~")))
            ?? text
    }
}
