import Foundation
import SQLKit

/// Dashboard sessions ended on the server. The session cookie is signed and stateless (every
/// instance accepts it), so signing out has to be remembered where every instance reads it: a
/// signed-out session's nonce (until the session would have expired anyway), and per secret key
/// the time of its last "sign out everywhere".
public struct DashboardSessionStore: Sendable {
    public let database: Database

    public init(database: Database) { self.database = database }

    /// Whether the session (`nonce`, issued at `issued` seconds, by the key `keyId`) was ended.
    public func isEnded(nonce: String, keyId: String, issued: Int64) async throws -> Bool {
        try await database.read { sql in
            if try await sql.raw("SELECT 1 AS n FROM dashboard_sessions_ended WHERE nonce = \(bind: nonce)").first()
                != nil
            {
                return true
            }
            guard
                let row = try await sql.raw(
                    "SELECT not_before FROM dashboard_sign_outs WHERE key_id = \(bind: keyId)"
                ).first()
            else { return false }
            return issued <= (try row.decode(column: "not_before", as: Int64.self))
        }
    }

    /// Ends one session; its row goes once the session would have expired (`expires` seconds).
    /// Rows of sessions past their expiry are swept here too.
    public func end(nonce: String, expires: Int64, now: Date) async throws {
        let seconds = Int64(now.timeIntervalSince1970)
        try await database.transaction { sql in
            try await sql.raw("DELETE FROM dashboard_sessions_ended WHERE expires_at < \(bind: seconds)").run()
            try await sql.raw(
                """
                INSERT INTO dashboard_sessions_ended (nonce, expires_at) VALUES (\(bind: nonce), \(bind: expires))
                ON CONFLICT (nonce) DO NOTHING
                """
            ).run()
        }
    }

    /// Ends every session the key `keyId` opened up to now.
    public func endAll(keyId: String, now: Date) async throws {
        let seconds = Int64(now.timeIntervalSince1970)
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO dashboard_sign_outs (key_id, not_before) VALUES (\(bind: keyId), \(bind: seconds))
                ON CONFLICT (key_id) DO UPDATE SET not_before = excluded.not_before
                """
            ).run()
        }
    }
}
