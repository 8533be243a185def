/// A scalar in a legacy `verifyReceipt` response.
///
/// Apple sends almost every scalar there as a JSON string (`"quantity": "1"`), but a few as
/// numbers or booleans. This keeps whichever JSON type arrived, so a response re-encodes
/// unchanged, and reads it as the type the caller wants.
public enum LegacyValue: Codable, Hashable, Sendable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral {
    case string(String)
    case integer(Int64)
    case double(Double)
    case bool(Bool)

    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else {
            self = .double(try container.decode(Double.self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .integer(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        case .bool(let value): try container.encode(value)
        }
    }

    /// The value as text, whatever JSON type carried it.
    public var stringValue: String {
        switch self {
        case .string(let value): value
        case .integer(let value): String(value)
        case .double(let value): String(value)
        case .bool(let value): String(value)
        }
    }

    /// The value as a 64-bit integer (`"1616411598724"` and `1616411598724` alike).
    public var int64Value: Int64? {
        switch self {
        case .string(let value): Int64(value)
        case .integer(let value): value
        case .double(let value): Int64(exactly: value)
        case .bool(let value): value ? 1 : 0
        }
    }

    /// The value as a boolean (`"true"`, `"1"`, `true`, `1`).
    public var boolValue: Bool? {
        switch self {
        case .string(let value):
            switch value.lowercased() {
            case "true", "1": true
            case "false", "0": false
            default: nil
            }
        case .integer(let value): value != 0
        case .double(let value): value != 0
        case .bool(let value): value
        }
    }
}
