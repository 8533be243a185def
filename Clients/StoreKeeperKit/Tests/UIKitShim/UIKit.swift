// The UIKit surface LifecycleTriggers uses (the application's lifecycle notifications), with
// Apple's names, so the triggers compile on Linux. Test-only, Linux only.
#if os(Linux)
    import Foundation

    @MainActor
    open class UIApplication {
        public nonisolated static let willEnterForegroundNotification = Notification.Name(
            "UIApplicationWillEnterForegroundNotification")
        public nonisolated static let didBecomeActiveNotification = Notification.Name(
            "UIApplicationDidBecomeActiveNotification")
        public nonisolated static let didEnterBackgroundNotification = Notification.Name(
            "UIApplicationDidEnterBackgroundNotification")
    }
#endif
