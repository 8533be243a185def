import Foundation
import SQLKit

/// The schema, as numbered migrations applied once each, at start and by `storekeeper migrate`.
/// Portable SQL: the same statements run on SQLite and PostgreSQL. Times are epoch ms.
public enum Migrations {
    public static let all: [(version: Int, statements: [String])] = era1 + era2 + era3

    /// Applies every migration not yet applied, each in its own transaction. Safe to run from
    /// several processes at once: a migration that loses the race is skipped.
    public static func run(on database: Database) async throws {
        try await database.transaction { sql in
            try await sql.raw(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"
            ).run()
        }
        // A schema a later release wrote: this binary does not know what it means.
        let latest = all.map(\.version).max() ?? 0
        if let newest = try await appliedVersions(on: database).max(), newest > latest {
            throw SchemaNewerThanBinary(applied: newest, known: latest)
        }
        for migration in all {
            do {
                // A migration may build an index on a large table: far longer than the 30 s an
                // ordinary PostgreSQL transaction is given.
                try await database.transaction(deadline: .seconds(3600)) { sql in
                    let applied = try await sql.raw(
                        "SELECT version FROM schema_migrations WHERE version = \(bind: migration.version)"
                    ).first()
                    guard applied == nil else { return }
                    // Claim the version first, so a concurrent migrator fails here, not halfway.
                    try await sql.raw(
                        "INSERT INTO schema_migrations (version, applied_at) VALUES (\(bind: migration.version), \(bind: Date().milliseconds))"
                    ).run()
                    for statement in migration.statements { try await sql.raw(SQLQueryString(statement)).run() }
                }
            } catch {
                let applied = try await database.read { sql in
                    try await sql.raw(
                        "SELECT version FROM schema_migrations WHERE version = \(bind: migration.version)"
                    )
                    .first()
                }
                if applied == nil { throw error }
            }
        }
    }

    /// The database's schema was written by a later release than this binary.
    public struct SchemaNewerThanBinary: Error, CustomStringConvertible {
        public var applied: Int
        public var known: Int
        public var description: String {
            "the database's schema is at migration \(applied), newer than this binary knows (\(known)): a later release wrote it. Run that release or a later one; an older binary is refused, because migrations are never undone (restore the backup taken before the upgrade to roll back)"
        }
    }

    /// The versions applied, or none when the database has no schema yet (nothing was ever
    /// migrated): what a pre-flight reads without writing.
    public static func appliedVersionsIfAny(on database: Database) async throws -> [Int] {
        let exists = try await database.read { sql in
            switch database.kind {
            case .sqlite:
                try await sql.raw(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
                ).first() != nil
            case .postgres:
                try await sql.raw("SELECT to_regclass('schema_migrations') IS NOT NULL AS found").first()?.decode(
                    column: "found", as: Bool.self) ?? false
            }
        }
        return exists ? try await appliedVersions(on: database) : []
    }

    public static func appliedVersions(on database: Database) async throws -> [Int] {
        try await database.read { sql in
            try await sql.raw("SELECT version FROM schema_migrations ORDER BY version").all().map {
                try $0.decode(column: "version", as: Int.self)
            }
        }
    }
}

extension Date {
    var milliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }
    init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
