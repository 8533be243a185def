import Foundation
import GooglePlay
import StoreKeeperCore
import StoreKeeperStorage
import StoreKeeperSupport

/// Google Play's duties as jobs in the one durable queue: re-reading a token after a
/// notification, acknowledging (consuming) within three days, polling voided purchases, and
/// answering refund reviews within 24 hours.
extension JobRunner {
    static let googleVoidedJobKind = "google_voided_poll"

    func backoff(_ job: JobStore.Job, now: Date, error: any Error) async {
        let delay = min(900, pow(2, Double(min(job.attempts, 20))))
        try? await app.jobs.reschedule(
            job.id, runAt: now.addingTimeInterval(Double.random(in: (delay / 2)...delay)), error: "\(error)")
    }

    /// A notification's job: the purchase read again and applied (or the voided list polled,
    /// or the refund review answered).
    func syncGoogle(_ job: JobStore.Job, now: Date) async {
        guard let payload = try? JSONDecoder().decode(StoreKeeperApp.GoogleSyncJob.self, from: Data(job.payload.utf8)),
            let google = app.google[payload.appId]
        else {
            try? await app.jobs.fail(job.id, error: "unreadable job or unknown app")
            return
        }
        let store = GooglePlayStore(database: app.database)
        do {
            var outcome: String
            if let reviewToken = payload.reviewToken, let orderId = payload.orderId {
                outcome = try await answerReview(google, orderId: orderId, reviewToken: reviewToken, now: now)
            } else if payload.voided == true {
                let applied = try await pollVoided(google, now: now)
                outcome = "voided purchases polled: \(applied) refund(s) applied"
            } else {
                let reading = try await app.purchases.readGoogle(
                    google, token: payload.token, productId: payload.productId, kind: payload.kind)
                switch try await app.purchases.applyGoogle(reading, submittingAccount: nil, orderId: nil, now: now) {
                case .delivered(let result, let transaction):
                    outcome =
                        "\(transaction.transactionId ?? "?"): \(result.plan.outcome)\(reading.status.map { "; subscription \($0.rawValue)" } ?? "")"
                case .pending: outcome = "pending at Google: nothing delivered"
                case .notPaid(let why): outcome = "never paid (\(why)): nothing delivered"
                case .retired: outcome = "a replaced token: grants nothing"
                case .wrongEnvironment:
                    outcome =
                        "a test purchase (license tester): Sandbox is not accepted by this server, nothing delivered"
                }
            }
            if let messageId = payload.messageId {
                try await store.finishNotification(messageId, status: "applied", outcome: outcome, now: now)
            }
            try await app.jobs.complete(job.id)
        } catch let error as GooglePlayError where !error.isRetryable && error.kind != .unauthorized {
            if let messageId = payload.messageId {
                try? await store.finishNotification(
                    messageId, status: "ignored", outcome: "Google: \(error.message)", now: now)
            }
            try? await app.jobs.fail(job.id, error: error.message)
        } catch StoreKeeperApp.GoogleReadFailure.unknownProduct(let id) {
            try? await app.purchases.raiseUnknownGoogleProduct(
                id, token: payload.token, app: google, account: nil, now: now)
            if let messageId = payload.messageId {
                try? await store.finishNotification(
                    messageId, status: "ignored", outcome: "product '\(id)' is not in the catalog", now: now)
            }
            try? await app.jobs.fail(job.id, error: "unknown product \(id)")
        } catch {
            await backoff(job, now: now, error: error)
        }
    }

    /// Acknowledges (a consumable: consumes) paid purchases Google still waits for, a claim's
    /// jobs together: their records read in one statement, Google
    /// called a few at a time, and those Google took recorded (the purchase acknowledged, its
    /// audit entry, its job done) in one database transaction. A refusal or an error is handled
    /// per job.
    func acknowledgeGoogle(_ jobs: [JobStore.Job], now: Date) async {
        guard !jobs.isEmpty else { return }
        let purchases: [String: GooglePlayStore.Purchase]
        do {
            purchases = try await GooglePlayStore(database: app.database).purchases(jobs.map(\.payload))
        } catch {
            for job in jobs { await backoff(job, now: now, error: error) }
            return
        }
        let done = await Self.atMostEightAtOnce(jobs) { job in
            await acknowledgeOneAtGoogle(job, purchase: purchases[job.payload], now: now)
        }
        do {
            try await GooglePlayStore(database: app.database).completeAcknowledgements(done, now: now)
        } catch {
            // Not recorded: each runs again once its lease ends (acknowledging twice is harmless:
            // Google answers the second as already acknowledged).
            app.logger.warning("cannot record Google acknowledgements", metadata: ["error": "\(error)"])
        }
    }

