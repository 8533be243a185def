import Foundation
import GooglePlay

/// Google Play's external transactions (its US programs, google-play.md and the Android
/// Publisher API's `externaltransactions`): the tokens Play Billing gives an app before it links
/// out, the reports a developer's server sends for each payment taken outside Google Play, and
/// their refunds — checked as Google checks them.
extension LocalGooglePlay {
    /// What the local Google Play keeps of external transactions.
    struct ExternalState: Sendable {
        /// Tokens issued to the app (`createExternalTransactionTokenAsync`), and those a
        /// report used.
        var tokens: Set<String> = []
        var usedTokens: Set<String> = []
        var transactions: [String: ExternalTransaction] = [:]
        /// Creation order, for listing.
        var order: [String] = []
        var refundIds: [String: Set<String>] = [:]
    }

    /// Google's refusal of an external transaction request: status, reason, message.
    public struct ExternalRefusal: Error, Sendable, Equatable {
        public var status: Int
        public var reason: String
        public var message: String
    }

    /// A token as Play Billing Library 8.3's billing-program API hands it to the app before it
    /// opens the external link.
    public func issueExternalTransactionToken() -> String {
        let token = "ext-" + UUID().uuidString.lowercased()
        external.tokens.insert(token)
        return token
    }

    static func validExternalId(_ id: String) -> Bool {
        (1...63).contains(id.utf8.count)
            && id.utf8.allSatisfy {
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2D
                    || $0 == 0x5F
            }
    }

    static func micros(_ price: ExternalTransaction.Price?) -> Int64? {
        guard let price, let value = Int64(price.priceMicros), value >= 0, price.currency.utf8.count == 3 else {
            return nil
        }
        return value
    }

    /// `externaltransactions.createexternaltransaction`.
    public func createExternalTransaction(id: String, _ body: ExternalTransaction) throws(ExternalRefusal)
        -> ExternalTransaction
    {
        func invalid(_ message: String) -> ExternalRefusal {
            ExternalRefusal(status: 400, reason: "invalidValue", message: message)
        }
        guard Self.validExternalId(id) else {
            throw invalid("externalTransactionId must be 1-63 characters of [a-zA-Z0-9_-].")
        }
        guard external.transactions[id] == nil else {
            throw ExternalRefusal(
                status: 409, reason: "alreadyExists", message: "An external transaction with this id already exists.")
        }
        guard let preTax = Self.micros(body.originalPreTaxAmount), let tax = Self.micros(body.originalTaxAmount),
            body.originalPreTaxAmount?.currency == body.originalTaxAmount?.currency
        else { throw invalid("originalPreTaxAmount and originalTaxAmount are required, in one currency.") }
        guard body.transactionTime.flatMap(GoogleTime.parse) != nil else {
            throw invalid("transactionTime is required (RFC 3339).")
        }
        guard let region = body.userTaxAddress?.regionCode, region.utf8.count == 2 else {
            throw invalid("userTaxAddress.regionCode is required (ISO 3166-1 alpha-2).")
        }
        guard region == "US" else {
            throw invalid("The user's country is not eligible for this program.")
        }
        switch (body.oneTimeTransaction, body.recurringTransaction) {
        case (let oneTime?, nil):
            try useToken(oneTime.externalTransactionToken)
        case (nil, let recurring?):
            guard let type = recurring.externalSubscription?.subscriptionType, ["RECURRING", "PREPAID"].contains(type)
            else { throw invalid("recurringTransaction.externalSubscription.subscriptionType is required.") }
            switch (recurring.externalTransactionToken, recurring.initialExternalTransactionId) {
            case (let token?, nil):
                try useToken(token)
            case (nil, let initial?):
                guard let first = external.transactions[initial], first.recurringTransaction != nil else {
                    throw invalid("initialExternalTransactionId does not name a recurring external transaction.")
                }
            default:
                throw invalid("Give externalTransactionToken (initial) or initialExternalTransactionId (renewal).")
            }
        default:
            throw invalid("Exactly one of oneTimeTransaction and recurringTransaction is required.")
        }
        _ = preTax
        _ = tax
        var stored = body
        stored.externalTransactionId = id
        stored.currentPreTaxAmount = body.originalPreTaxAmount
        stored.currentTaxAmount = body.originalTaxAmount
        stored.createTime = GoogleTime.format(clock.now())
        stored.packageName = configuration.packageName
        stored.transactionState = "TRANSACTION_REPORTED"
        external.transactions[id] = stored
        external.order.append(id)
        return stored
    }

