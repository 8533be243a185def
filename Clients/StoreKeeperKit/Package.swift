// swift-tools-version:5.9
import PackageDescription

// StoreKeeperKit: the client SDK. Foundation only, so an iOS app adding it resolves nothing
// of the server's. The core (purchase coordinator, durable pending store, backend client) is
// platform-neutral and tested on Linux; the StoreKit adapters compile only where StoreKit
// exists, and are type-checked on Linux against `StoreKitShim` (tests only), a module that
// declares exactly the StoreKit API surface they use, with Apple's signatures.
let package = Package(
    name: "StoreKeeperKit",
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8)],
    products: [
        .library(name: "StoreKeeperKit", targets: ["StoreKeeperKit"]),
        .library(name: "StoreKeeperKitCore", targets: ["StoreKeeperKitCore"]),
    ],
    targets: [
        .target(name: "StoreKeeperKitCore"),
        .target(name: "StoreKeeperKit", dependencies: ["StoreKeeperKitCore"]),
        // Test-only: StoreKit's API surface as Apple declares it, under the module name
        // `StoreKit`, so `canImport(StoreKit)` holds where it is a dependency (Linux only).
        .target(name: "StoreKit", path: "Tests/StoreKitShim"),
        .testTarget(
            name: "StoreKitAdapterTypeCheck",
            dependencies: [
                "StoreKeeperKitCore", .target(name: "StoreKit", condition: .when(platforms: [.linux])),
            ]),
        .testTarget(name: "StoreKeeperKitCoreTests", dependencies: ["StoreKeeperKitCore"]),
    ]
)
