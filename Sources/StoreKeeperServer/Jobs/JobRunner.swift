import AppStoreClient
import AppStoreModels
import AppStoreVerification
import Foundation
import Logging
import ServiceLifecycle
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// What a `lookup_transaction` job carries.
struct LookupJob: Codable {
    var transactionId: String
    var accountId: String
    var orderId: String?
}

/// Retries work that needs Apple until Apple answers: exponential backoff with full jitter,
/// Apple's `Retry-After` honoured, and a `verification_stuck` anomaly when a job has waited
/// too long (it keeps retrying; nothing is dropped — invariant 2).
public struct JobRunner: Service {
    let app: StoreKeeperApp
    let pollInterval: Duration
    let stuckAfter: TimeInterval
    let maxBackoff: TimeInterval

    public init(
        app: StoreKeeperApp, pollInterval: Duration = .seconds(1), stuckAfter: TimeInterval = 600,
        maxBackoff: TimeInterval = 900
    ) {
        self.app = app
        self.pollInterval = pollInterval
        self.stuckAfter = stuckAfter
        self.maxBackoff = maxBackoff
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                _ = await runDue(now: Date())
                try await Task.sleep(for: pollInterval)
            }
        }
    }

    /// Runs every job due at `now`; returns how many were delivered.
    @discardableResult
    public func runDue(now: Date) async -> Int {
        let jobs: [JobStore.Job]
        do {
            jobs = try await app.jobs.claimDue(now: now)
        } catch {
            app.logger.warning("cannot claim jobs", metadata: ["error": "\(error)"])
            return 0
        }
        var delivered = 0
        for job in jobs {
            if await run(job, now: now) { delivered += 1 }
        }
        return delivered
    }

    func run(_ job: JobStore.Job, now: Date) async -> Bool {
        guard job.kind == "lookup_transaction",
            let lookup = try? JSONDecoder().decode(LookupJob.self, from: Data(job.payload.utf8))
        else {
            try? await app.jobs.fail(job.id, error: "unknown job kind \(job.kind)")
            return false
        }
        do {
            let transaction = try await app.fetchTransaction(lookup.transactionId)
            _ = try await app.store.deliver(
                transaction, submittingAccount: lookup.accountId, requestedOrderId: lookup.orderId,
                catalog: app.catalog,
                policy: app.configuration.ownershipPolicy, evidence: .lookup, now: now)
            try await app.jobs.complete(job.id)
            return true
        } catch let error as AppStoreAPIError where error.isRetryable {
            await retry(job, lookup: lookup, reason: error.description, retryAfter: error.retryAfter, now: now)
        } catch let failure as VerificationFailure where failure.isRetryable {
            await retry(job, lookup: lookup, reason: failure.description, retryAfter: nil, now: now)
        } catch let error as AppStoreAPIError where error.kind == .unauthorized {
            app.noteAppleRefusal(error)
            await retry(job, lookup: lookup, reason: error.description, retryAfter: nil, now: now)
        } catch let error where !Self.isFinal(error) {
            // The database, the network, anything but a final answer from Apple: try again later.
            await retry(job, lookup: lookup, reason: "\(error)", retryAfter: nil, now: now)
        } catch {
            // Apple answered, and the answer is final (unknown id, forged data…): an operator looks.
            if let failure = error as? VerificationFailure {
                app.metrics.verificationFailure(failure.code)
                await app.keepRejected(
                    .transactionId(lookup.transactionId), failure: failure, accountId: lookup.accountId,
                    orderId: lookup.orderId)
            }
            try? await app.jobs.fail(job.id, error: "\(error)")
            try? await app.store.raiseAnomaly(
                AnomalyDraft(
                    kind: .verificationStuck, transactionId: lookup.transactionId, orderId: lookup.orderId,
                    accountId: lookup.accountId, detail: "lookup failed for good: \(error)"),
                dedupeKey: "verification_stuck|\(job.id)", now: now)
        }
        return false
    }

    /// Only Apple's own final answers end a job: a permanent Server API error (unknown
    /// transaction, bad request) or a proof that does not verify.
    static func isFinal(_ error: any Error) -> Bool {
        switch error {
        case let error as AppStoreAPIError:
            // A refused token (key or clock) is the server's to fix, not the purchase's fate.
            if error.kind == .unauthorized { return false }
            return !error.isRetryable
        case let failure as VerificationFailure: return !failure.isRetryable
        default: return false
        }
    }

    private func retry(_ job: JobStore.Job, lookup: LookupJob, reason: String, retryAfter: Date?, now: Date) async {
        let backoff = min(maxBackoff, pow(2, Double(min(job.attempts, 20))))
        var next = now.addingTimeInterval(Double.random(in: (backoff / 2)...backoff))
        if let retryAfter, retryAfter > next { next = retryAfter }
        try? await app.jobs.reschedule(job.id, runAt: next, error: reason)
        if !job.stuckReported, now.timeIntervalSince(job.createdAt) >= stuckAfter {
            try? await app.store.raiseAnomaly(
                AnomalyDraft(
                    kind: .verificationStuck, transactionId: lookup.transactionId, orderId: lookup.orderId,
                    accountId: lookup.accountId,
                    detail: "Apple has not answered for \(Int(now.timeIntervalSince(job.createdAt))) s: \(reason)"),
                dedupeKey: "verification_stuck|\(job.id)", now: now)
            try? await app.jobs.markStuckReported(job.id)
        }
    }
}