    func useToken(_ token: String?) throws(ExternalRefusal) {
        guard let token, external.tokens.contains(token) else {
            throw ExternalRefusal(
                status: 400, reason: "invalidValue", message: "The external transaction token is invalid.")
        }
        guard !external.usedTokens.contains(token) else {
            throw ExternalRefusal(
                status: 400, reason: "invalidValue",
                message: "The external transaction token was already used by another transaction.")
        }
        external.usedTokens.insert(token)
    }

    public func externalTransaction(_ id: String) -> ExternalTransaction? { external.transactions[id] }

    /// Every reported external transaction, in the order they were created.
    public func externalTransactions() -> [ExternalTransaction] {
        external.order.compactMap { external.transactions[$0] }
    }

    /// `externaltransactions.refundexternaltransaction`: a full refund cancels it; a partial
    /// one lowers its current amounts (tax in proportion), each `refundId` once.
    public func refundExternalTransaction(id: String, _ body: ExternalTransactionRefund) throws(ExternalRefusal)
        -> ExternalTransaction
    {
        guard var transaction = external.transactions[id] else {
            throw ExternalRefusal(status: 404, reason: "notFound", message: "The external transaction was not found.")
        }
        guard transaction.transactionState != "TRANSACTION_CANCELED" else {
            throw ExternalRefusal(
                status: 400, reason: "invalidValue", message: "The external transaction is already fully refunded.")
        }
        guard GoogleTime.parse(body.refundTime) != nil else {
            throw ExternalRefusal(status: 400, reason: "invalidValue", message: "refundTime is required (RFC 3339).")
        }
        let currentPreTax = Self.micros(transaction.currentPreTaxAmount) ?? 0
        let currentTax = Self.micros(transaction.currentTaxAmount) ?? 0
        switch (body.fullRefund, body.partialRefund) {
        case (_?, nil):
            transaction.currentPreTaxAmount?.priceMicros = "0"
            transaction.currentTaxAmount?.priceMicros = "0"
            transaction.transactionState = "TRANSACTION_CANCELED"
        case (nil, let partial?):
            guard Self.validExternalId(partial.refundId) else {
                throw ExternalRefusal(
                    status: 400, reason: "invalidValue", message: "refundId must be 1-63 characters of [a-zA-Z0-9_-].")
            }
            guard !(external.refundIds[id]?.contains(partial.refundId) ?? false) else {
                throw ExternalRefusal(
                    status: 409, reason: "alreadyExists", message: "A refund with this refundId already exists.")
            }
            guard let amount = Self.micros(partial.refundPreTaxAmount), amount > 0, amount <= currentPreTax,
                partial.refundPreTaxAmount.currency == transaction.currentPreTaxAmount?.currency
            else {
                throw ExternalRefusal(
                    status: 400, reason: "invalidValue",
                    message:
                        "refundPreTaxAmount must be positive, in the transaction's currency, and at most its current pre-tax amount."
                )
            }
            let left = currentPreTax - amount
            let taxLeft =
                currentPreTax > 0 ? Int64((Double(currentTax) * Double(left) / Double(currentPreTax)).rounded()) : 0
            transaction.currentPreTaxAmount?.priceMicros = String(left)
            transaction.currentTaxAmount?.priceMicros = String(taxLeft)
            if left == 0 { transaction.transactionState = "TRANSACTION_CANCELED" }
            external.refundIds[id, default: []].insert(partial.refundId)
        default:
            throw ExternalRefusal(
                status: 400, reason: "invalidValue", message: "Exactly one of fullRefund and partialRefund is required."
            )
        }
        external.transactions[id] = transaction
        return transaction
    }
}