    /// `body` of each job, at most 8 running at once (Google's calls overlap: each is a round
    /// trip), and what they returned.
    static func atMostEightAtOnce<Result: Sendable>(
        _ jobs: [JobStore.Job], _ body: @escaping @Sendable (JobStore.Job) async -> Result?
    ) async -> [Result] {
        await withTaskGroup(of: Result?.self) { group in
            var results: [Result] = []
            var next = 0
            func start() {
                guard next < jobs.count else { return }
                let job = jobs[next]
                next += 1
                group.addTask { await body(job) }
            }
            for _ in 0..<min(8, jobs.count) { start() }
            while let result = await group.next() {
                if let result { results.append(result) }
                start()
            }
            return results
        }
    }

    typealias Acknowledged = (
        token: String, jobId: String, audit: (actor: String, action: String, subject: String?, detail: String)
    )

    /// One purchase acknowledged at Google (`purchase`: its record, read with its batch's):
    /// what to record, or nil when the job was finished otherwise (failed, rescheduled, backed
    /// off, nothing to do).
    func acknowledgeOneAtGoogle(_ job: JobStore.Job, purchase: GooglePlayStore.Purchase?, now: Date) async
        -> Acknowledged?
    {
        do {
            guard let purchase, let google = app.google[purchase.appId]
            else {
                try await app.jobs.fail(job.id, error: "unknown purchase token or app")
                return nil
            }
            guard purchase.acknowledgedAt == nil, !purchase.retired else {
                try await app.jobs.complete(job.id)
                return nil
            }
            // Past Google's window the purchase is refunded: a job never retries it forever.
            if let paid = purchase.paidAt, now.timeIntervalSince(paid) > GooglePlayPlanner.acknowledgeUntil {
                try await app.jobs.fail(job.id, error: "past Google's acknowledgement window: refunded by Google")
                return nil
            }
            // Only what an account has: an unattributed purchase waits for its claim (the
            // device's submission or the operator's resolution); the 48-hour alert shows it.
            if purchase.accountId == nil {
                let id = GooglePlayPlanner.transactionId(
                    orderId: purchase.orderId, tokenDigest: GoogleReading.digest(purchase.purchaseToken))
                guard try await app.store.deliveryAccount(id) != nil else {
                    try await app.jobs.reschedule(
                        job.id, runAt: now.addingTimeInterval(3600), error: "not delivered to an account yet")
                    return nil
                }
            }
            do {
                if purchase.kind == "subscription" {
                    try await google.client.acknowledgeSubscription(
                        productId: purchase.productId, token: purchase.purchaseToken)
                } else if app.catalog.product(purchase.catalogProductId)?.type == .consumable {
                    try await google.client.consumeProduct(productId: purchase.productId, token: purchase.purchaseToken)
                } else {
                    try await google.client.acknowledgeProduct(
                        productId: purchase.productId, token: purchase.purchaseToken)
                }
            } catch let error as GooglePlayError where error.reason == "invalidPurchaseState" {
                // Already acknowledged (the app did it) or not in a state to be: read what is true.
                let reading = try await app.purchases.readGoogle(google, token: purchase.purchaseToken, productId: nil)
                guard reading.acknowledged || reading.readiness != .paid else { throw error }
            }
            return (
                purchase.purchaseToken, job.id,
                (
                    "storekeeper", "google_acknowledged", GoogleReading.digest(purchase.purchaseToken),
                    "\(purchase.kind == "subscription" ? "subscription" : "purchase") of '\(purchase.productId)' acknowledged at Google (app \(purchase.appId))"
                )
            )
        } catch let error as GooglePlayError where error.kind == .notFound {
            try? await app.jobs.fail(job.id, error: error.message)
        } catch {
            await backoff(job, now: now, error: error)
        }
        return nil
    }

