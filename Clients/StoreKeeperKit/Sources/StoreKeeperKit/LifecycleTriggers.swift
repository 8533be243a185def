// iOS and tvOS (UIKit); on Linux against the UIKit and Network shims, for the tests.
#if canImport(UIKit) && canImport(Network) && !os(watchOS)
    import Foundation
    import Network
    import UIKit
    import StoreKeeperKitCore

    /// Re-drives the coordinator's held submissions when the app comes to the foreground and
    /// when the network path becomes satisfied (the coordinator debounces a storm of them).
    /// Keep it alive as long as the coordinator.
    public final class LifecycleTriggers: @unchecked Sendable {
        private let coordinator: PurchaseCoordinator
        private let monitor = NWPathMonitor()
        private var observer: NSObjectProtocol?

        public init(coordinator: PurchaseCoordinator) {
            self.coordinator = coordinator
            observer = NotificationCenter.default.addObserver(
                forName: UIApplication.willEnterForegroundNotification, object: nil, queue: nil
            ) { [coordinator] _ in
                Task { await coordinator.redrive(.foreground) }
            }
            monitor.pathUpdateHandler = { [coordinator] path in
                guard path.status == .satisfied else { return }
                Task { await coordinator.redrive(.networkChange) }
            }
            monitor.start(queue: DispatchQueue(label: "StoreKeeperKit.network"))
        }

        deinit {
            monitor.cancel()
            if let observer { NotificationCenter.default.removeObserver(observer) }
        }
    }
#elseif canImport(AppKit) && canImport(Network)
    import AppKit
    import Foundation
    import Network
    import StoreKeeperKitCore

    /// macOS: re-drives when the app becomes active and when the network path is satisfied.
    public final class LifecycleTriggers: @unchecked Sendable {
        private let coordinator: PurchaseCoordinator
        private let monitor = NWPathMonitor()
        private var observer: NSObjectProtocol?

        public init(coordinator: PurchaseCoordinator) {
            self.coordinator = coordinator
            observer = NotificationCenter.default.addObserver(
                forName: NSApplication.didBecomeActiveNotification, object: nil, queue: nil
            ) { [coordinator] _ in
                Task { await coordinator.redrive(.foreground) }
            }
            monitor.pathUpdateHandler = { [coordinator] path in
                guard path.status == .satisfied else { return }
                Task { await coordinator.redrive(.networkChange) }
            }
            monitor.start(queue: DispatchQueue(label: "StoreKeeperKit.network"))
        }

        deinit {
            monitor.cancel()
            if let observer { NotificationCenter.default.removeObserver(observer) }
        }
    }
#endif
