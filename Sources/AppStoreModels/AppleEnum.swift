/// An Apple enumeration that keeps values it does not know.
///
/// Apple adds enum values every few months. Each Apple enum is a struct over its raw value
/// with the known values as static members, so an unknown value decodes, survives
/// re-encoding unchanged and can still be logged (`isKnown == false`).
public protocol AppleEnum: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible
where RawValue: Codable & Hashable & Sendable {
    /// The values Apple documents.
    static var knownValues: [Self] { get }
    init(rawValue: RawValue)
}

extension AppleEnum {
    /// Whether this value is one Apple documents (as of this library's spec).
    public var isKnown: Bool { Self.knownValues.contains(self) }
    public var description: String { "\(rawValue)" }
}
