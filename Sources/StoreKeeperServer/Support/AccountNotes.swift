import Foundation
import Hummingbird
import StoreKeeperStorage

/// `POST /v1/accounts/{accountId}/notes` (support) and `GET …/notes` (read): support's notes on
/// an account, audited with the key's label; never part of the player's own account view.
extension StoreKeeperApp {
    struct NoteBody: RequestBody {
        var text: String
        var ticket: String?

        func validate() throws {
            let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
            guard !trimmed.isEmpty, text.unicodeScalars.count <= 2000 else {
                throw APIError.badRequest("field 'text' is required: 1…2000 characters")
            }
            try StoreKeeperApp.validateText(text, field: "text", requireNFC: false)
            if let ticket {
                guard !ticket.isEmpty, ticket.unicodeScalars.count <= 100 else {
                    throw APIError.badRequest("field 'ticket' must be 1…100 characters")
                }
                try StoreKeeperApp.validateText(ticket, field: "ticket", requireNFC: false)
            }
        }
    }

    struct NoteJSON: Encodable {
        var id: String
        var accountId: String
        var text: String
        var ticket: String?
        var author: String
        var createdAt: String

        init(_ note: AccountNote) {
            id = note.id
            accountId = note.accountId
            text = note.text
            ticket = note.ticket
            author = note.author
            createdAt = StoreKeeperApp.iso(note.createdAt)
        }
    }
}
