// The SwiftUI API surface the integration guide's views use, declared with Apple's shapes, so
// the guide's SwiftUI code type-checks on Linux (where SwiftUI does not exist). Declarations
// only: nothing here renders; every body traps. Linux only — elsewhere SwiftUI is imported.
#if os(Linux)
    @_exported import Combine

    private func unavailable() -> Never { fatalError("SwiftUI shim: declarations only") }

    @MainActor @preconcurrency
    public protocol View {
        associatedtype Body: View
        @ViewBuilder var body: Self.Body { get }
    }

    extension Never: View {
        public var body: Never { unavailable() }
    }

    public struct EmptyView: View {
        public init() {}
        public var body: Never { unavailable() }
    }

    public struct TupleView<T>: View {
        public init(_ value: T) {}
        public var body: Never { unavailable() }
    }

    public struct _ConditionalContent<TrueContent: View, FalseContent: View>: View {
        public var body: Never { unavailable() }
    }

    extension Optional: View where Wrapped: View {
        public var body: Never { unavailable() }
    }

    @resultBuilder
    public enum ViewBuilder {
        public static func buildBlock() -> EmptyView { EmptyView() }
        public static func buildBlock<Content: View>(_ content: Content) -> Content { content }
        public static func buildBlock<each Content: View>(_ content: repeat each Content) -> TupleView<
            (repeat each Content)
        > { TupleView((repeat each content)) }
        public static func buildExpression<Content: View>(_ content: Content) -> Content { content }
        public static func buildIf<Content: View>(_ content: Content?) -> Content? { content }
        public static func buildEither<T: View, F: View>(first: T) -> _ConditionalContent<T, F> { unavailable() }
        public static func buildEither<T: View, F: View>(second: F) -> _ConditionalContent<T, F> { unavailable() }
    }

    public struct Text: View {
        public init<S: StringProtocol>(_ content: S) {}
        public var body: Never { unavailable() }
    }

    public struct Button<Label: View>: View {
        public var body: Never { unavailable() }
    }

    extension Button where Label == Text {
        public init<S: StringProtocol>(_ title: S, action: @escaping @MainActor () -> Void) {}
    }

    public struct VStack<Content: View>: View {
        public init(@ViewBuilder content: () -> Content) {}
        public var body: Never { unavailable() }
    }

    public struct ModifiedContent<Content, Modifier>: View {
        public var body: Never { unavailable() }
    }

    extension View {
        public func task(priority: TaskPriority = .userInitiated, _ action: @escaping @Sendable () async -> Void)
            -> some View
        { ModifiedContent<Self, Void>() }
        public func disabled(_ disabled: Bool) -> some View { ModifiedContent<Self, Void>() }
    }

    @propertyWrapper
    public struct ObservedObject<ObjectType: ObservableObject> {
        public init(wrappedValue: ObjectType) { self.wrappedValue = wrappedValue }
        public var wrappedValue: ObjectType
    }

    @propertyWrapper
    public struct StateObject<ObjectType: ObservableObject> {
        public init(wrappedValue thunk: @autoclosure @escaping () -> ObjectType) { unavailable() }
        public var wrappedValue: ObjectType { unavailable() }
    }

    @propertyWrapper
    public struct EnvironmentObject<ObjectType: ObservableObject> {
        public init() {}
        public var wrappedValue: ObjectType { unavailable() }
    }

    @propertyWrapper
    public struct State<Value> {
        public init(wrappedValue value: Value) {}
        public var wrappedValue: Value {
            get { unavailable() }
            nonmutating set {}
        }
    }

    public protocol App {
        associatedtype Body: Scene
        @SceneBuilder @MainActor var body: Self.Body { get }
        @MainActor init()
    }

    public protocol Scene {}

    @resultBuilder
    public enum SceneBuilder {
        public static func buildBlock<Content: Scene>(_ content: Content) -> Content { content }
    }

    public struct WindowGroup<Content: View>: Scene {
        public init(@ViewBuilder content: () -> Content) {}
    }

    extension View {
        public func environmentObject<T: ObservableObject>(_ object: T) -> some View { ModifiedContent<Self, T>() }
    }
#endif
