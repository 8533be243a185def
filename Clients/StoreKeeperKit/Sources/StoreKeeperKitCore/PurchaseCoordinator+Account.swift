import Foundation

/// The logged-in account's view, cached on the device, and the streams that publish it.
extension PurchaseCoordinator {

    /// The server's view of the logged-in account, cached durably; offline, the last one seen.
    /// Records the logged-in customer's consent to share consumption data with Apple when they
    /// ask for a refund (Apple's Send Consumption Information is sent only with it). Ask in your
    /// own words, opt-in, and let them change it later; not the App Tracking Transparency prompt.
    public func setConsumptionDataConsent(_ granted: Bool) async throws {
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        try await backend.setConsumptionDataConsent(accountId: account, granted: granted)
    }

    /// Redeems a purchase made on the web before this account existed (the code a web checkout's
    /// success page or link gave): bound to the logged-in account once, then its view, fresh.
    /// A code already used is `BackendError.server(code: "already_redeemed")`; an old one
    /// `redemption_expired` (support can renew it).
    public func redeem(_ code: String) async throws -> CustomerInfo {
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        let cleaned = code.trimmingCharacters(in: .whitespacesAndNewlines).uppercased()
        try await backend.redeem(accountId: account, code: cleaned)
        return try await customerInfo()
    }

    public func customerInfo() async throws -> CustomerInfo {
        guard let account = accountId else { throw PurchaseError.notLoggedIn }
        do {
            let info = try await backend.customerInfo(accountId: account)
            if let server = info.serverTime { timeAnchor = (server, clock.uptime()) }
            remember(info)
            return info
        } catch {
            if case BackendError.unverifiedAnswer = error { noteUnverifiedAnswer() }
            if let cached = state.customerInfo[account] { return cached }
            throw error
        }
    }

    /// The last account view seen for the logged-in account, without asking the server.
    public func cachedCustomerInfo() -> CustomerInfo? {
        accountId.flatMap { state.customerInfo[$0] }
    }

    /// Whether the logged-in account has the entitlement now, by the last view seen (offline
    /// too): an entitlement past its `expiresAt` is not active, whatever the cache said.
    public func isEntitled(_ entitlement: String) -> Bool {
        cachedCustomerInfo()?.isActive(entitlement, at: entitlementNow()) ?? false
    }

    /// "Now" for entitlements: the server's time at its last answer plus the elapsed time since
    /// (a device set days ahead or behind decides nothing); the device's clock until the server
    /// has answered in this run.
    public func entitlementNow() -> Date {
        guard let anchor = timeAnchor else { return clock.now() }
        return anchor.server.addingTimeInterval(max(0, clock.uptime() - anchor.uptime))
    }

    /// Every change of an account view the device sees (after a delivery, or a refresh); the
    /// logged-in account's current view first.
    public func customerInfoUpdates() -> AsyncStream<CustomerInfo> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<CustomerInfo>.makeStream(bufferingPolicy: .bufferingNewest(8))
        if let current = cachedCustomerInfo() { continuation.yield(current) }
        infoObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.removeObserver(id) }
        }
        return stream
    }

    func removeObserver(_ id: UUID) { infoObservers[id] = nil }

    func remember(_ info: CustomerInfo) {
        // Only the logged-in account's view is kept on the device, and only it is shown: an
        // answer about another account (a submission for someone who switched away) is neither.
        guard Self.same(info.accountId, accountId), state.customerInfo[info.accountId] != info else { return }
        state.customerInfo[info.accountId] = info
        persistOrLog()
        for continuation in infoObservers.values { continuation.yield(info) }
        publishAccountView()
    }

    /// Byte-wise equality, as the server compares ids.
    static func same(_ lhs: String?, _ rhs: String?) -> Bool {
        switch (lhs, rhs) {
        case (nil, nil): true
        case (let lhs?, let rhs?): lhs.utf8.elementsEqual(rhs.utf8)
        default: false
        }
    }
}
