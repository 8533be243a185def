import Foundation
import GooglePlay
import StoreKeeperStorage

/// Google Play's external transactions: the journal's reports sent to Google
/// (`externalTransactions`), each retried with backoff until Google accepts or refuses it for
/// good; a refund waits for its payment's report.
extension JobRunner {
    static let googleExternalKinds: [JobKind] = [.duty(ExternalTransactionStore.jobKind) { $0.sendGoogleExternal }]

    func sendGoogleExternal(_ job: JobStore.Job, now: Date) async {
        let journal = ExternalTransactionStore(database: app.database)
        let payload = job.payload
        do {
            if payload.hasPrefix("tx:") {
                try await reportGoogleExternal(String(payload.dropFirst(3)), journal: journal, job: job, now: now)
            } else if payload.hasPrefix("refund:") {
                try await refundGoogleExternal(String(payload.dropFirst(7)), journal: journal, job: job, now: now)
            } else {
                try await app.jobs.fail(job.id, error: "unknown payload")
            }
        } catch {
            let backoff = min(maxBackoff, pow(2, Double(min(job.attempts, 20))))
            try? await app.jobs.reschedule(job.id, runAt: now.addingTimeInterval(backoff), error: "\(error)")
        }
    }

    /// The report of one payment; Google's "already exists" for our id is success (a retry
    /// after a lost answer), read back to be sure.
    func reportGoogleExternal(
        _ id: String, journal: ExternalTransactionStore, job: JobStore.Job, now: Date
    ) async throws {
        guard let transaction = try await journal.transaction(id), transaction.state == "pending" else {
            try await app.jobs.complete(job.id)
            return
        }
        guard let google = app.google[transaction.googleAppId] else {
            try await journal.markFailed(
                transaction: id, error: "Google Play app '\(transaction.googleAppId)' is not configured", final: true,
                now: now)
            try await app.jobs.fail(job.id, error: "no Google Play app")
            return
        }
        do {
            _ = try await google.client.createExternalTransaction(id: id, Self.externalTransaction(transaction))
        } catch let error as GooglePlayError where error.status == 409 {
            // Already reported under this id: Google's record answers.
            _ = try await google.client.externalTransaction(id: id)
        } catch let error as GooglePlayError where error.kind == .refused || error.kind == .notFound {
            try await journal.markFailed(transaction: id, error: "\(error)", final: true, now: now)
            try await app.jobs.fail(job.id, error: "\(error)")
            return
        } catch {
            try await journal.markFailed(transaction: id, error: "\(error)", final: false, now: now)
            throw error
        }
        try await journal.markReported(transaction: id, now: now)
        try await app.jobs.complete(job.id)
    }

    func refundGoogleExternal(
        _ id: String, journal: ExternalTransactionStore, job: JobStore.Job, now: Date
    ) async throws {
        guard let refund = try await journal.refund(id), refund.state == "pending",
            let transaction = try await journal.transaction(refund.transactionId)
        else {
            try await app.jobs.complete(job.id)
            return
        }
        guard transaction.state == "reported" else {
            if transaction.state == "failed" {
                try await journal.markFailed(
                    refund: id, error: "its payment's report was refused: nothing to refund at Google", final: true,
                    now: now)
                try await app.jobs.complete(job.id)
                return
            }
            // Its payment's report first (a refund of an unknown transaction is refused).
            throw GooglePlayError(.unavailable, "waiting for the payment's report")
        }
        guard let google = app.google[transaction.googleAppId] else {
            try await journal.markFailed(refund: id, error: "Google Play app not configured", final: true, now: now)
            try await app.jobs.fail(job.id, error: "no Google Play app")
            return
        }
        let body = ExternalTransactionRefund(
            refundTime: GoogleTime.format(Date(storeMilliseconds: refund.refundTime)),
            fullRefund: refund.full ? .init() : nil,
            partialRefund: refund.full
                ? nil
                : .init(
                    refundId: refund.refundId,
                    refundPreTaxAmount: .init(
                        priceMicros: String(refund.preTaxMicros), currency: transaction.currency)))
        do {
            _ = try await google.client.refundExternalTransaction(id: transaction.id, body)
        } catch let error as GooglePlayError where error.status == 409 && error.reason == "alreadyExists" {
            // This refund id was recorded by an attempt whose answer was lost.
        } catch let error as GooglePlayError where error.kind == .refused || error.kind == .notFound {
            try await journal.markFailed(refund: id, error: "\(error)", final: true, now: now)
            try await app.jobs.fail(job.id, error: "\(error)")
            return
        } catch {
            try await journal.markFailed(refund: id, error: "\(error)", final: false, now: now)
            throw error
        }
        try await journal.markReported(refund: id, now: now)
        try await app.jobs.complete(job.id)
    }

    /// The request body: amounts, time, the buyer's tax address, one-time or recurring (the
    /// first with the app's token, a renewal with the first report's id).
    static func externalTransaction(_ journal: ExternalTransactionStore.Transaction) -> ExternalTransaction {
        var body = ExternalTransaction()
        body.originalPreTaxAmount = .init(priceMicros: String(journal.preTaxMicros), currency: journal.currency)
        body.originalTaxAmount = .init(priceMicros: String(journal.taxMicros), currency: journal.currency)
        body.transactionTime = GoogleTime.format(Date(storeMilliseconds: journal.transactionTime))
        body.userTaxAddress = .init(regionCode: journal.regionCode, administrativeArea: journal.administrativeArea)
        if journal.recurring {
            body.recurringTransaction = .init(
                externalTransactionToken: journal.token, initialExternalTransactionId: journal.initialId,
                externalSubscription: .init(subscriptionType: "RECURRING"))
        } else {
            body.oneTimeTransaction = .init(externalTransactionToken: journal.token)
        }
        return body
    }
}
