import EventLoopPinning
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import StoreKeeperServer
@testable import StoreKeeperStorage

/// Connections handled on their event loop: the connection's task, and the handler task
/// `race` starts for a bounded route, run on the loop's thread — also after they suspend and are
/// resumed from another thread — while other routes stay on Swift's pool.
@Suite struct EventLoopPinningTests {
    /// Resumed from a thread of its own, as the SQLite writer or the deadline watcher does.
    static func resumedElsewhere() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread { continuation.resume() }.start()
        }
    }

    @Test func aRaceWithTheLoopsExecutorRunsItsWorkOnTheLoop() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let executor = EventLoopTaskExecutor.of(loop)
        #expect(EventLoopTaskExecutor.of(loop) === executor)
        let onLoop: [Bool] = try await race(deadline: .seconds(3600), executor: executor, timedOut: { .success([]) }) {
            var seen = [loop.inEventLoop]
            await Self.resumedElsewhere()
            seen.append(loop.inEventLoop)
            await Task.yield()
            seen.append(loop.inEventLoop)
            return seen
        }
        #expect(onLoop == [true, true, true])
        // Without it, Swift's pool: no event loop's thread.
        let elsewhere = try await race(deadline: .seconds(3600), timedOut: { .success(true) }) {
            MultiThreadedEventLoopGroup.currentEventLoop != nil
        }
        #expect(elsewhere == false)
    }

    /// A connection's handling (what Hummingbird's `HTTP1Channel.handle` does) runs on the
    /// channel's loop and publishes the executor for `DeadlineResponder`.
    @Test func aPinnedConnectionIsHandledOnItsChannelsLoop() async throws {
        struct Value: ServerChildChannelValue {
            let channel: any Channel
        }
        final class Seen: Sendable {
            let values = Mutex<[Bool]>([])
        }
        struct Recording: ServerChildChannel {
            let seen: Seen
            func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
                channel.eventLoop.makeSucceededFuture(Value(channel: channel))
            }
            func handle(value: Value, logger: Logger) async {
                let loop = value.channel.eventLoop
                var seen = [loop.inEventLoop, EventLoopTaskExecutor.pinned?.eventLoop === loop]
                await EventLoopPinningTests.resumedElsewhere()
                seen.append(loop.inEventLoop)
                self.seen.values.withLock { $0 = seen }
            }
        }
        let channel = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        let recording = Recording(seen: Seen())
        let pinned = EventLoopPinned(inner: recording)
        let value = try await pinned.setup(channel: channel, logger: Logger(label: "test")).get()
        await pinned.handle(value: value, logger: Logger(label: "test"))
        #expect(recording.seen.values.withLock { $0 } == [true, true, true])
        // Not pinned (the local Google Play on the server's shared loops): the handler runs on
        // Swift's pool, with no executor to hand on.
        let unpinned = EventLoopPinned(inner: recording, pinned: false)
        await unpinned.handle(value: value, logger: Logger(label: "test"))
        #expect(recording.seen.values.withLock { $0 } == [false, false, false])
        try await channel.close()
    }

    @Test func onlyBoundedRoutesRunOnTheLoop() {
        let onLoop = [
            "/v1/accounts/u1", "/v1/accounts/u1/balances/coins/debit", "/v1/accounts/u1/grants", "/v1/purchases",
            "/v1/orders", "/v1/orders/o1", "/v1/retention/apple", "/healthz",
        ]
        let onPool = [
            "/v1/notifications/apple", "/v1/revenue", "/v1/audit", "/v1/anomalies", "/v1/rejected-proofs",
            "/v1/rejected-proofs/reverify",
            "/v1/extensions/mass", "/v1/retention/report", "/v1/status", "/metrics", "/dashboard",
            "/dashboard/accounts/u1", "/v1/accountsX", "/v1/ordersX", "/v1/purchases/x", "/",
        ]
        typealias Responder = DeadlineResponder<RouterResponder<StoreKeeperContext>>
        for path in onLoop { #expect(Responder.runsOnEventLoop(path), "\(path)") }
        for path in onPool { #expect(!Responder.runsOnEventLoop(path), "\(path)") }
    }
}