    /// A paid one-time purchase's price, from its order (`orders.get`), onto its delivery: what
    /// the buyer paid for all units, in the buyer's currency (Google's purchase resources carry
    /// no price). Waits for the delivery (an unattributed purchase is delivered when claimed)
    /// until Google's acknowledgement window has passed; a service account without the
    /// "View financial data" permission fails the job with that reason (the purchase stays
    /// delivered, only without money in analytics).
    ///
    /// A claim's price jobs run together: their purchases and deliveries read in one statement
    /// each, Google asked a few at a time, the prices and the jobs' completion one transaction.
    func priceGoogleOrders(_ jobs: [JobStore.Job], now: Date) async {
        guard !jobs.isEmpty else { return }
        let store = GooglePlayStore(database: app.database)
        let purchases: [String: GooglePlayStore.Purchase]
        let delivered: Set<String>
        do {
            purchases = try await store.purchases(jobs.map(\.payload))
            delivered = try await store.delivered(
                purchases.values.compactMap { purchase in
                    purchase.orderId.map {
                        GooglePlayPlanner.transactionId(
                            orderId: $0, tokenDigest: GoogleReading.digest(purchase.purchaseToken))
                    }
                })
        } catch {
            for job in jobs { await backoff(job, now: now, error: error) }
            return
        }
        // The delivered ones' orders, each app's in one `orders.batchGet` (up to 1,000 a call).
        var ordersByApp: [String: Result<[String: GoogleOrder], any Error>] = [:]
        let asked = Dictionary(
            grouping: jobs.compactMap { job -> GooglePlayStore.Purchase? in
                guard let purchase = purchases[job.payload], let orderId = purchase.orderId,
                    delivered.contains(
                        GooglePlayPlanner.transactionId(
                            orderId: orderId, tokenDigest: GoogleReading.digest(purchase.purchaseToken)))
                else { return nil }
                return purchase
            }, by: \.appId)
        for (appId, ofApp) in asked {
            guard let google = app.google[appId] else { continue }
            let ids = Array(Set(ofApp.compactMap(\.orderId)))
            do {
                var found: [String: GoogleOrder] = [:]
                for start in stride(from: 0, to: ids.count, by: 1000) {
                    for order in try await google.client.orders(
                        orderIds: Array(ids[start..<min(ids.count, start + 1000)]))
                    {
                        if let id = order.orderId { found[id] = order }
                    }
                }
                ordersByApp[appId] = .success(found)
            } catch {
                ordersByApp[appId] = .failure(error)
            }
        }
        let fetched = ordersByApp
        let priced = await Self.atMostEightAtOnce(jobs) { job in
            await priceGoogleOrder(
                job, purchase: purchases[job.payload], delivered: delivered,
                prefetched: purchases[job.payload].flatMap { fetched[$0.appId] }, now: now)
        }
        do {
            try await store.priceDeliveries(priced)
        } catch {
            // Not recorded: each runs again once its lease ends (reading an order twice is harmless).
            app.logger.warning("cannot record Google order prices", metadata: ["error": "\(error)"])
        }
    }

    /// One price job: its order's price to record, or nil when the job was finished otherwise
    /// (failed, rescheduled, backed off). `prefetched`: its app's `orders.batchGet`, if asked —
    /// an order it lacks, or a batch one bad id failed, is read alone (`orders.get`).
    func priceGoogleOrder(
        _ job: JobStore.Job, purchase: GooglePlayStore.Purchase?, delivered: Set<String>,
        prefetched: Result<[String: GoogleOrder], any Error>?, now: Date
    ) async -> GooglePlayStore.OrderPrice? {
        do {
            guard let purchase, let orderId = purchase.orderId, let google = app.google[purchase.appId] else {
                try await app.jobs.fail(job.id, error: "unknown purchase token, order or app")
                return nil
            }
            let id = GooglePlayPlanner.transactionId(
                orderId: orderId, tokenDigest: GoogleReading.digest(purchase.purchaseToken))
            // Google is asked only once there is a delivery to price.
            guard delivered.contains(id) else {
                if let paid = purchase.paidAt, now.timeIntervalSince(paid) > GooglePlayPlanner.acknowledgeUntil + 86_400
                {
                    try await app.jobs.fail(job.id, error: "never delivered: no price to record")
                } else {
                    try await app.jobs.reschedule(
                        job.id, runAt: now.addingTimeInterval(min(3600, 30 * pow(2, Double(min(job.attempts, 7))))),
                        error: "not delivered yet")
                }
                return nil
            }
            let order: GoogleOrder
            switch prefetched {
            case .success(let orders)?:
                if let found = orders[orderId] {
                    order = found
                } else {
                    order = try await google.client.order(orderId: orderId)
                }
            case .failure(let error as GooglePlayError)? where error.kind == .notFound || error.kind == .refused:
                order = try await google.client.order(orderId: orderId)
            case .failure(let error)?:
                throw error
            case nil:
                order = try await google.client.order(orderId: orderId)
            }
            // Only Google's word on this very purchase prices it.
            guard order.purchaseToken == nil || order.purchaseToken == purchase.purchaseToken else {
                try await app.jobs.fail(job.id, error: "Google's order \(orderId) names another purchase token")
                return nil
            }
            guard let total = order.total, let milli = total.milliunits, milli >= 0,
                let currency = total.currencyCode, currency.utf8.count == 3,
                currency.utf8.allSatisfy({ (65...90).contains($0) })
            else {
                try await app.jobs.fail(job.id, error: "Google's order \(orderId) names no total")
                return nil
            }
            return GooglePlayStore.OrderPrice(transactionId: id, priceMilli: milli, currency: currency, jobId: job.id)
        } catch let error as GooglePlayError where error.kind == .unauthorized {
            app.logger.warning(
                "Google's Orders API refused: grant the service account \"View financial data\" for prices in analytics",
                metadata: ["error": "\(error.message)"])
            try? await app.jobs.fail(job.id, error: "Orders API: \(error.message)")
        } catch let error as GooglePlayError where error.kind == .notFound || error.kind == .refused {
            try? await app.jobs.fail(job.id, error: error.message)
        } catch {
            await backoff(job, now: now, error: error)
        }
        return nil
    }

