import Foundation

/// A task executor that owns one thread. SQLite work runs on it start to finish — every
/// statement of a transaction, and the commit's fsync — without hopping between threads per
/// statement and without blocking a thread of Swift's cooperative pool.
final class ThreadExecutor: TaskExecutor, @unchecked Sendable {
    // `condition` guards `jobs` and `stopped`.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var stopped = false

    init(name: String) {
        let thread = Thread { [self] in run() }
        thread.name = name
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        let accepted = !stopped
        if accepted {
            jobs.append(job)
            condition.signal()
        }
        condition.unlock()
        // After `stop`, work still runs (on the shared pool) rather than waiting forever.
        if !accepted { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }

    /// Ends the thread once the jobs already queued have run; later jobs run on the shared pool.
    func stop() {
        condition.lock()
        stopped = true
        condition.signal()
        condition.unlock()
    }

    private func run() {
        var running: [UnownedJob] = []
        while true {
            condition.lock()
            while jobs.isEmpty && !stopped { condition.wait() }
            if jobs.isEmpty && stopped {
                condition.unlock()
                return
            }
            swap(&running, &jobs)
            condition.unlock()
            for job in running { job.runSynchronously(on: asUnownedTaskExecutor()) }
            running.removeAll(keepingCapacity: true)
        }
    }
}
