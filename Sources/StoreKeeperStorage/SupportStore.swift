import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Customer support: operator grants, renewal-date extensions asked of the stores (through
/// the job queue), and Apple's retention requests with the answers given.
public struct SupportStore: Sendable {
    public let database: Database
    /// Retention requests, group committed: concurrent answers share one commit.
    let retentionCommitter: GroupCommit<RetentionRecord>

    public init(database: Database) {
        self.database = database
        self.retentionCommitter = GroupCommit(database: database) { items, sql in
            try await Self.insertRetention(items, sql: sql)
        }
    }
}

/// Customer support on the database: operator grants, renewal-date extensions asked of
/// Apple (through the job queue), and Apple's retention requests with the answers given.
extension SupportStore {
    // MARK: Grants

    public struct GrantRow: Sendable, Hashable {
        public var grantId: String
        public var accountId: String
        public var entitlementId: String
        public var expiresAt: Date
        public var createdAt: Date
        public var endedAt: Date?
        public var note: String

        /// A grant for good: stored with `SupportStore.grantForGood` as its end.
        public var forGood: Bool { expiresAt >= SupportStore.grantForGood }
    }

    /// The end a grant for good is stored with (9999-12-31): entitlements read it as "never".
    public static let grantForGood = Date(milliseconds: 253_402_214_400_000)

    /// Gives `account` the entitlement until `expiresAt`; audited. Nothing ends it but the
    /// clock (entitlement is derived when read) or `endGrant`.
    public func createGrant(
        account: String, entitlement: String, expiresAt: Date, note: String, actor: String, now: Date
    ) async throws -> GrantRow {
        let grant = GrantRow(
            grantId: RowIdentifiers.uuidString(), accountId: account, entitlementId: entitlement,
            expiresAt: expiresAt, createdAt: now, note: note)
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO grants (grant_id, account_id, entitlement_id, expires_at, created_at, note)
                VALUES (\(bind: grant.grantId), \(bind: account), \(bind: entitlement), \(bind: expiresAt.milliseconds),
                        \(bind: now.milliseconds), \(bind: note))
                """
            ).run()
            try await PurchaseStore.audit(
                sql, actor: actor, action: "grant", subject: account,
                detail:
                    "granted '\(entitlement)' \(grant.forGood ? "for good" : "until \(SubscriptionStore.iso8601(expiresAt))") (grant \(grant.grantId)): \(note)",
                at: now.milliseconds)
        }
        return grant
    }

    /// An account's grants, newest first (running, ended and run out alike).
    public func grants(of account: String, limit: Int = 200) async throws -> [GrantRow] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM grants WHERE account_id = \(bind: account)
                ORDER BY created_at DESC, grant_id DESC LIMIT \(bind: max(1, min(limit, 1000)))
                """
            ).all().map {
                GrantRow(
                    grantId: try $0.decode(column: "grant_id", as: String.self),
                    accountId: try $0.decode(column: "account_id", as: String.self),
                    entitlementId: try $0.decode(column: "entitlement_id", as: String.self),
                    expiresAt: Date(milliseconds: try $0.decode(column: "expires_at", as: Int64.self)),
                    createdAt: Date(milliseconds: try $0.decode(column: "created_at", as: Int64.self)),
                    endedAt: try $0.decode(column: "ended_at", as: Int64?.self).map(Date.init(milliseconds:)),
                    note: try $0.decode(column: "note", as: String.self))
            }
        }
    }

    /// Ends a grant now; false when the account has no such grant still running.
    public func endGrant(account: String, grantId: String, actor: String, now: Date) async throws -> Bool {
        try await database.transaction { sql in
            let ended = try await sql.raw(
                """
                UPDATE grants SET ended_at = \(bind: now.milliseconds)
                WHERE grant_id = \(bind: grantId) AND account_id = \(bind: account) AND ended_at IS NULL
                RETURNING entitlement_id
                """
            ).first()
            guard let ended else { return false }
            try await PurchaseStore.audit(
                sql, actor: actor, action: "grant_ended", subject: account,
                detail:
                    "ended grant \(grantId) of '\(try ended.decode(column: "entitlement_id", as: String.self))'",
                at: now.milliseconds)
            return true
        }
    }

    // MARK: Extensions

    /// The subscription asked for is unknown (404).
    public struct UnknownSubscription: Error, Sendable {}
    /// Two extensions in the last 365 days already (409 `extension_limit`).
    public struct ExtensionLimit: Error, Sendable {
        public var last: [Date]
    }

    public static let extendJobKind = "extend_subscription"
    public static let massExtendJobKind = "extend_mass"

    public struct ExtensionRow: Sendable, Hashable {
        public var requestId: String
        public var originalTransactionId: String?
        public var productId: String?
        public var accountId: String?
        public var days: Int
        public var reason: String
        public var note: String
        public var status: String
        public var createdAt: Date
        public var completedAt: Date?
        public var effectiveDate: Date?
        public var succeededCount: Int?
        public var failedCount: Int?
        public var error: String?
    }

    /// Records an extension of one subscription and queues it for Apple, in one transaction:
    /// refused when the subscription is unknown, or when two extensions (asked or done; not
    /// failed ones) fall within the last 365 days — Apple's limit.
    public func requestExtension(
        originalTransactionId: String, days: Int, reason: String, note: String, actor: String, now: Date
    ) async throws -> ExtensionRow {
        try await database.transaction { sql in
            guard
                let subscription = try await sql.raw(
                    "SELECT account_id, product_id FROM subscriptions WHERE original_transaction_id = \(bind: originalTransactionId)"
                ).first()
            else { throw UnknownSubscription() }
            let since = now.addingTimeInterval(-365 * 86_400).milliseconds
            let recent = try await sql.raw(
                """
                SELECT created_at FROM extensions
                WHERE original_transaction_id = \(bind: originalTransactionId) AND status <> 'failed'
                  AND created_at > \(bind: since) ORDER BY created_at
                """
            ).all().map { Date(milliseconds: try $0.decode(column: "created_at", as: Int64.self)) }
            guard recent.count < 2 else { throw ExtensionLimit(last: recent) }
            let row = ExtensionRow(
                requestId: RowIdentifiers.uuidString(), originalTransactionId: originalTransactionId,
                productId: try subscription.decode(column: "product_id", as: String.self),
                accountId: try subscription.decode(column: "account_id", as: String.self), days: days, reason: reason,
                note: note, status: "pending", createdAt: now)
            try await Self.insertExtension(row, sql: sql)
            try await JobStore.insert(
                kind: Self.extendJobKind, dedupeKey: "\(Self.extendJobKind)|\(row.requestId)", payload: row.requestId,
                sql: sql, now: now)
            try await PurchaseStore.audit(
                sql, actor: actor, action: "extension_requested", subject: originalTransactionId,
                detail: "extend by \(days) days (\(reason)), request \(row.requestId): \(note)", at: now.milliseconds)
            return row
        }
    }

    /// Records a mass extension of every active subscriber of `productId` and queues it.
    public func requestMassExtension(
        productId: String, days: Int, reason: String, note: String, actor: String, now: Date
    ) async throws -> ExtensionRow {
        let row = ExtensionRow(
            requestId: RowIdentifiers.uuidString(), productId: productId, days: days, reason: reason, note: note,
            status: "pending", createdAt: now)
        try await database.transaction { sql in
            try await Self.insertExtension(row, sql: sql)
            try await JobStore.insert(
                kind: Self.massExtendJobKind, dedupeKey: "\(Self.massExtendJobKind)|\(row.requestId)",
                payload: row.requestId, sql: sql, now: now)
            try await PurchaseStore.audit(
                sql, actor: actor, action: "mass_extension_requested", subject: productId,
                detail:
                    "extend every active \(productId) by \(days) days (\(reason)), request \(row.requestId): \(note)",
                at: now.milliseconds)
        }
        return row
    }

    static func insertExtension(_ row: ExtensionRow, sql: any SQLDatabase) async throws {
        try await sql.raw(
            """
            INSERT INTO extensions (request_id, original_transaction_id, product_id, account_id, days, reason, note,
                                    status, created_at)
            VALUES (\(bind: row.requestId), \(bind: row.originalTransactionId), \(bind: row.productId),
                    \(bind: row.accountId), \(bind: row.days), \(bind: row.reason), \(bind: row.note),
                    \(bind: row.status), \(bind: row.createdAt.milliseconds))
            """
        ).run()
    }

    public func extensionRequest(_ requestId: String) async throws -> ExtensionRow? {
        try await database.read { sql in
            try await sql.raw("SELECT * FROM extensions WHERE request_id = \(bind: requestId)").first().map(
                Self.decodeExtension)
        }
    }

    /// The extensions of a subscription, newest first.
    public func extensions(of originalTransactionId: String) async throws -> [ExtensionRow] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM extensions WHERE original_transaction_id = \(bind: originalTransactionId)
                ORDER BY created_at DESC LIMIT 100
                """
            ).all().map(Self.decodeExtension)
        }
    }

    /// Apple answered an extension: `succeeded` (with the new expiry, or a mass request's
    /// counts), `sent` (a mass request accepted, running at Apple) or `failed` (Apple said no);
    /// audited.
    public func completeExtension(
        _ requestId: String, status: String, effectiveDate: Date? = nil, succeeded: Int? = nil, failed: Int? = nil,
        error: String? = nil, now: Date
    ) async throws {
        try await database.transaction { sql in
            let done = status == "sent" ? nil : now.milliseconds
            try await sql.raw(
                """
                UPDATE extensions SET status = \(bind: status), completed_at = \(bind: done),
                       effective_date = \(bind: effectiveDate?.milliseconds), succeeded_count = \(bind: succeeded),
                       failed_count = \(bind: failed), error = \(bind: error)
                WHERE request_id = \(bind: requestId)
                """
            ).run()
            let subject =
                try await sql.raw(
                    "SELECT original_transaction_id, product_id FROM extensions WHERE request_id = \(bind: requestId)"
                ).first().map {
                    try $0.decode(column: "original_transaction_id", as: String?.self)
                        ?? $0.decode(column: "product_id", as: String?.self)
                } ?? nil
            var detail = "request \(requestId): \(status)"
            if let effectiveDate { detail += ", renews \(SubscriptionStore.iso8601(effectiveDate))" }
            if let succeeded { detail += ", \(succeeded) extended, \(failed ?? 0) failed" }
            if let error { detail += ": \(error)" }
            try await PurchaseStore.audit(
                sql, actor: "apple", action: "extension_\(status)", subject: subject, detail: detail,
                at: now.milliseconds)
        }
    }

    static func decodeExtension(_ row: any SQLRow) throws -> ExtensionRow {
        ExtensionRow(
            requestId: try row.decode(column: "request_id", as: String.self),
            originalTransactionId: try row.decode(column: "original_transaction_id", as: String?.self),
            productId: try row.decode(column: "product_id", as: String?.self),
            accountId: try row.decode(column: "account_id", as: String?.self),
            days: try row.decode(column: "days", as: Int.self),
            reason: try row.decode(column: "reason", as: String.self),
            note: try row.decode(column: "note", as: String.self),
            status: try row.decode(column: "status", as: String.self),
            createdAt: Date(milliseconds: try row.decode(column: "created_at", as: Int64.self)),
            completedAt: try row.decode(column: "completed_at", as: Int64?.self).map(Date.init(milliseconds:)),
            effectiveDate: try row.decode(column: "effective_date", as: Int64?.self).map(Date.init(milliseconds:)),
            succeededCount: try row.decode(column: "succeeded_count", as: Int?.self),
            failedCount: try row.decode(column: "failed_count", as: Int?.self),
            error: try row.decode(column: "error", as: String?.self))
    }

    // MARK: Retention

    /// What the retention endpoint reads, in one query: the subscription, its paid tenure,
    /// and the answer already given to this request identifier.
    public struct RetentionContext: Sendable {
        public var subscription: SubscriptionState?
        public var accountId: String?
        public var paidTenure: TimeInterval
        public var priorAnswer: String?
        /// The account's offer history in the group, when asked for (`historyOf`).
        public var history: OfferStore.OfferHistory?
    }

    /// `historyOf`: the subscription group's products, when an offer rule may be reached, with
    /// the offers whose redemptions count (`offerIds`): the account's offer history comes in the
    /// same single query (its redemption counts, and whether it has other subscriptions in the
    /// group — rare: only then is the full history read).
    public func retentionContext(
        originalTransactionId: String, requestIdentifier: String, historyOf groupProducts: [String]? = nil,
        offerIds: [String] = []
    ) async throws -> RetentionContext {
        try await database.read { sql in
            var query: SQLQueryString = """
                SELECT (SELECT answer FROM retention_requests WHERE request_identifier = \(bind: requestIdentifier)) AS prior,
                       (SELECT CAST(COALESCE(SUM(period_end - period_start), 0) AS BIGINT) FROM deliveries
                        WHERE original_transaction_id = \(bind: originalTransactionId) AND price_milli > 0
                          AND refunded_at IS NULL AND period_end IS NOT NULL) AS tenure,
                """
            if let groupProducts, !groupProducts.isEmpty {
                query.appendInterpolation(
                    """
                           (SELECT COUNT(*) FROM subscriptions x WHERE x.account_id = s.account_id
                              AND x.product_id IN (\(binds: groupProducts))
                              AND x.original_transaction_id <> s.original_transaction_id) AS others,
                    """ as SQLQueryString)
                for (index, offerId) in offerIds.enumerated() {
                    query.appendInterpolation(
                        """
                               (SELECT COUNT(*) FROM deliveries d WHERE d.account_id = s.account_id AND d.offer_type = 2
                                  AND d.offer_identifier = \(bind: offerId)) AS \(ident: "r\(index)"),
                        """ as SQLQueryString)
                }
            }
            query.appendInterpolation(
                """
                       s.*
                FROM (SELECT 1 AS one) AS o
                LEFT JOIN subscriptions s ON s.original_transaction_id = \(bind: originalTransactionId)
                """ as SQLQueryString)
            let row = try await sql.raw(query).first()
            guard let row else { return RetentionContext(paidTenure: 0) }
            let prior = try row.decode(column: "prior", as: String?.self)
            let tenure = try row.decode(column: "tenure", as: Int64?.self) ?? 0
            var state: SubscriptionState?
            var account: String?
            if try row.decode(column: "original_transaction_id", as: String?.self) != nil {
                state = try SubscriptionStore.decodeState(row)
                account = try row.decode(column: "account_id", as: String.self)
            }
            var history: OfferStore.OfferHistory?
            if prior == nil, let account, let state, let groupProducts, !groupProducts.isEmpty {
                if try row.decode(column: "others", as: Int?.self) ?? 0 > 0 {
                    history = try await OfferStore.offerHistory(
                        account: account, groupProducts: groupProducts, latestTransaction: false, sql: sql)
                } else {
                    var redemptions: [String: Int] = [:]
                    for (index, offerId) in offerIds.enumerated() {
                        redemptions[offerId] = try row.decode(column: "r\(index)", as: Int?.self) ?? 0
                    }
                    history = OfferStore.OfferHistory(
                        subscriptions: [state], redemptions: redemptions, hadIntroductoryOffer: false)
                }
            }
            return RetentionContext(
                subscription: state, accountId: account, paidTenure: Double(tenure) / 1000, priorAnswer: prior,
                history: history)
        }
    }

    public struct RetentionRecord: Sendable {
        public var requestIdentifier: String
        public var originalTransactionId: String
        public var accountId: String?
        public var productId: String
        public var ruleName: String?
        public var holdout: Bool
        /// The JSON answered.
        public var answer: String
        public var environment: String?
        var receivedAt = Date()

        public init(
            requestIdentifier: String, originalTransactionId: String, accountId: String?, productId: String,
            ruleName: String?, holdout: Bool, answer: String, environment: String?
        ) {
            self.requestIdentifier = requestIdentifier
            self.originalTransactionId = originalTransactionId
            self.accountId = accountId
            self.productId = productId
            self.ruleName = ruleName
            self.holdout = holdout
            self.answer = answer
            self.environment = environment
        }
    }

    /// Records a request and its answer once, durably, before the answer goes out (group
    /// committed). A repeat is answered from the first record by `retentionContext`; a twin
    /// arriving in the same instant is decided the same way (the rule and the holdout draw
    /// depend only on the request) and the first record stays.
    public func recordRetention(_ record: RetentionRecord, now: Date) async throws -> String {
        var record = record
        record.receivedAt = now
        try await retentionCommitter.commit(record)
        return record.answer
    }

    static func insertRetention(_ records: [RetentionRecord], sql: any SQLDatabase) async throws {
        var seen = Set<String>()
        var insert = sql.insert(into: "retention_requests").columns(
            "request_identifier", "original_transaction_id", "account_id", "product_id", "rule_name", "holdout",
            "answer", "environment", "received_at")
        for record in records where seen.insert(record.requestIdentifier).inserted {
            insert = insert.values([
                record.requestIdentifier, record.originalTransactionId, record.accountId, record.productId,
                record.ruleName, record.holdout ? 1 : 0, record.answer, record.environment,
                record.receivedAt.milliseconds,
            ])
        }
        try await sql.execute(sql: insert.ignoringConflicts(with: ["request_identifier"]).insert) { _ in }
    }

    /// One rule's figures (or the requests no rule matched: `rule` nil), answered or holdout.
    public struct RetentionFigures: Sendable, Hashable {
        public var rule: String?
        public var holdout: Bool
        public var requests = 0
        /// Offer redeemed or plan switched within 30 days.
        public var saved = 0
        public var offerRedeemed = 0
        public var planSwitched = 0
        /// Auto-renew turned off, or expired, within 30 days.
        public var cancelled = 0
        /// 30 days passed with none of those.
        public var stayed = 0
        /// Fewer than 30 days since, and nothing yet.
        public var pending = 0
    }

    /// Every request's outcome, from the notifications of its subscription signed within 30
    /// days after it, aggregated per rule and holdout by the database (bounded memory).
    public func retentionReport(since: Date?, now: Date) async throws -> [RetentionFigures] {
        let window: Int64 = 30 * 86_400_000
        let from = since?.milliseconds ?? 0
        return try await database.read { sql in
            func within(_ condition: String) -> String {
                """
                EXISTS (SELECT 1 FROM notifications n WHERE n.subject = r.original_transaction_id
                        AND n.signed_date > r.received_at AND n.signed_date <= r.received_at + \(window) AND \(condition))
                """
            }
            let outcome = """
                CASE WHEN \(within("n.notification_type = 'OFFER_REDEEMED'")) THEN 'offer_redeemed'
                     WHEN \(within("n.notification_type = 'DID_CHANGE_RENEWAL_PREF'")) THEN 'plan_switched'
                     WHEN \(within("((n.notification_type = 'DID_CHANGE_RENEWAL_STATUS' AND n.subtype = 'AUTO_RENEW_DISABLED') OR n.notification_type = 'EXPIRED')")) THEN 'cancelled'
                     WHEN r.received_at + \(window) < \(now.milliseconds) THEN 'stayed'
                     ELSE 'pending' END
                """
            // Only integers of our own are spliced in; nothing from a request.
            let text = """
                SELECT rule_name, holdout, outcome, COUNT(*) AS n FROM (
                    SELECT r.rule_name, r.holdout, \(outcome) AS outcome
                    FROM retention_requests r WHERE r.received_at >= \(from)
                ) AS x GROUP BY rule_name, holdout, outcome
                """
            let rows = try await sql.raw(SQLQueryString(text)).all()
            var figures: [String: RetentionFigures] = [:]
            for row in rows {
                let rule = try row.decode(column: "rule_name", as: String?.self)
                let holdout = try row.decode(column: "holdout", as: Int.self) != 0
                let count = try row.decode(column: "n", as: Int.self)
                let key = "\(rule ?? "")|\(holdout)"
                var entry = figures[key] ?? RetentionFigures(rule: rule, holdout: holdout)
                entry.requests += count
                switch try row.decode(column: "outcome", as: String.self) {
                case "offer_redeemed":
                    entry.offerRedeemed += count
                    entry.saved += count
                case "plan_switched":
                    entry.planSwitched += count
                    entry.saved += count
                case "cancelled": entry.cancelled += count
                case "stayed": entry.stayed += count
                default: entry.pending += count
                }
                figures[key] = entry
            }
            return figures.values.sorted { ($0.rule ?? "", $0.holdout ? 1 : 0) < ($1.rule ?? "", $1.holdout ? 1 : 0) }
        }
    }
}

extension SupportStore {
    /// Where a subscription was bought (`Production`, `Sandbox`) and its latest transaction.
    public func subscriptionFacts(_ originalTransactionId: String) async throws -> (
        environment: String?, latestTransactionId: String?
    ) {
        try await database.read { sql in
            let environment = try await sql.raw(
                "SELECT environment FROM deliveries WHERE original_transaction_id = \(bind: originalTransactionId) LIMIT 1"
            ).first()?.decode(column: "environment", as: String.self)
            let latest = try await SubscriptionStore.states([originalTransactionId], sql: sql)[originalTransactionId]?
                .latestTransactionId
            return (environment, latest)
        }
    }
}