    /// Voided purchases of the last 30 days (two days of overlap with the last poll), each
    /// applied once through the one refund path; quantity-based partial refunds take back
    /// their units. Returns how many refunds were applied.
    func pollVoided(_ google: GooglePlayApp, now: Date) async throws -> Int {
        let store = GooglePlayStore(database: app.database)
        let appId = google.configuration.id
        let oldest = now.addingTimeInterval(-30 * 86_400 + 60)
        let start =
            try await store.voidedPolledAt(appId: appId).map {
                max(oldest, $0.addingTimeInterval(-2 * 86_400))
            } ?? oldest
        var page: String?
        var applied = 0
        var pages = 0
        repeat {
            let answer = try await google.client.voidedPurchases(startTime: start, pageToken: page)
            for voided in answer.voidedPurchases ?? [] {
                if try await applyVoided(voided, appId: appId, now: now) { applied += 1 }
            }
            page = answer.tokenPagination?.nextPageToken
            pages += 1
        } while page != nil && pages < 1000
        try await store.setVoidedPolledAt(appId: appId, now)
        return applied
    }

    func applyVoided(_ voided: VoidedPurchase, appId: String, now: Date) async throws -> Bool {
        guard let token = voided.purchaseToken, !token.isEmpty else { return false }
        let store = GooglePlayStore(database: app.database)
        let record = try await store.voided(
            purchaseToken: token, orderId: voided.orderId, voidedQuantity: voided.voidedQuantity,
            voidedAt: voided.voidedTimeMillis?.value)
        guard !record.seen else { return false }
        let quantities = record.quantities
        let known = try await store.purchase(token)
        let digest = GoogleReading.digest(token)
        let transactionId = GooglePlayPlanner.transactionId(orderId: voided.orderId, tokenDigest: digest)
        let now = now
        // The same record, applied again after a crash, has the same key and share: nothing more.
        let orderDigest = GoogleReading.digest(token + "\u{0}" + (voided.orderId ?? ""))
        var refund = RefundEvent(
            kind: .refund, store: .googlePlay, key: "gp-void:\(orderDigest):\(quantities.count)",
            transactionId: transactionId, originalTransactionId: known?.originalTransactionId ?? transactionId,
            productId: known?.catalogProductId,
            revocation: GooglePlayPlanner.revocation(voidedQuantities: quantities, quantity: known?.quantity ?? 1))
        refund.storeIdentity = app.google[appId]?.configuration.packageName
        refund.environment = known?.test == true ? "Sandbox" : "Production"
        refund.reasonCode = voided.voidedReason.map(Int64.init)
        refund.purchasedAt = voided.purchaseTimeMillis?.value
        let settings = app.notificationSettings()
        let outcome = try await app.notifications.applyRefund(refund, settings: settings, now: now, actor: "google")
        try await store.markVoided(
            record, appId: appId, purchaseToken: token, orderId: voided.orderId,
            voidedQuantity: voided.voidedQuantity, voidedAt: voided.voidedTimeMillis?.value, now: now)
        app.logger.info(
            "Google voided purchase applied",
            metadata: ["order": "\(voided.orderId ?? "-")", "outcome": "\(outcome.1)"])
        return true
    }

