import Foundation
import Yams

/// `GET /openapi.json`: docs/openapi.yaml, compiled into the binary and served as JSON.
enum OpenAPIDocument {
    /// The YAML as committed.
    static var yaml: String { String(decoding: PackageResources.openapi_yaml, as: UTF8.self) }

    /// The document as JSON, converted once.
    static let json: Data = {
        guard let object = try? Yams.load(yaml: yaml),
            let data = try? JSONSerialization.data(
                withJSONObject: jsonSafe(object as Any), options: [.sortedKeys, .withoutEscapingSlashes])
        else {
            return Data(
                #"{"error":{"code":"internal","message":"the OpenAPI document does not parse","retryable":false}}"#.utf8
            )
        }
        return data
    }()

    /// YAML scalars Yams gives as types JSON has no word for (dates) become strings; integer
    /// keys (response codes) become string keys.
    static func jsonSafe(_ value: Any) -> Any {
        switch value {
        case let dictionary as [AnyHashable: Any]:
            var out: [String: Any] = [:]
            for (key, item) in dictionary { out["\(key.base)"] = jsonSafe(item) }
            return out
        case let array as [Any]: return array.map(jsonSafe)
        case let date as Date: return ISO8601DateFormatter().string(from: date)
        case is String, is Int, is Double, is Bool: return value
        case is NSNull: return NSNull()
        default: return "\(value)"
        }
    }
}
