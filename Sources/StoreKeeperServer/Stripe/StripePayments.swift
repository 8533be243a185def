import Foundation
import Logging
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperStorage

/// Stripe's side of the server: its webhook and redemptions (`StripeController`), its events
/// applied by the job runner, support's Stripe refunds. It owns what that takes — Stripe's apps,
/// the stores it writes, the catalog — and delivers through the one delivery path like every
/// store; it never reaches the app.
struct StripePayments: RequestHandling, CarriesAccountView, Sendable {
    let configuration: ServerConfiguration
    let database: Database
    let store: PurchaseStore
    let jobs: JobStore
    let notifications: NotificationStore
    let catalog: Catalog
    /// The Stripe apps, by id.
    let stripe: [String: StripeApp]
    /// The Google Play apps, by id (a Stripe payment made from an Android app is reported to Google).
    let google: [String: GooglePlayApp]
    /// Stripe Checkout (the app a payment names, sessions opened).
    let checkouts: StripeCheckouts
    let metrics: ServerMetrics
    let logger: Logger
    /// The account view a redemption answers with.
    let accountBook: AccountBook
    /// How refunds and disputes are applied (the one refund path).
    let notificationSettings: NotificationStore.Settings

    var maxBodyBytes: Int { configuration.maxBodyBytes }
}

extension StoreKeeperApp {
    /// Stripe's side of the server, built from the app's parts (`StripePayments`).
    var stripePayments: StripePayments {
        StripePayments(
            configuration: configuration, database: database, store: store, jobs: jobs, notifications: notifications,
            catalog: catalog, stripe: stripe, google: google, checkouts: checkouts, metrics: metrics, logger: logger,
            accountBook: accountBook, notificationSettings: notificationSettings())
    }

    /// Stripe Checkout as the orders and Stripe's routes use it.
    var checkouts: StripeCheckouts {
        StripeCheckouts(stripe: stripe, database: database, orderTTL: configuration.orderTTL)
    }
}
