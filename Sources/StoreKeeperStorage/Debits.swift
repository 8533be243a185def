import Crypto
import Foundation
import SQLKit
import StoreKeeperCatalog
import StoreKeeperCore
import StoreKeeperSupport

/// Debits: one conditional UPDATE of the balance, idempotent per key.
extension AccountStore {
    public enum DebitResult: Sendable, Hashable {
        case debited(balance: Int64)
        case insufficient(balance: Int64)
        /// The key already answered a debit of another account, currency or amount.
        case idempotencyConflict
    }

    /// What a debit idempotency key is bound to: length-prefixed, so no two requests share it.
    static func debitRequestHash(accountId: String, currency: String, amount: Int64) -> String {
        let canonical = "\(accountId.utf8.count):\(accountId)|\(currency.utf8.count):\(currency)|\(amount)"
        return SHA256.hash(data: Data(canonical.utf8)).lowercaseHex
    }

    /// Debits a consumable balance once per idempotency key: a repeated key with the same
    /// account, currency and amount answers the same balance without debiting again; with
    /// any of them different it is a conflict.
    /// `actor` (an operator: support taking coins back, say): audited with the debit and its
    /// reason (or that none was given), in its transaction; the app's own spending (nil) leaves
    /// the audit log to operators' acts.
    public func debit(
        accountId: String, currency: String, amount: Int64, idempotencyKey: String, reason: String? = nil,
        actor: String? = nil, now: Date
    ) async throws -> DebitResult {
        let requestHash = Self.debitRequestHash(accountId: accountId, currency: currency, amount: amount)
        var lastError: (any Error)?
        for _ in 0..<4 {
            do {
                return try await database.transaction { sql in
                    switch try await Self.previousRequest(idempotencyKey, requestHash: requestHash, sql: sql) {
                    case .conflict: return .idempotencyConflict
                    case .answered(let balance): return .debited(balance: balance)
                    case nil: break
                    }
                    // A retry of a debit made before keys had their own column.
                    if let legacy = try await sql.raw(
                        """
                        SELECT amount, balance_after FROM debits WHERE idempotency_key = \(bind: "\(accountId)|\(currency)|\(idempotencyKey)")
                        AND account_id = \(bind: accountId) AND currency = \(bind: currency)
                        """
                    ).first() {
                        guard try legacy.decode(column: "amount", as: Int64.self) == amount else {
                            return .idempotencyConflict
                        }
                        return .debited(balance: try legacy.decode(column: "balance_after", as: Int64.self))
                    }
                    // One conditional UPDATE: on PostgreSQL concurrent debits of one account
                    // queue on its balance row and each sees the balance the previous one left.
                    let debited = try await sql.raw(
                        """
                        UPDATE balances SET amount = amount - \(bind: amount)
                        WHERE account_id = \(bind: accountId) AND currency = \(bind: currency) AND amount >= \(bind: amount)
                        RETURNING amount
                        """
                    ).first()
                    guard let after = try debited?.decode(column: "amount", as: Int64.self) else {
                        let balance =
                            try await sql.raw(
                                "SELECT amount FROM balances WHERE account_id = \(bind: accountId) AND currency = \(bind: currency)"
                            ).first()?.decode(column: "amount", as: Int64.self) ?? 0
                        return .insufficient(balance: balance)
                    }
                    // The request row claims the key; a concurrent twin fails here, rolls back
                    // its UPDATE and retries (then answers with the first one's result).
                    try await sql.raw(
                        """
                        INSERT INTO debit_requests (idempotency_key, request_hash, account_id, currency, amount, balance_after, created_at)
                        VALUES (\(bind: idempotencyKey), \(bind: requestHash), \(bind: accountId), \(bind: currency),
                                \(bind: amount), \(bind: after), \(bind: now.milliseconds))
                        """
                    ).run()
                    try await sql.raw(
                        """
                        INSERT INTO ledger (entry_key, account_id, currency, amount, created_at, reason)
                        VALUES (\(bind: "debit:v2:" + idempotencyKey), \(bind: accountId), \(bind: currency),
                                \(bind: -amount), \(bind: now.milliseconds), \(bind: reason))
                        """
                    ).run()
                    if let actor {
                        try await PurchaseStore.audit(
                            sql, actor: actor, action: "balance_debited", subject: accountId,
                            detail: "debited \(amount) \(currency) (balance \(after)): \(reason ?? "no reason given")",
                            at: now.milliseconds)
                    }
                    return .debited(balance: after)
                }
            } catch {
                lastError = error
            }
        }
        throw lastError ?? CancellationError()
    }

