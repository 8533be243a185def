// Apple platforms (Combine, StoreKit 2); on Linux only in the type-check test target, against the shims.
#if canImport(Combine) && canImport(StoreKit) && (canImport(Darwin) || STOREKIT_SHIM)
    import Combine
    import Foundation
    import StoreKeeperKitCore

    /// The short path: one call at launch, one object for every screen.
    ///
    ///     let store = try StoreKeeper.configure(
    ///         server: URL(string: "https://iap.example.com")!, appId: "ios",
    ///         responseSigningKeys: ["<current key from GET /v1/status>", "<next key, during a rotation>"],
    ///         tokens: { account, refresh in try await backend.clientToken(for: account, refresh: refresh) })
    ///
    /// then `await store.login(userId)`, `try await store.purchase("coins_100")`,
    /// `store.isEntitled("pro")` in a view body, `try await store.restore()`.
    public enum StoreKeeper {
        /// The model `configure` made (nil before).
        @MainActor public private(set) static var shared: StoreKeeperModel?

        /// Configures StoreKeeperKit with StoreKit 2 (`storeKit1: true` for apps still on
        /// `SKPaymentQueue`), the server over HTTP and the pending state in the Keychain, starts
        /// it, and keeps the lifecycle triggers alive. Throws when a signing key does not parse
        /// (never silently unsigned) or the server URL is not https (http only for this machine).
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, *)
        @MainActor
        @discardableResult
        public static func configure(
            server: URL, appId: String, responseSigningKeys: [String] = [], storeKit1: Bool = false,
            configuration: PurchaseCoordinator.Configuration = PurchaseCoordinator.defaultConfiguration(),
            tokens: @escaping ClientTokenProvider
        ) throws -> StoreKeeperModel {
            let keys = try responseSigningKeys.map { try ResponseSigningKey($0) }
            try StoreKeeperConfigurationCheck.server(server)
            let coordinator =
                storeKit1
                ? PurchaseCoordinator.storeKit1(
                    server: server, appId: appId, tokens: tokens, responseSigningKeys: keys,
                    configuration: configuration)
                : PurchaseCoordinator.storeKit2(
                    server: server, appId: appId, tokens: tokens, responseSigningKeys: keys,
                    configuration: configuration)
            let model = StoreKeeperModel(
                coordinator: coordinator, triggers: LifecycleTriggers(coordinator: coordinator))
            Task { await coordinator.configure() }
            shared = model
            return model
        }
    }

    /// The logged-in account for SwiftUI on every supported OS (`ObservableObject`: use it with
    /// `@StateObject`, `@ObservedObject` or `@EnvironmentObject`): `isEntitled("pro")`,
    /// `balance("coins")`, `pendingPurchases` read synchronously in a body, republished from the
    /// coordinator's one stream on the main actor. On iOS 17 and later `observable` is the same
    /// account as an `@Observable`.
    @MainActor
    public final class StoreKeeperModel: ObservableObject, AccountActions {
        @Published public private(set) var view = AccountView(accountId: nil, customerInfo: nil)
        public let coordinator: PurchaseCoordinator
        private var follower: AccountViewFollower?
        private let triggers: AnyObject?

        public init(coordinator: PurchaseCoordinator, triggers: AnyObject? = nil) {
            self.coordinator = coordinator
            self.triggers = triggers
            follower = AccountViewFollower(coordinator) { [weak self] view in self?.view = view }
        }

        /// The same account as an `@Observable` (iOS 17, macOS 14, tvOS 17): one per model.
        @available(iOS 17.0, macOS 14.0, tvOS 17.0, *)
        public var observable: StoreKeeperObservable {
            if let made = observableModel as? StoreKeeperObservable { return made }
            let made = StoreKeeperObservable(coordinator: coordinator)
            observableModel = made
            return made
        }
        private var observableModel: AnyObject?
    }
#endif
