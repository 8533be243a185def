import Testing

@testable import StoreKeeperStorage

/// A replica's lag, from what PostgreSQL says of it: a dead WAL receiver counts as behind (it had
/// reported zero lag — it had replayed all it received, which was nothing — while analytics,
/// exports and revenue went stale indefinitely).
@Suite struct ReplicaLagTests {
    @Test(
        arguments: [
            // recovering, receiving, caught up, seconds since the last replayed transaction → lag
            (false, false, false, nil, 0.0),
            (true, true, true, 3600.0, 0.0),
            (true, true, false, 12.5, 12.5),
            (true, true, false, nil, 1e9),
            (true, false, true, 1.0, 1e9),
            (true, false, false, 2.0, 1e9),
        ] as [(Bool, Bool, Bool, Double?, Double)])
    func aDeadReceiverCountsAsBehind(
        recovering: Bool, receiving: Bool, caughtUp: Bool, sinceReplay: Double?, lag: Double
    ) {
        #expect(
            ReadReplica.lag(recovering: recovering, receiving: receiving, caughtUp: caughtUp, sinceReplay: sinceReplay)
                == lag)
    }
}
