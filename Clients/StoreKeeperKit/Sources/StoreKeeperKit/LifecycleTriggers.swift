// iOS and tvOS (UIKit), macOS (AppKit); on Linux against the UIKit and Network shims, for the tests.
#if (canImport(UIKit) || canImport(AppKit)) && canImport(Network) && !os(watchOS)
    import Foundation
    import Network
    import StoreKeeperKitCore
    #if canImport(UIKit)
        import UIKit
    #else
        import AppKit
    #endif

    /// Re-drives the coordinator's held submissions when the app comes to the foreground (macOS:
    /// becomes active) and when the network path becomes satisfied (the coordinator debounces a
    /// storm of them). Keep it alive as long as the coordinator.
    public final class LifecycleTriggers: @unchecked Sendable {
        private let coordinator: PurchaseCoordinator
        private let monitor = NWPathMonitor()
        private var observer: NSObjectProtocol?

        private var backgroundObserver: NSObjectProtocol?

        #if canImport(UIKit)
            static let foreground = UIApplication.willEnterForegroundNotification
            static let background = UIApplication.didEnterBackgroundNotification
        #else
            static let foreground = NSApplication.didBecomeActiveNotification
            static let background = NSApplication.didResignActiveNotification
        #endif

        public init(coordinator: PurchaseCoordinator) {
            self.coordinator = coordinator
            observer = NotificationCenter.default.addObserver(forName: Self.foreground, object: nil, queue: nil) {
                [coordinator] _ in
                Task { await coordinator.setForeground(true) }
            }
            // In the background no receipt refresh (a possible sign-in sheet) is started.
            backgroundObserver = NotificationCenter.default.addObserver(
                forName: Self.background, object: nil, queue: nil
            ) { [coordinator] _ in
                Task { await coordinator.setForeground(false) }
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
            if let backgroundObserver { NotificationCenter.default.removeObserver(backgroundObserver) }
        }
    }
#endif
