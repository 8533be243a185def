import AppStoreAdapter
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
                // A full claim means more are due: go again at once (a notification burst is
                // applied as fast as the database allows, not 64 a second).
                if await runDueCounting(now: Date()).claimed < claimLimit {
                    try await Task.sleep(for: pollInterval)
                }
            }
        }
    }

    /// Runs every job due at `now`; returns how many were delivered.
    @discardableResult
    public func runDue(now: Date) async -> Int {
        await runDueCounting(now: now).delivered
    }

    let claimLimit = 64

    func runDueCounting(now: Date) async -> (claimed: Int, delivered: Int) {
        let jobs: [JobStore.Job]
        // Set App Account Token claims wait, unread, while Apple's rate is spent.
        let rated = app.configuration.setAppAccountToken && app.transactionSource != nil
        do {
            jobs = try await app.jobs.claimDue(
                now: now, limit: claimLimit,
                excluding: rated && app.setAppAccountTokenRate.spent ? [AppleAccountStore.setTokenJobKind] : [])
        } catch {
            app.logger.warning("cannot claim jobs", metadata: ["error": "\(error)"])
            return (0, 0)
        }
        // Jobs run one after another and an Apple lookup may take its whole timeout: a job
        // whose lease is (nearly) over may be another runner's by now — it waits for the next
        // claim instead of running twice at once.
        func current(_ job: JobStore.Job) -> Bool { Date() < job.leasedUntil.addingTimeInterval(-15) }
        // Notifications first, every claimed subject in one transaction.
        await applyNotifications(jobs.filter { $0.kind == NotificationStore.jobKind && current($0) }, now: now)
        // Set App Account Token claims (one per purchase made outside the app): completed together.
        var claims = jobs.filter { $0.kind == AppleAccountStore.setTokenJobKind && current($0) }
        var postponed = 0
        if rated, !claims.isEmpty {
            // At Apple's rate (per environment): those over it are due again in a second.
            var later: [String] = []
            let bySandbox = Dictionary(grouping: claims) { job in
                (try? JSONDecoder().decode(AppleAccountStore.ClaimJob.self, from: Data(job.payload.utf8)))?.environment
                    == "Sandbox"
            }
            for (sandbox, ofIt) in bySandbox {
                let allowed = app.setAppAccountTokenRate.take(ofIt.count, sandbox: sandbox)
                later += ofIt.dropFirst(allowed).map(\.id)
            }
            if !later.isEmpty {
                postponed = later.count
                let waiting = Set(later)
                claims.removeAll { waiting.contains($0.id) }
                try? await app.jobs.postpone(later, until: now.addingTimeInterval(1))
            }
        }
        if !claims.isEmpty { await setAppAccountTokens(claims, now: now, current: current) }
        // Kinds run a claim at a time (Google Play's acknowledgements and order prices): each
        // kind's jobs together.
        var batched: Set<String> = [NotificationStore.jobKind, AppleAccountStore.setTokenJobKind]
        for (kind, ofKind) in Dictionary(grouping: jobs, by: \.kind) {
            guard let runBatch = JobKinds.batchHandlers[kind] else { continue }
            batched.insert(kind)
            let live = ofKind.filter(current)
            if !live.isEmpty { await runBatch(self, live, now) }
        }
        var delivered = 0
        for job in jobs where !batched.contains(job.kind) {
            guard current(job) else { continue }
            if await run(job, now: now) { delivered += 1 }
        }
        // Claims postponed for Apple's rate are not work done: a claim full of them is no reason
        // to go again at once.
        return (jobs.count - postponed, delivered)
    }

    func run(_ job: JobStore.Job, now: Date) async -> Bool {
        guard let handler = JobKinds.handlers[job.kind] else {
            try? await app.jobs.fail(job.id, error: "unknown job kind \(job.kind)")
            return false
        }
        return await handler(self, job, now)
    }

    /// `lookup_transaction`: a transaction submitted by id, fetched from Apple and delivered
    /// (true: delivered).
    func lookUpTransaction(_ job: JobStore.Job, now: Date) async -> Bool {
        guard let lookup = try? JSONDecoder().decode(LookupJob.self, from: Data(job.payload.utf8))
        else {
            try? await app.jobs.fail(job.id, error: "unknown job kind \(job.kind)")
            return false
        }
        do {
            let transaction = try await app.purchases.fetchTransaction(lookup.transactionId)
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
            app.purchases.noteAppleRefusal(error)
            await retry(job, lookup: lookup, reason: error.description, retryAfter: nil, now: now)
        } catch let error where !Self.isFinal(error) {
            // The database, the network, anything but a final answer from Apple: try again later.
            await retry(job, lookup: lookup, reason: "\(error)", retryAfter: nil, now: now)
        } catch {
            // Apple answered, and the answer is final (unknown id, forged data…): an operator looks.
            if let failure = error as? VerificationFailure {
                app.metrics.verificationFailure(failure.code)
                await app.purchases.keepRejected(
                    .transactionId(lookup.transactionId), failure: failure, accountId: lookup.accountId,
                    orderId: lookup.orderId)
            }
            try? await app.jobs.fail(job.id, error: "\(error)")
            try? await app.store.anomalies.raiseAnomaly(
                AnomalyDraft(
                    kind: .verificationStuck, transactionId: lookup.transactionId, orderId: lookup.orderId,
                    accountId: lookup.accountId, detail: "lookup failed for good: \(error)"),
                dedupeKey: "verification_stuck|\(job.id)", now: now)
        }
        return false
    }

    /// Applies the pending notifications of the jobs' subjects (their payloads), each subject in
    /// order, all in one transaction; if that fails for anything but an outage (a conflict
    /// with a delivery another instance made at the same moment), each subject goes alone.
    func applyNotifications(_ jobs: [JobStore.Job], now: Date) async {
        guard !jobs.isEmpty else { return }
        let settings = app.notificationSettings()
        func apply(_ jobs: [JobStore.Job]) async throws {
            let applied = try await app.notifications.apply(
                subjects: jobs.map(\.payload),
                completing: jobs.map { .init(jobId: $0.id, leasedUntil: $0.leasedUntil) }, settings: settings, now: now)
            for result in applied where result.status != "applied" {
                app.logger.info(
                    "notification \(result.status)",
                    metadata: ["notification": "\(result.notificationUUID)", "outcome": "\(result.outcome)"])
            }
        }
        do {
            try await apply(jobs)
            return
        } catch  where jobs.count > 1 && StorageUnavailable.classify(error) == nil {
            for job in jobs {
                do {
                    try await apply([job])
                } catch {
                    await retry(job, error: error, now: now)
                }
            }
        } catch {
            for job in jobs { await retry(job, error: error, now: now) }
        }
    }

    /// The database (down, restarting, locked) or a conflict: the notifications stay pending,
    /// the job comes back soon.
    private func retry(_ job: JobStore.Job, error: any Error, now: Date) async {
        let backoff = min(60, pow(2, Double(min(job.attempts, 6))))
        try? await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: "\(error)")
    }

    /// Answers a CONSUMPTION_REQUEST (the job's payload is the transaction id) with Send
    /// Consumption Information built from our records; the request sent and Apple's answer
    /// are kept in the audit log. Retried like any Apple call, within Apple's 12 hours.
    func sendConsumption(_ job: JobStore.Job, now: Date) async {
        let transactionId = job.payload
        guard let source = app.transactionSource else {
            try? await app.jobs.fail(job.id, error: "no App Store Server API key configured")
            return
        }
        guard now.timeIntervalSince(job.createdAt) < 12 * 3600 else {
            try? await app.jobs.fail(job.id, error: "Apple's 12-hour window to answer has passed")
            try? await app.store.anomalies.recordAudit(
                actor: "storekeeper", action: "consumption_expired", subject: transactionId,
                detail: "not answered within Apple's 12 hours: \(job.attempts) attempts", now: now)
            return
        }
        do {
            let (facts, environment, consent) = try await app.store.accounts.consumptionFacts(
                transactionId, catalog: app.catalog)
            guard consent?.consumptionData == true else {
                // Withdrawn since the request was queued: Apple gets nothing.
                try await app.store.anomalies.recordAudit(
                    actor: "storekeeper", action: "consumption_withheld", subject: transactionId,
                    detail:
                        "not sent: account \(consent.map { Identifiers.quoted($0.accountId) } ?? "(unknown)") no longer consents to sharing consumption data",
                    now: now)
                try await app.jobs.complete(job.id)
                return
            }
            let product = app.catalog.product(facts.productId)
            let answer = ConsumptionPlanner.answer(
                facts, policy: app.catalog.refunds,
                sampleContentProvided: product?.introductoryOffer != nil
                    || app.catalog.refunds.sampleContentProvided == true,
                now: now)
            let request = answer.appleRequest
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            var body = String(decoding: try encoder.encode(request), as: UTF8.self)
            body +=
                answer.rule.map { " (refundPreference by rule '\($0)'\(answer.note.map { "; \($0)" } ?? ""))" }
                ?? " (no refund preference rule matched)"
            do {
                try await source.sendConsumption(transactionId, environment: environment, request)
            } catch let error as AppStoreAPIError where Self.isFinal(error) {
                try await app.store.anomalies.recordAudit(
                    actor: "storekeeper", action: "consumption_refused", subject: transactionId,
                    detail: "sent \(body); Apple refused: \(error)", now: now)
                try await app.jobs.fail(job.id, error: "\(error)")
                return
            }
            try await app.store.anomalies.recordAudit(
                actor: "storekeeper", action: "consumption_sent", subject: transactionId,
                detail: "sent \(body); Apple accepted it", now: now)
            try await app.jobs.complete(job.id)
        } catch {
            let backoff = min(1800, pow(2, Double(min(job.attempts, 20))))
            try? await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: "\(error)")
        }
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
            try? await app.store.anomalies.raiseAnomaly(
                AnomalyDraft(
                    kind: .verificationStuck, transactionId: lookup.transactionId, orderId: lookup.orderId,
                    accountId: lookup.accountId,
                    detail: "Apple has not answered for \(Int(now.timeIntervalSince(job.createdAt))) s: \(reason)"),
                dedupeKey: "verification_stuck|\(job.id)", now: now)
            try? await app.jobs.markStuckReported(job.id)
        }
    }
}
