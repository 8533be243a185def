import Foundation
import SQLKit

#if canImport(Glibc)
    import Glibc
#endif

/// Scratch databases on a PostgreSQL server, for work that needs a database of its own for a
/// while (the test suites: every PostgreSQL test runs on one). Each database is created once, emptied
/// when it is given back (its connections ended, its `public` schema dropped and created again)
/// and handed to the next user; at most `capacity` are lent at once from one server, later users
/// wait their turn (a server of their own, such as the cluster the restart tests restart, never
/// waits behind another's).
/// A database is named after the process that lends it; one whose process has ended is taken
/// over by the next process that needs one, so successive runs reuse the same few databases.
///
/// Why not a database per use, dropped afterwards: PostgreSQL copies the template through the
/// WAL for every `CREATE DATABASE` and makes every `DROP DATABASE` wait for an immediate
/// checkpoint, which syncs every file any database wrote since the last one. Hundreds of tests
/// doing that at once kept a PostgreSQL 15 server in back-to-back checkpoints of ~70,000 files,
/// and the tests' statements passed their 30 s deadlines behind them. Emptying a schema needs no
/// checkpoint, and the lending limit bounds the connections and the files in play.
public actor ScratchDatabases {
    /// One database lent: its URL (the base URL with its name), until `giveBack`.
    public struct Lease: Sendable {
        public let url: String
        public let name: String
        let base: String
    }

    /// The process's lender: 24 databases at once (each server holds a pool of a few connections;
    /// PostgreSQL's default allows 100, the test clusters 300).
    public static let shared = ScratchDatabases(capacity: 24)

    let capacity: Int
    /// What its databases' names start with (`sk_scratch_`): only those are taken over.
    let prefix: String
    private var lent: [String: Int] = [:]
    private var waiting: [String: [CheckedContinuation<Void, Never>]] = [:]
    private var idle: [String: [String]] = [:]
    private var admins: [String: Task<Database, any Error>] = [:]
    private var leftovers: [String: [String]] = [:]

    public init(capacity: Int, prefix: String = "sk_scratch_") {
        self.capacity = max(1, capacity)
        self.prefix = prefix
    }

    /// A database of its own on the server `base` names (`postgres://user:pass@host:port/db`,
    /// the user allowed to create databases): empty, no other connection to it.
    public func lend(base: String) async throws -> Lease {
        while lent[base, default: 0] >= capacity {
            await withCheckedContinuation { waiting[base, default: []].append($0) }
        }
        lent[base, default: 0] += 1
        do {
            if let name = idle[base]?.popLast() { return try Lease(url: Self.url(base, name), name: name, base: base) }
            if let name = try await adoptLeftover(base) {
                return try Lease(url: Self.url(base, name), name: name, base: base)
            }
            let name = newName()
            let admin = try await admin(base)
            try await admin.read { sql in try await sql.raw("CREATE DATABASE \(ident: name)").run() }
            return try Lease(url: Self.url(base, name), name: name, base: base)
        } catch {
            returned(base)
            throw error
        }
    }

    /// Takes `lease` back: ends every connection still open to it and empties it for the next
    /// user. A database that cannot be emptied is dropped instead (never lent again).
    public func giveBack(_ lease: Lease) async {
        defer { returned(lease.base) }
        if (try? await empty(lease)) == true {
            idle[lease.base, default: []].append(lease.name)
        } else if let admin = try? await admin(lease.base) {
            try? await admin.read { sql in
                try await sql.raw("DROP DATABASE IF EXISTS \(ident: lease.name) WITH (FORCE)").run()
            }
        }
    }

    /// Ends every connection to the database and drops and creates its `public` schema; false
    /// when it could not be emptied.
    private func empty(_ lease: Lease) async throws -> Bool {
        let admin = try await admin(lease.base)
        try await admin.read { sql in
            try await sql.raw(
                """
                SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
                WHERE datname = \(bind: lease.name) AND pid <> pg_backend_pid()
                """
            ).run()
        }
        let database = try await Database.open(url: lease.url)
        do {
            try await database.read { sql in
                try await sql.raw("DROP SCHEMA IF EXISTS public CASCADE").run()
                try await sql.raw("CREATE SCHEMA public").run()
            }
        } catch {
            try? await database.close()
            return false
        }
        try? await database.close()
        return true
    }

    /// Runs `body` with a database of its own (given back when `body` returns or throws).
    public nonisolated func with<T>(base: String, _ body: (Lease) async throws -> T) async throws -> T {
        let lease = try await lend(base: base)
        do {
            let result = try await body(lease)
            await giveBack(lease)
            return result
        } catch {
            await giveBack(lease)
            throw error
        }
    }

    /// `sk_scratch_<pid>_<random>`: the process that lends it, so a later process knows which
    /// databases nobody uses any more.
    func newName() -> String {
        "\(prefix)\(getpid())_\(UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased())"
    }

    /// The process a scratch database's name says lent it, if its name has one.
    func lender(of name: String) -> Int32? {
        let parts = name.dropFirst(prefix.count).split(separator: "_")
        guard name.hasPrefix(prefix), parts.count == 2 else { return nil }
        return Int32(parts[0])
    }

    /// A database an earlier process lent and left when it ended (its process is gone): renamed
    /// to this process (so no other process takes it too), emptied, and lent again — so runs
    /// after runs keep reusing the same few databases instead of leaving more behind each time.
    private func adoptLeftover(_ base: String) async throws -> String? {
        if leftovers[base] == nil {
            let admin = try await admin(base)
            let names = try await admin.read { sql in
                try await sql.raw("SELECT datname FROM pg_database").all()
                    .compactMap { try? $0.decode(column: "datname", as: String.self) }
            }
            let mine = getpid()
            leftovers[base] = names.filter { name in
                guard let pid = lender(of: name), pid != mine else { return false }
                return kill(pid, 0) != 0 && errno == ESRCH
            }
        }
        while let old = leftovers[base]?.popLast() {
            let name = newName()
            let admin = try await admin(base)
            do {
                try await admin.read { sql in
                    try await sql.raw(
                        """
                        SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
                        WHERE datname = \(bind: old) AND pid <> pg_backend_pid()
                        """
                    ).run()
                    try await sql.raw("ALTER DATABASE \(ident: old) RENAME TO \(ident: name)").run()
                }
            } catch {
                continue  // another process took it first, or it is in use
            }
            if (try? await empty(Lease(url: Self.url(base, name), name: name, base: base))) == true { return name }
        }
        return nil
    }

    private func returned(_ base: String) {
        lent[base, default: 1] -= 1
        if var queue = waiting[base], !queue.isEmpty {
            let next = queue.removeFirst()
            waiting[base] = queue
            next.resume()
        }
    }

    private func admin(_ base: String) async throws -> Database {
        if let task = admins[base] {
            if let database = try? await task.value { return database }
            admins[base] = nil
        }
        let task = Task { try await Database.open(url: base) }
        admins[base] = task
        return try await task.value
    }

    static func url(_ base: String, _ name: String) throws -> String {
        guard var components = URLComponents(string: base) else {
            throw Database.InvalidURL(description: "not a PostgreSQL URL: \(base.prefix(40))")
        }
        components.path = "/\(name)"
        guard let url = components.string else {
            throw Database.InvalidURL(description: "not a PostgreSQL URL: \(base.prefix(40))")
        }
        return url
    }
}
