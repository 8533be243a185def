import Foundation

/// How much the SDK says.
public enum LogLevel: Int, Comparable, Sendable, CustomStringConvertible {
    case debug = 0
    case info
    case warning
    case error

    public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { ["debug", "info", "warning", "error"][rawValue] }
}

/// Where the SDK's log lines go: the app's own logging (os.Logger, a crash reporter's
/// breadcrumbs). Lines name transaction ids, product ids and codes, never tokens or receipts.
public protocol StoreKeeperLogger: Sendable {
    func log(_ level: LogLevel, _ message: String)
}

/// Lines at or above `minimum` to standard error (the default logger says warnings and errors).
public struct PrintLogger: StoreKeeperLogger {
    public var minimum: LogLevel
    public init(minimum: LogLevel = .warning) { self.minimum = minimum }
    public func log(_ level: LogLevel, _ message: String) {
        guard level >= minimum else { return }
        FileHandle.standardError.write(Data("[StoreKeeperKit] \(level): \(message)\n".utf8))
    }
}

/// Says nothing.
public struct SilentLogger: StoreKeeperLogger {
    public init() {}
    public func log(_ level: LogLevel, _ message: String) {}
}