    /// A pending refund review, answered once from the ledger by the catalog's rules.
    func answerReview(_ google: GooglePlayApp, orderId: String, reviewToken: String, now: Date) async throws -> String {
        let transactionId = GooglePlayPlanner.prefix + orderId
        let (facts, _, _) = try await app.store.accounts.consumptionFacts(transactionId, catalog: app.catalog)
        let answer = GooglePlayPlanner.reviewAnswer(
            facts, policy: app.catalog.refunds,
            sampleContentProvided: app.catalog.refunds.sampleContentProvided ?? false, now: now)
        try await google.client.reviewRefund(
            orderId: orderId,
            ReviewRefundRequest(
                pendingRefundToken: reviewToken, sampleContentProvided: answer.sampleContentProvided,
                refundPreference: answer.refundPreference,
                consumptionPercentageMilliunits: answer.consumptionPercentageMilliunits))
        let detail =
            "refund review of order \(orderId): \(answer.refundPreference)\(answer.consumptionPercentageMilliunits.map { ", consumed \(RefundPlanner.percent(Int32($0)))" } ?? "")\(answer.rule.map { " (rule '\($0)')" } ?? " (no rule matched)")"
        try await app.store.anomalies.recordAudit(
            actor: "storekeeper", action: "google_refund_review", subject: transactionId, detail: detail, now: now)
        return detail
    }

    /// The periodic pass (every minute, its own service — `MinuteDuties`): acknowledgements Google
    /// still waits for after an hour are queued again; one at 48 hours raises an alert; every
    /// hour, each app's voided purchases are polled.
    func googleHousekeeping(now: Date) async {
        guard !app.google.isEmpty else { return }
        let store = GooglePlayStore(database: app.database)
        do {
            let swept = try await store.sweepUnacknowledged(
                after: GooglePlayPlanner.sweepAfter, alertAfter: GooglePlayPlanner.alertAfter, now: now)
            for purchase in swept.alerts {
                app.logger.error(
                    "Google purchase unacknowledged for 48 hours: Google refunds it at 72",
                    metadata: ["app": "\(purchase.appId)", "product": "\(purchase.productId)"])
                try await app.store.anomalies.raiseAnomaly(
                    AnomalyDraft(
                        kind: .acknowledgementOverdue, transactionId: nil, orderId: nil, accountId: purchase.accountId,
                        detail:
                            "Google Play purchase of '\(purchase.productId)' (app \(purchase.appId), order \(purchase.orderId ?? "-")) still unacknowledged \(Int(now.timeIntervalSince(purchase.paidAt ?? now) / 3600)) h after payment; Google refunds it at 72 h. Check the Google service account's permissions."
                    ), dedupeKey: AnomalyStore.dedupeKey("acknowledgement_overdue", purchase.purchaseToken), now: now)
            }
            let hour = Int64((now.timeIntervalSince1970 * 1000).rounded(.down)) / 3_600_000
            for appId in app.google.keys {
                _ = try await app.jobs.enqueue(
                    kind: Self.googleVoidedJobKind, dedupeKey: "\(Self.googleVoidedJobKind)|\(appId)|\(hour)",
                    payload: appId, runAt: now, now: now)
            }
            // Reconciliation: subscriptions whose period ended without news are read again
            // (a notification lost while the server was down), once an hour each.
            for purchase in try await store.subscriptionsToReread(before: now) {
                let job = StoreKeeperApp.GoogleSyncJob(appId: purchase.appId, token: purchase.purchaseToken)
                _ = try await app.jobs.enqueue(
                    kind: GooglePlayStore.syncJobKind,
                    dedupeKey:
                        "\(GooglePlayStore.syncJobKind)|reread|\(GoogleReading.digest(purchase.purchaseToken))|\(hour)",
                    payload: String(decoding: try JSONEncoder().encode(job), as: UTF8.self), runAt: now, now: now)
            }
        } catch {
            app.logger.warning("Google housekeeping failed; will retry", metadata: ["error": "\(error)"])
        }
    }

    func pollVoidedJob(_ job: JobStore.Job, now: Date) async {
        guard let google = app.google[job.payload] else {
            try? await app.jobs.fail(job.id, error: "unknown app")
            return
        }
        do {
            _ = try await pollVoided(google, now: now)
            try await app.jobs.complete(job.id)
        } catch {
            await backoff(job, now: now, error: error)
        }
    }
}

extension StoreKeeperApp {
    /// The minute pass's Google duties at `now` (tests move time without waiting).
    public func runGoogleHousekeeping(now: Date) async {
        await JobRunner(app: self).googleHousekeeping(now: now)
    }
}
