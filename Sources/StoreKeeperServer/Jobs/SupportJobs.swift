import AppStoreClient
import AppStoreModels
import Foundation
import StoreKeeperStorage

/// Renewal-date extensions through the job queue: asked of Apple with the extension's own
/// request identifier on every retry (Apple applies a repeat once), until Apple answers.
extension JobRunner {
    static let massStatusJobKind = "extend_mass_status"

    static func reasonCode(_ reason: String) -> ExtendReasonCode {
        switch reason {
        case "customer_satisfaction": .customerSatisfaction
        case "other": .other
        case "service_issue": .serviceIssueOrOutage
        default: .undeclared
        }
    }

    func sendExtension(_ job: JobStore.Job, now: Date) async {
        do {
            guard let row = try await app.store.support.extensionRequest(job.payload),
                let original = row.originalTransactionId
            else {
                try await app.jobs.fail(job.id, error: "no extension \(job.payload)")
                return
            }
            guard let source = app.transactionSource else {
                try await app.store.support.completeExtension(
                    row.requestId, status: "failed", error: "no App Store Server API key configured", now: now)
                try await app.jobs.fail(job.id, error: "no App Store Server API key configured")
                return
            }
            let facts = try await app.store.support.subscriptionFacts(original)
            let request = ExtendRenewalDateRequest(
                extendByDays: Int32(row.days), extendReasonCode: Self.reasonCode(row.reason),
                requestIdentifier: row.requestId)
            let answer: ExtendRenewalDateResponse
            do {
                answer = try await source.extendRenewalDate(original, environment: facts.environment, request)
            } catch let error as AppStoreAPIError where Self.isFinal(error) {
                // Apple's final word (ineligible, two extensions already, unknown): a failed
                // extension, visible on the subscription and in the audit.
                try await app.store.support.completeExtension(
                    row.requestId, status: "failed", error: "\(error)", now: now)
                try await app.jobs.complete(job.id)
                return
            }
            guard answer.success != false else {
                try await app.store.support.completeExtension(
                    row.requestId, status: "failed", error: "Apple answered success: false", now: now)
                try await app.jobs.complete(job.id)
                return
            }
            try await app.store.support.completeExtension(
                row.requestId, status: "succeeded",
                effectiveDate: answer.effectiveDate.map { Date(timeIntervalSince1970: Double($0) / 1000) }, now: now)
            try await app.jobs.complete(job.id)
            // The new renewal date, from what Apple signs (the RENEWAL_EXTENDED notification
            // brings it too; whichever is signed later wins, the other is stale).
            if let latest = facts.latestTransactionId,
                let transaction = try? await app.purchases.fetchTransaction(latest)
            {
                _ = try? await app.store.reconciliation.applyAppleStatus(
                    1, transaction: transaction, renewalInfo: nil, catalog: app.catalog,
                    policy: app.configuration.ownershipPolicy, now: now)
            }
        } catch {
            await retryApple(job, error: error, now: now)
        }
    }

    func sendMassExtension(_ job: JobStore.Job, now: Date) async {
        do {
            guard let row = try await app.store.support.extensionRequest(job.payload), let productId = row.productId
            else {
                try await app.jobs.fail(job.id, error: "no mass extension \(job.payload)")
                return
            }
            guard let source = app.transactionSource else {
                try await app.store.support.completeExtension(
                    row.requestId, status: "failed", error: "no App Store Server API key configured", now: now)
                try await app.jobs.fail(job.id, error: "no App Store Server API key configured")
                return
            }
            do {
                _ = try await source.massExtend(
                    MassExtendRenewalDateRequest(
                        extendByDays: Int32(row.days), extendReasonCode: Self.reasonCode(row.reason),
                        requestIdentifier: row.requestId, productId: productId))
            } catch let error as AppStoreAPIError where Self.isFinal(error) {
                try await app.store.support.completeExtension(
                    row.requestId, status: "failed", error: "\(error)", now: now)
                try await app.jobs.complete(job.id)
                return
            }
            try await app.store.support.completeExtension(row.requestId, status: "sent", now: now)
            try await app.jobs.enqueue(
                kind: Self.massStatusJobKind, dedupeKey: "\(Self.massStatusJobKind)|\(row.requestId)",
                payload: row.requestId, runAt: now, now: now)
            try await app.jobs.complete(job.id)
        } catch {
            await retryApple(job, error: error, now: now)
        }
    }

    /// Polls Apple's status of a mass extension until it is complete (a minute apart).
    func pollMassExtension(_ job: JobStore.Job, now: Date) async {
        do {
            guard let row = try await app.store.support.extensionRequest(job.payload), let productId = row.productId,
                let source = app.transactionSource
            else {
                try await app.jobs.fail(job.id, error: "no mass extension \(job.payload)")
                return
            }
            let status = try await source.massExtendStatus(productId: productId, requestIdentifier: row.requestId)
            guard status.complete == true else {
                try await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(60), error: "not complete yet")
                return
            }
            try await app.store.support.completeExtension(
                row.requestId, status: "succeeded", succeeded: status.succeededCount.map(Int.init),
                failed: status.failedCount.map(Int.init), now: now)
            try await app.jobs.complete(job.id)
        } catch {
            await retryApple(job, error: error, now: now)
        }
    }

    /// Apple or the database could not answer: the same job (and request identifier) later.
    func retryApple(_ job: JobStore.Job, error: any Error, now: Date) async {
        let backoff = min(maxBackoff, pow(2, Double(min(job.attempts, 20))))
        var next = now.addingTimeInterval(Double.random(in: (backoff / 2)...backoff))
        if let retryAfter = (error as? AppStoreAPIError)?.retryAfter, retryAfter > next { next = retryAfter }
        try? await app.jobs.reschedule(job.id, runAt: next, error: "\(error)")
    }
}
