import Foundation
import SQLKit
import Testing

@testable import StoreKeeperServer

extension NotificationTests {
    // The applier takes a claim of subscriptions in one transaction; when that fails for
    // anything but an outage, each subscription goes alone: one that cannot be applied is
    // retried later with its error, and never holds up the others.
    @Test(arguments: ServerAPITests.databases)
    func aSubscriptionThatCannotBeAppliedDoesNotHoldUpTheOthers(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            var originals: [String: String] = [:]
            for account in ["ann", "bob", "cid"] {
                let (_, transaction) = try await relay.buy(account, "pro_monthly")
                originals[account] = transaction.originalTransactionId
            }
            for notification in await relay.take() { try await relay.post(notification.signedPayload) }
            let poisoned = try #require(originals["bob"])
            // A failure that is not an outage, for that one subscription only: a trigger refuses
            // any status change of its notifications (as a conflicting write would).
            try await relay.app.database.transaction { sql in
                if kind == "sqlite" {
                    try await sql.raw(
                        SQLQueryString(
                            "CREATE TRIGGER poison BEFORE UPDATE ON notifications WHEN NEW.subject = '\(poisoned)' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
                        )
                    ).run()
                } else {
                    try await sql.raw(
                        SQLQueryString(
                            "CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN IF NEW.subject = '\(poisoned)' THEN RAISE EXCEPTION 'poisoned'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
                        )
                    ).run()
                    try await sql.raw(
                        "CREATE TRIGGER poison BEFORE UPDATE ON notifications FOR EACH ROW EXECUTE FUNCTION poison()"
                    ).run()
                }
            }
            let applying = Date()
            await relay.apply()

            let rows = try await relay.app.database.read { sql in
                try await sql.raw("SELECT subject, status FROM notifications").all().map {
                    (
                        try $0.decode(column: "subject", as: String.self),
                        try $0.decode(column: "status", as: String.self)
                    )
                }
            }
            for (subject, status) in rows {
                if subject == poisoned {
                    #expect(status == "pending", "the poisoned subscription waits for a retry")
                } else {
                    #expect(status != "pending", "\(subject) was held up")
                }
            }
            #expect(rows.contains { $0.0 == originals["ann"] } && rows.contains { $0.0 == originals["cid"] })
            let job = try await relay.app.database.read { sql in
                try await sql.raw(
                    "SELECT attempts, last_error, run_at FROM jobs WHERE kind = 'apply_notifications' AND payload = \(bind: poisoned)"
                ).first()
            }
            let row = try #require(job)
            #expect(try row.decode(column: "last_error", as: String?.self) != nil)
            // Retried later, with a backoff from the failed attempt (never "now": a loaded machine's
            // reads may come seconds after it, so the wall clock at this line proves nothing).
            #expect(
                try row.decode(column: "run_at", as: Int64.self) > Int64(applying.timeIntervalSince1970 * 1000) + 500)
        }
    }
}

extension NotificationTests {
    // REFUND_REVERSED gives back exactly what the refund took: a non-renewing pass bought while
    // another was running extends that one's window; reversed after a refund, it has that same
    // window again, not one recomputed from its purchase date.
    @Test(arguments: ServerAPITests.databases)
    func aReversedRefundOfAStackedPassRestoresItsExactWindow(kind: String) async throws {
        try await Self.withRelay(kind) { relay in
            _ = try await relay.buy("pia", "season_pass")
            let (_, second) = try await relay.buy("pia", "season_pass")
            _ = try await relay.deliver()
            func windows() async throws -> [String] {
                try await relay.entitlements("pia").compactMap { $0["expiresAt"] as? String }.sorted()
            }
            let before = try await windows()
            #expect(before.count == 2)
            try await relay.store.refund(second.transactionId!)
            #expect(try await relay.deliver() == ["REFUND"])
            #expect(try await windows() == [before[0]])
            try await relay.store.reverseRefund(second.transactionId!)
            #expect(try await relay.deliver(times: 2) == ["REFUND_REVERSED"])
            #expect(try await windows() == before, "the stacked window, exactly")
        }
    }
}
