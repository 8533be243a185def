import AppStoreModels
import AppStoreVerification
import Foundation
import Hummingbird
import StoreKeeperCore
import StoreKeeperStorage

/// Nothing Apple signed is lost to a misconfiguration: every proof that fails verification is
/// kept (`rejected_proofs`), and after the fix it is re-verified under the current trust
/// policy and delivered, exactly once, through the normal delivery path.
extension PurchasePipeline {
    /// Keeps a rejected proof; never fails the request it belongs to.
    func keepRejected(_ proof: Proof, failure: VerificationFailure, accountId: String, orderId: String?) async {
        do {
            let kept = try await rejectedProofs.keep(
                kind: proof.kind, proof: proof.text, keepText: await worthKeeping(proof, failure: failure),
                code: failure.code, reason: failure.reason, accountId: accountId, orderId: orderId,
                serverVersion: StoreKeeperVersion.current, now: Date())
            if kept == .capped {
                logger.warning(
                    "rejected proof not kept: the account's daily cap or the rejected proofs' byte budget is reached",
                    metadata: ["account": "\(accountId)", "code": "\(failure.code)"])
            }
        } catch {
            logger.error("could not keep a rejected proof", metadata: ["error": "\(error)"])
        }
    }

    /// Whether a rejected proof's text is worth keeping: it could verify once the configuration
    /// is fixed. A transaction id (digits) always; a JWS or receipt only when its signature and
    /// chain reach one of the trusted roots or Apple's own — a failure past the chain (wrong
    /// bundle, app, environment, revoked) says so already, anything else is checked again with
    /// no identity checks (`TrustPolicy.provenanceVerifiers`). Random bytes and forgeries are
    /// never stored whole.
    func worthKeeping(_ proof: Proof, failure: VerificationFailure) async -> Bool {
        if case .transactionId = proof { return true }
        switch failure {
        case .invalidSignature, .invalidChain: break
        default: return true
        }
        guard let provenance else { return false }
        switch proof {
        case .transactionId: return true
        case .signedTransaction(let jws):
            return (try? await provenance.signedData.verifyTransaction(jws)) != nil
        case .receipt(let base64):
            return (try? await provenance.receipts.verify(base64: base64)) != nil
        }
    }

}

extension StoreKeeperApp {
    /// What one re-verification pass did.
    public struct ReverifySummary: Codable, Sendable, Hashable {
        /// Proofs still rejected before this pass that matched the filters.
        public var checked = 0
        /// Transactions delivered by this pass (each exactly once, whatever runs concurrently).
        public var delivered = 0
        /// Proofs that still do not verify (forgeries stay here).
        public var stillRejected = 0
    }
}

extension PurchasePipeline {
    typealias ReverifySummary = StoreKeeperApp.ReverifySummary

    /// Re-verifies the kept proofs under the current configuration. A proof that now verifies
    /// is delivered through the same path as a submission, to the account and order that
    /// submitted it; a forgery stays rejected, and no check is relaxed.
    func reverify(since: Date? = nil, code: String? = nil, actor: String = "operator") async throws
        -> ReverifySummary
    {
        var summary = ReverifySummary()
        var cursor: (Int64, String)?
        while true {
            let page = try await rejectedProofs.stillRejected(code: code, since: since, after: cursor, limit: 200)
            guard let last = page.last else { break }
            cursor = (Int64((last.createdAt.timeIntervalSince1970 * 1000).rounded()), last.id)
            for kept in page {
                // A request deadline that passed stops the pass between proofs; a new pass
                // continues where this one stopped (what was delivered stays delivered, once).
                try Task.checkCancellation()
                summary.checked += 1
                let proof = Proof(kind: kept.kind, text: kept.proof)
                let transactions: [StoreTransaction]
                do {
                    transactions = try await verifyOffline(proof)
                } catch let failure as VerificationFailure {
                    summary.stillRejected += 1
                    try await rejectedProofs.recordCheck(
                        kept.id, verified: false, code: failure.code, reason: failure.reason, outcome: nil, now: Date())
                    continue
                } catch {
                    // Apple unreachable (transactionId proofs) or the like: try again next pass.
                    summary.stillRejected += 1
                    continue
                }
                let delivered = try await deliverVerified(
                    transactions, accountId: kept.accountId, orderId: kept.orderId, evidence: proof.evidence)
                summary.delivered += delivered.results.filter { $0.outcome == "delivered" }.count
                let outcomes = delivered.results.map(\.outcome).joined(separator: ",")
                try await rejectedProofs.recordCheck(
                    kept.id, verified: true, code: kept.code, reason: kept.reason, outcome: outcomes, now: Date())
            }
        }
        try await store.anomalies.recordAudit(
            actor: actor, action: "reverify", subject: nil,
            detail:
                "re-verified rejected proofs (code \(code ?? "any"), since \(since.map(StoreKeeperApp.iso) ?? "any")): checked \(summary.checked), delivered \(summary.delivered), still rejected \(summary.stillRejected)",
            now: Date())
        logger.notice(
            "re-verified rejected proofs",
            metadata: [
                "checked": "\(summary.checked)", "delivered": "\(summary.delivered)",
                "stillRejected": "\(summary.stillRejected)",
            ])
        return summary
    }

}

