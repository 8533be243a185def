import Foundation
import SQLKit
import Synchronization

/// A PostgreSQL streaming replica for reads that tolerate staleness (`database.readReplicaURL`):
/// analytics, exports and the dashboard's lists. Writes, and every read a decision depends on
/// (deliveries, refunds, account reads after a purchase), stay on the primary. Past
/// `maxLagSeconds` of replication lag — or when the replica does not answer — reads go to the
/// primary until it has caught up again.
public final class ReadReplica: Sendable {
    public let database: Database
    public let maxLag: TimeInterval
    /// The last lag measured (nil: the replica did not answer), and when.
    private let measured = Mutex<(lag: TimeInterval?, at: Date?)>((nil, nil))
    /// Reads that went to the replica, and that fell back to the primary.
    private let counts = Mutex<(replica: Int, primary: Int)>((0, 0))

    public init(database: Database, maxLag: TimeInterval) {
        self.database = database
        self.maxLag = maxLag
    }

    /// Seconds the replica is behind the primary: 0 when it has replayed everything it received
    /// (an idle primary sends nothing, which is no lag), else since the last transaction it
    /// replayed; 0 for a server that is not a replica at all. Nil: it does not answer.
    public func lag(now: Date = Date()) async -> TimeInterval? {
        // Measured at most once a second; a replica that did not answer is asked again only
        // after 10 s (meanwhile every stale read goes straight to the primary, never waiting).
        let last = measured.withLock { $0 }
        if let at = last.at, now.timeIntervalSince(at) < (last.lag == nil ? 10 : 1) { return last.lag }
        let lag: TimeInterval? = try? await raceDeadline(.seconds(2), what: "the replica's lag") {
            try await self.database.read { sql in
                guard
                    let row = try await sql.raw(
                        """
                        SELECT pg_is_in_recovery() AS recovering,
                               EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE pid IS NOT NULL) AS receiving,
                               COALESCE(pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn(), false) AS caught_up,
                               EXTRACT(EPOCH FROM (now() - pg_last_xact_replay_timestamp()))::float8 AS since_replay
                        """
                    ).first()
                else { return nil }
                return Self.lag(
                    recovering: try row.decode(column: "recovering", as: Bool.self),
                    receiving: try row.decode(column: "receiving", as: Bool.self),
                    caughtUp: try row.decode(column: "caught_up", as: Bool.self),
                    sinceReplay: try row.decode(column: "since_replay", as: Double?.self))
            }
        }
        measured.withLock { $0 = (lag, now) }
        return lag
    }

    /// The lag a replica's state means: 0 for a primary; behind for good (1e9) when its WAL
    /// receiver is not running — it receives nothing, so "replayed all it received" says
    /// nothing (a dead receiver once reported zero lag while analytics went stale for days);
    /// 0 when it has replayed everything it received (an idle primary sends nothing); else the
    /// seconds since the last transaction it replayed.
    static func lag(recovering: Bool, receiving: Bool, caughtUp: Bool, sinceReplay: Double?) -> TimeInterval {
        guard recovering else { return 0 }
        guard receiving else { return 1e9 }
        if caughtUp { return 0 }
        return sinceReplay ?? 1e9
    }

    /// How many reads each side took (for `/v1/status` and tests).
    public var readCounts: (replica: Int, primary: Int) { counts.withLock { $0 } }

    func count(replica: Bool) {
        counts.withLock {
            if replica {
                $0.replica += 1
            } else {
                $0.primary += 1
            }
        }
    }
}

extension Database {
    /// A read that tolerates staleness: on the replica when one is attached and within its lag
    /// bound, else (or when the replica fails) on this database.
    public func readStale<T: Sendable>(_ body: @escaping @Sendable (any SQLDatabase) async throws -> T)
        async throws -> T
    {
        if let replica = replica.withLock({ $0 }), let lag = await replica.lag(), lag <= replica.maxLag {
            do {
                let value = try await replica.database.read(body)
                replica.count(replica: true)
                return value
            } catch {
                // The replica failed mid-read: the primary answers.
            }
        }
        replica.withLock { $0 }?.count(replica: false)
        return try await read(body)
    }

    /// The database a stale-tolerant read should use now: the replica within its lag bound,
    /// else this one (for work that needs its own transaction on the chosen side).
    public func forStaleReads() async -> Database {
        guard let replica = replica.withLock({ $0 }) else { return self }
        if let lag = await replica.lag(), lag <= replica.maxLag {
            replica.count(replica: true)
            return replica.database
        }
        replica.count(replica: false)
        return self
    }

    /// Attaches a read replica (PostgreSQL only).
    public func attach(replica: ReadReplica) {
        self.replica.withLock { $0 = replica }
    }

    public var readReplica: ReadReplica? { replica.withLock { $0 } }
}