    enum PreviousRequest {
        case answered(Int64)
        case conflict
    }

    /// What a balance request's idempotency key already answered (credits and debits share the
    /// keys): the same request again gets the same balance, another one a conflict.
    static func previousRequest(_ key: String, requestHash: String, sql: any SQLDatabase) async throws
        -> PreviousRequest?
    {
        guard
            let previous = try await sql.raw(
                "SELECT request_hash, balance_after FROM debit_requests WHERE idempotency_key = \(bind: key)"
            ).first()
        else { return nil }
        guard try previous.decode(column: "request_hash", as: String.self) == requestHash else { return .conflict }
        return .answered(try previous.decode(column: "balance_after", as: Int64.self))
    }

    public enum CreditResult: Sendable, Equatable {
        case credited(balance: Int64)
        /// The key answered another credit (or a debit) already.
        case idempotencyConflict
    }

    /// Credits a consumable balance once per idempotency key (support compensating a player): a
    /// repeated key with the same account, currency and amount answers the same balance without
    /// crediting again. The ledger entry, the balance and the audit entry (actor, reason) commit
    /// together.
    public func credit(
        accountId: String, currency: String, amount: Int64, idempotencyKey: String, reason: String, actor: String,
        now: Date
    ) async throws -> CreditResult {
        let requestHash = "credit:" + Self.debitRequestHash(accountId: accountId, currency: currency, amount: amount)
        var lastError: (any Error)?
        for _ in 0..<4 {
            do {
                return try await database.transaction { sql in
                    switch try await Self.previousRequest(idempotencyKey, requestHash: requestHash, sql: sql) {
                    case .conflict: return .idempotencyConflict
                    case .answered(let balance): return .credited(balance: balance)
                    case nil: break
                    }
                    let after =
                        try await sql.raw(
                            """
                            INSERT INTO balances (account_id, currency, amount)
                            VALUES (\(bind: accountId), \(bind: currency), \(bind: amount))
                            ON CONFLICT (account_id, currency) DO UPDATE SET amount = balances.amount + excluded.amount
                            RETURNING amount
                            """
                        ).first()?.decode(column: "amount", as: Int64.self) ?? amount
                    try await sql.raw(
                        """
                        INSERT INTO debit_requests (idempotency_key, request_hash, account_id, currency, amount, balance_after, created_at)
                        VALUES (\(bind: idempotencyKey), \(bind: requestHash), \(bind: accountId), \(bind: currency),
                                \(bind: amount), \(bind: after), \(bind: now.milliseconds))
                        """
                    ).run()
                    try await sql.raw(
                        """
                        INSERT INTO ledger (entry_key, account_id, currency, amount, created_at, reason)
                        VALUES (\(bind: "credit:" + idempotencyKey), \(bind: accountId), \(bind: currency),
                                \(bind: amount), \(bind: now.milliseconds), \(bind: reason))
                        """
                    ).run()
                    try await PurchaseStore.audit(
                        sql, actor: actor, action: "balance_credited", subject: accountId,
                        detail: "credited \(amount) \(currency) (balance \(after)): \(reason)", at: now.milliseconds)
                    return .credited(balance: after)
                }
            } catch {
                lastError = error
            }
        }
        throw lastError ?? CancellationError()
    }
}
