import HummingbirdCore
import Logging
import NIOCore
import Synchronization

/// An event loop as a Swift task executor: a job enqueued here runs on the loop's thread.
public final class EventLoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    public let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }

    /// One executor per event loop, made on first use (a server has as many loops as cores).
    public static func of(_ eventLoop: any EventLoop) -> EventLoopTaskExecutor {
        let id = ObjectIdentifier(eventLoop)
        return executors.withLock { executors in
            if let executor = executors[id] { return executor }
            let executor = EventLoopTaskExecutor(eventLoop)
            executors[id] = executor
            return executor
        }
    }

    private static let executors = Mutex<[ObjectIdentifier: EventLoopTaskExecutor]>([:])

    /// The executor the current connection's task prefers, for tasks it starts on its behalf.
    @TaskLocal public static var pinned: EventLoopTaskExecutor?
}

/// A connection handled on its own event loop's thread. Hummingbird reads each request from,
/// and writes each answer to, the connection's event loop; its handler task ran on Swift's
/// shared pool, so every request crossed threads twice (a wake-up each way). With the
/// connection's task preferring the loop's executor, the handler runs where the bytes are and
/// the crossings disappear (account reads: ~10 % less CPU each, BENCHMARKS.md). The SQLite
/// writer keeps its thread either way. Unstructured tasks are not pinned (Swift does not pass
/// the preference on to them) unless they ask: `DeadlineResponder` does, for the routes whose
/// work is bounded (`runsOnEventLoop`).
public struct EventLoopPinned<Inner: ServerChildChannel>: ServerChildChannel {
    public typealias Value = Inner.Value
    let inner: Inner
    /// False: the connection's handlers run on Swift's shared pool, as without this wrapper.
    let pinned: Bool

    public init(inner: Inner, pinned: Bool = true) {
        self.inner = inner
        self.pinned = pinned
    }

    public func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        inner.setup(channel: channel, logger: logger)
    }

    public func handle(value: Value, logger: Logger) async {
        guard pinned else { return await inner.handle(value: value, logger: logger) }
        let executor = EventLoopTaskExecutor.of(value.channel.eventLoop)
        await EventLoopTaskExecutor.$pinned.withValue(executor) {
            await withTaskExecutorPreference(executor) {
                await inner.handle(value: value, logger: logger)
            }
        }
    }
}
