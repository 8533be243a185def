import Foundation

#if canImport(Observation)
    import Observation
#endif

/// What a screen reads about the logged-in account, synchronously, on the main actor: every
/// model below answers these from one `AccountView`, updated from the coordinator's one stream
/// (`accountViews()`), so a SwiftUI body can ask `isEntitled("pro")` directly.
@MainActor
public protocol AccountViewPresenting: AnyObject {
    var view: AccountView { get }
}

extension AccountViewPresenting {
    public var accountId: String? { view.accountId }
    public var customerInfo: CustomerInfo? { view.customerInfo }
    /// The account's entitlements active now (an expired one is not, offline too) — now by the
    /// server's time, not the device's clock (the view was published with them, and again when
    /// one expires).
    public var activeEntitlements: [CustomerInfo.Entitlement] {
        let active = Set(view.activeEntitlementIds)
        return view.customerInfo?.entitlements.filter { active.contains($0.id) && $0.active } ?? []
    }
    public var balances: [String: Int64] { view.customerInfo?.balances ?? [:] }
    public var subscriptions: [CustomerInfo.Subscription] { view.customerInfo?.subscriptions ?? [] }
    /// Whether the logged-in account has the entitlement now, by the last view seen.
    public func isEntitled(_ entitlement: String) -> Bool {
        view.activeEntitlementIds.contains(entitlement)
    }
    /// The account's balance of a currency (0 when it has none, or nobody is logged in).
    public func balance(_ currency: String) -> Int64 { view.customerInfo?.balances[currency] ?? 0 }
    /// Purchases paid and being delivered ("Payment received — your purchase will appear shortly").
    public var pendingPurchases: Int { view.pendingPurchases }
}

/// Follows a coordinator's account views on the main actor; the models embed it.
@MainActor
public final class AccountViewFollower {
    public private(set) var view = AccountView(accountId: nil, customerInfo: nil)
    var onChange: ((AccountView) -> Void)?
    private let task = Locked<Task<Void, Never>?>(nil)

    public init(_ coordinator: PurchaseCoordinator, onChange: ((AccountView) -> Void)? = nil) {
        self.onChange = onChange
        let following = Task { [weak self] in
            for await view in await coordinator.accountViews() {
                guard let self else { return }
                self.apply(view)
            }
        }
        task.withValue { $0 = following }
    }

    deinit { task.withValue { $0?.cancel() } }

    func apply(_ next: AccountView) {
        guard next != view else { return }
        view = next
        onChange?(next)
    }

    /// Stops following.
    public func stop() { task.withValue { $0?.cancel() } }
}

/// Actions every model offers, forwarded to the coordinator.
@MainActor
public protocol AccountActions: AccountViewPresenting {
    var coordinator: PurchaseCoordinator { get }
}

extension AccountActions {
    public func login(_ accountId: String) async { await coordinator.login(accountId) }
    public func logout() async { await coordinator.logout() }
    public func purchase(_ productId: String, quantity: Int = 1) async throws -> PurchaseOutcome {
        try await coordinator.purchase(productId: productId, quantity: quantity)
    }
    public func restore() async throws -> RestoreResult { try await coordinator.restore() }
    /// Redeems a web purchase's code for the logged-in account (`PurchaseCoordinator.redeem`).
    @discardableResult
    public func redeem(_ code: String) async throws -> CustomerInfo { try await coordinator.redeem(code) }
    /// Asks the server for the account's view now (offline: the last one stands).
    public func refresh() async { _ = try? await coordinator.customerInfo() }
}

#if canImport(Observation)
    /// The account for SwiftUI with Observation (iOS 17, macOS 14, tvOS 17): `@State var store =
    /// StoreKeeperObservable(coordinator: …)` (or `StoreKeeper.shared.observable`), then
    /// `store.isEntitled("pro")` in a body re-renders when it changes.
    @available(iOS 17.0, macOS 14.0, tvOS 17.0, watchOS 10.0, *)
    @MainActor
    @Observable
    public final class StoreKeeperObservable: AccountActions {
        public private(set) var view = AccountView(accountId: nil, customerInfo: nil)
        @ObservationIgnored public let coordinator: PurchaseCoordinator
        @ObservationIgnored private var follower: AccountViewFollower?

        public init(coordinator: PurchaseCoordinator) {
            self.coordinator = coordinator
            follower = AccountViewFollower(coordinator) { [weak self] view in self?.view = view }
        }
    }
#endif
