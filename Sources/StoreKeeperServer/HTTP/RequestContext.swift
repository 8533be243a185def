import HTTPTypes
import Hummingbird
import Logging
import NIOCore

/// Every StoreKeeper request's context: Hummingbird's core, and who is calling — put there
/// once by `Authenticate`, so no handler parses a header again.
public struct StoreKeeperContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The authenticated caller (nil on open routes: `/healthz`, `/metrics`, the demo's local
    /// App Store).
    public var authenticated: Caller?

    /// The connection, for its peer's address (the dashboard's sign-in limit); read only there.
    let channel: any Channel

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        authenticated = nil
        channel = source.channel
    }

    /// The peer's IP address (without the port); "unknown" for a Unix socket or a closed channel.
    var peerAddress: String {
        channel.remoteAddress?.ipAddress ?? "unknown"
    }

    /// The caller `Authenticate` put here. Every route behind it has one; a route outside it
    /// asking is a programming error answered 401, never a crash.
    func caller() throws -> Caller {
        guard let authenticated else { throw APIError.unauthenticated }
        return authenticated
    }
}

/// Authentication and rate limiting, once, for every route of the API (`/v1`): the caller is
/// a secret key or a client token (HS256, one account), rate limited per caller, and put into
/// the context. The scope rules are `Caller.require` (a client token reaches its own account
/// only) and `Caller.requireSecretKey` (operator routes).
struct Authenticate: RouterMiddleware {
    typealias Context = StoreKeeperContext
    let authenticator: Authenticator
    let limiter: RateLimiter

    func handle(
        _ request: Request, context: StoreKeeperContext,
        next: (Request, StoreKeeperContext) async throws -> Response
    ) async throws -> Response {
        let caller = try await authenticator.authenticate(request)
        if let retryAfter = limiter.admit(caller) {
            var error = APIError(.tooManyRequests, "rate_limited", "too many requests", retryable: true)
            error.headers[.retryAfter] = String(retryAfter)
            throw error
        }
        var context = context
        // `StoreKeeper-Origin: mcp` (the MCP desk's calls): the same key, its origin named in
        // the audit log. It grants nothing: the key alone decides what the call may do.
        if request.headers[HTTPField.Name("StoreKeeper-Origin")!] == "mcp" {
            context.authenticated = caller.through("mcp")
        } else {
            context.authenticated = caller
        }
        return try await next(request, context)
    }
}
