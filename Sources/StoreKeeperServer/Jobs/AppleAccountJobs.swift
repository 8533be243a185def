import AppStoreAdapter
import AppStoreClient
import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

/// Jobs that tell Apple something: Set App Account Token after a claim, Finish Transaction on
/// the server, External Purchase reports. Each retried like any Apple call; Apple's final
/// refusal ends it, audited.
extension JobRunner {
    func setAppAccountToken(_ job: JobStore.Job, now: Date) async {
        await setAppAccountTokens([job], now: now)
    }

    /// Set App Account Token for each claim: Apple is called for each in turn; the claims Apple
    /// took are completed (with their audit entries) in one database transaction; a refusal or
    /// an error is handled per job, as every Apple call is.
    /// `current`: whether a job's lease still holds (calls run one after another; one whose lease
    /// ran out meanwhile may be another runner's by now, and waits for the next claim).
    func setAppAccountTokens(
        _ jobs: [JobStore.Job], now: Date, current: (JobStore.Job) -> Bool = { _ in true }
    ) async {
        var done: [(id: String, audit: (actor: String, action: String, subject: String?, detail: String)?)] = []
        var refused:
            [(id: String, audit: (actor: String, action: String, subject: String?, detail: String), error: String)] =
                []
        for job in jobs where current(job) {
            guard let claim = try? JSONDecoder().decode(AppleAccountStore.ClaimJob.self, from: Data(job.payload.utf8))
            else {
                try? await app.jobs.fail(job.id, error: "malformed payload")
                continue
            }
            guard app.configuration.setAppAccountToken, let source = app.transactionSource else {
                done.append((job.id, nil))
                continue
            }
            await callApple(
                job, now: now, action: "app_account_token_set", subject: claim.originalTransactionId,
                completing: { done.append(($0, $1)) }, refusing: { refused.append(($0, $1, $2)) }
            ) {
                // Only while the account still owns it: a transfer since made another account's claim.
                guard
                    try await app.store.appleAccounts.owns(
                        claim.accountId, originalTransactionId: claim.originalTransactionId)
                else {
                    return
                        "not sent: transaction \(claim.originalTransactionId) is no longer account \(Identifiers.quoted(claim.accountId))'s"
                }
                let token = try await app.store.appleAccounts.accountToken(claim.accountId, now: now)
                try await source.setAppAccountToken(
                    claim.originalTransactionId, environment: claim.environment, token: token)
                return
                    "Set App Account Token: transaction \(claim.originalTransactionId) now carries account \(Identifiers.quoted(claim.accountId))'s token \(token.uuidString.lowercased())"
            }
        }
        do {
            try await app.jobs.complete(done, now: now, failed: refused)
        } catch {
            // Not recorded as done: each runs again once its lease ends (Apple's call is idempotent).
            app.logger.warning("cannot complete Set App Account Token jobs", metadata: ["error": "\(error)"])
        }
    }

    func finishTransaction(_ job: JobStore.Job, now: Date) async {
        let parts = job.payload.split(separator: "|", maxSplits: 1).map(String.init)
        guard parts.count == 2, let source = app.transactionSource else {
            try? await app.jobs.fail(job.id, error: "no App Store Server API key configured, or a malformed payload")
            return
        }
        await callApple(job, now: now, action: "transaction_finished", subject: parts[1]) {
            try await source.finishTransaction(parts[1], environment: parts[0])
            try await app.store.appleAccounts.markFinished(parts[1], now: now)
            return "Finish Transaction: \(parts[1]) finished on the server"
        }
    }

    /// Runs one Apple call of `job`: audited on success and on Apple's final refusal; anything
    /// else (network, 5xx, 429, the database) comes back later with backoff.
    func callApple(
        _ job: JobStore.Job, now: Date, action: String, subject: String,
        completing: ((String, (actor: String, action: String, subject: String?, detail: String)) -> Void)? = nil,
        refusing: ((String, (actor: String, action: String, subject: String?, detail: String), String) -> Void)? = nil,
        _ body: () async throws -> String
    ) async {
        do {
            let detail = try await body()
            let audit = (actor: "storekeeper", action: action, subject: Optional(subject), detail: detail)
            if let completing {
                completing(job.id, audit)
                return
            }
            try await app.jobs.complete(job.id, audit: audit, now: now)
        } catch let error where Self.isFinal(error) {
            if let refusing {
                refusing(
                    job.id,
                    (
                        actor: "storekeeper", action: action + "_refused", subject: subject,
                        detail: "Apple refused: \(error)"
                    ),
                    "\(error)")
                return
            }
            try? await app.store.anomalies.recordAudit(
                actor: "storekeeper", action: action + "_refused", subject: subject, detail: "Apple refused: \(error)",
                now: now)
            try? await app.jobs.fail(job.id, error: "\(error)")
        } catch {
            var backoff = min(maxBackoff, pow(2, Double(min(job.attempts, 20))))
            if let retryAfter = (error as? AppStoreAPIError)?.retryAfter {
                backoff = max(backoff, retryAfter.timeIntervalSince(now))
            }
            try? await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: "\(error)")
        }
    }
}

extension JobRunner {
    /// Sends the token's next External Purchase report (see `ExternalPurchaseStore.nextReport`).
    func sendExternalReport(_ job: JobStore.Job, now: Date) async {
        let token = job.payload
        guard app.configuration.externalPurchaseReporting, let source = app.transactionSource else {
            try? await app.store.anomalies.recordAudit(
                actor: "storekeeper", action: "external_report_skipped", subject: token,
                detail: "not reported: apple.externalPurchase.reporting is off or no Server API key is configured",
                now: now)
            try? await app.jobs.complete(job.id)
            return
        }
        let external = ExternalPurchaseStore(database: app.database)
        do {
            guard let (requestId, report) = try await external.nextReport(token, now: now) else {
                try await app.jobs.complete(job.id)
                return
            }
            do {
                try await source.sendExternalReport(ExternalPurchaseReport(report), sandbox: token.hasPrefix("SANDBOX"))
            } catch let error where Self.isFinal(error) {
                try await external.reportFailed(requestId, token: token, reason: "\(error)", final: true, now: now)
                try await app.jobs.fail(job.id, error: "\(error)")
                return
            } catch {
                try await external.reportFailed(requestId, token: token, reason: "\(error)", final: false, now: now)
                throw error
            }
            try await external.reportSent(requestId, report, now: now)
            // More may have arrived meanwhile: the next run finds nothing or sends them.
            try await app.jobs.complete(job.id)
        } catch {
            let backoff = min(maxBackoff, pow(2, Double(min(job.attempts, 20))))
            try? await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: "\(error)")
        }
    }
}
