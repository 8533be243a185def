// The Combine API surface StoreKeeperKit's SwiftUI model uses (`ObservableObject`, `@Published`),
// declared with Apple's shapes so the model type-checks on Linux, where Combine does not exist.
// The model's logic lives in StoreKeeperKitCore and is tested there; nothing here publishes.
#if os(Linux)
    public protocol ObservableObject: AnyObject {
        associatedtype ObjectWillChangePublisher = ObservableObjectPublisher
        var objectWillChange: ObjectWillChangePublisher { get }
    }

    public final class ObservableObjectPublisher {
        public init() {}
        public func send() {}
    }

    extension ObservableObject where ObjectWillChangePublisher == ObservableObjectPublisher {
        public var objectWillChange: ObservableObjectPublisher { ObservableObjectPublisher() }
    }

    @propertyWrapper
    public struct Published<Value> {
        public var wrappedValue: Value
        public init(wrappedValue: Value) { self.wrappedValue = wrappedValue }
    }
#endif
