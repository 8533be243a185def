import Logging

/// swift-log's `StreamLogHandler` (standard error, the same line format), with metadata kept as
/// set and written out only when a line is logged.
///
/// `StreamLogHandler` renders its metadata to text every time a key is set. Every request sets
/// two (Hummingbird's `hb.request.id`, our `request_id`) whether or not anything is logged at the
/// configured level: that rendering was 3–4 % of an account read's CPU (`bench --accounts`).
public struct LazyMetadataLogHandler: LogHandler {
    private var stream: StreamLogHandler
    public var metadata: Logger.Metadata = [:]

    public init(label: String) {
        stream = StreamLogHandler.standardError(label: label)
    }

    /// Writing to `stream` instead (tests).
    public init(label: String, stream output: any TextOutputStream & Sendable) {
        stream = StreamLogHandler(label: label, stream: output, metadataProvider: LoggingSystem.metadataProvider)
    }

    /// A logger that writes through this handler at `level`.
    public static func logger(label: String, level: Logger.Level = .info) -> Logger {
        var logger = Logger(label: label) { LazyMetadataLogHandler(label: $0) }
        logger.logLevel = level
        return logger
    }

    public var logLevel: Logger.Level {
        get { stream.logLevel }
        set { stream.logLevel = newValue }
    }

    public var metadataProvider: Logger.MetadataProvider? {
        get { stream.metadataProvider }
        set { stream.metadataProvider = newValue }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var event = event
        if !metadata.isEmpty {
            // The statement's own metadata wins over the handler's, as in StreamLogHandler.
            event.metadata = metadata.merging(event.metadata ?? [:]) { _, explicit in explicit }
        }
        stream.log(event: event)
    }
}