extension StoreKeeperApp {
    // MARK: HTTP

    struct RejectedProofJSON: Encodable {
        var id: String
        var sha256: String
        var kind: String
        var code: String
        var reason: String
        var accountId: String
        var orderId: String?
        var size: Int
        var status: String
        var createdAt: String
        var serverVersion: String
        var checkedAt: String?
        var outcome: String?
        /// false: the proof's chain reached no trusted or Apple root, and only its hash, code and
        /// account are kept (it cannot be re-verified).
        var proofKept: Bool

        init(_ proof: RejectedProofStore.Proof) {
            id = proof.id
            sha256 = proof.sha256
            kind = proof.kind.rawValue
            code = proof.code
            reason = proof.reason
            accountId = proof.accountId
            orderId = proof.orderId
            size = proof.size
            status = proof.status
            createdAt = StoreKeeperApp.iso(proof.createdAt)
            serverVersion = proof.serverVersion
            checkedAt = proof.checkedAt.map(StoreKeeperApp.iso)
            outcome = proof.outcome
            proofKept = proof.proofKept
        }
    }

    static let rejectionCodes: Set<String> = [
        "invalid_signature", "invalid_chain", "wrong_bundle", "wrong_app", "wrong_environment", "revoked",
    ]

    /// `code` and `since` filters, from a query string or a body.
    public static func rejectedProofFilters(code: String?, since: String?) throws -> (code: String?, since: Date?) {
        if let code, !rejectionCodes.contains(code) {
            throw APIError.badRequest(
                "'code' must be one of \(rejectionCodes.sorted().joined(separator: ", "))")
        }
        guard let since else { return (code, nil) }
        guard let date = parseDate(since) else {
            throw APIError.badRequest("'since' must be an ISO 8601 date or date-time")
        }
        return (code, date)
    }

    /// `2026-11-22`, `2026-11-22T10:00:00Z` or with fractional seconds.
    public static func parseDate(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: .iso8601) { return date }
        if let date = try? Date(
            text,
            strategy: .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(
                separator: .omitted))
        {
            return date
        }
        return try? Date(text, strategy: .iso8601.year().month().day())
    }
}

/// `GET /v1/rejected-proofs` and `POST /v1/rejected-proofs/reverify`. It owns the store it
/// lists from; re-verifying runs the purchase pipeline, handed in as `reverify`.
struct RejectedProofsController: RequestHandling {
    let store: RejectedProofStore
    let maxBodyBytes: Int
    /// Every kept proof since a date, of a code, through the purchase pipeline again.
    let reverify: @Sendable (_ since: Date?, _ code: String?) async throws -> StoreKeeperApp.ReverifySummary

    func addRoutes(to v1: some RouterMethods<StoreKeeperContext>) {
        v1.get("rejected-proofs") { request, context in try await listRejectedProofs(request, context) }
        v1.post("rejected-proofs/reverify") { request, context in try await reverifyRejectedProofs(request, context) }
    }

    func listRejectedProofs(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireScope(.read)
        try context.caller().requireEveryApp("the rejected proofs")
        let query = request.uri.queryParameters
        let filters = try StoreKeeperApp.rejectedProofFilters(
            code: query["code"].map(String.init), since: query["since"].map(String.init))
        let status = query["status"].map(String.init)
        if let status, !["rejected", "reverified"].contains(status) {
            throw APIError.badRequest("query 'status' must be rejected or reverified")
        }
        var limit = 100
        if let text = query["limit"] {
            guard let parsed = Int(text), (1...1000).contains(parsed) else {
                throw APIError.badRequest("query 'limit' must be 1…1000")
            }
            limit = parsed
        }
        let proofs = try await store.list(
            code: filters.code, since: filters.since, status: status, limit: limit)
        return try Self.json(["rejectedProofs": proofs.map(StoreKeeperApp.RejectedProofJSON.init)])
    }

    struct ReverifyBody: Decodable {
        var since: String?
        var code: String?
    }

    func reverifyRejectedProofs(_ request: Request, _ context: StoreKeeperContext) async throws -> Response {
        try context.caller().requireSecretKey()
        var request = request
        let buffer = try await request.collectBody(upTo: maxBodyBytes)
        var body = ReverifyBody()
        if buffer.readableBytes > 0 {
            do {
                body = try JSONDecoder().decode(ReverifyBody.self, from: Data(buffer: buffer))
            } catch let error as DecodingError {
                throw APIError.badRequest(ErrorMiddleware<StoreKeeperContext>.describe(error))
            }
        }
        let filters = try StoreKeeperApp.rejectedProofFilters(code: body.code, since: body.since)
        return try Self.json(try await reverify(filters.since, filters.code))
    }
}
