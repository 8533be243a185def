import Foundation
import SQLKit
import StoreKeeperSupport

/// Support's notes on an account: what an agent learned or promised, for which ticket, by whom.
/// Kept for operators (the API's `read` scope and the dashboard), never in the player's account
/// view; each note is also an audit entry.
public struct AccountNote: Sendable, Hashable {
    public var id: String
    public var accountId: String
    public var text: String
    public var ticket: String?
    public var author: String
    public var createdAt: Date
}

extension AccountStore {
    public func addNote(accountId: String, text: String, ticket: String?, author: String, now: Date) async throws
        -> AccountNote
    {
        let note = AccountNote(
            id: RowIdentifiers.uuidString(), accountId: accountId, text: text, ticket: ticket, author: author,
            createdAt: Date(milliseconds: now.milliseconds))
        try await database.transaction { sql in
            try await sql.raw(
                """
                INSERT INTO account_notes (id, account_id, text, ticket, author, created_at)
                VALUES (\(bind: note.id), \(bind: accountId), \(bind: text), \(bind: ticket), \(bind: author),
                        \(bind: now.milliseconds))
                """
            ).run()
            try await PurchaseStore.audit(
                sql, actor: author, action: "account_note", subject: accountId,
                detail: "note\(ticket.map { " (ticket \($0))" } ?? ""): \(text.prefix(300))", at: now.milliseconds)
        }
        return note
    }

    /// An account's notes, newest first.
    public func notes(of accountId: String, limit: Int = 200) async throws -> [AccountNote] {
        try await database.read { sql in
            try await sql.raw(
                """
                SELECT * FROM account_notes WHERE account_id = \(bind: accountId)
                ORDER BY created_at DESC, id DESC LIMIT \(bind: max(1, min(limit, 1000)))
                """
            ).all().map {
                AccountNote(
                    id: try $0.decode(column: "id", as: String.self),
                    accountId: try $0.decode(column: "account_id", as: String.self),
                    text: try $0.decode(column: "text", as: String.self),
                    ticket: try $0.decode(column: "ticket", as: String?.self),
                    author: try $0.decode(column: "author", as: String.self),
                    createdAt: Date(milliseconds: try $0.decode(column: "created_at", as: Int64.self)))
            }
        }
    }
}
