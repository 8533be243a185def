import Hummingbird
import StoreKeeperSupport

/// Every query parameter a `/v1` route reads, by route: any other is 400 `unknown_parameter`
/// naming it (an export asked `?to=` would otherwise answer everything, silently).
struct KnownQueryParameters<Context: RequestContext>: RouterMiddleware {
    /// Path segments after `/v1` (`*` matches one segment) → the parameters the route reads.
    static var routes: [(path: [String], names: Set<String>)] {
        [
            (["anomalies"], ["status", "limit", "after"]),
            (["export", "*"], ["format", "cursor", "since", "until", "limit"]),
            (["analytics", "*"], ["from", "to", "interval", "store", "appId", "country", "productId", "timeZone"]),
            (["revenue"], ["since", "until"]),
            (["rejected-proofs"], ["code", "since", "status", "limit"]),
            (["retention", "report"], ["since"]),
            (["external-purchases", "tokens"], ["unreported"]),
        ]
    }

    static func allowed(_ segments: [Substring]) -> Set<String> {
        for route in routes where route.path.count == segments.count {
            if zip(route.path, segments).allSatisfy({ $0 == "*" || $0 == $1 }) { return route.names }
        }
        return []
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        let query = request.uri.queryParameters
        if !query.isEmpty {
            let segments = request.uri.path.split(separator: "/").dropFirst()  // after "v1"
            let allowed = Self.allowed(Array(segments))
            for (name, _) in query where !allowed.contains(String(name)) {
                let takes = allowed.isEmpty ? "no query parameters" : "only " + allowed.sorted().joined(separator: ", ")
                throw APIError(
                    .badRequest, "unknown_parameter",
                    "unknown query parameter \(QuotedText.quoted(name, quote: "'", limit: 64)): this route takes \(takes)"
                )
            }
        }
        return try await next(request, context)
    }
}
