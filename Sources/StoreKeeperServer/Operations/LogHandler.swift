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
        // One event, one line: control characters in the message or in any metadata value (a
        // client's text quoted in an error, say) are written escaped, never raw.
        let message = event.message.description
        if Self.needsEscaping(message) { event.message = "\(Self.escaped(message))" }
        if let metadata = event.metadata,
            metadata.contains(where: { Self.needsEscaping($0.key) || Self.needsEscaping($0.value) })
        {
            event.metadata = Dictionary(
                uniqueKeysWithValues: metadata.map { (Self.escaped($0.key), Self.escaped($0.value)) })
        }
        stream.log(event: event)
    }

    /// C0 and C1 controls, DEL, and Unicode's line and paragraph separators: what can end a log
    /// line or drive a terminal.
    static func isUnsafe(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028 || scalar.value == 0x2029
    }

    static func needsEscaping(_ text: String) -> Bool {
        text.utf8.contains { $0 < 0x20 || $0 == 0x7F || $0 >= 0xC2 } && text.unicodeScalars.contains(where: isUnsafe)
    }

    static func needsEscaping(_ value: Logger.Metadata.Value) -> Bool {
        switch value {
        case .string(let text): needsEscaping(text)
        case .stringConvertible(let value): needsEscaping(value.description)
        case .array(let values): values.contains(where: needsEscaping)
        case .dictionary(let values): values.contains { needsEscaping($0.key) || needsEscaping($0.value) }
        }
    }

    static func escaped(_ text: String) -> String {
        guard needsEscaping(text) else { return text }
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x0A: out += "\\n"
            case 0x0D: out += "\\r"
            case 0x09: out += "\\t"
            default:
                if isUnsafe(scalar) {
                    out += "\\u{\(String(scalar.value, radix: 16))}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

    static func escaped(_ value: Logger.Metadata.Value) -> Logger.Metadata.Value {
        switch value {
        case .string(let text): .string(escaped(text))
        case .stringConvertible(let value):
            needsEscaping(value.description) ? .string(escaped(value.description)) : .stringConvertible(value)
        case .array(let values): .array(values.map(escaped))
        case .dictionary(let values):
            .dictionary(Dictionary(uniqueKeysWithValues: values.map { (escaped($0.key), escaped($0.value)) }))
        }
    }
}
