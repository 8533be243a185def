import AppStoreModels
import Foundation
import StoreKeeperCore
import StoreKeeperStorage

// The JSON bodies of docs/api.md: camelCase keys, ISO 8601 UTC timestamps, Apple ids as strings.

struct AnomalyJSON: Encodable {
    var id: String
    var kind: String
    var status: String
    var transactionId: String?
    var orderId: String?
    var accountId: String?
    var detail: String
    var createdAt: String
    var resolvedAt: String?
    var resolution: String?
    /// The store of the transaction it is about (`app_store`, `google_play`, `web`).
    var store: String?
    /// The app of its delivery or order (when one was recorded).
    var appId: String?
    /// A manual delivery's answer (`POST /v1/anomalies/{id}/resolve` with `deliver`).
    var outcome: AnomaliesController.ResolveOutcome?

    init(_ anomaly: AnomalyStore.StoredAnomaly) {
        id = anomaly.id
        kind = anomaly.kind
        status = anomaly.status
        transactionId = anomaly.transactionId
        orderId = anomaly.orderId
        accountId = anomaly.accountId
        detail = anomaly.detail
        createdAt = StoreKeeperApp.iso(anomaly.createdAt)
        resolvedAt = anomaly.resolvedAt.map(StoreKeeperApp.iso)
        resolution = anomaly.resolution
        store = anomaly.store
        appId = anomaly.appId
    }
}

struct AuditJSON: Encodable {
    var id: String
    var actor: String
    var action: String
    var subject: String?
    var detail: String
    var createdAt: String

    init(_ entry: AnomalyStore.AuditEntry) {
        id = entry.id
        actor = entry.actor
        action = entry.action
        subject = entry.subject
        detail = entry.detail
        createdAt = StoreKeeperApp.iso(entry.createdAt)
    }
}
