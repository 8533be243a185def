import Foundation
import Yams

/// Every key a catalog may hold, checked before it is decoded: a typo (`storeProduct:`,
/// `introductoryOfer:`, `perid:`) is refused with "did you mean", as the configuration's are,
/// never silently ignored — a mis-keyed `storeProducts` would turn every real purchase into an
/// `unknown_product` anomaly.
enum CatalogKeys {
    static let top: Set<String> = ["products", "retention", "refunds"]
    static let product: Set<String> = [
        "id", "type", "group", "duration", "period", "grants", "prices", "offers", "introductoryOffer",
        "winBackOffers", "offerCodes", "storeProducts",
    ]
    static let grants: Set<String> = ["currency", "amount", "entitlement"]
    static let price: Set<String> = ["currency", "price"]
    static let offer: Set<String> = [
        "id", "eligible", "lapsedAtLeast", "maxPerAccount", "discountType", "price", "period",
    ]
    static let introductoryOffer: Set<String> = ["discountType", "price", "period"]
    static let winBackOffer: Set<String> = [
        "id", "discountType", "price", "period", "paidAtLeast", "churnedAtLeast", "maxPerAccount",
    ]
    static let offerCode: Set<String> = ["id", "maxPerAccount"]
    static let retentionRule: Set<String> = ["id", "when", "message", "alternateProduct", "promotionalOffer"]
    static let refunds: Set<String> = ["revokeNonConsumableAt", "preference", "sampleContentProvided", "disputes"]
    /// The stores a product may name its own id for.
    static let stores: Set<String> = ["app_store", "google_play", "stripe", "web"]

    /// A YAML node as plain values for the check: objects keyed by text, lists, scalars as
    /// text. Never Yams' own `load`, which traps on a key that is not text (`{ {a: 1}: 2 }`):
    /// such a key, an alias or nesting past 64 levels is left to the decoder's own error.
    static func plain(_ node: Node, depth: Int) -> Any? {
        guard depth < 64 else { return nil }
        switch node {
        case .scalar(let scalar): return scalar.string
        case .sequence(let sequence): return sequence.map { plain($0, depth: depth + 1) as Any }
        case .mapping(let mapping):
            var object: [String: Any] = [:]
            for (name, value) in mapping {
                guard case .scalar(let scalar) = name else { return nil }
                object[scalar.string] = plain(value, depth: depth + 1) as Any
            }
            return object
        case .alias: return nil
        }
    }

    /// Checks a parsed catalog document; throws naming the first unknown key with its path.
    static func check(_ document: Any?) throws {
        guard let root = document as? [String: Any] else { return }
        try known(root, top, at: "")
        for (index, entry) in (root["products"] as? [Any] ?? []).enumerated() {
            try checkProduct(entry, at: "products[\(index)]")
        }
        for (index, entry) in (root["retention"] as? [Any] ?? []).enumerated() {
            guard let rule = entry as? [String: Any] else { continue }
            // A product listed among the rules (docs' example catalogs do) is a product.
            if rule["type"] != nil {
                try checkProduct(rule, at: "retention[\(index)]")
            } else {
                try known(rule, retentionRule, at: "retention[\(index)]")
            }
        }
        if let refunds = root["refunds"] as? [String: Any] { try known(refunds, self.refunds, at: "refunds") }
    }

    static func checkProduct(_ entry: Any, at path: String) throws {
        guard let product = entry as? [String: Any] else { return }
        let name = (product["id"] as? String).map { "\(path) (\($0))" } ?? path
        try known(product, self.product, at: name)
        if let grants = product["grants"] as? [String: Any] { try known(grants, self.grants, at: "\(name).grants") }
        if let prices = product["prices"] as? [String: Any] {
            for (storefront, value) in prices {
                if let price = value as? [String: Any] {
                    try known(price, self.price, at: "\(name).prices.\(storefront)")
                }
            }
        }
        if let intro = product["introductoryOffer"] as? [String: Any] {
            try known(intro, introductoryOffer, at: "\(name).introductoryOffer")
        }
        for (key, keys) in [("offers", offer), ("winBackOffers", winBackOffer), ("offerCodes", offerCode)] {
            for (index, item) in (product[key] as? [Any] ?? []).enumerated() {
                if let item = item as? [String: Any] { try known(item, keys, at: "\(name).\(key)[\(index)]") }
            }
        }
        if let stores = product["storeProducts"] as? [String: Any] {
            try known(stores, self.stores, at: "\(name).storeProducts", what: "store")
        }
    }

    static func known(_ object: [String: Any], _ keys: Set<String>, at path: String, what: String = "key")
        throws
    {
        for key in object.keys.sorted() where !keys.contains(key) {
            let place = path.isEmpty ? key : "\(path).\(key)"
            throw CatalogError(
                "catalog: unknown \(what) '\(String(key.prefix(64)))' at \(place)\(suggestion(for: key, among: keys))")
        }
    }

    /// ", did you mean 'x'?" for the nearest known key (edit distance ≤ 2, or a case difference);
    /// else the known keys.
    static func suggestion(for key: String, among keys: Set<String>) -> String {
        let lowered = key.lowercased()
        let nearest = keys.map { ($0, distance(lowered, $0.lowercased())) }.min { ($0.1, $0.0) < ($1.1, $1.0) }
        if let (match, cost) = nearest, cost <= max(2, match.count / 4) {
            return ", did you mean '\(match)'?"
        }
        return " (known: \(keys.sorted().joined(separator: ", ")))"
    }

    /// Levenshtein distance on Unicode scalars, bounded inputs (keys are short).
    static func distance(_ a: String, _ b: String) -> Int {
        let x = Array(a.unicodeScalars.prefix(64))
        let y = Array(b.unicodeScalars.prefix(64))
        if x.isEmpty { return y.count }
        if y.isEmpty { return x.count }
        var previous = Array(0...y.count)
        for i in 1...x.count {
            var current = [i] + Array(repeating: 0, count: y.count)
            for j in 1...y.count {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x[i - 1] == y[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return previous[y.count]
    }
}
