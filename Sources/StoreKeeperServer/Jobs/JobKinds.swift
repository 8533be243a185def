import Foundation
import StoreKeeperStorage

/// A job kind and what runs it (true: it delivered a purchase). Each feature and each store
/// declares its own kinds beside its code; the runner looks a claimed job's kind up here, so a new
/// duty is a new registration, never an edit of the runner.
struct JobKind: Sendable {
    let name: String
    let run: @Sendable (JobRunner, JobStore.Job, Date) async -> Bool

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
        .duty(GooglePlayStore.acknowledgeJobKind) { $0.acknowledgeGoogle },
        .duty(GooglePlayStore.orderPriceJobKind) { $0.priceGoogleOrder },
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
