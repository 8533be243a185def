import Foundation
import SQLKit
import Synchronization

/// Group commit for small durable writes: items that arrive while a commit is in flight are
/// written together by the next database transaction — one commit (one fsync) for all of
/// them — and every caller is answered only once that commit is durable. Used for accepted
/// notifications, where each item is one insert and a failing batch fails whole (the sender
/// retries).
final class GroupCommit<Item: Sendable>: Sendable {
    private struct Waiting: Sendable {
        var item: Item
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var pending: [Waiting] = []
        var draining = false
    }

    let database: Database
    let maxBatch: Int
    let write: @Sendable ([Item], any SQLDatabase) async throws -> Void
    private let state = Mutex(State())

    init(
        database: Database, maxBatch: Int = 256,
        write: @escaping @Sendable ([Item], any SQLDatabase) async throws -> Void
    ) {
        self.database = database
        self.maxBatch = maxBatch
        self.write = write
    }

    /// Returns once `item` is committed; throws when its batch could not be.
    func commit(_ item: Item) async throws {
        try await withCheckedThrowingContinuation { continuation in
            let start = state.withLock { state -> Bool in
                state.pending.append(Waiting(item: item, continuation: continuation))
                guard !state.draining else { return false }
                state.draining = true
                return true
            }
            if start { Task { await self.drain() } }
        }
    }

    private func drain() async {
        while true {
            let batch = state.withLock { state -> [Waiting] in
                let taken = Array(state.pending.prefix(maxBatch))
                state.pending.removeFirst(taken.count)
                if taken.isEmpty { state.draining = false }
                return taken
            }
            if batch.isEmpty { return }
            let items = batch.map(\.item)
            do {
                try await database.transaction { sql in try await self.write(items, sql) }
                for waiting in batch { waiting.continuation.resume() }
            } catch {
                let failure = StorageUnavailable.classify(error) ?? error
                for waiting in batch { waiting.continuation.resume(throwing: failure) }
            }
        }
    }
}
