import StoreKeeperStorage
import Testing

@testable import StoreKeeperServer

/// The typed job registry: every kind the server queues has exactly one handler, declared by its
/// feature or store.
@Suite struct JobKindsTests {
    @Test func everyQueuedKindHasOneHandler() {
        let names = JobKinds.all.map(\.name)
        #expect(Set(names).count == names.count, "a kind registered twice: \(names)")
        for kind in [
            NotificationStore.jobKind, NotificationStore.consumptionJobKind, AppleAccountStore.setTokenJobKind,
            AppleAccountStore.finishJobKind, ExternalPurchaseStore.reportJobKind, SupportStore.extendJobKind,
            SupportStore.massExtendJobKind, JobRunner.massStatusJobKind, GooglePlayStore.syncJobKind,
            GooglePlayStore.acknowledgeJobKind, GooglePlayStore.orderPriceJobKind, JobRunner.googleVoidedJobKind,
            "lookup_transaction",
        ] {
            #expect(JobKinds.handlers[kind] != nil, "no handler for \(kind)")
        }
    }
}
