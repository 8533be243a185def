// The Network framework surface LifecycleTriggers uses (NWPathMonitor), with Apple's names, so
// the triggers compile on Linux; a test can deliver a path update by hand. Test-only, Linux only.
#if os(Linux)
    import Foundation

    public struct NWPath: Sendable {
        public enum Status: Sendable, Equatable { case satisfied, unsatisfied, requiresConnection }
        public let status: NWPath.Status
        public init(status: NWPath.Status) { self.status = status }
    }

    public final class NWPathMonitor: @unchecked Sendable {
        public var pathUpdateHandler: (@Sendable (_ newPath: NWPath) -> Void)?
        nonisolated(unsafe) static var started: [NWPathMonitor] = []
        static let lock = NSLock()

        public init() {}

        public func start(queue: DispatchQueue) {
            Self.lock.lock()
            Self.started.append(self)
            Self.lock.unlock()
        }

        public func cancel() {
            Self.lock.lock()
            Self.started.removeAll { $0 === self }
            Self.lock.unlock()
        }

        /// Tests: every started monitor sees this path.
        public static func simulate(_ path: NWPath) {
            lock.lock()
            let monitors = started
            lock.unlock()
            for monitor in monitors { monitor.pathUpdateHandler?(path) }
        }
    }
#endif
