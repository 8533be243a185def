import Foundation
import StoreKeeperStorage

/// A job kind and what runs it (true: it delivered a purchase). Each feature and each store
/// declares its own kinds beside its code; the runner looks a claimed job's kind up here, so a new
/// duty is a new registration, never an edit of the runner.
struct JobKind: Sendable {
    let name: String
    let run: @Sendable (JobRunner, JobStore.Job, Date) async -> Bool
    /// Runs a claim's jobs of this kind together (their reads and their completion one
    /// statement or transaction for the lot), when the kind does; else each job by `run`.
    var runBatch: (@Sendable (JobRunner, [JobStore.Job], Date) async -> Void)? = nil

    /// A duty run a claim's jobs at a time (`run` is the same for one job).
    static func batched(
        _ name: String, _ run: @escaping @Sendable (JobRunner) -> ([JobStore.Job], Date) async -> Void
    ) -> JobKind {
        JobKind(
            name: name,
            run: { runner, job, now in
                await run(runner)([job], now)
                return false
            },
            runBatch: { runner, jobs, now in await run(runner)(jobs, now) })
    }

    /// A duty that delivers nothing itself.
    static func duty(_ name: String, _ run: @escaping @Sendable (JobRunner) -> (JobStore.Job, Date) async -> Void)
        -> JobKind
    {
        JobKind(name: name) { runner, job, now in
            await run(runner)(job, now)
            return false
        }
    }
}

enum JobKinds {
    /// Every kind, by feature and store.
    static let all: [JobKind] =
        JobRunner.appStoreKinds + JobRunner.googlePlayKinds + JobRunner.googleExternalKinds + JobRunner.supportKinds
        + JobRunner.stripeKinds

    static let handlers: [String: @Sendable (JobRunner, JobStore.Job, Date) async -> Bool] = Dictionary(
        all.map { ($0.name, $0.run) }, uniquingKeysWith: { first, _ in first })

    static let batchHandlers: [String: @Sendable (JobRunner, [JobStore.Job], Date) async -> Void] = Dictionary(
        all.compactMap { kind in kind.runBatch.map { (kind.name, $0) } }, uniquingKeysWith: { first, _ in first })
}

extension JobRunner {
    /// The App Store's duties: notifications, lookups, Set App Account Token, Finish Transaction,
    /// consumption information, external purchase reports.
    static let appStoreKinds: [JobKind] = [
        JobKind(name: NotificationStore.jobKind) { runner, job, now in
            await runner.applyNotifications([job], now: now)
            return false
        },
        JobKind(name: "lookup_transaction") { runner, job, now in await runner.lookUpTransaction(job, now: now) },
        .duty(NotificationStore.consumptionJobKind) { $0.sendConsumption },
        .duty(AppleAccountStore.setTokenJobKind) { $0.setAppAccountToken },
        .duty(AppleAccountStore.finishJobKind) { $0.finishTransaction },
        .duty(ExternalPurchaseStore.reportJobKind) { $0.sendExternalReport },
    ]

    /// Google Play's duties: a notification's re-read, acknowledgement, order prices, voided purchases.
    static let googlePlayKinds: [JobKind] = [
        .duty(GooglePlayStore.syncJobKind) { $0.syncGoogle },
        .batched(GooglePlayStore.acknowledgeJobKind) { $0.acknowledgeGoogle },
        .batched(GooglePlayStore.orderPriceJobKind) { $0.priceGoogleOrders },
        .duty(googleVoidedJobKind) { $0.pollVoidedJob },
    ]

    /// The support desk's: subscription extensions, one and mass, and the mass extension's status.
    static let supportKinds: [JobKind] = [
        .duty(SupportStore.extendJobKind) { $0.sendExtension },
        .duty(SupportStore.massExtendJobKind) { $0.sendMassExtension },
        .duty(massStatusJobKind) { $0.pollMassExtension },
        .duty(StoreKeeperApp.googleRefundJobKind) { $0.retryGoogleRefund },
    ]
}
